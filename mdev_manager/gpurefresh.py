"""A GPU read before, read again only where a vGPU's creation or removal changes it (#37).

A claim's prepare or unprepare makes or removes one vGPU: its GPU's functions, drivers, VFs and the
types each parent offers stay as they were; what changes is each parent's mdevs, each type's
``available_instances`` (the kernel lowers other parents' too: equal-size mode, occupancy) and what
NVML derives from them (placements, GPU instances). :func:`refresh_vgpus` reads those again and takes
the rest from the GPU as last read: one attribute per type instead of four, no function re-read.
The caller uses it only where the GPU's other fingerprint marks (functions, drivers) are unchanged;
a parent whose type list differs from the one read before makes it read the GPU whole (None).

``apply`` reuses what it read before the node lock, under it, where :func:`still_current` finds the
node unchanged, and reads back only the GPUs it wrote (:func:`read_again`).
"""

from __future__ import annotations

from collections.abc import Iterable

from mdev_manager import catalog
from mdev_manager.discovery import DeviceDirs, _int, _mig_state, _placements, discover, read_function, read_gpu, read_mdevs
from mdev_manager.host.env import HostEnv
from mdev_manager.host.fingerprint import settled_print
from mdev_manager.host.io import HostIO
from mdev_manager.models import Gpu, Inventory, MdevParent, Vgpu, VgpuType
from mdev_manager.typeset import mdev_type, summarise


def refresh_vgpus(env: HostEnv, io: HostIO, gpu: Gpu) -> Gpu | None:
    """``gpu`` with its vGPUs, types' free instances, placements and GPU instances read now; None: it
    is not an mdev GPU, or a parent's types are not the ones read before (read the GPU whole)."""
    if gpu.framework not in ("mdev", "mdev-sriov"):
        return None
    dirs = DeviceDirs(env, io)
    parents: list[MdevParent] = []
    vgpus: list[Vgpu] = []
    for p in gpu.parents:
        free = io.read_children(dirs(p.address) / "mdev_supported_types", ["available_instances"])
        if set(free) != {t.id for t in p.types}:
            return None
        parents.append(p.model_copy(update={"types": [
            _with_free(t, _int(free[t.id]["available_instances"]) or 0) for t in p.types]}))
        vgpus += read_mdevs(env, io, p.address, gpu.address, dirs)
    fields = {"vendor_id": gpu.vendor_id, "driver": gpu.driver}
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    types, placements, mixed = summarise(parents, vgpus, gpu.framework, gpu.vendor_id, board,
                                         lambda merged: _placements(io, gpu.address, fields, merged))
    mig = _mig_state(io, gpu.address, fields, types, vgpus)
    return gpu.model_copy(update={"parents": parents, "vgpus": vgpus, "types": types, "placements": placements,
                                  "mig": mig, "mixed_size": mixed})


def _with_free(t: VgpuType, available: int) -> VgpuType:
    """``t`` with ``available`` instances free: the shared record of that reading (:func:`~mdev_manager.typeset.mdev_type`)
    where ``t`` is one as read, else a copy. A copy per parent and type brought back discovery's 11,776 records on a
    16 x 32-VF node once claims had touched every GPU (~17 MB in the agent: #37)."""
    if t.available_instances == available:
        return t
    if t.framework == "mdev" and t == mdev_type(t.id, t.name, t.description, t.device_api, t.available_instances):
        return mdev_type(t.id, t.name, t.description, t.device_api, available)
    return t.model_copy(update={"available_instances": available})


def read_again(env: HostEnv, io: HostIO, inv: Inventory, addresses: Iterable[str],
               light: Iterable[str] = ()) -> Inventory:
    """``inv`` with the GPUs at ``addresses`` read now, each whole (functions, VFs, types, vGPUs, NVML's
    view), the others as read before; those also in ``light`` (only vGPUs made or removed there) read
    as :func:`refresh_vgpus` does where it can. A GPU that no longer reads (off the bus) makes it read
    the whole node, as :func:`~mdev_manager.discovery.discover` words a failed read."""
    wanted, light = set(addresses), set(light)
    if not wanted:
        return inv
    dirs = DeviceDirs(env, io)

    def read(g: Gpu) -> Gpu:
        fresh = refresh_vgpus(env, io, g) if g.address in light else None
        return fresh or read_gpu(env, io, g.address, g.index, read_function(env, io, g.address, dirs), dirs=dirs)

    try:
        gpus = [read(g) if g.address in wanted else g for g in inv.gpus]
    except OSError:
        return discover(env, io, node=inv.node)
    return inv.model_copy(update={"gpus": gpus})


def still_current(env: HostEnv, io: HostIO, inv: Inventory, seen: str) -> Inventory | None:
    """``inv``, read after :func:`~mdev_manager.host.fingerprint.settled_print` gave ``seen``, if the node
    shows no change since (its GPUs with state in the driver, MIG or mixed-size mode, read again: no
    sysfs listing shows a GPU instance made); None: something changed, read the node whole."""
    if settled_print(env, io) != seen:
        return None
    return read_again(env, io, inv, [g.address for g in inv.gpus if g.mig is not None or g.placements is not None])
