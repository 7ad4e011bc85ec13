"""Decide what to change: a pure function from (inventory, layout, usage, saved state) to a Plan.

Nothing here touches the host, so every rule (in-use protection, adoption, equal-size
mode, crash recovery) is tested on plain data. The rules:

* Existing vGPUs that match the layout stay; nothing is cleared and re-created.
* An extra vGPU is removed only when nothing uses it; otherwise it stays and is reported.
* A definition is written before its device is created, and the device removed before its
  definition, so a crash at any point leaves saved state the next plan completes
  (a definition without a device is started again, or forgotten if no longer wanted).
* Steps that change what a GPU offers (driver, VFs) are structural: the reconciler runs
  them, discovers again and plans the vGPUs on the new state.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence

from mdev_manager import catalog
from mdev_manager.actions import (
    Action,
    BindDriver,
    CreateMdev,
    DisableVfs,
    EnableVfs,
    Plan,
    RemoveDefinition,
    RemoveMdev,
    SaveDefinition,
    SavePassthrough,
    SavePlacementRecord,
    SaveVendorRecord,
    SetVgpuType,
    Skip,
)
from mdev_manager.config import ConfigError, GpuLayout, did_you_mean_type, layout_error
from mdev_manager.migplan import check_mig_layout, forget_layout_instances, plan_mig, switch_mig_mode
from mdev_manager.models import Gpu, Inventory, MdevDefinition, Usage, Vgpu, VgpuType, held_types, occupancy
from mdev_manager.placeplan import check_mixed_layout, plan_placed, preview, refused, slot_map, switch_mixed
from mdev_manager.vgpusteps import (
    clear_step,
    dormant_users,
    forget_step,
    kept_for_its_domain,
    named_dormant,
    split_existing,
    vgpu_users,
)

NVIDIA = "0x10de"


# ---------------------------------------------------------------- selection
def select_gpus(inv: Inventory, layouts: list[GpuLayout]) -> dict[str, GpuLayout]:
    """Map each selected GPU to its entry; a GPU selected twice, or a selector that matches nothing, is an error.

    A device filter (vgpu-device-manager's) narrows a selection and is no error when it
    leaves nothing: one file serves a fleet of differently equipped nodes.
    """
    chosen, problems, _waiting = _select(inv, layouts)
    if problems:
        raise layout_error(problems, layouts)  # named as the file writes them
    return chosen


def waiting_entries(inv: Inventory, layouts: list[GpuLayout]) -> list[Skip]:
    """The entries that name a GPU which left the bus (``inv.gone``): each waits for its GPU."""
    return _select(inv, layouts)[2]


def _select(inv: Inventory, layouts: list[GpuLayout]) -> tuple[dict[str, GpuLayout], list[str], list[Skip]]:
    """:func:`select_gpus` without raising: the GPUs selected, every selection problem, and the
    entries waiting for a GPU that left the bus (by ``pciAddress``, or an ``index`` that pointed at
    it); an ``index`` that a GPU leaving the bus would move onto another GPU is a problem."""
    chosen: dict[str, GpuLayout] = {}
    where_chosen: dict[str, str] = {}
    problems = []
    waiting: list[Skip] = []
    nvidia = [g for g in inv.gpus if g.vendor_id == NVIDIA]
    for i, entry in enumerate(layouts):
        where = f"{entry.at(i)} ({entry.describe()})"
        pool = nvidia if entry.nvidia_only else inv.gpus
        if entry.all:
            hits = pool
        elif entry.index is not None:
            numbered = _numbered(inv, entry.nvidia_only)
            meant = numbered[entry.index] if entry.index < len(numbered) else None
            if meant in inv.gone:
                waiting.append(Skip(device=meant, reason=_gone(where, meant)))
                continue
            hits = [g for g in pool if g.address == meant]
            if not hits:
                problems.append(f"{where}.{entry.field_name('index')}: the node has {len(numbered)} "
                                f"{'NVIDIA ' if entry.nvidia_only else ''}GPUs (indices 0-{len(numbered) - 1})")
                continue
        elif entry.pci_address:
            hits = [g for g in inv.gpus if g.address == entry.pci_address]
            if not hits and entry.pci_address in inv.gone:
                waiting.append(Skip(device=entry.pci_address, reason=_gone(where, entry.pci_address)))
                continue
            if not hits:
                problems.append(f"{where}.pciAddress: no GPU at {entry.pci_address}; GPUs are at "
                                + ", ".join(g.address for g in inv.gpus))
                continue
        else:
            assert entry.model is not None  # GpuLayout: exactly one selector
            m = entry.model.lower()
            hits = [g for g in inv.gpus if m in (g.product_name or "").lower()
                    or m == f"{g.vendor_id[2:]}:{g.device_id[2:]}".lower()]
            if not hits:
                problems.append(f"{where}.model: no GPU matches {entry.model!r}; models here: "
                                + ", ".join(sorted({g.model for g in inv.gpus})))
                continue
        hits = [g for g in hits if entry.matches_device(g.vendor_id, g.device_id, g.subsystem_vendor_id,
                                                        g.subsystem_device_id)]
        for g in hits:
            if g.address in chosen:
                problems.append(f"{where}: GPU {g.index} ({g.address}) is already selected by "
                                f"{where_chosen[g.address]}; select each GPU once")
            else:
                chosen[g.address] = entry
                where_chosen[g.address] = where
    return chosen, problems, waiting


def _numbered(inv: Inventory, nvidia_only: bool) -> list[str]:
    """The addresses an ``index`` counts, in the node's numbering (GPUs that left the bus keep their
    place, so no index moves onto another GPU); ``nvidia_only`` (vgpu-device-manager's ``devices``)
    counts NVIDIA GPUs only, and a gone GPU whose vendor an earlier release did not record as one."""
    numbers = {g.address: g.index for g in inv.gpus if not nvidia_only or g.vendor_id == NVIDIA}
    numbers |= {a: n for a, n in inv.gone_numbers.items() if not nvidia_only or inv.gone_vendors.get(a, NVIDIA) == NVIDIA}
    return sorted(numbers, key=lambda a: numbers[a])


def _gone(where: str, address: str) -> str:
    return (f"{where}: GPU {address} left the bus (hot-unplug, or fallen off it); the entry waits for it and "
            "applies once the GPU is back (a rescan or a reboot); every other GPU follows the layout")


# ---------------------------------------------------------------- types and capacity
def offered_types(gpu: Gpu) -> list[VgpuType]:
    """What the GPU offers; before its VFs are enabled the catalog says what they will offer."""
    if gpu.types:
        return gpu.types
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    if not board:
        return []
    fw = "vendor-vfio" if board.framework == "vendor-vfio" else "mdev"
    return [VgpuType(id=str(t.num) if fw == "vendor-vfio" else t.mdev_id(board.driver), name=t.name,
                     short_name=t.short_name, framework=fw, available_instances=t.max_instances,
                     max_instances=t.max_instances, framebuffer_mib=t.fb_mib, mig_backed=t.mig_backed,
                     gpu_instance_profile=t.gpu_instance_profile, inferred=list(t.inferred),
                     max_per_instance=t.max_per_instance)
            for t in board.types]


def resolve_type(types: list[VgpuType], ref: str) -> VgpuType | None:
    low = ref.lower()
    return next((t for t in types if ref == t.id or low in (t.name.lower(), t.short_name.lower())), None)


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.address}, {gpu.model})"


def size_mode(gpu: Gpu, entry: GpuLayout) -> bool:
    """Mixed-size mode for a layout entry: what the GPU shows wins; one that cannot tell yet
    (no vGPUs) is taken at the entry's word (``mixedSize``)."""
    return gpu.mixed_size if gpu.mixed_size is not None else entry.mixed_size


def _mixed_hint(entry: GpuLayout) -> str:
    if entry.field_name("mixed_size"):
        return "add mixedSize: true: vgpuctl then switches the GPU to mixed-size mode and places each vGPU"
    return ("vgpu-device-manager's format cannot declare mixed-size mode; for a GPU switched to it, "
            "write this entry as a vgpuctl/v1 layout with mixedSize: true")


class _UnknownType(str):
    """A layout entry's type that a GPU does not offer: one problem per GPU, merged per field by
    :func:`_once_per_field` (an entry selecting 7 GPUs says it once)."""

    field: str
    ref: str
    gpu: Gpu
    offers: str

    def __new__(cls, text: str, *, field: str, ref: str, gpu: Gpu, offers: str) -> _UnknownType:
        self = super().__new__(cls, text)
        self.field, self.ref, self.gpu, self.offers = field, ref, gpu, offers
        return self


def _once_per_field(problems: list[str], selects: dict[str, int] | None = None) -> list[str]:
    """An unknown type selected on several GPUs, in one line: the GPUs grouped by what they offer.
    ``selects``: how many GPUs each entry (its ``vgpus`` field) selects, to say how many of them lack it."""
    groups: dict[tuple[str, str], list[_UnknownType]] = {}
    for p in problems:
        if isinstance(p, _UnknownType):
            groups.setdefault((p.field, p.ref), []).append(p)
    out: list[str] = []
    for p in problems:
        if not isinstance(p, _UnknownType):
            out.append(p)
            continue
        group = groups.pop((p.field, p.ref), None)
        if group is None:
            continue  # said with its group
        if len(group) == 1:
            out.append(str(p))
            continue
        by_offer: dict[str, list[Gpu]] = {}
        for q in group:
            by_offer.setdefault(q.offers, []).append(q.gpu)
        parts = [f"GPU {', '.join(str(g.index) for g in gpus)} ({', '.join(dict.fromkeys(g.model for g in gpus))}) "
                 f"offer{'s' if len(gpus) == 1 else ''} {offers}" for offers, gpus in by_offer.items()]
        total = (selects or {}).get(p.field[:-len(p.ref) - 1], len(group))
        lack = (f"none of the {len(group)} GPUs this entry selects offers" if total <= len(group) else
                f"{len(group)} of the {total} GPUs this entry selects offer no")
        out.append(f"{p.field}: {lack} vGPU type {p.ref!r}" + (f" (the other {total - len(group)} do)"
                                                                if total > len(group) else "") + ": " + "; ".join(parts))
    return out


def validate_layout(gpu: Gpu, entry: GpuLayout, i: int) -> dict[str, int]:
    """Type id -> count for a vgpu/dra entry, or a list of problems naming the field."""
    types = offered_types(gpu)
    problems: list[str] = []
    wanted: dict[str, tuple[VgpuType, int]] = {}
    for ref, count in entry.vgpus.items():
        t = resolve_type(types, ref)
        field = f"{entry.at(i, 'vgpus')}.{ref}"
        if t is None:
            usable = [t.short_name for t in types if not t.mig_backed or gpu.mig is not None]
            names = ", ".join(usable) or "none (not a vGPU-capable GPU)"
            close = did_you_mean_type(ref, usable)
            problems.append(_UnknownType(f"{field}: {_label(gpu)} offers no vGPU type {ref!r}; it offers {names}{close}",
                                         field=field, ref=str(ref), gpu=gpu, offers=f"{names}{close}"))
            continue
        if t.mig_backed and entry.mode == "dra" and not entry.mig_mode:
            problems.append(f"{field}: {t.name} is MIG-backed; a dra GPU offers MIG-backed types in MIG mode "
                            "only: add migMode: true (or auto) to this entry")
            continue
        if not t.mig_backed and entry.mode == "dra" and entry.mig_mode is True:
            problems.append(f"{field}: {t.name} is time-sliced; a GPU in MIG mode (migMode: true) offers "
                            "MIG-backed types only")
            continue
        if t.id in wanted:
            problems.append(f"{field}: names the same type as another key ({t.name}); list each type once")
            continue
        if t.max_instances is not None and count > t.max_instances:
            problems.append(f"{field}: {count} is more than the {t.max_instances} {t.short_name} vGPUs {_label(gpu)} holds")
            continue
        wanted[t.id] = (t, count)
    active = [(t, n) for t, n in wanted.values() if n > 0]
    if any(t.mig_backed for t, _ in active):  # GPU instances, not shares: placements decide what fits
        if entry.mode == "vgpu":  # a dra entry's keys name what is offered; claims take the placements
            problems += check_mig_layout(gpu, active, entry.at(i, "vgpus"), _label(gpu))
        if entry.mixed_size:
            problems.append(f"{entry.at(i, 'mixed_size')}: mixed-size mode places time-sliced vGPUs; this entry "
                            "holds MIG-backed ones (GPU instances are placed by MIG)")
        active = []
    if entry.mixed_size and entry.mig_mode is True:
        problems.append(f"{entry.at(i, 'mixed_size')}: a GPU in MIG mode (migMode: true) has no mixed-size mode")
    sizes = sorted({t.framebuffer_mib for t, _ in active if t.framebuffer_mib})
    placed = (entry.mixed_size or gpu.mixed_size is True) and gpu.vendor_id == NVIDIA
    smap = slot_map(gpu, types) if placed else None
    if entry.mixed_size and gpu.vendor_id == NVIDIA and smap is None:
        problems.append(f"{entry.at(i, 'mixed_size')}: {refused(gpu, _label(gpu))}")
    elif len(sizes) > 1 and not entry.mixed_size and gpu.vendor_id == NVIDIA:
        detail = ", ".join(f"{t.short_name} ({t.framebuffer_mib} MiB)" for t, _ in active)
        mode = ("runs in mixed-size mode, but a reboot clears that: a layout mixing sizes declares it" if gpu.mixed_size
                else "is in equal-size mode and holds one framebuffer size")
        problems.append(f"{entry.at(i, 'vgpus')}: {_label(gpu)} {mode}; this layout mixes {detail} ({_mixed_hint(entry)})")
    elif smap is not None:
        if entry.mode == "vgpu":
            problems += check_mixed_layout(smap, active, entry.at(i, "vgpus"), _label(gpu))
    elif entry.mode == "vgpu" and occupancy(active) > 1:
        detail = " + ".join(f"{n} x {t.short_name} (max {t.max_instances})" for t, n in active)
        problems.append(f"{entry.at(i, 'vgpus')}: {detail} is more than {_label(gpu)} holds")
    total = sum(n for _, n in wanted.values() if n > 0)
    vf_bound = gpu.sriov_total_vfs if gpu.framework != "mdev" else 0
    if entry.mode == "vgpu" and vf_bound and total > vf_bound:
        problems.append(f"{entry.at(i, 'vgpus')}: {total} vGPUs need {total} VFs; {_label(gpu)} has {vf_bound}")
    if problems:
        raise ConfigError(problems)
    return {tid: n for tid, (t, n) in wanted.items()}


# ---------------------------------------------------------------- the plan
def native_driver(gpu: Gpu) -> str | None:
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    if board:
        return board.driver
    return {"0x10de": "nvidia", "0x8086": "i915"}.get(gpu.vendor_id)


def make_plan(
    inv: Inventory,
    layouts: list[GpuLayout],
    usage: Usage | None = None,
    definitions: Sequence[MdevDefinition] = (),
    vendor_records: dict[str, str] | None = None,
    new_uuid: Callable[[], str] = lambda: str(uuidlib.uuid4()),
    passthrough: dict[str, str] | None = None,
    mig_records: dict[str, list[dict]] | None = None,
    placement_records: dict[str, dict] | None = None,
) -> Plan:
    """The ordered steps that take the node to ``layouts``. Raises ConfigError before any step on bad input."""
    usage = usage or Usage()
    # every problem at once: the selectors', then those of each entry that did select its GPUs
    chosen, problems, waiting = _select(inv, layouts)
    wanted: dict[str, dict[str, int]] = {}
    gpus: dict[str, Gpu] = {}
    selects: dict[str, int] = {}  # an entry's vgpus field -> how many GPUs it selects
    for i, entry in enumerate(layouts):
        selects[entry.at(i, "vgpus")] = sum(1 for e in chosen.values() if e is entry)
        for addr, e in chosen.items():
            if e is not entry:
                continue
            gpu = inv.gpu(addr)
            assert gpu is not None  # chosen from inv.gpus
            gpus[addr] = gpu
            try:
                if e.mig_mode is not None and e.mode != "dra":
                    problems.append(f"{e.at(i, 'mig_mode')}: only dra mode takes migMode; in vgpu mode the "
                                    "MIG-backed types in vgpus put the GPU in MIG mode")
                if e.mode in ("vgpu", "dra"):
                    wanted[addr] = validate_layout(gpu, e, i)
                problems += _workload_conflicts(gpu, e, usage, i)
            except ConfigError as exc:
                problems += exc.problems
    if problems:
        raise layout_error(_once_per_field(problems, selects), layouts)  # named as the file writes them
    plan = Plan(waiting=waiting)
    for addr, entry in chosen.items():
        gpu = gpus[addr]
        mixed_record = (placement_records or {}).get(addr)
        if passthrough is not None:
            _plan_passthrough_record(plan, gpu, entry.mode, passthrough)
        if mixed_record and not (entry.mixed_size and entry.mode in ("vgpu", "dra")):
            plan.actions.append(SavePlacementRecord(gpu=addr, mixed=False))  # restore no longer sets the mode
        if entry.mode == "passthrough":
            _plan_passthrough(plan, gpu, usage, definitions, vendor_records or {})
        elif entry.mode in ("vgpu", "dra"):
            if _prepare_for_vgpu(plan, gpu, usage):
                plan.notes += preview(gpu, entry, offered_types(gpu), wanted.get(addr, {}))
                continue
            if entry.mode == "dra":  # the DRA bridge creates vGPUs per claim
                if isinstance(entry.mig_mode, bool) and gpu.mig is not None and gpu.mig.enabled != entry.mig_mode:
                    switch_mig_mode(plan, gpu, usage, definitions, vendor_records or {}, entry.mig_mode)
                    continue
                if entry.mixed_size and not gpu.mixed_size:
                    switch_mixed(plan, gpu, usage, definitions, vendor_records or {}, mixed_record)
                    plan.notes += preview(gpu, entry, offered_types(gpu), wanted.get(addr, {}))
                    continue
                _plan_dra(plan, gpu, usage, definitions, vendor_records or {})
                forget_layout_instances(plan, gpu, (mig_records or {}).get(addr))
                if entry.mixed_size and (not mixed_record or not mixed_record.get("mixed") or mixed_record.get("vgpus")):
                    plan.actions.append(SavePlacementRecord(gpu=addr, mixed=True))  # claims' vGPUs are the plugin's
                continue
            if gpu.mig is not None and plan_mig(plan, gpu, wanted[addr], usage, definitions, vendor_records or {},
                                                (mig_records or {}).get(addr), new_uuid):
                continue
            if entry.mixed_size and not gpu.mixed_size:
                switch_mixed(plan, gpu, usage, definitions, vendor_records or {}, mixed_record)
                plan.notes += preview(gpu, entry, offered_types(gpu), wanted[addr])
                continue
            if gpu.mixed_size and gpu.placements is not None and gpu.framework != "none":
                plan_placed(plan, gpu, wanted[addr], usage, definitions, vendor_records or {}, mixed_record,
                            record=entry.mixed_size, new_uuid=new_uuid)
            elif gpu.framework in ("mdev", "mdev-sriov"):
                _plan_mdev(plan, gpu, wanted[addr], usage, definitions, new_uuid)
            elif gpu.framework == "vendor-vfio":
                _plan_vendor(plan, gpu, wanted[addr], usage, vendor_records or {})
            elif any(wanted[addr].values()):
                plan.notes.append(f"{_label(gpu)}: offers no vGPU types with driver {gpu.driver}; nothing to create")
    return plan


def group_users(gpu: Gpu, usage: Usage) -> list[str]:
    return usage.pci_users(gpu.address, gpu.iommu_group)


def _workload_conflicts(gpu: Gpu, entry: GpuLayout, usage: Usage, i: int) -> list[str]:
    """A GPU held by a workload in another form cannot change form under it."""
    out = []
    where = entry.at(i, "mode")
    # A GPU a workload holds in another form (passed through, or vGPUs in use) is not a layout
    # error: the layout is reached once the workload lets go (a "converging" node, blocked_by_use).
    # A foreign driver is one: vgpuctl never unbinds a driver it does not manage.
    if entry.mode in ("vgpu", "dra"):
        native = native_driver(gpu)
        if gpu.driver not in (None, "vfio-pci", native):
            out.append(f"{where}: {_label(gpu)} is bound to {gpu.driver}, not {native}; "
                       "unbind it or mark the GPU unmanaged")
    return out


def _prepare_for_vgpu(plan: Plan, gpu: Gpu, usage: Usage) -> bool:
    """Native driver and VFs first; True when the GPU needs another discovery before vGPUs."""
    native = native_driver(gpu)
    if gpu.driver == "vfio-pci" and group_users(gpu, usage):
        plan.skipped.append(Skip(device=gpu.address, reason=(
            f"passed through ({'; '.join(group_users(gpu, usage))}); returned to {native} when released")))
        return True
    if gpu.driver in (None, "vfio-pci") and native:
        drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
        for addr, driver in sorted(drivers.items()):
            if driver in (None, "vfio-pci"):
                plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver=None))
        return True
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    for addr, override in sorted(gpu.iommu_group_overrides.items()):
        if override == "vfio-pci" and drivers.get(addr) not in (None, "vfio-pci"):
            # left by an apply that stopped between driver_override and unbind: clear it, or the
            # function would go to vfio-pci at its next probe (a reboot, a driver reload)
            plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver=None))
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    needs_vfs = gpu.sriov_total_vfs > 0 and (gpu.framework == "none" or (board and board.framework != "mdev"))
    if needs_vfs and gpu.sriov_num_vfs == 0 and gpu.vendor_id == NVIDIA:
        plan.actions.append(EnableVfs(gpu=gpu.address, count=gpu.sriov_total_vfs))
        return True
    return False


def _plan_dra(plan: Plan, gpu: Gpu, usage: Usage, definitions: Sequence[MdevDefinition],
              records: dict[str, str]) -> None:
    """A ``dra`` GPU's vGPUs are its claims': what an earlier layout saved on it goes, so the
    layout and a claim never name one device (a dormant record would take a claim's VF back at the
    next restore) and no vGPU outside the DRA accounting takes the GPU's capacity. Unused saved
    vGPUs are removed with their definitions or records, dormant ones forgotten; one in use stays
    (blocked) until released; a claim's is never touched."""
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    defs = {d.uuid: d for d in definitions if d.parent in parents}
    recs = {vf: t for vf, t in records.items() if vf in parents}
    present = {v.id for v in gpu.vgpus}
    for v in gpu.vgpus:
        if v.id not in (defs if v.framework == "mdev" else recs):
            continue  # not the layout's: a claim's, or nobody's to touch
        if usage.claims_of(v.id):  # the claim's device: only the layout's record of it goes
            plan.actions.append(forget_step(gpu, v))
        elif users := vgpu_users(v, usage):
            plan.skipped.append(Skip(device=v.id, reason=f"not removed: in use ({'; '.join(users)})"))
        else:
            plan.actions += [clear_step(gpu, v), forget_step(gpu, v)]
    for d in defs.values():
        if d.uuid not in present and not kept_for_its_domain(plan, gpu, d.uuid, usage, mdev=True):
            plan.actions.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    for vf in sorted(recs):
        if vf not in present and not kept_for_its_domain(plan, gpu, vf, usage, mdev=False):
            plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))


def _plan_passthrough_record(plan: Plan, gpu: Gpu, mode: str, saved: dict[str, str]) -> None:
    """What ``restore`` rebinds after a reboot: a passthrough GPU's functions already on vfio-pci
    (a bind step records the others itself), and nothing of a GPU the layout hands back (unmanaged;
    other modes rebind it to its native driver, which forgets it)."""
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    if mode == "passthrough":
        for fn, driver in sorted(drivers.items()):
            if driver == "vfio-pci" and saved.get(fn) != gpu.address:
                plan.actions.append(SavePassthrough(gpu=gpu.address, address=fn, keep=True))
    elif mode == "unmanaged":
        for fn in sorted(f for f, g in saved.items() if g == gpu.address):
            plan.actions.append(SavePassthrough(gpu=gpu.address, address=fn, keep=False))


def _plan_passthrough(plan: Plan, gpu: Gpu, usage: Usage, definitions: Sequence[MdevDefinition],
                      records: dict[str, str]) -> None:
    parents = {gpu.address, *(vf.address for vf in gpu.vfs)}
    if gpu.sriov_total_vfs and not gpu.vfs:
        # VFs gone (a reboot): their saved vGPUs sit on the PF's bus, as restore assumes; forget
        # them too, or restore would enable VFs on the passed-through GPU and re-create them
        bus = gpu.address.rsplit(":", 1)[0]
        parents |= {p for p in [d.parent for d in definitions] + list(records) if p.rsplit(":", 1)[0] == bus}
    busy = [v for v in gpu.vgpus if vgpu_users(v, usage)]
    # a saved vGPU without a device that a domain names is the domain's: kept saved, and the GPU not
    # rebound under it (the domain could never start again)
    named = named_dormant(gpu, parents, definitions, records, usage)
    if busy or named:  # nothing changes under a workload: the GPU is passed through once they are released
        for v in busy:
            plan.skipped.append(Skip(device=v.id, reason=f"in use ({'; '.join(vgpu_users(v, usage))})"))
        for key, (_, users) in named.items():
            plan.skipped.append(Skip(device=key, gpu=gpu.address, held_by=users, reason=(
                f"passing GPU {gpu.address} through: the layout wants the whole GPU; this saved vGPU stays saved, "
                "not forgotten")))
        held = [f"{len(busy)} vGPU(s) in use"] * bool(busy) + [f"{len(named)} saved vGPU(s) a domain names"] * bool(named)
        plan.skipped.append(Skip(device=gpu.address, reason=f"passed through once its {' and '.join(held)} are released"))
        return
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    if any(d != "vfio-pci" for d in drivers.values()) and (users := group_users(gpu, usage)):
        # a VF or a companion function of its group is held (vfio: one owner per group): the
        # kernel would refuse the VF disable or the unbind, so nothing is tried under it
        plan.skipped.append(Skip(device=gpu.address, reason=f"passed through once released ({'; '.join(users)})"))
        return
    plan.actions += [clear_step(gpu, v) for v in gpu.vgpus]
    for d in definitions:
        if d.parent in parents:
            plan.actions.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    for vf in sorted(set(records) & parents):
        plan.actions.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
    if gpu.sriov_num_vfs:
        plan.actions.append(DisableVfs(gpu=gpu.address))
    drivers = gpu.iommu_group_drivers or {gpu.address: gpu.driver}
    for addr, driver in sorted(drivers.items()):
        if driver != "vfio-pci":
            plan.actions.append(BindDriver(gpu=gpu.address, address=addr, driver="vfio-pci"))


def _sizes(sizes: Iterable[int | None]) -> str:
    """``2048 MiB, 4096 MiB``; a type whose framebuffer the driver does not tell is said last."""
    return ", ".join(f"{s} MiB" if s is not None else "unknown" for s in sorted(sizes, key=lambda s: (s is None, s or 0)))


class _Room:
    """What a GPU still holds while a plan adds vGPUs to the ones it keeps (both frameworks)."""

    def __init__(self, gpu: Gpu, types: dict[str, VgpuType], kept: list[Vgpu]):
        self.gpu = gpu
        self.types = types
        self.equal_size = not gpu.mixed_size and gpu.vendor_id == NVIDIA
        held = held_types(types.values(), kept)
        self.used = occupancy((t, 1) for t in held)
        self.sizes = {t.framebuffer_mib for t in held}

    def size_allows(self, plan: Plan, t: VgpuType, need: int) -> bool:
        other = self.sizes - {t.framebuffer_mib}
        if self.equal_size and other:
            plan.skipped.append(Skip(device=self.gpu.address, reason=(
                f"{need} x {t.short_name} not created: the GPU keeps vGPUs of another framebuffer size "
                f"({_sizes(other)}) and is in equal-size mode")))
            return False
        return True

    def to_create(self, plan: Plan, wanted: dict[str, int], have: list[str]) -> Iterable[tuple[VgpuType, int]]:
        """(type, how many more) per wanted type (``have``: the type ids kept), in type order; sizes the
        GPU cannot mix are skipped."""
        for tid, want in sorted(wanted.items()):
            t = self.types.get(tid)
            need = want - have.count(tid)
            if need > 0 and t is not None and self.size_allows(plan, t, need):
                yield t, need

    def fits(self, plan: Plan, t: VgpuType) -> bool:
        if t.max_instances and self.used + occupancy([(t, 1)]) > 1:
            plan.skipped.append(Skip(device=self.gpu.address, reason=f"{t.short_name} not created: the GPU is full"))
            return False
        return True

    def add(self, t: VgpuType) -> None:
        self.used += occupancy([(t, 1)])
        self.sizes.add(t.framebuffer_mib)

    def revive(self, plan: Plan, key: str, type_id: str, parent: str, free: list[str], users: list[str],
               wanted: dict[str, int], have: list[str]) -> bool:
        """Room for a saved vGPU without a device that ``users`` name, as it was saved (type, parent):
        True when it is re-created (counted in ``have``). Otherwise, or when the layout has no room
        for it, a Skip naming them: its record stays and the node is blocked on it
        (:func:`mdev_manager.blocked.blocked_by_use`), never told it matches."""
        t = self.types.get(type_id)
        other = self.sizes - {t.framebuffer_mib} if t else set()
        if t is None:
            why = f"{parent} offers no vGPU type {type_id} now"
        elif parent not in free:
            why = f"{parent} holds another vGPU"
        elif self.equal_size and other:
            why = f"the GPU keeps vGPUs of another framebuffer size ({_sizes(other)}) and is in equal-size mode"
        elif t.max_instances and self.used + occupancy([(t, 1)]) > 1:
            why = "the GPU is full"
        else:
            self.add(t)
            have.append(type_id)
            if have.count(type_id) > wanted.get(type_id, 0):
                plan.skipped.append(Skip(device=key, gpu=self.gpu.address, held_by=users, reason=(
                    f"its removal: the layout has no room for this {t.short_name}, re-created as saved")))
            return True
        plan.skipped.append(Skip(device=key, gpu=self.gpu.address, held_by=users, reason=(
            f"re-creating it as saved ({why}): its saved record is kept, not forgotten")))
        return False


def _plan_mdev(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage,
               definitions: Iterable[MdevDefinition], new_uuid: Callable[[], str]) -> None:
    types = {t.id: t for t in gpu.types}
    parents = [p.address for p in gpu.parents]
    defs = {d.uuid: d for d in definitions if d.parent in parents}
    removals: list[Action] = []
    saves: list[Action] = []
    creates: list[Action] = []
    keep, busy, drop = split_existing(plan, [v for v in gpu.vgpus if v.framework == "mdev"], wanted, usage,
                                       set(defs), "removed")
    kept = keep + busy
    for v in busy:
        if v.id in defs and usage.claims_of(v.id):  # a claim's device is not the layout's to save
            removals.append(forget_step(gpu, v))
    for v in keep:
        if v.id not in defs:
            saves.append(SaveDefinition(gpu=gpu.address, parent=v.parent, uuid=v.id, type_id=v.type_id))
    for v in drop:
        removals += [clear_step(gpu, v), forget_step(gpu, v)] if v.id in defs else [clear_step(gpu, v)]
    active = {v.id for v in gpu.vgpus}
    removed = {a.uuid for a in removals if isinstance(a, RemoveMdev)}
    busy_parents = {v.parent for v in gpu.vgpus if v.id not in removed}
    per_vf = gpu.framework == "mdev-sriov"
    free = [p for p in parents if not per_vf or p not in busy_parents]
    dormant = [d for d in defs.values() if d.uuid not in active]
    room = _Room(gpu, types, kept)
    have = [v.type_id for v in keep]
    for d in [d for d in dormant if dormant_users(d.uuid, usage, mdev=True)]:
        dormant.remove(d)  # a domain's: re-created as saved, or kept saved; never forgotten or re-used
        if room.revive(plan, d.uuid, d.mdev_type, d.parent, free, dormant_users(d.uuid, usage, mdev=True),
                       wanted, have):
            creates.append(CreateMdev(gpu=gpu.address, parent=d.parent, uuid=d.uuid, type_id=d.mdev_type))
        if per_vf and d.parent in free:
            free.remove(d.parent)
    for t, need in room.to_create(plan, wanted, have):
        tid = t.id
        for _ in range(need):
            if not room.fits(plan, t):
                break
            reuse = next((d for d in dormant if d.mdev_type == tid and d.parent in free), None)
            if reuse:
                dormant.remove(reuse)
                parent, uid = reuse.parent, reuse.uuid
            else:
                if not free:
                    plan.skipped.append(Skip(device=gpu.address, reason=f"{t.short_name} not created: no free VF left"))
                    break
                parent, uid = free[0], new_uuid()
                saves.append(SaveDefinition(gpu=gpu.address, parent=parent, uuid=uid, type_id=tid))
            if per_vf:
                free.remove(parent)
            creates.append(CreateMdev(gpu=gpu.address, parent=parent, uuid=uid, type_id=tid))
            room.add(t)
    for d in dormant:
        removals.append(RemoveDefinition(gpu=gpu.address, parent=d.parent, uuid=d.uuid))
    plan.actions += removals + saves + creates


def _plan_vendor(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage, records: dict[str, str]) -> None:
    types = {t.id: t for t in gpu.types}
    vfs = [vf.address for vf in gpu.vfs]
    mine = {vf: tid for vf, tid in records.items() if vf in vfs}
    removals: list[Action] = []
    saves: list[Action] = []
    creates: list[Action] = []
    # a VF a DRA claim holds (or will make its vGPU on again, after a reboot) is the claim's: a
    # layout record naming it is forgotten and the VF is not the layout's to fill
    claimed_vfs = {vf for vf in vfs if usage.claims_of(vf)}
    for vf in sorted(claimed_vfs & set(mine)):
        removals.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
        del mine[vf]
    keep, busy, drop = split_existing(plan, gpu.vgpus, wanted, usage, set(mine), "cleared")
    kept = keep + busy
    for v in keep:
        if mine.get(v.id) != v.type_id:
            saves.append(SaveVendorRecord(gpu=gpu.address, vf=v.id, type_id=v.type_id))
    for v in drop:
        removals += [clear_step(gpu, v), forget_step(gpu, v)] if v.id in mine else [clear_step(gpu, v)]
    holding = {v.id for v in kept} | claimed_vfs
    free = [vf for vf in vfs if vf not in holding]
    dormant = {vf: tid for vf, tid in mine.items() if vf not in {v.id for v in gpu.vgpus}}
    room = _Room(gpu, types, kept)
    have = [v.type_id for v in keep]
    for vf, tid in sorted(dormant.items()):
        if users := dormant_users(vf, usage, mdev=False):
            del dormant[vf]  # a domain's: its type set again as saved, or kept saved; never another type
            if room.revive(plan, vf, tid, vf, free, users, wanted, have):
                creates.append(SetVgpuType(gpu=gpu.address, vf=vf, type_id=tid))
            if vf in free:
                free.remove(vf)
    for t, need in room.to_create(plan, wanted, have):
        tid = t.id
        for _ in range(need):
            if not room.fits(plan, t):
                break
            target = next((v for v, rt in dormant.items() if rt == tid and v in free), None) or (free[0] if free else None)
            if target is None:
                plan.skipped.append(Skip(device=gpu.address, reason=f"{t.short_name} not created: no free VF left"))
                break
            free.remove(target)
            if dormant.pop(target, None) != tid:
                saves.append(SaveVendorRecord(gpu=gpu.address, vf=target, type_id=tid))
            creates.append(SetVgpuType(gpu=gpu.address, vf=target, type_id=tid))
            room.add(t)
    for vf in dormant:
        removals.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
    plan.actions += removals + saves + creates
