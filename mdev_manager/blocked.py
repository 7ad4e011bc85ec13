"""What in-use devices hold back: the part of a plan that waits for a workload to let go (pure).

A plan never changes a device something uses; :func:`blocked_by_use` names each such device, its
users and what waits for it, so ``apply`` can say "converging" (exit 3) and the agent ``pending``.
"""

from __future__ import annotations

from collections import defaultdict

from mdev_manager.actions import Plan
from mdev_manager.config import GpuLayout
from mdev_manager.models import Blocked, Inventory, Usage
from mdev_manager.modeplan import group_users
from mdev_manager.offers import native_driver
from mdev_manager.selection import select_gpus
from mdev_manager.vgpusteps import vgpu_users


def blocked_by_use(inv: Inventory, layouts: list[GpuLayout], plan: Plan, usage: Usage) -> list[Blocked]:
    """The devices a plan keeps only because something uses them, each with its users and what
    waits for its release (the plan's other skips on the same GPU). Empty: the plan, once run,
    leaves the node as the layout says. A whole GPU a DRA claim holds on a ``dra`` GPU is what
    the layout asks for, not a block."""
    modes = {addr: e.mode for addr, e in select_gpus(inv, layouts).items()}
    waits: dict[str, list[str]] = defaultdict(list)
    for s in plan.skipped:
        if inv.gpu(s.device) is not None:
            waits[s.device].append(s.reason)
    vgpus = {v.id: v for v in inv.all_vgpus()}
    out = []
    for s in plan.skipped:
        if s.held_by and s.device not in vgpus:  # a saved vGPU without a device that a domain names
            out.append(Blocked(device=s.device, gpu=s.gpu, held_by=s.held_by, blocks=s.reason))
            continue
        v = vgpus.get(s.device)
        if v is not None and (users := vgpu_users(v, usage)):
            if modes.get(v.gpu) == "passthrough":
                blocks = f"passing GPU {v.gpu} through: the layout wants the whole GPU"
            elif usage.claims_of(v.id):
                then = "; then " + "; ".join(waits[v.gpu]) if waits[v.gpu] else ""
                blocks = f"the layout: this {v.type_name} belongs to a DRA claim, not to the layout{then}"
            else:
                then = "; then " + "; ".join(waits[v.gpu]) if waits[v.gpu] else ""
                blocks = f"its removal: the layout has no room for this {v.type_name}{then}"
            out.append(Blocked(device=v.id, gpu=v.gpu, held_by=users, blocks=blocks))
            continue
        gpu = inv.gpu(s.device)
        if gpu is not None and modes.get(gpu.address) == "passthrough" and (users := group_users(gpu, usage)):
            out.append(Blocked(device=gpu.address, gpu=gpu.address, held_by=users,
                               blocks="passing it through: its IOMMU group is held by another owner"))
            continue
        if (gpu is not None and modes.get(gpu.address) in ("vgpu", "dra") and gpu.driver == "vfio-pci"
                and (users := group_users(gpu, usage))):
            if modes.get(gpu.address) == "dra" and usage.claims_of(gpu.address):
                continue  # a DRA claim passes it through: what a dra GPU is for
            out.append(Blocked(device=gpu.address, gpu=gpu.address, held_by=users,
                               blocks=f"its return to {native_driver(gpu) or 'its native driver'} for "
                                      + ("DRA claims" if modes.get(gpu.address) == "dra" else "vGPUs")))
    return out
