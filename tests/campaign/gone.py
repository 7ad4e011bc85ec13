"""A GPU leaves the bus and comes back while the agent is stopped, and an admin applies by hand.

Split from :mod:`.steps` (its size). The step is issue 36's "apply without the agent across an
unplug and replug of the first, middle and last GPU": the layout is the selected one written by
``index`` (the node's numbering), as an admin's file would be, so an index that moved onto
another GPU (a numbering only ``serve`` keeps, a gone GPU giving up its place) lays out the wrong
GPU or is refused, and the step says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from mdev_manager.discovery import discover
from tests.campaign import oracle
from tests.campaign.steps import Checks, _checkpoint
from tests.campaign.world import World

PLACES = ("first", "middle", "last")


def by_index(layout: list[dict], numbers: dict[str, int]) -> list[dict]:
    """``layout`` with each ``pciAddress`` selector written as the GPU's ``index``."""
    return [{**{k: v for k, v in e.items() if k != "pciAddress"}, "index": numbers[e["pciAddress"]]}
            if e.get("pciAddress") in numbers else e for e in layout]


@dataclass(frozen=True)
class GpuGone:
    """The node's ``where`` GPU (in PCI order: first, middle, last) leaves the bus while the agent is
    stopped; an admin runs ``vgpuctl apply`` with layout ``name`` written by index while it is gone
    and again once it is back (cold); then the agent starts again. After each apply every GPU on the
    bus is as the layout says for it, or kept so by what is in use; the gone GPU's entry waits.
    A GPU anything holds (a claim's record, a VM, a libvirt domain) is left on the bus: what it
    holds would die with it, which is not what this step asks about."""

    where: str
    name: str

    def run(self, world: World) -> Checks:
        io = world.node.io
        cp = _checkpoint(world)
        inv = discover(world.env, io, node=world.node.node)
        if cp is None or not inv.gpus:
            return Checks()
        gpus = sorted(inv.gpus, key=lambda g: g.address)
        gpu = gpus[{"first": 0, "middle": len(gpus) // 2, "last": len(gpus) - 1}[self.where]]
        mine = {gpu.address, *gpu.iommu_group_drivers, *(vf.address for vf in gpu.vfs), *(v.id.lower() for v in gpu.vgpus)}
        if set(oracle.holders(world, cp)) & mine or any(d.gpu == gpu.address for r in cp.claims.values()
                                                         for d in r.devices):
            world.log.append(f"GPU {gpu.address} not unplugged: something holds it")
            return Checks()
        indexed = f"{self.name}-by-index"
        world.layouts[indexed] = by_index(world.layouts[self.name], {g.address: g.index for g in inv.gpus})
        world.write_layouts()
        world.stop_daemon()
        problems: list[str] = []
        try:
            world.node.host.unplug(gpu.address)
            world.log.append(f"GPU {gpu.address} ({self.where}) left the bus; the agent is stopped")
            problems += _apply(world, indexed, self.name, f"with GPU {gpu.address} off the bus")
            world.node.host.replug(gpu.address)
            world.log.append(f"GPU {gpu.address} is back")
            problems += _apply(world, indexed, self.name, f"with GPU {gpu.address} back")
        finally:
            del world.layouts[indexed]
            world.write_layouts()
            world.restart_daemon()
        return Checks(problems=problems)


def _apply(world: World, indexed: str, name: str, when: str) -> list[str]:
    code, out, err = world.vgpuctl_main("apply", "--layout", indexed)
    world.log.append(f"vgpuctl apply --layout {indexed} {when}: exit {code}\n{out[-2000:]}{err[-1500:]}")
    if code not in (0, 3):
        return [f"vgpuctl apply --layout {indexed} {when} exited {code}: {err.strip()[-400:]}"]
    cp = _checkpoint(world)
    if cp is None:
        return []
    inv = discover(world.env, world.node.io, node=world.node.node)
    wrong = [v for v in oracle.judge(world, name, inv, cp) if not v.matches and not v.blocked and v.why != "the GPU is gone"]
    return [f"vgpuctl apply --layout {indexed} {when} (exit {code}) left: " + " | ".join(map(str, wrong))] if wrong else []
