"""What a GPU's types read as: merged over its parents, capped by what its vGPUs already take. Pure.

Discovery builds a GPU's ``types`` from what sysfs lists per parent (a PF, or each VF); the light
re-read (:mod:`mdev_manager.gpurefresh`) from the free instances it reads again; a preview
(:mod:`mdev_manager.expect`) from the types it expects each parent to list. All three summarise them
with :func:`summarise` and link GPU instances with :func:`link_instances`, so a preview's GPU reads
as discovery would read the same node, and a light re-read as a whole one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from mdev_manager import catalog
from mdev_manager.models import (
    MdevParent,
    MigState,
    Vgpu,
    VgpuPlacements,
    VgpuType,
    creatable,
    held,
    held_types,
    occupancy,
)
from mdev_manager.names import framebuffer_mib_from_name, is_mig_backed, mig_profile_of, short_type_name

_MAX_INSTANCE = re.compile(r"max_instance=(\d+)")
_FRAMEBUFFER = re.compile(r"framebuffer=(\d+)M")
_GVT_GM = re.compile(r"(low|high)_gm_size:\s*(\d+)MB")


def framebuffer(name: str, description: str) -> int | None:
    m = _FRAMEBUFFER.search(description)
    if m:
        return int(m.group(1))
    gm = dict((k, int(v)) for k, v in _GVT_GM.findall(description))
    if gm:
        return gm.get("low", 0) + gm.get("high", 0)
    return framebuffer_mib_from_name(name)


def max_instances(name: str, description: str) -> int | None:
    m = _MAX_INSTANCE.search(description)
    if m:
        return int(m.group(1))
    known = catalog.known_type(name)
    return known.max_instances if known else None


#: the records of the types the parents offer, one per distinct reading (see :func:`_shared`)
_SHARED: dict[tuple[str | int, ...], VgpuType] = {}
_SHARED_MOST = 4096


def _shared(build: Callable[..., VgpuType], *reading: str | int) -> VgpuType:
    """One record per distinct type as a parent offers it (id, name, description, instances free).

    A 16-GPU node with 32 VFs each offers 23 types per VF: 11,776 records, about 30 MB as one model
    each, of which some 50 differ. They are shared across parents, GPUs and reads; :class:`VgpuType`
    is frozen, so a record cannot be changed under another parent. Bounded: a host whose readings
    keep changing starts over rather than growing."""
    key = (build.__name__, *reading)
    t = _SHARED.get(key)
    if t is None:
        if len(_SHARED) >= _SHARED_MOST:
            _SHARED.clear()
        t = _SHARED[key] = build(*reading)
    return t


def _new_mdev_type(tid: str, name: str, description: str, device_api: str, available: int) -> VgpuType:
    return VgpuType(id=tid, name=name, short_name=short_type_name(name), framework="mdev", description=description,
                    device_api=device_api, available_instances=available,
                    max_instances=max_instances(name, description), framebuffer_mib=framebuffer(name, description),
                    mig_backed=is_mig_backed(name), gpu_instance_profile=mig_profile_of(name))


def _new_vendor_type(tid: str, name: str, available: int) -> VgpuType:
    return VgpuType(id=tid, name=name, short_name=short_type_name(name), framework="vendor-vfio",
                    available_instances=available, max_instances=max_instances(name, ""),
                    framebuffer_mib=framebuffer_mib_from_name(name), mig_backed=is_mig_backed(name),
                    gpu_instance_profile=mig_profile_of(name))


def mdev_type(tid: str, name: str, description: str, device_api: str, available: int) -> VgpuType:
    """An mdev type as its ``mdev_supported_types/<tid>`` directory describes it (a shared record)."""
    return _shared(_new_mdev_type, tid, name, description, device_api, available)


def vendor_type(tid: str, name: str, available: int) -> VgpuType:
    """A vendor-VFIO type as a VF's ``creatable_vgpu_types`` line names it (a shared record)."""
    return _shared(_new_vendor_type, tid, name, available)


def merge_types(parents: list[MdevParent], board: catalog.BoardSpec | None, vendor_vfio: bool) -> list[VgpuType]:
    """The GPU's types: each offered type once, its free instances summed over the parents (new records:
    the parents' are shared)."""
    first: dict[str, VgpuType] = {}
    free: dict[str, int] = {}
    for p in parents:
        for t in p.types:
            first.setdefault(t.id, t)
            free[t.id] = free.get(t.id, 0) + t.available_instances
    if vendor_vfio and board:
        # creatable_vgpu_types lists only what fits now; the board's full list comes from the catalog.
        # A type whose catalog id is a placeholder ("id" inferred) is left out where the driver lists
        # it by name under its real id: one type, the driver's id.
        listed = {short_type_name(t.name).lower() for t in first.values()}
        for spec in board.types:
            if "id" in spec.inferred and spec.short_name.lower() in listed:
                continue
            if str(spec.num) not in first:
                first[str(spec.num)] = vendor_type(str(spec.num), spec.name, 0)
                free[str(spec.num)] = 0
    merged = []
    for tid, t in first.items():
        update: dict[str, object] = {"available_instances": free[tid]}
        if board:  # the board's own entry, where a short name is shared (DC-8C)
            update["inferred"] = list(catalog.inferred_of(t.id, board))
            own = catalog.known_type(t.name, board) if vendor_vfio else None
            if own is not None:  # vendor VFIO prints no maximum: the GPU's own board's, not a namesake's
                update["max_instances"] = own.max_instances
            if t.mig_backed:
                update["gpu_instance_profile"] = catalog.gi_profile_of(t.name, board)
                known = catalog.known_type(t.name, board)
                update["max_per_instance"] = known.max_per_instance if known else None
        merged.append(t.model_copy(update=update))
    return sorted(merged, key=lambda t: (t.framebuffer_mib or 0, t.name))


def _capped(t: VgpuType, most: int) -> VgpuType:
    return t if t.available_instances <= most else t.model_copy(update={"available_instances": most})


def cap_by_occupancy(types: list[VgpuType], vgpus: list[Vgpu]) -> list[VgpuType]:
    """On VFs each parent reads 0 or 1, so their sum overstates what the GPU still holds.

    Cap it by occupancy: each vGPU of type t uses 1/max(t) of the GPU (vgpu-types.md).
    """
    used = occupancy((t, 1) for t in held_types(types, vgpus))
    return [_capped(t, max(0, int((1 - used) * t.max_instances))) if t.max_instances else t for t in types]


def cap_by_placements(types: list[VgpuType], vgpus: list[Vgpu], smap: VgpuPlacements) -> list[VgpuType]:
    """In mixed-size mode only placements limit a type: at most one vGPU per creatable placement."""
    taken = held(vgpus, smap)
    return [t if t.mig_backed else _capped(t, len(creatable(smap, taken, t.id))) for t in types]


def capped(types: list[VgpuType], vgpus: list[Vgpu], placements: VgpuPlacements | None,
           framework: str) -> list[VgpuType]:
    """The GPU's summed types capped by what it holds: by placements in mixed-size mode, else by
    occupancy where each parent (a VF) reads 0 or 1."""
    if placements is not None and placements.enabled:
        return cap_by_placements(types, vgpus, placements)
    if framework in ("mdev-sriov", "vendor-vfio"):
        return cap_by_occupancy(types, vgpus)
    return types


def infer_mixed_size(vendor_id: str, types: list[VgpuType], vgpus: list[Vgpu]) -> bool | None:
    """Whether an NVIDIA GPU runs in mixed-size mode, as far as sysfs shows it (None: cannot tell);
    used where NVML reports no mode for the GPU (no library, or a board NVML has no mode for).

    No attribute says (NVML sets the mode), but in equal-size mode, once a vGPU
    exists, every type of another framebuffer size reads 0 available (kernel.md). So a GPU
    holding vGPUs that still offers another size is in mixed-size mode; one that offers
    none of another size although there is room for it is in equal-size mode.
    """
    if vendor_id != "0x10de":
        return None
    held_ = held_types(types, vgpus)
    if not held_:
        return None
    sizes = {t.framebuffer_mib for t in held_}
    other = [t for t in types if not t.mig_backed and t.framebuffer_mib and t.max_instances
             and t.framebuffer_mib not in sizes]
    if any(t.available_instances > 0 for t in other):
        return True
    free = 1 - occupancy((t, 1) for t in held_)
    if any(occupancy([(t, 1)]) <= free for t in other):
        return False
    return None  # full, or nothing of another size would fit anyway


class Summary(NamedTuple):
    """What a GPU's parents and vGPUs sum up to: its types, its mixed-size placements and mode."""

    types: list[VgpuType]
    placements: VgpuPlacements | None
    mixed_size: bool | None


def summarise(parents: list[MdevParent], vgpus: list[Vgpu], framework: str, vendor_id: str,
              board: catalog.BoardSpec | None,
              placements_of: Callable[[list[VgpuType]], VgpuPlacements | None]) -> Summary:
    """The GPU's types merged over its parents and capped by its vGPUs, its placements and mixed-size mode.

    ``placements_of`` gives the placements of the merged types (NVML's answer for discovery, the
    catalog's and the last answer for a preview); its mode is the GPU's where it has one, else
    inferred from what sysfs shows (:func:`infer_mixed_size`)."""
    types = merge_types(parents, board, framework == "vendor-vfio")
    placements = placements_of(types)
    types = capped(types, vgpus, placements, framework)
    mixed = placements.enabled if placements is not None else infer_mixed_size(vendor_id, types, vgpus)
    return Summary(types, placements, mixed)


def link_instances(mig: MigState, types: list[VgpuType], vgpus: list[Vgpu]) -> None:
    """Each GPU instance's vGPUs, set on ``mig`` in place (its links before are dropped).

    A vendor-VFIO VF names its instance (``nvidia/gpu_instance_id``); an mdev does not, so mdevs
    of a profile are matched to that profile's remaining instances in id order (which one holds
    which is then a guess; how many are held is not)."""
    for g in mig.instances:
        g.vgpu, g.vgpus = None, []
    if not mig.enabled:
        return
    by_id = {g.id: g for g in mig.instances}
    for v in vgpus:
        if v.gpu_instance in by_id:
            gi = by_id[v.gpu_instance]
            gi.vgpu = gi.vgpu or v.id
            gi.vgpus.append(v.id)
    profile_of = {t.id: t.gpu_instance_profile for t in types}
    for v in vgpus:
        name = profile_of.get(v.type_id) or mig_profile_of(v.type_name)
        if v.gpu_instance is None and name and (prof := mig.profile(name)):
            free = next((g for g in mig.instances if g.profile_id == prof.id and g.vgpu is None), None)
            if free is not None:
                free.vgpu, free.vgpus, v.gpu_instance = v.id, [v.id], free.id
