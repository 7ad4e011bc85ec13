"""Mixed-size vGPUs in a layout: the mode, and each vGPU at an exact placement. Pure.

NVIDIA's mixed-size ("heterogeneous") mode (../shared/reference/heterogeneous-vgpu.md): a GPU is
a row of 1 GiB slots; a vGPU holds ``[id, id + size)`` at one of its type's placement ids; the mode
switches only while the GPU holds no vGPU and is lost at reboot. The rules kept here, as in
:mod:`.plan` and :mod:`.migplan`:

* ``mixedSize: true`` switches an empty GPU to the mode (NVML); one holding vGPUs has them
  removed first, unless one is in use: then nothing changes until it is released;
* vGPUs the layout keeps stay where they are (in use or not: a layout asks for counts, not
  slots); new ones go where an exact search over the placements finds room beside them;
* a new vGPU is created (the driver takes the lowest creatable placement), then moved to its
  placement (``placement_id``), one at a time, so a temporary spot never collides with a target;
* the placements of the layout's vGPUs and the mode are recorded before any device changes
  (:class:`SavePlacementRecord`), so ``restore`` sets the mode again and re-creates them there;
  their mdev definitions say ``start: manual`` so mdevctl does not start them at boot first.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterable

from mdev_manager import catalog, catalog_placements
from mdev_manager.actions import (
    Action,
    CreateMdev,
    Plan,
    RemoveDefinition,
    SaveDefinition,
    SavePlacementRecord,
    SaveVendorRecord,
    SetMixedSize,
    SetPlacement,
    SetVgpuType,
    Skip,
)
from mdev_manager.config import GpuLayout
from mdev_manager.models import (  # noqa: F401  creatable, held: read from here too; in models, discovery loads no planner
    Gpu,
    MdevDefinition,
    TypePlacements,
    Usage,
    VgpuPlacements,
    VgpuType,
    creatable,
    held,
)
from mdev_manager.vgpusteps import clear_step, dormant_users, empty_gpu, forget_step, kept_for_its_domain, split_existing


def slot_map(gpu: Gpu, types: Iterable[VgpuType]) -> VgpuPlacements | None:
    """The GPU's placements: NVML's where it lists them; else (driver or VFs not ready yet) the
    catalog's table for the board; None when neither knows one: the board refuses the mode."""
    if gpu.placements is not None and gpu.placements.types:
        return gpu.placements
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    if board is None or catalog_placements.placements(board.key) is None:
        return None
    table = {}
    for t in types:
        if t.mig_backed or t.framebuffer_mib is None:
            continue  # no placements (type_placements answers none for an unknown size)
        ids = catalog_placements.type_placements(board.key, t.framebuffer_mib)
        if ids:
            size = catalog_placements.slot_size(board.key, t.framebuffer_mib) or 0
            table[t.id] = TypePlacements(size=size, ids=list(ids))
    return VgpuPlacements(enabled=bool(gpu.mixed_size), slots=catalog_placements.slots(board.key), types=table)


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def place(smap: VgpuPlacements, taken: Iterable[int], need: list[str]) -> list[int] | None:
    """A placement id for each type of ``need`` (in its order) beside the ``taken`` slots, or None.

    Exact: backtracking over each type's placements, largest sizes first, lowest id first; vGPUs of
    one type take their placements in increasing order (no permutation is tried twice), failed
    states are remembered and a branch whose free slots cannot hold what is left is cut.
    """
    if any(t not in smap.types for t in need):
        return None
    used0 = 0
    for s in taken:
        used0 |= 1 << s
    order = sorted(range(len(need)), key=lambda i: (-smap.types[need[i]].size, need[i], i))
    sizes = [smap.types[need[i]].size for i in order]
    left = [sum(sizes[k:]) for k in range(len(order) + 1)]
    chosen: dict[int, int] = {}
    failed: set[tuple[int, int, int]] = set()

    def search(k: int, used: int, lo: int) -> bool:
        if k == len(order):
            return True
        if smap.slots - bin(used).count("1") < left[k] or (k, used, lo) in failed:
            return False
        i = order[k]
        tp = smap.types[need[i]]
        same_next = k + 1 < len(order) and need[order[k + 1]] == need[i]
        for j in range(lo, len(tp.ids)):
            m = _mask(tp.ids[j], tp.size)
            if used & m:
                continue
            chosen[i] = tp.ids[j]
            if search(k + 1, used | m, j + 1 if same_next else 0):
                return True
        failed.add((k, used, lo))
        return False

    return [chosen[i] for i in range(len(need))] if search(0, used0, 0) else None


def describe_map(smap: VgpuPlacements, types: dict[str, VgpuType]) -> str:
    """Each size's placements, for messages: ``8Q at 0/16/24/40``."""
    by_size: dict[int, tuple[str, list[int]]] = {}
    for tid, tp in smap.types.items():
        name = types[tid].short_name.split("-")[-1] if tid in types else tid
        by_size.setdefault(tp.size, (name, tp.ids))
    return ", ".join(f"{name} at {'/'.join(map(str, ids))}" for _, (name, ids) in sorted(by_size.items(), reverse=True))


def check_mixed_layout(smap: VgpuPlacements, active: list[tuple[VgpuType, int]], where: str, label: str) -> list[str]:
    """Problems with a layout's time-sliced types on a GPU in mixed-size mode (each naming ``where``):
    a type without placements, or a mix no placement holds even on the empty GPU."""
    problems = []
    for t, _ in active:
        if t.id not in smap.types:
            why = " (1 GiB types are never placed: the driver refuses some of their placements)" \
                if t.framebuffer_mib == catalog_placements.SLOT_MIB else ""
            problems.append(f"{where}.{t.short_name}: {label} has no mixed-size placement for {t.name}{why}")
    if problems:
        return problems
    need = [t.id for t, n in active for _ in range(n)]
    if place(smap, (), need) is None:
        detail = " + ".join(f"{n} x {t.short_name}" for t, n in active)
        types = {t.id: t for t, _ in active}
        lower = "".join(f"; {m}" for t, n in active if (m := lowered(smap, t)) and n > mixed_max(smap, t))
        problems.append(f"{where}: {detail} do not fit on {label} in mixed-size mode: no placement of these vGPUs "
                        f"exists on its {smap.slots} slots of 1 GiB ({describe_map(smap, types)}){lower}")
    return problems


def mixed_max(smap: VgpuPlacements, t: VgpuType) -> int:
    """How many vGPUs of ``t`` alone fit in mixed-size mode: its placements that do not overlap."""
    tp = smap.types.get(t.id)
    if tp is None:
        return 0
    count, end = 0, 0
    for p in sorted(tp.ids):
        if p >= end:
            count, end = count + 1, p + tp.size
    return count


def lowered(smap: VgpuPlacements, t: VgpuType) -> str | None:
    """What mixed-size mode costs ``t``: fewer vGPUs than equal-size mode gives (its placements are
    NVIDIA's table, not every multiple of its size), said where a layout meets it."""
    most = mixed_max(smap, t)
    if t.id not in smap.types or not t.max_instances or most >= t.max_instances:
        return None  # no placement at all: a problem of its own (check_mixed_layout)
    return (f"mixed-size mode allows at most {most} x {t.short_name} (placements "
            f"{'/'.join(map(str, sorted(smap.types[t.id].ids)))}), equal-size mode {t.max_instances}: without "
            f"mixedSize the GPU takes {t.max_instances}")


def preview(gpu: Gpu, entry: GpuLayout, offered: list[VgpuType], wanted: dict[str, int]) -> list[str]:
    """Where a ``mixedSize`` vgpu entry's vGPUs go on the empty GPU once it is ready (the search the
    round after the driver, VF and mode steps runs), as a plan note for ``vgpuctl plan``, and what
    mixed-size mode costs its sizes (fewer placements than equal-size mode's maximum); for a dra
    entry, what it costs the sizes it names (every size, naming none)."""
    if not entry.mixed_size or entry.mode not in ("vgpu", "dra"):
        return []
    types = {t.id: t for t in offered}
    smap = slot_map(gpu, offered)
    if entry.mode == "dra":  # claims place the vGPUs; what the mode costs each size is still worth saying
        named = [types[tid] for tid in wanted if tid in types] or [t for t in offered if not t.mig_backed]
        fewer = [f"{t.short_name}: {mixed_max(smap, t)}, not {t.max_instances}" for t in named
                 if smap is not None and lowered(smap, t)]
        if not fewer:
            return []
        return [f"GPU {gpu.index} ({gpu.address}): in mixed-size mode (NVIDIA's placements) DRA offers fewer of "
                "these sizes than equal-size mode: " + "; ".join(fewer)]
    need = [tid for tid, n in sorted(wanted.items()) for _ in range(n) if tid in types and not types[tid].mig_backed]
    spots = place(smap, (), need) if smap is not None and need else None
    if smap is None or not spots:
        return []
    names = ", ".join(f"{types[t].short_name} at slot {p}" for t, p in sorted(zip(need, spots, strict=True),
                                                                               key=lambda x: x[1]))
    costs = [m for tid in dict.fromkeys(need) if (m := lowered(smap, types[tid]))]
    return [f"GPU {gpu.index} ({gpu.address}): once in mixed-size mode, places {names} ({smap.slots} slots of 1 GiB)",
            *(f"GPU {gpu.index} ({gpu.address}): {m}" for m in costs)]


def board_name(gpu: Gpu) -> str:
    """The GPU's board as the catalog names it (its model where the catalog has none)."""
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    return board.key if board else gpu.model


def refused(gpu: Gpu, label: str) -> str:
    """Why a GPU gets no mixed-size mode: its board's table is not known (nothing is guessed)."""
    return (f"{label}: board {board_name(gpu)} has no known mixed-size placement table, so "
            f"vgpuctl does not run it in mixed-size mode; boards with one: {', '.join(catalog_placements.KNOWN)}")


def switch_mixed(plan: Plan, gpu: Gpu, usage: Usage, definitions: Iterable[MdevDefinition],
                 records: dict[str, str], saved: dict | None = None) -> None:
    """Everything on the GPU goes (nothing of it in use), the mode is recorded, then switched on.

    ``saved``: the GPU's placement record. One that already says mixed-size means the driver lost the
    mode (enabling or disabling VFs, ``sriov-manage -e``, clears it; a driver reload too) rather than the
    layout changing it: the record and its placements stay, so the vGPUs come back where they were."""
    waits = "mixed-size mode set once its {n} vGPU(s) in use are released (NVIDIA switches it on an empty GPU only)"
    if not empty_gpu(plan, gpu, usage, definitions, records, waits):
        return
    if not (saved and saved.get("mixed")):
        plan.actions.append(SavePlacementRecord(gpu=gpu.address, mixed=True))
    plan.actions.append(SetMixedSize(gpu=gpu.address, enabled=True))


class _Targets:
    """Where new vGPUs go: recorded placements first (dormant vGPUs after a reboot), then the search."""

    def __init__(self, smap: VgpuPlacements, taken: set[int]):
        self.smap, self.taken = smap, set(taken)

    def choose(self, need: list[tuple[str, int | None]]) -> list[int] | None:
        """``need``: (type id, preferred placement) per new vGPU."""
        fixed, free = {}, set(self.taken)
        for k, (tid, want) in enumerate(need):
            tp = self.smap.types.get(tid)
            if want is not None and tp is not None and want in tp.ids and free.isdisjoint(range(want, want + tp.size)):
                fixed[k] = want
                free |= set(range(want, want + tp.size))
        rest = [k for k in range(len(need)) if k not in fixed]
        spots = place(self.smap, free, [need[k][0] for k in rest])
        if spots is None and fixed:  # the recorded spots do not leave room: place everything afresh
            fixed, rest = {}, list(range(len(need)))
            spots = place(self.smap, self.taken, [tid for tid, _ in need])
        if spots is None:
            return None
        fixed.update(zip(rest, spots, strict=True))
        return [fixed[k] for k in range(len(need))]


def plan_placed(plan: Plan, gpu: Gpu, wanted: dict[str, int], usage: Usage, definitions: Iterable[MdevDefinition],
                records: dict[str, str], saved: dict | None, *, record: bool,
                new_uuid: Callable[[], str] = lambda: str(uuidlib.uuid4())) -> None:
    """Steps taking a GPU in mixed-size mode to ``wanted`` (type id -> count), each new vGPU created
    and moved to its placement. ``record``: the layout declares the mode (``mixedSize``), so the
    mode and the placements are recorded for ``restore``; ``saved``: what was recorded before."""
    smap = gpu.placements
    assert smap is not None
    mdev = gpu.framework in ("mdev", "mdev-sriov")
    types = {t.id: t for t in gpu.types}
    vfs = [vf.address for vf in gpu.vfs]
    parents = [p.address for p in gpu.parents] if mdev else vfs
    defs = {d.uuid: d for d in definitions if d.parent in parents}
    mine: dict[str, MdevDefinition | str] = dict(defs) if mdev else {vf: t for vf, t in records.items() if vf in vfs}
    removals: list[Action] = []
    saves: list[Action] = []
    creates: list[Action] = []
    claimed_vfs = set() if mdev else {vf for vf in vfs if usage.claims_of(vf)}
    for vf in sorted(claimed_vfs & set(mine)):  # a claim's VF is not the layout's (see equalplan.plan_vendor)
        removals.append(SaveVendorRecord(gpu=gpu.address, vf=vf, type_id=None))
        del mine[vf]
    existing = [v for v in gpu.vgpus if v.framework == ("mdev" if mdev else "vendor-vfio")]
    keep, busy, drop = split_existing(plan, existing, wanted, usage, set(mine), "removed" if mdev else "cleared")
    for v in busy:
        if mdev and v.id in defs and usage.claims_of(v.id):
            removals.append(forget_step(gpu, v))
            del mine[v.id]
    for v in drop:
        removals += [clear_step(gpu, v), forget_step(gpu, v)] if v.id in mine else [clear_step(gpu, v)]
        mine.pop(v.id, None)
    start = "manual" if record else "auto"
    for v in keep:
        if v.id not in mine:
            saves.append(SaveDefinition(gpu=gpu.address, parent=v.parent, uuid=v.id, type_id=v.type_id, start=start)
                         if mdev else SaveVendorRecord(gpu=gpu.address, vf=v.id, type_id=v.type_id))
        elif mdev and defs[v.id].start != start:  # manual while restore places it, auto otherwise
            saves.append(SaveDefinition(gpu=gpu.address, parent=v.parent, uuid=v.id, type_id=v.type_id, start=start))
        elif not mdev and mine[v.id] != v.type_id:
            saves.append(SaveVendorRecord(gpu=gpu.address, vf=v.id, type_id=v.type_id))
    stay = keep + busy
    slots_of = held(stay, smap)
    placed = {vid: r.start for vid, r in slots_of.items() if not usage.claims_of(vid)}
    # dormant saved vGPUs (no device: after a reboot, or a crash) are re-used for their type first
    present = {v.id for v in gpu.vgpus}
    dormant = {k: (d.mdev_type if isinstance(d, MdevDefinition) else d) for k, d in mine.items() if k not in present}
    # one a domain names is re-used for its own type only: its VF takes no other vGPU
    named = {defs[k].parent if mdev else k for k in dormant if dormant_users(k, usage, mdev=mdev)}
    holding = {v.parent for v in gpu.vgpus if v not in drop} | claimed_vfs
    free = [p for p in parents if p not in holding] if (gpu.framework != "mdev") else list(parents)
    recorded = (saved or {}).get("vgpus", {})
    need: list[tuple[str, int | None]] = []
    devices: list[tuple[str, str, bool]] = []  # (vgpu id, parent, new definition/record)
    for tid, n in sorted(wanted.items()):
        for _ in range(n - sum(1 for v in keep if v.type_id == tid)):
            reuse = next((k for k, rt in dormant.items() if rt == tid and (defs[k].parent if mdev else k) in free), None)
            if reuse is not None:
                dormant.pop(reuse)
                parent = defs[reuse].parent if mdev else reuse
                devices.append((reuse, parent, False))
            elif spare := [p for p in free if gpu.framework == "mdev" or p not in named]:
                parent = spare[0]
                devices.append((new_uuid() if mdev else parent, parent, True))
            else:
                plan.skipped.append(Skip(device=gpu.address, reason=f"{types[tid].short_name if tid in types else tid} "
                                                                    "not created: no free VF left"))
                break
            if gpu.framework != "mdev":
                free.remove(parent)
            need.append((tid, recorded.get(devices[-1][0])))
    spots = _Targets(smap, {s for r in slots_of.values() for s in r}).choose(need) if need else []
    if spots is None:
        detail = ", ".join(types[t].short_name if t in types else t for t, _ in need)
        plan.skipped.append(Skip(device=gpu.address, reason=(
            f"{len(need)} vGPU(s) ({detail}) not created: no placement left beside the vGPUs kept (in use or "
            f"wanted) on its {smap.slots} slots; they are created once those are released")))
        placed |= {vid: recorded[vid] for vid, _, new in devices if not new and vid in recorded}  # still restore's
        need, devices, spots = [], [], []
    for (tid, _), (vid, parent, new), p in zip(need, devices, spots, strict=True):
        size = smap.types[tid].size
        if new:
            saves.append(SaveDefinition(gpu=gpu.address, parent=parent, uuid=vid, type_id=tid, start=start)
                         if mdev else SaveVendorRecord(gpu=gpu.address, vf=vid, type_id=tid))
        creates.append(CreateMdev(gpu=gpu.address, parent=parent, uuid=vid, type_id=tid) if mdev
                       else SetVgpuType(gpu=gpu.address, vf=vid, type_id=tid))
        creates.append(SetPlacement(gpu=gpu.address, vgpu=vid, parent=parent, type_id=tid, placement=p, size=size))
        placed[vid] = p
    for k in dormant:
        if kept_for_its_domain(plan, gpu, k, usage, mdev=mdev):
            continue
        removals.append(RemoveDefinition(gpu=gpu.address, parent=defs[k].parent, uuid=k) if mdev
                        else SaveVendorRecord(gpu=gpu.address, vf=k, type_id=None))
    plan.actions += removals + saves
    if record and (saved is None or not saved.get("mixed") or saved.get("vgpus", {}) != placed):
        plan.actions.append(SavePlacementRecord(gpu=gpu.address, mixed=True, vgpus=placed))
    plan.actions += creates
    if spots:
        names = ", ".join(f"{types[t].short_name if t in types else t} at slot {p}"
                          for (t, _), p in zip(need, spots, strict=True))
        plan.notes.append(f"GPU {gpu.index} ({gpu.address}): places {names} (mixed-size mode, {smap.slots} slots)")
