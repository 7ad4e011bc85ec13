"""Which GPUs the DRA bridge offers, derived from the node layout.

GPUs in mode ``dra`` are offered: their ``vgpus`` keys (if any) are the types offered,
and the first type's framebuffer is the equal-size choice on servers older than 1.37;
``passthrough: true`` also offers the whole GPU; ``mixedSize: true`` offers every size
without compatibility groups; ``migMode: auto`` offers MIG-backed and time-sliced vGPUs of a
MIG-capable GPU side by side (:mod:`.dualmode`). With no layout every GPU is offered.
"""

from __future__ import annotations

from dra_bridge.pool.devices import GpuPolicy, PoolPolicy
from mdev_manager.config import GpuLayout
from mdev_manager.models import Inventory
from mdev_manager.plan import offered_types, resolve_type, select_gpus, size_mode


def policy_from_layout(inv: Inventory, layouts: list[GpuLayout] | None) -> PoolPolicy:
    if layouts is None:
        return PoolPolicy.default()
    gpus = {}
    for addr, entry in select_gpus(inv, layouts).items():
        if entry.mode != "dra":
            continue
        gpu = inv.gpu(addr)
        assert gpu is not None  # select_gpus picks from the inventory's GPUs
        types = [t for t in (resolve_type(offered_types(gpu), ref) for ref in entry.vgpus) if t]
        sliced = [t for t in types if not t.mig_backed]
        gpus[addr] = GpuPolicy(passthrough=entry.passthrough,
                               vgpu_types=[t.id for t in types] or None,
                               equal_size_fb_mib=sliced[0].framebuffer_mib if sliced else None,
                               mixed_size=size_mode(gpu, entry),
                               mig_auto=entry.mig_mode == "auto")
    return PoolPolicy(gpus=gpus)


def with_outside(policy: PoolPolicy, inv: Inventory, claimed: set[str]) -> PoolPolicy:
    """``policy`` with each offered GPU's time-sliced vGPUs that no prepared claim holds (``claimed``:
    the vGPU ids the kubelet plugin's records name) as its ``outside_vgpus``: the published counters
    leave their room out (a vGPU made by hand on a ``dra`` GPU, or one in use that the layout could not
    remove), so the scheduler cannot allocate a slot the GPU cannot make."""
    gpus = dict(policy.gpus)
    for gpu in inv.gpus:
        pol = policy.for_gpu(gpu.address)
        outside = [v.id for v in gpu.vgpus if v.id not in claimed and v.gpu_instance is None]
        if pol is not None and outside:
            gpus[gpu.address.lower()] = pol.model_copy(update={"outside_vgpus": outside})
    return policy.model_copy(update={"gpus": gpus})
