"""The pool for an API server that drops the shared counters (issue #14).

With ``DRAPartitionableDevices`` off (the default on 1.34 and 1.35) kube-apiserver stores the
slices without ``sharedCounters`` and ``consumesCounters``: every device is then independent to
the scheduler, which could allocate a whole GPU together with its vGPUs, or vGPU slots of several
types (or sizes) that no GPU can hold at once. What stays safe is what holds without counters:
per physical GPU, either the whole GPU, or the slots of *one* vGPU type (a type's slots number its
maximum instances, so any subset of them is creatable; a MIG-backed type's slots are its profile's
placements, which never overlap one another, cut to the profile's instance count) — never both,
and never two types (on a GPU in mixed-size mode: one size's placements, none overlapping another or a
vGPU the GPU holds, :func:`.mixed.safe_devices`). A GPU
gets the slots of the type it already holds vGPUs of, else of the first type its policy offers;
the whole GPU only when it offers no vGPU type. The counter sets are left out too (the server
would drop them anyway). Pure: the agent applies it when it has found the counters dropped.
"""

from __future__ import annotations

from dra_bridge.pool.devices import Pool
from dra_bridge.pool.mixed import safe_devices
from mdev_manager.models import Inventory


def without_counters(pool: Pool, inventory: Inventory) -> Pool:
    """``pool`` cut to what cannot be over-allocated without counters (see the module docstring)."""
    out = Pool(warnings=list(pool.warnings))
    by_gpu: dict[str, list] = {}
    for dev in pool.devices:
        by_gpu.setdefault(dev.gpu, []).append(dev)
    for addr, devices in by_gpu.items():
        vgpus = [d for d in devices if d.kind == "vgpu"]
        whole = [d for d in devices if d.kind == "passthrough"]
        if not vgpus:
            keep = whole
        elif any(d.slots is not None for d in vgpus):  # mixed-size: one size's placements (mixed.py)
            keep, size = safe_devices(vgpus, inventory.gpu(addr))
            out.warnings.append(f"GPU {addr}: the API server drops shared counters, so only {size} vGPUs are offered, "
                                "at placements that cannot overlap (not the other sizes"
                                + (", nor the whole GPU" if whole else "") + "); enable DRAPartitionableDevices to "
                                "offer them all safely")
        else:
            gpu = inventory.gpu(addr)
            held = {v.type_id for v in gpu.vgpus} if gpu else set()
            offered = list(dict.fromkeys(d.type_id for d in vgpus))
            chosen = next((t for t in offered if t in held), offered[0])
            keep = [d for d in vgpus if d.type_id == chosen]
            if keep[0].placement is not None:
                # MIG-backed: one profile's placements never overlap one another, but the profile
                # may have fewer instances than placements (one "+me" per GPU): that many at most
                keep = keep[:keep[0].profile_instances or len(keep)]
            dropped = sorted({t for t in offered if t != chosen}) + (["the whole GPU"] if whole else [])
            if dropped:
                out.warnings.append(f"GPU {addr}: the API server drops shared counters, so only vGPU type "
                                    f"{chosen} is offered (not {', '.join(dropped)}); enable "
                                    "DRAPartitionableDevices to offer them all safely")
        for d in keep:
            out.devices.append(d.model_copy(update={"consumes": []}))
    return out
