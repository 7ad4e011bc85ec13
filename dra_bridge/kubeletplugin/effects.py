"""Node-side effects of a claim: create or remove a vGPU, bind or release a passthrough GPU.

Decisions (which parent, which VF) are pure functions over a freshly read GPU, or over the agent's
state of it with each candidate parent asked before it is chosen (:func:`choose_parent`); the
writes go through the node manager's executor, so the DRA path and the layout path
touch the kernel the same way.
"""

from __future__ import annotations

import errno
import logging
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
from dra_bridge.rpc.types import ClaimRef
from mdev_manager.actions import DisableVfs, EnableVfs
from mdev_manager.discovery import read_available as read_available  # asked before a parent is chosen
from mdev_manager.discovery import read_function, read_gpu
from mdev_manager.executor import Executor
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, link_name
from mdev_manager.host.nvml import NVML_ERROR_IN_USE, NVML_ERROR_NOT_FOUND, Mig, NvmlError
from mdev_manager.models import Gpu, MdevParent, MigPlacement
from mdev_manager.plan import native_driver

log = logging.getLogger(__name__)


class PrepareError(Exception):
    """A per-claim error returned to the kubelet."""


def read_one_gpu(env: HostEnv, io: HostIO, address: str, index: int = 0,
                 only_types: set[str] | None = None) -> Gpu | None:
    """The GPU as it is now; ``only_types``: read just those vGPU types of each parent (a vGPU's
    prepare needs one type: 1 of 23 type directories per VF on an L40S)."""
    if not io.exists(env.pci(address)):
        return None
    return read_gpu(env, io, address, index, read_function(env, io, address), only_types=only_types)


def choose_parent(gpu: Gpu, type_id: str, taken: set[str], first: str | None = None,
                  avoid: AbstractSet[str] = frozenset(), available: Callable[[str, str], int] | None = None
                  ) -> tuple[str, str]:
    """(framework, parent) for a new vGPU of ``type_id``, ``first`` tried first (a re-creation
    keeps its parent where it can), parents in ``avoid`` last (VFs a layout record names: its
    restore would want them back); PrepareError says why none fits.

    ``available`` (parent, type -> free instances now): ``gpu`` is the agent's state in memory, read
    before other claims' vGPUs were made or freed; what it shows only orders the parents (free first)
    and each candidate is asked now, one attribute, before it is chosen. The parents other claims'
    records hold (``taken``) are never asked: the records are current where the state may not be."""
    offered = next((t for t in gpu.types if t.id == type_id), None)
    if offered is None:
        raise PrepareError(f"GPU {gpu.address} does not offer vGPU type {type_id} (driver {gpu.driver}, "
                           f"framework {gpu.framework})")
    busy = {v.parent for v in gpu.vgpus} | taken
    if available is None:
        for p in sorted(gpu.parents, key=lambda p: (p.address != first, p.address in avoid)):
            if gpu.framework != "mdev" and p.address in busy:
                continue
            t = next((t for t in p.types if t.id == type_id), None)
            if t is not None and t.available_instances > 0:
                return offered.framework, p.address
    else:
        def shown_free(p: MdevParent) -> bool:
            t = next((t for t in p.types if t.id == type_id), None)
            return t is not None and t.available_instances > 0 and (gpu.framework == "mdev" or p.address not in busy)

        for p in sorted(gpu.parents, key=lambda p: (p.address != first, p.address in avoid, not shown_free(p))):
            if gpu.framework != "mdev" and p.address in taken:
                continue
            if available(p.address, type_id) > 0:
                return offered.framework, p.address
    held = Counter(v.type_name for v in gpu.vgpus)
    on = ", ".join(f"{n} x {name}" for name, n in sorted(held.items()))
    why = f"no free instance beside the {on} it holds" if held else "no free instance"
    if taken:
        why += f" ({len(taken)} parent(s) taken by other claims' records)"
    raise PrepareError(f"GPU {gpu.address} cannot create {offered.name} now: {why}")


def switch_mig_mode(ex: Executor, gpu: Gpu, enable: bool) -> None:
    """A dual-mode GPU (``migMode: auto``) into the mode of the claim being prepared: the
    scheduler's compatibility groups allocated it only because no claim of the other mode holds
    the GPU, so it is empty; NVML refuses the switch otherwise (in use), and so do we, first."""
    assert gpu.mig is not None
    held = [v.id for v in gpu.vgpus] + [f"GPU instance {g.id}" for g in gpu.mig.instances]
    if held:
        raise PrepareError(f"GPU {gpu.address} must leave {'time-sliced' if enable else 'MIG'} mode for this claim "
                           f"but holds {', '.join(held[:4])}")
    mig = Mig(ex.io.nvml())
    try:
        mig.set_mode(gpu.address, enable)
        state = mig.state(gpu.address) or {}
    except NvmlError as exc:
        raise PrepareError(f"GPU {gpu.address}: MIG mode not switched {'on' if enable else 'off'}: {exc}") from None
    if bool(state.get("enabled")) != enable:  # a board that needs a GPU reset first (pending != current)
        raise PrepareError(f"GPU {gpu.address}: MIG mode {'on' if enable else 'off'} is pending a GPU reset")
    log.info("GPU %s: MIG mode %s for a claim of that mode", gpu.address, "on" if enable else "off")


def create_instance(ex: Executor, rec: PreparedDeviceRecord) -> None:
    """A MIG-backed vGPU's GPU instance, at the allocated placement (NVML
    ``nvmlDeviceCreateGpuInstanceWithPlacement``); its id goes into the record. A vGPU that shares
    its instance (``placement`` inside it) joins the instance there, if another vGPU made it already."""
    if rec.gi_profile is None or rec.gpu_instance is not None:
        return
    start, size = rec.gi_start, rec.gi_size
    if start is None or size is None:  # planned with its profile (plan_mig_vgpu): a record without is corrupt
        raise PrepareError(f"GPU {rec.gpu}: the record of {rec.device} names GPU instance profile {rec.gi_profile} "
                           "but no placement")
    mig = Mig(ex.io.nvml())
    try:
        if rec.placement is not None:
            there = [gi["id"] for gi in (mig.state(rec.gpu) or {}).get("instances", [])
                     if gi["profile_id"] == rec.gi_profile and gi["placement"]["start"] == start]
            if there:
                rec.gpu_instance = there[0]
                return
        rec.gpu_instance = mig.create(rec.gpu, rec.gi_profile, start, size)
    except NvmlError as exc:
        raise PrepareError(f"GPU {rec.gpu}: GPU instance (profile {rec.gi_profile}) at memory slices "
                           f"{start}-{start + size - 1} not created: {exc}") from None


def vgpu_of(rec: PreparedDeviceRecord) -> tuple[str, str, str]:
    """(parent, type id, vGPU id) of a vGPU's record: a planned vGPU has all three (:func:`plan_vgpu`,
    :func:`plan_mig_vgpu`), so a record without one is corrupt, said in one line."""
    if rec.parent is None or rec.type_id is None or rec.vgpu_id is None:
        raise PrepareError(f"GPU {rec.gpu}: the record of {rec.device} names no vGPU (parent {rec.parent}, "
                           f"type {rec.type_id}, id {rec.vgpu_id})")
    return rec.parent, rec.type_id, rec.vgpu_id


def create_vgpu(ex: Executor, gpu: Gpu, rec: PreparedDeviceRecord) -> None:
    parent, type_id, vgpu_id = vgpu_of(rec)
    if rec.framework == "vendor-vfio":
        ex.set_vgpu_type(parent, type_id, rec.gpu_instance)
    else:
        ex.create_mdev(parent, type_id, vgpu_id)


def remove_vgpu(ex: Executor, env: HostEnv, io: HostIO, rec: PreparedDeviceRecord) -> None:
    """The record's vGPU (a record without a parent made none), then its GPU instance."""
    parent = rec.parent
    if parent is not None and rec.framework == "vendor-vfio":
        cur = env.pci(parent) / "nvidia" / "current_vgpu_type"
        if io.exists(cur) and io.read(cur).strip() == rec.type_id:
            ex.set_vgpu_type(parent, "0")
    elif parent is not None and rec.vgpu_id:
        ex.remove_mdev(parent, rec.vgpu_id)
    remove_instance(ex, rec)


def remove_instance(ex: Executor, rec: PreparedDeviceRecord) -> None:
    """The GPU instance prepare made, once no vGPU lives on it (NVML refuses it otherwise): found by
    its placement, so a crash before its id was recorded, or a reboot, leaves nothing behind. An
    instance this vGPU shared (MIG time-slicing) stays while another vGPU lives on it: the last to
    leave removes it."""
    if rec.gi_profile is None:
        return
    mig = Mig(ex.io.nvml())
    try:
        state = mig.state(rec.gpu)
        for gi in (state or {}).get("instances", []):
            if gi["profile_id"] == rec.gi_profile and gi["placement"]["start"] == rec.gi_start:
                try:
                    mig.destroy(rec.gpu, gi["id"])
                except NvmlError as exc:
                    if exc.code != NVML_ERROR_IN_USE or rec.placement is None:
                        raise
                    log.info("GPU %s: GPU instance %s kept: another vGPU lives on it", rec.gpu, gi["id"])
    except NvmlError as exc:
        if exc.code != NVML_ERROR_NOT_FOUND:
            raise OSError(errno.EBUSY, f"GPU instance at slice {rec.gi_start} of {rec.gpu}: {exc}") from None


def plan_mig_vgpu(gpu: Gpu, rec: PreparedDeviceRecord, placement: MigPlacement, profile_id: int, taken: set[str],
                  prefer: PreparedDeviceRecord | None = None, avoid: AbstractSet[str] = frozenset(),
                  inside: MigPlacement | None = None) -> PreparedDeviceRecord:
    """A MIG-backed vGPU: its GPU instance at the allocated placement, then the vGPU on a free VF.
    ``inside``: the vGPU shares its instance (MIG time-slicing) at that placement inside it; an
    instance there of its profile holding only vGPUs of its type, that placement free, is joined."""
    if gpu.mig is None or not gpu.mig.enabled:
        raise PrepareError(f"GPU {gpu.address} is not in MIG mode; {rec.device} cannot be made")
    slices = set(placement.slices)
    for g in gpu.mig.instances:
        if not slices & set(g.placement.slices):
            continue
        if inside is None or (g.profile_id, g.placement) != (profile_id, placement):
            raise PrepareError(f"GPU {gpu.address}: memory slices {placement.start}-{placement.start + placement.size - 1} "
                               f"are held by GPU instance {g.id}" + (f" ({g.vgpu})" if g.vgpu else ""))
        on = [v for v in gpu.vgpus if v.id in (g.vgpus or ([g.vgpu] if g.vgpu else [])) or v.gpu_instance == g.id]
        other = next((v for v in on if v.type_id != rec.type_id), None)
        if other is not None:
            raise PrepareError(f"GPU {gpu.address}: GPU instance {g.id} holds {other.type_name} ({other.id}); "
                               f"{rec.device} is another type")
        end = inside.start + inside.size
        held = next((v for v in on if v.placement_id is not None and v.placement_id < end
                     and inside.start < v.placement_id + inside.size), None)
        if held is not None:
            raise PrepareError(f"GPU {gpu.address}: placement {inside.start} inside GPU instance {g.id} is held by "
                               f"vGPU {held.id}")
    busy = {v.parent for v in gpu.vgpus} | taken
    first = prefer.parent if prefer else None
    vfs = sorted((vf.address for vf in gpu.vfs if vf.address not in busy),
                 key=lambda a: (a != first, a in avoid, a))
    if not vfs:
        raise PrepareError(f"GPU {gpu.address} has no free VF for {rec.device}")
    parent = vfs[0]
    taken.add(parent)
    framework = "vendor-vfio" if gpu.framework == "vendor-vfio" else "mdev"
    if framework == "vendor-vfio":
        vgpu_id = parent
    elif prefer is not None and prefer.vgpu_id and prefer.framework == "mdev":
        vgpu_id = prefer.vgpu_id
    else:
        vgpu_id = str(uuidlib.uuid4())
    return rec.model_copy(update={"framework": framework, "parent": parent, "vgpu_id": vgpu_id,
                                  "gi_profile": profile_id, "gi_start": placement.start,
                                  "gi_size": placement.size, "gpu_instance": None,
                                  "placement": inside.start if inside else None,
                                  "placement_size": inside.size if inside else None})


def plan_vgpu(gpu: Gpu, rec: PreparedDeviceRecord, taken: set[str],
              prefer: PreparedDeviceRecord | None = None, avoid: AbstractSet[str] = frozenset(),
              available: Callable[[str, str], int] | None = None) -> PreparedDeviceRecord:
    """Where the vGPU goes; ``prefer`` (the record from before a reboot) keeps its parent and mdev UUID;
    ``available``: ``gpu`` is the state kept in memory, each parent asked now (:func:`choose_parent`)."""
    if rec.type_id is None:  # a vGPU's record is made with the type its device offers
        raise PrepareError(f"GPU {gpu.address}: {rec.device} names no vGPU type")
    framework, parent = choose_parent(gpu, rec.type_id, taken, prefer.parent if prefer else None, avoid, available)
    if framework == "vendor-vfio":
        vgpu_id = parent  # a vendor-VFIO vGPU is known by its VF
    elif prefer is not None and prefer.framework == "mdev" and prefer.vgpu_id:
        vgpu_id = prefer.vgpu_id
    else:
        vgpu_id = str(uuidlib.uuid4())
    taken.add(parent)
    return rec.model_copy(update={"framework": framework, "parent": parent, "vgpu_id": vgpu_id})


def plan_placement(gpu: Gpu, rec: PreparedDeviceRecord, slots: MigPlacement,
                   sizes: dict[str, int]) -> PreparedDeviceRecord:
    """A mixed-size device's vGPU: the GPU must be in mixed-size mode and the device's slots free
    (``sizes``: type id -> slots of the types published on the GPU, for the vGPUs it holds); the
    record carries the placement, on disk before the vGPU is made."""
    end = slots.start + slots.size
    if gpu.placements is None or not gpu.placements.enabled:
        raise PrepareError(f"GPU {gpu.address} is not in mixed-size mode (a reboot or a driver reload clears it, "
                           f"the node manager sets it again); {rec.device} cannot be placed")
    for v in gpu.vgpus:
        size = sizes.get(v.type_id)
        if v.placement_id is not None and size and v.placement_id < end and slots.start < v.placement_id + size:
            raise PrepareError(f"GPU {gpu.address}: slots {slots.start}-{end - 1} of {rec.device} are held by vGPU "
                               f"{v.id} ({v.type_name} at {v.placement_id})")
    return rec.model_copy(update={"placement": slots.start, "placement_size": slots.size})


def place_vgpu(ex: Executor, rec: PreparedDeviceRecord) -> None:
    """Move a vGPU just made (the driver put it at its type's lowest creatable placement) to its
    record's placement, through ``placement_id``, and read it back (the executor's step)."""
    if rec.placement is None or not rec.parent or not rec.vgpu_id:
        return
    try:
        ex.set_placement(rec.parent, rec.vgpu_id, rec.placement)
    except OSError as exc:
        end = rec.placement + (rec.placement_size or 1) - 1
        raise PrepareError(f"vGPU {rec.vgpu_id} of {rec.device} not placed at slots {rec.placement}-{end} of GPU "
                           f"{rec.gpu}: {exc.strerror or exc}") from None


def placement_order(records: list[PreparedDeviceRecord]) -> list[PreparedDeviceRecord]:
    """The order to make a claim's devices in: placed vGPUs by GPU and placement, lowest first (see
    :func:`creation_order`), the others after, as allocated."""
    return sorted(records, key=lambda d: (d.placement is None, d.gpu if d.placement is not None else "",
                                          d.placement if d.placement is not None else 0))


def creation_order(refs: list[ClaimRef], records: dict[str, ClaimRecord]) -> list[ClaimRef]:
    """The claims of one prepare call in the order to make them: those re-created at recorded
    placements (after a reboot) by their lowest placement, then the others, as asked.

    A vGPU is created at its type's lowest creatable placement, then moved. Made in increasing
    placement order on a GPU, that temporary spot is never a placement another claim recorded: a
    spot ``q < p`` of size ``s`` ends before ``p + s``, and every later placement, disjoint from
    ``[p, p + s)``, starts there or after; every earlier one is back already. (Where the kubelet
    asks in separate calls a temporary spot may be another's, for one step under the node lock:
    the move follows at once, and a failed move removes the vGPU.)"""
    def key(item: tuple[int, ClaimRef]) -> tuple[int, int, int]:
        k, ref = item
        rec = records.get(ref.uid)
        starts = [d.placement for d in rec.devices if d.placement is not None] if rec else []
        return (0, min(starts), k) if starts else (1, 0, k)

    return [ref for _, ref in sorted(enumerate(refs), key=key)]


def vgpu_present(env: HostEnv, io: HostIO, rec: PreparedDeviceRecord) -> bool:
    """Whether the host holds the recorded vGPU (an mdev of that UUID, a VF carrying that type)."""
    if rec.kind != "vgpu" or not rec.vgpu_id:
        return False
    if rec.framework == "vendor-vfio":
        cur = env.pci(rec.vgpu_id) / "nvidia" / "current_vgpu_type"
        return io.exists(cur) and io.read(cur).strip() == rec.type_id
    return io.exists(env.mdev_devices / rec.vgpu_id)


def device_present(env: HostEnv, io: HostIO, rec: PreparedDeviceRecord) -> bool:
    """The recorded vGPU exists, or the recorded GPU is on vfio-pci."""
    if rec.kind == "passthrough":
        return link_name(io, env.pci(rec.gpu) / "driver") == "vfio-pci"
    return vgpu_present(env, io, rec)


def passthrough_moves(gpu: Gpu) -> list[str]:
    """The functions of the GPU's IOMMU group that passing it through moves to vfio-pci."""
    if gpu.vgpus:
        raise PrepareError(f"GPU {gpu.address} holds vGPUs ({len(gpu.vgpus)}); it cannot be passed through")
    return [addr for addr, driver in sorted((gpu.iommu_group_drivers or {gpu.address: gpu.driver}).items())
            if driver != "vfio-pci"]


def bind_passthrough(ex: Executor, gpu: Gpu) -> list[str]:
    """Bind every function of the GPU's IOMMU group to vfio-pci; return the ones this moved.

    Idle SR-IOV VFs (a ``dra`` GPU keeps them on for vGPUs) are turned off first: a GPU
    whose VFs are enabled cannot be unbound (kernel.md), and no VF holds a vGPU here.
    """
    moved = passthrough_moves(gpu)
    if gpu.sriov_num_vfs:
        ex.apply(DisableVfs(gpu=gpu.address))
    for addr in moved:
        ex.bind(addr, "vfio-pci")
    return moved


def release_passthrough(ex: Executor, gpu: Gpu | None, rec: PreparedDeviceRecord) -> None:
    """Return what prepare moved to vfio-pci to its native driver."""
    if gpu is None or native_driver(gpu) is None:
        return
    for addr in rec.rebound:
        ex.bind(addr, None)
    if rec.vfs_disabled:
        ex.apply(EnableVfs(gpu=gpu.address, count=rec.vfs_disabled))
