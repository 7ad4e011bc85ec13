"""Free vGPUs per physical GPU and profile, as the agent's metrics report them (pure).

What "free" means follows the GPU's mode, because that is what a new workload can get:

* ``vgpu`` (the layout made the vGPUs): its vGPUs that nothing uses (no process holds them, no
  libvirt domain, prepared claim or device-plugin allocation names them); the layout, not a
  workload, decides how many exist;
* ``dra`` (the kubelet plugin creates a vGPU per claim): for every profile the node publishes on
  the GPU, the instances the GPU can still create now (the kernel's ``available_instances``,
  which already counts the vGPUs prepared claims hold and the equal-size rule).

Passthrough and unmanaged GPUs hold no vGPU profile and get no series. The scheduler's view
(claims allocated but not prepared yet) is ``vgpuctl capacity``'s, which reads the cluster.
"""

from __future__ import annotations

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import Pool
from mdev_manager.models import Inventory, Usage
from mdev_manager.plan import vgpu_users


def free_vgpus(inv: Inventory, pool: Pool, vgpu_mode: set[str], usage: Usage) -> dict[tuple[str, str], int]:
    """``(gpu address, profile short name) -> free vGPUs``; ``usage`` matters only for vgpu-mode GPUs."""
    out: dict[tuple[str, str], int] = {}
    published = {(d.gpu, d.type_id) for d in pool.devices if d.kind == "vgpu"}
    for g in inv.gpus:
        types = {t.id: t for t in g.types if not t.mig_backed}
        if g.address in vgpu_mode:
            for v in g.vgpus:
                t = types.get(v.type_id)
                if t is None:
                    continue
                key = (g.address, t.short_name)
                out[key] = out.get(key, 0) + (0 if vgpu_users(v, usage) else 1)
            continue
        for tid, t in types.items():
            if (g.address, tid) in published:
                out[(g.address, t.short_name)] = max(0, t.available_instances or 0)
    return out


def counters_in_use(pool: Pool, prepared: set[str]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """``(gpu, counter set, counter) -> (capacity, used)`` of the published shared counters;
    ``used`` sums what the devices of the prepared claims (``prepared``: device names) consume."""
    gpu_of = {c.counter_set: d.gpu for d in pool.devices for c in d.consumes}
    used: dict[tuple[str, str], int] = {}
    for d in pool.devices:
        if d.name in prepared:
            for c in d.consumes:
                for counter, value in c.counters.items():
                    used[(c.counter_set, counter)] = used.get((c.counter_set, counter), 0) + int(parse_quantity(value))
    return {(gpu_of[cs.name], cs.name, counter): (int(parse_quantity(cap)), used.get((cs.name, counter), 0))
            for cs in pool.counter_sets if cs.name in gpu_of for counter, cap in cs.counters.items()}
