"""A claim's plan: for each device allocated to it, the record of what its prepare makes and where
(a vGPU's parent and id, a MIG-backed vGPU's GPU instance, a mixed-size vGPU's placement, a whole
GPU), planned on the GPUs read for it before anything is made. The driver records the plan as the
claim's intent, then makes it (:mod:`.effects`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dra_bridge.kubeletplugin.claimconfig import VgpuConfigError, pick_type, requested_type
from dra_bridge.kubeletplugin.effects import (
    PrepareError,
    plan_mig_vgpu,
    plan_placement,
    plan_vgpu,
    read_available,
    read_one_gpu,
    switch_mig_mode,
)
from dra_bridge.kubeletplugin.state import PreparedDeviceRecord
from dra_bridge.pool.devices import Pool
from dra_bridge.pool.dualmode import offers_both_modes
from dra_bridge.pool.mixed import slot_sizes
from dra_bridge.pool.model import PoolDevice
from dra_bridge.rpc.types import ClaimRef
from mdev_manager import persist
from mdev_manager.executor import Executor
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Gpu

#: what a prepare read a GPU for: a vGPU type on it (its parents of that type), or the whole GPU (passthrough)
GpuKey = str | tuple[str, str | None]


def plan_claim(ref: ClaimRef, results: list[dict], pool: Pool, prefer: dict[str, PreparedDeviceRecord],
               claim: dict | None, taken: set[str], *, env: HostEnv, io: HostIO, ex: Executor, pool_name: str,
               driver: str, holds: Callable[[str], bool], gpu_state: Callable[[str], Gpu | None] | None
               ) -> tuple[list[PreparedDeviceRecord], dict[GpuKey, Gpu]]:
    """Each allocated device's record (what its prepare makes, and where) and the GPUs read for them.

    ``taken``: VFs other claims' records name (:meth:`.prepared.PreparedClaims.recorded_vfs`);
    ``holds``: whether this call holds a GPU's lock; ``gpu_state``: the agent's state of a GPU in
    memory (:func:`kept_state`). A GPU whose MIG mode this claim's device needs switched (migMode: auto)
    is switched here, before its devices are planned."""
    avoid: set[str] | None = None  # VFs a layout record names (a restore would take them back)
    records = []
    gpus: dict[GpuKey, Gpu] = {}
    for r in results:
        where = f"claim {ref.namespace}/{ref.name} request {r.get('request')}"
        if r.get("pool") != pool_name:
            raise PrepareError(f"{where}: device {r.get('device')} is in pool {r.get('pool')}, "
                               f"this node's pool is {pool_name}")
        dev = pool.device(r.get("device", ""))
        if dev is None:
            raise PrepareError(f"{where}: device {r.get('device')} no longer exists on this node")
        if not holds(dev.gpu):  # its GPU's lock was taken for another pool: never unlocked
            raise PrepareError(f"{where}: device {dev.name} moved to GPU {dev.gpu} while the claim waited; "
                               "the kubelet's next try prepares it")
        type_id = dev.type_id
        # a size slot (its type id: the default size): the claim's config picks the type
        if dev.kind == "vgpu" and dev.type_choices and type_id is not None:
            try:
                wanted = requested_type(claim or {}, r.get("request", ""), driver)
                type_id = pick_type(dev.type_choices, type_id, wanted, dev.name)
            except VgpuConfigError as exc:
                raise PrepareError(f"{where}: {exc}") from None
        # a vGPU needs its type's parents only; a whole GPU needs everything (its group, its VFs)
        key: GpuKey = (dev.gpu, type_id) if dev.kind == "vgpu" else dev.gpu
        only = {type_id} if dev.kind == "vgpu" and type_id is not None else None
        kept = None if key in gpus else kept_state(dev, gpu_state)
        gpu = gpus.get(key) or kept or read_one_gpu(env, io, dev.gpu, only_types=only)
        if gpu is None:
            raise PrepareError(f"{where}: GPU {dev.gpu} of device {dev.name} is gone")
        want_mig = dev.placement is not None
        if dev.kind == "vgpu" and gpu.mig is not None and gpu.mig.enabled != want_mig and \
                offers_both_modes(pool, dev.gpu):  # migMode: auto: this claim's mode is the GPU's now
            try:
                switch_mig_mode(ex, gpu, want_mig)
            except PrepareError as exc:
                raise PrepareError(f"{where}: {exc}") from None
            gpu = read_one_gpu(env, io, dev.gpu, only_types=only)
            if gpu is None:
                raise PrepareError(f"{where}: GPU {dev.gpu} of device {dev.name} is gone")
            gpus = {k: g for k, g in gpus.items() if g.address != dev.gpu}  # read before the switch
        gpus[key] = gpu
        rec = PreparedDeviceRecord(request=r["request"], pool=r["pool"], device=dev.name, kind=dev.kind,
                                   gpu=dev.gpu, type_id=type_id)
        if dev.kind == "vgpu":
            if gpu.framework == "vendor-vfio" and avoid is None:  # read once, only where a VF is the id
                avoid = set(persist.load_vendor_vfio(env, io))
            try:
                if dev.placement is not None:
                    if dev.gpu_instance_profile is None:  # the pool names both for a MIG-backed device
                        raise PrepareError(f"device {dev.name} has a MIG placement but no GPU instance profile")
                    rec = plan_mig_vgpu(gpu, rec, dev.placement, dev.gpu_instance_profile, taken,
                                        prefer.get(dev.name), avoid or set(), dev.inside)
                elif gpu is kept:
                    try:
                        rec = plan_vgpu(gpu, rec, taken, prefer.get(dev.name), avoid or set(), partial(read_available, env, io))
                    except PrepareError:  # the state in memory misled (a change by hand): the GPU as it is
                        gpu = read_one_gpu(env, io, dev.gpu, only_types=only)
                        if gpu is None:
                            raise PrepareError(f"GPU {dev.gpu} of device {dev.name} is gone") from None
                        gpus[key] = gpu
                        rec = plan_vgpu(gpu, rec, taken, prefer.get(dev.name), avoid or set())
                else:
                    rec = plan_vgpu(gpu, rec, taken, prefer.get(dev.name), avoid or set())
                if dev.slots is not None:  # mixed-size: made at the device's placement
                    rec = plan_placement(gpu, rec, dev.slots, slot_sizes(pool, dev.gpu))
            except PrepareError as exc:
                raise PrepareError(f"{where}: {exc}") from None
        records.append(rec)
    return records, gpus

def kept_state(dev: PoolDevice, gpu_state: Callable[[str], Gpu | None] | None) -> Gpu | None:
    """The agent's state of a vGPU device's GPU, where a prepare may plan on it instead of reading the
    GPU: a vGPU chosen by its parents' free instances alone (each asked before it is chosen), not a
    MIG-backed or mixed-size one (their GPU instances and placements are read as they are now)."""
    if gpu_state is None or dev.kind != "vgpu" or dev.placement is not None or dev.slots is not None:
        return None
    gpu = gpu_state(dev.gpu)
    if gpu is None or gpu.framework not in ("mdev", "mdev-sriov") or (gpu.mig is not None and gpu.mig.enabled) \
            or (gpu.placements is not None and gpu.placements.enabled):
        return None
    return gpu
