"""What a GPU's types read as: merged over its parents, capped by what its vGPUs already take. Pure.

Discovery builds a GPU's ``types`` from what sysfs lists per parent (a PF, or each VF); a preview
(:mod:`mdev_manager.expect`) builds them from the types it expects each parent to list. Both go
through these functions, so a preview's GPU reads as discovery would read the same node.
"""

from __future__ import annotations

import re

from mdev_manager import catalog
from mdev_manager.models import MdevParent, Vgpu, VgpuPlacements, VgpuType, held_types, occupancy
from mdev_manager.names import framebuffer_mib_from_name, is_mig_backed, mig_profile_of, short_type_name
from mdev_manager.placeplan import creatable, held

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


def mdev_type(tid: str, name: str, description: str, device_api: str, available: int) -> VgpuType:
    """An mdev type as its ``mdev_supported_types/<tid>`` directory describes it."""
    return VgpuType(id=tid, name=name, short_name=short_type_name(name), framework="mdev", description=description,
                    device_api=device_api, available_instances=available,
                    max_instances=max_instances(name, description), framebuffer_mib=framebuffer(name, description),
                    mig_backed=is_mig_backed(name), gpu_instance_profile=mig_profile_of(name))


def vendor_type(tid: str, name: str, available: int) -> VgpuType:
    """A vendor-VFIO type as a VF's ``creatable_vgpu_types`` line names it."""
    return VgpuType(id=tid, name=name, short_name=short_type_name(name), framework="vendor-vfio",
                    available_instances=available, max_instances=max_instances(name, ""),
                    framebuffer_mib=framebuffer_mib_from_name(name), mig_backed=is_mig_backed(name),
                    gpu_instance_profile=mig_profile_of(name))


def merge_types(parents: list[MdevParent], board: catalog.BoardSpec | None, vendor_vfio: bool) -> list[VgpuType]:
    merged: dict[str, VgpuType] = {}
    for p in parents:
        for t in p.types:
            if t.id in merged:
                merged[t.id].available_instances += t.available_instances
            else:
                merged[t.id] = t.model_copy()
    if vendor_vfio and board:
        # creatable_vgpu_types lists only what fits now; the board's full list comes from the catalog.
        # A type whose catalog id is a placeholder ("id" inferred) is left out where the driver lists
        # it by name under its real id: one type, the driver's id.
        listed = {short_type_name(t.name).lower() for t in merged.values()}
        for spec in board.types:
            if "id" in spec.inferred and spec.short_name.lower() in listed:
                continue
            merged.setdefault(str(spec.num), vendor_type(str(spec.num), spec.name, 0))
    if board:
        for t in merged.values():  # the board's own entry, where a short name is shared (DC-8C)
            t.inferred = list(catalog.inferred_of(t.id, board))
            own = catalog.known_type(t.name, board) if vendor_vfio else None
            if own is not None:  # vendor VFIO prints no maximum: the GPU's own board's, not a namesake's
                t.max_instances = own.max_instances
            if t.mig_backed:
                t.gpu_instance_profile = catalog.gi_profile_of(t.name, board)
                known = catalog.known_type(t.name, board)
                t.max_per_instance = known.max_per_instance if known else None
    return sorted(merged.values(), key=lambda t: (t.framebuffer_mib or 0, t.name))


def cap_by_occupancy(types: list[VgpuType], vgpus: list[Vgpu]) -> None:
    """On VFs each parent reads 0 or 1, so their sum overstates what the GPU still holds.

    Cap it by occupancy: each vGPU of type t uses 1/max(t) of the GPU (vgpu-types.md).
    """
    used = occupancy((t, 1) for t in held_types(types, vgpus))
    for t in types:
        if t.max_instances:
            t.available_instances = min(t.available_instances, max(0, int((1 - used) * t.max_instances)))


def cap_by_placements(types: list[VgpuType], vgpus: list[Vgpu], smap: VgpuPlacements) -> None:
    """In mixed-size mode only placements limit a type: at most one vGPU per creatable placement."""
    taken = held(vgpus, smap)
    for t in types:
        if not t.mig_backed:
            t.available_instances = min(t.available_instances, len(creatable(smap, taken, t.id)))


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
