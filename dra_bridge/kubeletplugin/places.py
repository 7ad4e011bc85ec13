"""Where a rebuilt checkpoint record's vGPU sits (pure): what prepare recorded of its place and a
rebuild from the node's traces must give back, so the overlap refusal (:mod:`.overlap`) still sees
what a claim holds and unprepare removes the GPU instance its prepare made (#38).
"""

from __future__ import annotations

import re

from dra_bridge.kubeletplugin.state import PreparedDeviceRecord
from dra_bridge.pool.devices import Pool, PoolDevice
from dra_bridge.pool.migshare import inside_placements
from mdev_manager.models import Gpu, Inventory, Vgpu


def place(rec: PreparedDeviceRecord, inv: Inventory, published: Pool | None) -> None:
    """Where a rebuilt vGPU sits, as its prepare recorded it: its GPU instance (profile, memory
    slices, id) and its placement inside a shared one (MIG time-slicing), or its mixed-size slots.
    Without them the overlap refusal would not see the instance the claim holds, and its unprepare
    would leave the instance its prepare made. Read from the node where the vGPU is there (NVML's
    instances; the vGPU's ``gpu_instance_id`` and ``placement_id``, as discovery reads them), else
    from the device the claim was allocated (a reboot took the vGPU: the record keeps its place
    until prepare makes it there again), else from the device's name (the daemon's start: no pool
    published yet), never smaller than the claim holds (:func:`_from_name`)."""
    if rec.kind != "vgpu" or not rec.gpu:
        return
    gpu = inv.gpu(rec.gpu)
    dev = published.device(rec.device) if published is not None else None
    vg = next((v for v in gpu.vgpus if v.id == rec.vgpu_id), None) if gpu is not None and rec.vgpu_id else None
    update: dict[str, int | None]
    if dev is not None:
        update = _from_device(dev) if dev.gpu == rec.gpu else {}
    else:  # the daemon's start (no pool published yet), or a device no longer published: its name
        update = _from_name(rec.device, gpu, rec.type_id) if gpu is not None else {}
    if gpu is not None and vg is not None:
        update = {**update, **_from_node(gpu, vg)} if vg.gpu_instance is not None or vg.placement_id is not None \
            else {}  # on the node, in no instance and at no placement: nothing to hold beyond the vGPU
    for name, value in update.items():
        setattr(rec, name, value)


def _from_node(gpu: Gpu, vg: Vgpu) -> dict[str, int]:
    """A vGPU's GPU instance and placements as the node shows them."""
    gi = next((i for i in gpu.mig.instances if i.id == vg.gpu_instance), None) if gpu.mig else None
    if gi is not None:
        out = {"gi_profile": gi.profile_id, "gi_start": gi.placement.start, "gi_size": gi.placement.size,
               "gpu_instance": gi.id}
        t = next((t for t in gpu.types if t.id == vg.type_id), None)
        at = next((p for p in (inside_placements(gpu, t) if t else []) if p.start == vg.placement_id), None)
        return {**out, "placement": at.start, "placement_size": at.size} if at is not None else out
    sized = gpu.placements.types.get(vg.type_id) if gpu.placements and gpu.placements.enabled else None
    if vg.gpu_instance is None and vg.placement_id is not None and sized is not None:
        return {"placement": vg.placement_id, "placement_size": sized.size}
    return {}


_MIG_NAME = re.compile(r"-mig-.+?-(\d+)-(\d+)(?:-at-(\d+))?$")  # ...-<profile id>-<start>[-at-<placement>]
_PLACED_NAME = re.compile(r"-vgpu-\d+(?:gb|mb)-at-(\d+)$")  # a mixed-size placement


def _from_name(device: str, gpu: Gpu, type_id: str | None) -> dict[str, int | None]:
    """The GPU instance and placements a device's name tells (as :mod:`dra_bridge.pool` names them),
    sized by the GPU as the node shows it now; nothing where a size cannot be told (a GPU not back in
    MIG or mixed-size mode yet), rather than a smaller span than the claim holds.

    A vGPU that shared its instance (``-at-<placement id>``) whose type the name does not tell: on a
    GB20x board several types take one instance profile at sizes that differ (1g.24gb: DC-1-2Q ...
    DC-1-12Q, and the A/B/C/Q series of each size), the placement id alone fits several of them, and
    its vGPU went with a reboot, so the node cannot tell either (the type is read from the VF's
    ``nvidia/current_vgpu_type`` and the place from its ``gpu_instance_id`` and ``placement_id``
    only while the vGPU exists: ../shared/reference/kernel.md, heterogeneous-vgpu.md "Creating a
    vGPU at a placement"). The record then holds the whole instance: its placement id with no size
    (:func:`.overlap.overlap` counts it as the whole instance, but for a claim that shared the
    instance with it, which makes its vGPU again beside it), until its claim prepares again (the
    published device's type and placement) or is unprepared."""
    t = next((t for t in gpu.types if t.id == type_id), None)
    if (m := _MIG_NAME.search(device)) and gpu.mig is not None:
        prof, start = gpu.mig.profile(int(m.group(1))), int(m.group(2))
        at = next((p for p in prof.placements if p.start == start), None) if prof else None
        if prof is None or at is None:
            return {}
        out: dict[str, int | None] = {"gi_profile": prof.id, "gi_start": start, "gi_size": at.size}
        if m.group(3) is None:
            return out
        inside = next((p for p in (inside_placements(gpu, t) if t else []) if p.start == int(m.group(3))), None)
        if inside is not None:
            return {**out, "placement": inside.start, "placement_size": inside.size}
        return {**out, "placement": int(m.group(3)), "placement_size": None}  # the size unknown: the whole instance
    sized = gpu.placements.types.get(type_id or "") if gpu.placements else None
    if (m := _PLACED_NAME.search(device)) and sized is not None:
        return {"placement": int(m.group(1)), "placement_size": sized.size}
    return {}


def _from_device(dev: PoolDevice) -> dict[str, int | None]:
    """The GPU instance and placements of the device a claim was allocated (prepare's intent)."""
    if dev.placement is not None and dev.gpu_instance_profile is not None:
        out: dict[str, int | None] = {"gi_profile": dev.gpu_instance_profile, "gi_start": dev.placement.start,
                                      "gi_size": dev.placement.size}
        return {**out, "placement": dev.inside.start, "placement_size": dev.inside.size} if dev.inside else out
    if dev.slots is not None:
        return {"placement": dev.slots.start, "placement_size": dev.slots.size}
    return {}


__all__ = ["place"]
