"""A MIG-capable GPU offering MIG-backed and time-sliced vGPUs at once (layout ``migMode: auto``).

A GPU runs in one mode at a time: MIG (GPU instances, MIG-backed vGPUs on them) or not
(time-sliced vGPUs). Where the API server keeps compatibility groups (KEP-5963,
``DRADeviceCompatibilityGroups``), both kinds are published on the GPU's one counter set and
kept apart by their groups: every MIG placement is in group ``mig``, every time-sliced slot in
its size's group (``fb-<MiB>``; ``time-sliced`` on a mixed-size GPU), and the scheduler
co-allocates devices of one counter set only where their groups intersect. So the first claim
allocated on an empty GPU decides its mode for as long as any claim holds it, and prepare
switches the GPU's MIG mode to match (only while the GPU holds nothing, as NVML requires).

The counter set is the union of the two: NVIDIA's MIG counters (engines, ``memory`` in bytes,
``memory-slice-<k>``) and the time-sliced fair-share counters, ``memory`` renamed
``vgpu-memory`` so the two totals never mix, and ``vgpus``. The whole GPU consumes all of it.
Where groups are not kept, :mod:`.devices` publishes the GPU's current mode only. Pure.
"""

from __future__ import annotations

from dra_bridge.api.attributes import ATTR_MIG_ENABLED
from dra_bridge.api.names import type_is_mig_backed
from dra_bridge.pool.model import Consumption, CounterSet, GpuPolicy, Pool, attr_bool
from mdev_manager.models import Gpu

#: The compatibility group of every MIG placement of a dual-mode GPU.
MIG_GROUP = "mig"
#: The group of the time-sliced slots of a mixed-size GPU (equal-size ones carry ``fb-<MiB>``).
TIME_SLICED_GROUP = "time-sliced"
#: What the time-sliced ``memory`` fair-share counter is called beside the MIG counters.
SLICED_MEMORY = "vgpu-memory"


def _split(gpu: Gpu, pol: GpuPolicy, mig: bool) -> GpuPolicy:
    if pol.vgpu_types is None:
        return pol
    keep = [r for r in pol.vgpu_types if (t := gpu.type_by_ref(r)) is None or type_is_mig_backed(t) == mig]
    return pol.model_copy(update={"vgpu_types": keep})


def time_sliced_policy(gpu: Gpu, pol: GpuPolicy) -> GpuPolicy:
    """The policy's time-sliced part (its MIG-backed types are the other mode's)."""
    return _split(gpu, pol, mig=False)


def mig_policy(gpu: Gpu, pol: GpuPolicy) -> GpuPolicy:
    return _split(gpu, pol, mig=True)


def in_mig_mode(gpu: Gpu) -> Gpu:
    """The GPU as its MIG mode would show it (the placements do not depend on the current mode)."""
    assert gpu.mig is not None
    return gpu.model_copy(update={"mig": gpu.mig.model_copy(update={"enabled": True})})


def merge_modes(pool: Pool, gpu: Gpu, sliced: Pool, mig: Pool) -> None:
    """``sliced`` and ``mig`` (each one GPU's counter set and devices) as one counter set into ``pool``."""
    pool.warnings += sliced.warnings + mig.warnings
    if not mig.counter_sets and not sliced.counter_sets:
        return
    base = (mig.counter_sets or sliced.counter_sets)[0]
    counters: dict[str, int | str] = dict(mig.counter_sets[0].counters) if mig.counter_sets else {}
    for cs in sliced.counter_sets:
        counters.update({_rename(k): v for k, v in cs.counters.items()})
    pool.counter_sets.append(CounterSet(name=base.name, counters=counters))
    whole = next((d for d in mig.devices if d.kind == "passthrough"), None) or \
        next((d for d in sliced.devices if d.kind == "passthrough"), None)
    if whole is not None:
        whole = whole.model_copy(deep=True)
        whole.attributes[ATTR_MIG_ENABLED] = attr_bool(bool(gpu.mig and gpu.mig.enabled))
        whole.consumes = [Consumption(counter_set=base.name, counters={k: str(v) for k, v in counters.items()})]
        pool.devices.append(whole)
    for d in sliced.devices:
        if d.kind == "passthrough":
            continue
        d.consumes = [c.model_copy(update={"counters": {_rename(k): v for k, v in c.counters.items()},
                                           "compatibility_groups": c.compatibility_groups or [TIME_SLICED_GROUP]})
                      for c in d.consumes]
        pool.devices.append(d)
    for d in mig.devices:
        if d.kind == "passthrough":
            continue
        d.consumes = [c.model_copy(update={"compatibility_groups": [MIG_GROUP]}) for c in d.consumes]
        pool.devices.append(d)


def offers_both_modes(pool: Pool, gpu_address: str) -> bool:
    """Whether ``pool`` publishes both kinds of vGPU of that GPU (so a claim may switch its mode)."""
    kinds = {d.placement is not None for d in pool.devices if d.gpu == gpu_address and d.kind == "vgpu"}
    return kinds == {True, False}


def _rename(counter: str) -> str:
    return SLICED_MEMORY if counter == "memory" else counter
