"""Bring back what a layout set up, after a reboot or crash, without the layout (``vgpuctl restore``).

The order is the layout's: first the structural steps (functions a layout passed through go
back to vfio-pci, SR-IOV VFs are enabled), then, discovered again, the vGPUs. mdevctl-format
definitions with ``start: auto`` and saved vendor-VFIO records are re-created where their
device is missing. A parent that is a VF of a PF whose VFs are not enabled (they vanish on
reboot) gets its PF's VFs enabled first: the VF is taken to sit on its PF's bus, as NVIDIA's
boards place them (offset 4, stride 1).

Passthrough bindings come from the executor's record (``persist.load_passthrough``). A GPU
that also has saved vGPUs is not rebound: a layout passing a GPU through forgets its vGPUs
first (and their GPU instances' record), so saved vGPUs there are the newer decision. A GPU holding vGPUs or VFs, or a function
something uses, is never rebound; the next apply settles it.

A device a prepared DRA claim holds (``usage``: the kubelet plugin's checkpoint) is the
claim's: restore leaves its id and its VF to the kubelet plugin, which re-creates it.

Mixed-size mode is lost at reboot: a GPU the placement record (``persist.load_placements``) says
a layout ran in it is switched again once its VFs are enabled and before any vGPU, and its
recorded vGPUs (mdev definitions there say ``start: manual``) are re-created first, each created
and moved to its recorded placement before the next; a GPU that cannot be switched (it holds
vGPUs already) gets none of them. vGPUs already present are never moved.
"""

from __future__ import annotations

from collections.abc import Callable

from mdev_manager import persist
from mdev_manager.actions import (
    Action,
    BindDriver,
    CreateGpuInstance,
    CreateMdev,
    EnableVfs,
    Plan,
    SetMigMode,
    SetMixedSize,
    SetPlacement,
    SetVgpuType,
)
from mdev_manager.discovery import discover
from mdev_manager.executor import Executor, Report
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Gpu, Inventory, MdevDefinition, Usage
from mdev_manager.usage import collect_usage


def _bus(addr: str) -> str:
    return addr.rsplit(":", 1)[0]


def plan_restore(inv: Inventory, defs: list[MdevDefinition], records: dict[str, str],
                 usage: Usage | None = None, passthrough: dict[str, str] | None = None,
                 holders: Usage | None = None, mig: dict[str, list[dict]] | None = None,
                 placements: dict[str, dict] | None = None) -> Plan:
    """The steps that bring back saved state; structural steps alone when any are needed.

    ``passthrough`` maps a passed-through function to its GPU; ``holders`` (default ``usage``)
    says who holds what, for the rebinding (processes and claims, see :func:`restore`).
    """
    plan = Plan()
    usage = usage or Usage()
    placements = placements or {}
    recorded = {v for e in placements.values() for v in e.get("vgpus", {})}
    saved = {d.parent for d in defs if d.start == "auto" or d.uuid in recorded} | set(records)
    defs, records = _not_claimed(plan, defs, records, usage)
    passed = _plan_bindings(plan, inv, passthrough or {}, saved, holders or usage)
    present = {p.address for g in inv.gpus for p in g.parents} | {vf.address for g in inv.gpus for vf in g.vfs}
    active = {v.id for v in inv.all_vgpus()}
    vendor_active = {v.id: v.type_id for v in inv.all_vgpus() if v.framework == "vendor-vfio"}
    missing_parents = {d.parent for d in defs if (d.start == "auto" or d.uuid in recorded) and d.parent not in present}
    missing_parents |= {vf for vf in records if vf not in present}
    for g in inv.gpus:
        if (g.sriov_total_vfs and not g.sriov_num_vfs and g.driver not in (None, "vfio-pci")  # not a passed-through GPU
                and g.address not in passed
                and any(_bus(p) == _bus(g.address) for p in missing_parents)):
            plan.actions.append(EnableVfs(gpu=g.address, count=g.sriov_total_vfs))
    if plan.actions:
        return plan
    instance_of = _plan_instances(plan, inv, mig or {})
    if plan.actions:
        return plan
    ready = _plan_mixed_modes(plan, inv, placements)
    if plan.actions:
        return plan
    gpu_of = {p.address: g.address for g in inv.gpus for p in g.parents}
    gpu_of |= {vf.address: g.address for g in inv.gpus for vf in g.vfs}
    # recorded placements first: a vGPU placed by first fit could take their slots
    first: list[list[Action]] = []
    then: list[list[Action]] = []
    for d in defs:
        if d.uuid not in active and d.parent in present and (d.start == "auto" or d.uuid in recorded):
            steps = _placed(inv.gpu(gpu_of[d.parent]), d.uuid, d.parent, d.mdev_type, placements, ready, plan)
            if steps is not None:
                create: Action = CreateMdev(gpu=gpu_of[d.parent], parent=d.parent, uuid=d.uuid, type_id=d.mdev_type)
                (first if steps else then).append([create, *steps])
    for vf, tid in sorted(records.items()):
        if vf in present and vendor_active.get(vf) is None:
            steps = _placed(inv.gpu(gpu_of[vf]), vf, vf, tid, placements, ready, plan)
            if steps is not None:
                create = SetVgpuType(gpu=gpu_of[vf], vf=vf, type_id=tid, gpu_instance=instance_of.get(vf))
                (first if steps else then).append([create, *steps])
    plan.actions += [a for group in first + then for a in group]
    _note_absent(plan, [d.parent for d in defs if d.start == "auto" or d.uuid in recorded] + list(records), present)
    return plan


def _note_absent(plan: Plan, parents: list[str], present: set[str]) -> None:
    """One note per bus whose saved vGPUs have no parent here (a GPU off the bus, or its VFs gone)."""
    by_bus: dict[str, list[str]] = {}
    for p in parents:
        if p not in present:
            by_bus.setdefault(_bus(p), []).append(p)
    for bus, gone in sorted(by_bus.items()):
        shown = ", ".join(sorted(set(gone))[:3]) + (" ..." if len(set(gone)) > 3 else "")
        plan.notes.append(f"{len(gone)} saved vGPU{'s' if len(gone) != 1 else ''} on bus {bus} not restored: "
                          f"their parent device is not on this node ({shown}); restore again once the GPU is back")


def _plan_mixed_modes(plan: Plan, inv: Inventory, placements: dict[str, dict]) -> set[str]:
    """Switch the recorded GPUs to mixed-size mode again (only an empty one switches); returns the
    GPUs in the mode, where recorded vGPUs may be re-created."""
    ready = set()
    for addr, entry in sorted(placements.items()):
        g = inv.gpu(addr)
        if not entry.get("mixed"):
            continue
        if g is None or g.placements is None:
            plan.notes.append(f"GPU {addr}: recorded in mixed-size mode, but "
                              + ("it is not on this node" if g is None else "NVML reports no mixed-size mode for it"))
        elif g.placements.enabled:
            ready.add(addr)
        elif g.vgpus:
            plan.notes.append(f"GPU {addr}: not switched to mixed-size mode again, it holds {len(g.vgpus)} vGPU(s); "
                              "its recorded vGPUs are not re-created")
        else:
            plan.actions.append(SetMixedSize(gpu=addr, enabled=True))
    return ready


def _placed(g: Gpu | None, vgpu: str, parent: str, type_id: str, placements: dict[str, dict], ready: set[str],
            plan: Plan) -> list[SetPlacement] | None:
    """The step that moves a re-created vGPU to its recorded placement ([] when none is recorded);
    None when it must not be re-created now (its GPU is not back in mixed-size mode)."""
    entry = placements.get(g.address) if g is not None else None
    if g is None or entry is None or vgpu not in entry.get("vgpus", {}):
        return []
    if g.address not in ready:
        return None
    tp = g.placements.types.get(type_id) if g.placements else None
    if tp is None:
        plan.notes.append(f"vGPU {vgpu}: type {type_id} has no mixed-size placement on GPU {g.address}; not re-created")
        return None
    return [SetPlacement(gpu=g.address, vgpu=vgpu, parent=parent, type_id=type_id,
                         placement=entry["vgpus"][vgpu], size=tp.size)]


def _plan_instances(plan: Plan, inv: Inventory, saved: dict[str, list[dict]]) -> dict[str, int]:
    """GPU instances do not survive a reboot (MIG mode does, on the board): the saved ones are
    created again at their placements, before their vGPUs. Returns vGPU -> its instance's id
    once they all exist (what a vendor-VFIO VF names in ``gpu_instance_id``)."""
    instance_of: dict[str, int] = {}
    for addr, entries in sorted(saved.items()):
        g = inv.gpu(addr)
        if g is None or g.mig is None:
            plan.notes.append(f"GPU {addr}: {len(entries)} saved GPU instance(s), but "
                              + ("the GPU is not on this node" if g is None else "NVML reports no MIG for it"))
            continue
        if not g.mig.enabled:
            if g.vgpus:
                plan.notes.append(f"GPU {addr}: not put back in MIG mode, it holds {len(g.vgpus)} vGPU(s)")
            else:
                plan.actions.append(SetMigMode(gpu=addr, enabled=True))
            continue
        for e in entries:
            here = next((i for i in g.mig.instances if i.profile_id == e["profile"]
                         and i.placement.start == e["start"] and i.placement.size == e["size"]), None)
            if here is not None:
                for v in e.get("vgpus") or ([e["vgpu"]] if e.get("vgpu") else []):
                    instance_of[v] = here.id
                continue
            taken = [i for i in g.mig.instances if set(i.placement.slices) & set(range(e["start"], e["start"] + e["size"]))]
            if taken:
                plan.notes.append(f"GPU {addr}: GPU instance at slices {e['start']}+{e['size']} not re-created, "
                                  f"instance {taken[0].id} holds them")
                continue
            prof = g.mig.profile(e["profile"])
            plan.actions.append(CreateGpuInstance(gpu=addr, profile_id=e["profile"], profile=prof.name if prof else "?",
                                                  start=e["start"], size=e["size"]))
    return instance_of


def _has_saved_vgpus(g: Gpu, saved_parents: set[str]) -> bool:
    """A saved vGPU sits on the GPU, a present VF of it, or a vanished VF on its bus."""
    own = {g.address} | {p.address for p in g.parents} | {vf.address for vf in g.vfs}
    return any(p in own or (g.sriov_total_vfs and not g.vfs and _bus(p) == _bus(g.address))
               for p in saved_parents)


def _plan_bindings(plan: Plan, inv: Inventory, passthrough: dict[str, str], saved_parents: set[str],
                   holders: Usage) -> set[str]:
    """Bind the saved passthrough functions back to vfio-pci; returns the GPUs that stay passed through."""
    by_gpu: dict[str, list[str]] = {}
    for fn, gpu in sorted(passthrough.items()):
        by_gpu.setdefault(gpu, []).append(fn)
    passed: set[str] = set()
    for addr, functions in sorted(by_gpu.items()):
        g = inv.gpu(addr)
        if g is None:
            plan.notes.append(f"passthrough GPU {addr}: not on this node")
            continue
        if _has_saved_vgpus(g, saved_parents):
            plan.notes.append(f"passthrough GPU {addr}: not rebound, it has saved vGPUs (a newer layout); "
                              "apply the layout to settle it")
            continue
        passed.add(addr)
        drivers = g.iommu_group_drivers or {g.address: g.driver}
        todo = [fn for fn in functions if fn in drivers and drivers[fn] != "vfio-pci"]
        for fn in functions:
            if fn not in drivers:
                plan.notes.append(f"passthrough function {fn}: no longer in GPU {addr}'s IOMMU group; not rebound")
        if not todo:
            continue
        why = _why_not_rebind(g, todo, holders)
        if why:
            plan.notes.append(f"passthrough GPU {addr}: not rebound to vfio-pci, {why}")
            continue
        plan.actions += [BindDriver(gpu=addr, address=fn, driver="vfio-pci") for fn in todo]
    return passed


def _why_not_rebind(g: Gpu, functions: list[str], holders: Usage) -> str:
    """Why the GPU's functions cannot change driver now ('' when they can): a driver change
    destroys its vGPUs and VFs, and nothing in use ever changes under its user."""
    if g.vgpus:
        return f"it holds {len(g.vgpus)} vGPU(s)"
    if g.sriov_num_vfs:
        return f"it has {g.sriov_num_vfs} VFs enabled"
    users = [u for fn in functions for u in holders.pci_users(fn, g.iommu_group)]
    if users:
        return f"in use ({'; '.join(dict.fromkeys(users))})"
    return ""


def _not_claimed(plan: Plan, defs: list[MdevDefinition], records: dict[str, str],
                 usage: Usage) -> tuple[list[MdevDefinition], dict[str, str]]:
    """The definitions and records whose device (or VF) no prepared claim holds; the others noted."""
    kept_defs = []
    for d in defs:
        users = usage.mdev_users(d.uuid) + usage.pci_users(d.parent)
        if users:
            plan.notes.append(f"definition {d.uuid} on {d.parent} not restored: {'; '.join(users)}")
        else:
            kept_defs.append(d)
    kept_records = {}
    for vf, tid in records.items():
        users = usage.pci_users(vf)
        if users:
            plan.notes.append(f"VF {vf} (type {tid}) not restored: {'; '.join(users)}")
        else:
            kept_records[vf] = tid
    return kept_defs, kept_records


def restore(env: HostEnv, io: HostIO, usage: Usage | None = None,
            stop: Callable[[], str | None] | None = None,
            on_step: Callable[[object], None] | None = None) -> list[Report]:
    """Re-create what is saved and missing; ``usage`` (prepared DRA claims) names devices not to touch.

    Rebinding also checks the processes holding VFIO groups and cdevs, but not libvirt: a
    defined domain waiting for its passthrough GPU is why the GPU is rebound, and a running
    one holds the group (which the process scan sees).
    """
    reports = []
    for _ in range(4):
        plan = _plan(env, io, usage)
        if not plan.actions:
            break
        reports.append(Executor(env, io, on_step, stop=stop).run(plan))  # on_step: a progress bar
        if reports[-1].stopped:
            break
        if not plan.structural():
            break
    return reports


def _plan(env: HostEnv, io: HostIO, usage: Usage | None) -> Plan:
    """The restore plan for what the node holds now and what is saved."""
    defs, _problems = persist.load_definitions(env, io)
    passthrough = persist.load_passthrough(env, io)
    holders = collect_usage(env.with_(libvirt_uri=None), io, usage) if passthrough else usage
    return plan_restore(discover(env, io), defs, persist.load_vendor_vfio(env, io), usage,
                        passthrough, holders, persist.load_mig(env, io), persist.load_placements(env, io))


def unrestored(env: HostEnv, io: HostIO, usage: Usage | None = None) -> list[str]:
    """After :func:`restore`: what is saved but still not back, and why (one line each); empty when
    everything is. A device a prepared claim holds is not counted: it is the kubelet plugin's to
    re-create. ``vgpuctl restore`` says these and exits 3, as apply does while it converges."""
    plan = _plan(env, io, usage)
    defs, _problems = persist.load_definitions(env, io)
    claimed = Plan()
    _not_claimed(claimed, defs, persist.load_vendor_vfio(env, io), usage or Usage())
    return [n for n in plan.notes if n not in claimed.notes] + [f"not restored: {a.describe()}" for a in plan.actions]
