"""Which GPU instance a simulated MIG-backed vGPU lives on, and where inside it.

A MIG-backed vGPU takes a free GPU instance of its profile whole (the GPU instance record's
``vgpu``), except on a board with MIG time-slicing (GB20x, the RTX PRO 6000): there several vGPUs
of one type share an instance, each at the first free placement inside it (:func:`.nvml.rooms`;
the record's ``shared``: vGPU -> placement, and ``type``), and writing its ``placement_id`` moves
it to another free placement of its type inside the instance (:func:`move`: assumed to work as in
mixed-size mode; the facts are silent). The instance is in use, and NVML
refuses to destroy it, while any vGPU lives on it (its ``vgpu`` is then one of them).
"""

from __future__ import annotations

import errno

from mdev_manager import catalog
from mdev_manager.catalog import TypeSpec
from mdev_manager.catalog_placements import instance_placements
from mdev_manager.sim.nvml import free_instances, mig_record, rooms
from mdev_manager.sim.rules import err


def take(gpu: dict, t: TypeSpec, vgpu: str, wanted: int | None = None) -> int:
    """The instance a new vGPU of ``t`` takes: the one ``wanted`` (vendor VFIO: the VF's
    ``gpu_instance_id``), else the lowest with room; EINVAL when none has room."""
    why = f" with id {wanted}" if wanted is not None else ""
    if t.max_per_instance:  # MIG time-slicing: a placement inside a shared instance
        open_ = [(g, free) for g, free in rooms(gpu, t) if wanted is None or g["id"] == wanted]
        if not open_:
            raise err(errno.EINVAL, f"no GPU instance with room for {t.name}{why}")
        joined, spots = open_[0]
        joined.setdefault("shared", {})[vgpu] = spots[0]  # first fit, as in mixed-size mode
        joined["type"], joined["vgpu"] = str(t.num), joined.get("vgpu") or vgpu
        return int(joined["id"])
    free = [g for g in free_instances(gpu, t.gpu_instance_profile or "") if wanted is None or g["id"] == wanted]
    if not free:
        raise err(errno.EINVAL, f"no free GPU instance for {t.name}{why}")
    free[0]["vgpu"] = vgpu
    return int(free[0]["id"])


def release(gpu: dict, vgpu: str) -> None:
    """The vGPU is gone: its instance (or its placement inside a shared one) is free again."""
    for gi in mig_record(gpu)["gis"] if "mig" in gpu else []:
        shared = gi.get("shared") or {}
        shared.pop(vgpu, None)
        if gi.get("vgpu") == vgpu:
            gi.pop("vgpu")
            if shared:
                gi["vgpu"] = next(iter(shared))
        if "shared" in gi and not shared:
            gi.pop("shared")
            gi.pop("type", None)


def placement_inside(gpu: dict, vgpu: str) -> int | None:
    """A MIG time-sliced vGPU's placement inside its instance (what its ``placement_id`` reads)."""
    for gi in mig_record(gpu)["gis"] if "mig" in gpu else []:
        if vgpu in (gi.get("shared") or {}):
            return int(gi["shared"][vgpu])
    return None


def move(gpu: dict, vgpu: str, value: int) -> bool:
    """Move a MIG time-sliced vGPU to placement ``value`` inside its instance; False when it shares
    no instance; ValueError when ``value`` is not one of its type's placements or is held."""
    for gi in mig_record(gpu)["gis"] if "mig" in gpu else []:
        shared = gi.get("shared") or {}
        if vgpu not in shared:
            continue
        t = next(t for t in catalog.board(gpu["board"]).types if str(t.num) == gi.get("type"))
        size, ids = instance_placements(gpu["board"], t)
        held = {s for other, p in shared.items() if other != vgpu for s in range(p, p + size)}
        if value not in ids or not held.isdisjoint(range(value, value + size)):
            raise ValueError(f"placement {value} of {t.name} is not free inside GPU instance {gi['id']}")
        shared[vgpu] = value
        return True
    return False
