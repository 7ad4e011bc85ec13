"""The DRA devices of a GPU in NVIDIA's mixed-size mode: one per (size, placement ID), kept apart
exactly by the placement counters of :mod:`.placements`.

In mixed-size mode a GPU is a row of 1 GiB slots; a vGPU of a size sits at one of that size's
placement IDs and holds the slots ``[id, id + placementSize)`` (../shared/reference/heterogeneous-vgpu.md).
So the GPU publishes, for each offered size, one device per placement, ``gpu-<i>-vgpu-<size>-at-<id>``
with int attributes ``placementStart`` and ``placementSize`` (slots, as NVML counts them), capacity
``memory`` and ``vgpuTypes``: the A, B, C and Q types of the size, the claim's ``VgpuConfig``
choosing one, as for size slots. The GPU's counters (:func:`.placements.encode` over the offered
sizes' placements) admit exactly the sets of devices whose slot ranges are pairwise disjoint; the
whole GPU consumes every counter. That is the driver's own rule, so nothing else is needed: no
compatibility group (sizes mix by design), no binding condition, on every server that keeps
counters. Where a server drops them, :func:`safe_devices` keeps one size's placements (they never
overlap one another, so any subset is creatable). Prepare makes each vGPU at its device's placement
(:mod:`dra_bridge.kubeletplugin.effects`). Pure.
"""

from __future__ import annotations

from dra_bridge.api.attributes import (
    ATTR_FRAMEWORK,
    ATTR_PARENT_PCI_BUS_ID,
    ATTR_PLACEMENT_SIZE,
    ATTR_PLACEMENT_START,
    ATTR_PROFILE,
    ATTR_SERIES,
    ATTR_TYPE,
    ATTR_TYPE_ID,
    ATTR_TYPE_NAME,
    ATTR_VGPU_TYPES,
)
from dra_bridge.api.names import mixed_device_name, passthrough_device_name
from dra_bridge.pool.model import (
    ATTR_PCI_BUS_ID,
    SERIES_ORDER,
    AttrValue,
    Consumption,
    GpuPolicy,
    Pool,
    PoolDevice,
    attr_int,
    attr_string,
    format_mib,
    gpu_vgpu_limit,
    type_framebuffer_mib,
    vgpu_types_attr,
)
from dra_bridge.pool.placements import PlacementCounters, PlacementError, encode
from mdev_manager.models import Gpu, MigPlacement, TypePlacements, VgpuPlacements, VgpuType, held
from mdev_manager.names import short_type_name, type_series
from mdev_manager.placeplan import slot_map

#: The counter added to the first slots set where a board's VFs (or vGPU cap) are fewer than the
#: vGPUs its slots could hold at once; on every published board they are not, and it is left out.
VGPUS = "vgpus"

Group = tuple[TypePlacements, list[VgpuType]]


def mixed_slot_map(gpu: Gpu) -> VgpuPlacements | None:
    """The slots and the types' placements of a GPU NVML reports in mixed-size mode: NVML's lists,
    else the catalog's table for the board (:func:`mdev_manager.placeplan.slot_map`). None where NVML
    does not say the GPU is in the mode (no library: a policy's ``mixed_size`` then gets the
    fair-share slots of :mod:`.devices`, placements not modelled) or no table is known."""
    if gpu.placements is None or not gpu.placements.enabled:
        return None
    return slot_map(gpu, [t for t in gpu.types if not t.mig_backed])


def size_groups(gpu: Gpu, pol: GpuPolicy, types: list[VgpuType], smap: VgpuPlacements,
                warnings: list[str]) -> list[Group]:
    """The offered types by placement (size and IDs), smallest size first, each group's default
    type first (series Q, C, B, A). A type without placements (1 GiB types are never placed) is
    left out, with a warning where the policy named it."""
    groups: dict[tuple[int, int, tuple[int, ...]], list[VgpuType]] = {}
    for t in types:
        tp, fb = smap.types.get(t.id), type_framebuffer_mib(t)
        if tp is None or not tp.ids or not fb:
            if pol.vgpu_types is not None:
                warnings.append(f"GPU {gpu.address}: {t.short_name} has no mixed-size placement (1 GiB types are "
                                "never placed); skipped")
            continue
        groups.setdefault((tp.size, fb, tuple(tp.ids)), []).append(t)
    out: list[Group] = []
    names: set[int] = set()
    for (size, fb, ids), members in sorted(groups.items()):
        members = [t for _, t in sorted(enumerate(members), key=lambda kt: (
            SERIES_ORDER.get(type_series(kt[1].name) or "", 9), kt[0]))]
        if fb in names:  # one size, two lists of IDs: NVML would never say so; the names would clash
            warnings.append(f"GPU {gpu.address}: {', '.join(t.short_name for t in members)} placed apart from the other "
                            f"{fb} MiB types; skipped")
            continue
        names.add(fb)
        kept = [m for k, m in enumerate(members) if len(vgpu_types_attr(members[: k + 1]).encode()) <= 64]
        if len(kept) < len(members):  # a selector must find every name whole in the 64-byte attribute
            warnings.append(f"GPU {gpu.address}: {', '.join(t.short_name for t in members[len(kept):])} left out: the "
                            "vgpuTypes attribute holds 64 bytes")
        out.append((TypePlacements(size=size, ids=list(ids)), kept))
    return out


def most_at_once(slots: int, ranges: list[tuple[int, int]]) -> int:
    """The most pairwise disjoint ranges (interval scheduling: earliest end first is optimal)."""
    n, end = 0, -1
    for a, b in sorted(ranges, key=lambda r: r[1]):
        if a >= end:
            n, end = n + 1, b
    return n


def add_mixed_gpu(pool: Pool, gpu: Gpu, pol: GpuPolicy, types: list[VgpuType], smap: VgpuPlacements,
                  common: dict[str, AttrValue], version: tuple[int, int]) -> None:
    """The counter set(s) and devices of a GPU in mixed-size mode (see the module docstring)."""
    groups = size_groups(gpu, pol, types, smap, pool.warnings)
    if not groups and not pol.passthrough:
        return
    table: dict[int, set[int]] = {}
    for tp, _ in groups:
        table.setdefault(tp.size, set()).update(tp.ids)
    try:
        enc = encode(smap.slots, {s: sorted(ids) for s, ids in table.items()}, server_version=version)
    except PlacementError as exc:
        pool.warnings.append(f"GPU {gpu.address}: {exc}; its vGPUs are not offered")
        groups, enc = [], encode(smap.slots, {}, server_version=version)
    sets = enc.counter_sets(gpu.index)
    limit = gpu_vgpu_limit(gpu)
    count = most_at_once(smap.slots, [(p, p + tp.size) for tp, _ in groups for p in tp.ids])
    vgpus = count > limit
    if vgpus:  # more vGPUs fit the slots than the board can make: each consumes one of its VFs too
        sets[0].counters[VGPUS] = limit
    pool.counter_sets += sets
    theirs = set(pol.outside_vgpus)
    outside = [v for v in gpu.vgpus if v.id in theirs]
    if outside:  # vGPUs no claim holds: their slots (and VFs) are not the claims'
        spans = held(outside, smap)
        if len(spans) < len(outside) or (vgpus and limit - len(outside) < 1):
            groups = []  # one of unknown slots, or no VF left: nothing can be offered safely
        else:
            groups = [(tp.model_copy(update={"ids": [p for p in tp.ids if all(
                p + tp.size <= r.start or r.stop <= p for r in spans.values())]}), members) for tp, members in groups]
        pool.warnings.append(f"GPU {gpu.address}: {len(outside)} vGPU(s) no claim holds keep their slots from the "
                             "claims (remove them, or let the layout do so once they are free)")
        if vgpus:
            sets[0].counters[VGPUS] = max(0, limit - len(outside))
    if pol.passthrough and not outside:
        pool.devices.append(PoolDevice(
            name=passthrough_device_name(gpu.index), kind="passthrough", gpu=gpu.address,
            attributes={ATTR_TYPE: attr_string("passthrough"), ATTR_PROFILE: attr_string(gpu.model),
                        ATTR_FRAMEWORK: attr_string("vfio-pci"), **common, ATTR_PCI_BUS_ID: attr_string(gpu.address)},
            capacity={"memory": format_mib(smap.slots * 1024)},
            consumes=_consumes(enc, gpu.index, 0, smap.slots, limit if vgpus else 0)))
    for tp, members in groups:
        t = members[0]
        fb = type_framebuffer_mib(t)
        assert fb  # size_groups keeps types of known size only
        attrs: dict[str, AttrValue] = {
            ATTR_TYPE: attr_string("vgpu"),
            ATTR_PROFILE: attr_string(t.short_name or short_type_name(t.name)),
            ATTR_TYPE_NAME: attr_string(t.name),
            ATTR_TYPE_ID: attr_string(t.id),
            ATTR_FRAMEWORK: attr_string(t.framework),
            ATTR_VGPU_TYPES: attr_string(vgpu_types_attr(members)),
            **common,
            ATTR_PARENT_PCI_BUS_ID: attr_string(gpu.address),
            ATTR_PLACEMENT_SIZE: attr_int(tp.size),
        }
        if (series := type_series(t.name)) is not None:
            attrs[ATTR_SERIES] = attr_string(series)
        choices = {x.short_name: x.id for x in members}
        for p in tp.ids:
            pool.devices.append(PoolDevice(
                name=mixed_device_name(gpu.index, fb, p), kind="vgpu", gpu=gpu.address, type_id=t.id,
                type_choices=dict(choices), slots=MigPlacement(start=p, size=tp.size),
                attributes={**attrs, ATTR_PLACEMENT_START: attr_int(p)}, capacity={"memory": format_mib(fb)},
                consumes=_consumes(enc, gpu.index, p, tp.size, 1 if vgpus else 0)))


def _consumes(enc: PlacementCounters, index: int, start: int, size: int, vgpus: int) -> list[Consumption]:
    """The slots ``[start, start + size)`` of the counters, and ``vgpus`` of the first set's VF counter."""
    out = enc.consumes(index, start, size)
    if vgpus:
        first = enc.counter_sets(index)[0].name
        mine = next((c for c in out if c.counter_set == first), None)
        if mine is None:
            out.insert(0, Consumption(counter_set=first, counters={VGPUS: str(vgpus)}))
        else:
            mine.counters[VGPUS] = str(vgpus)
    return out


def safe_devices(devices: list[PoolDevice], gpu: Gpu | None) -> tuple[list[PoolDevice], str]:
    """A mixed-size GPU's vGPU devices for a server that drops counters: one size's placements, the
    size its vGPUs already have (else the smallest offered), without those that overlap a vGPU
    the GPU holds or one kept before (pairwise disjoint, so any subset the scheduler picks is
    creatable; each board's placements of one size never overlap, checked per board in the
    tests). Returns the devices kept and the size, for the warning."""
    placed = [d for d in devices if d.slots is not None]
    held: list[tuple[int, int]] = []
    sizes: list[int] = []
    for v in gpu.vgpus if gpu else []:
        dev = next((d for d in placed if v.type_id in d.type_choices.values()), None)
        if dev is not None and dev.slots is not None and v.placement_id is not None:
            held.append((v.placement_id, v.placement_id + dev.slots.size))
            sizes.append(dev.slots.size)
    order = list(dict.fromkeys(d.slots.size for d in placed if d.slots is not None))
    chosen = next((s for s in order if s in sizes), order[0] if order else 0)
    keep: list[PoolDevice] = []
    taken = list(held)
    for d in placed:
        assert d.slots is not None
        r = (d.slots.start, d.slots.start + d.slots.size)
        if d.slots.size != chosen:
            continue
        if r in held:  # a claim's vGPU: its device stays (the allocation names it), already taken
            keep.append(d)
        elif all(r[1] <= a or b <= r[0] for a, b in taken):
            keep.append(d)
            taken.append(r)
    return keep, (keep[0].capacity.get("memory", "one size's") if keep else "no")


def slot_sizes(pool: Pool, gpu: str) -> dict[str, int]:
    """Type id -> the slots a vGPU of it holds, for every type the GPU's placement devices offer."""
    return {tid: d.slots.size for d in pool.devices if d.gpu == gpu and d.slots is not None
            for tid in d.type_choices.values()}
