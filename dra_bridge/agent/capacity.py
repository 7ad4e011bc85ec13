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
