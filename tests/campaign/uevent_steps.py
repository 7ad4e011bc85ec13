"""Uevent faults (#37.5): the kernel's events about the node reach the agent lost, duplicated,
reordered or in a storm (with an overflow in it); the safety invariants hold, and the agent's next
periodic resync (not a forced one) ends on the node's state.

The events are what the kernel sends for what changed on the host since the last such step (PCI
functions added, removed, bound, unbound; mdevs made, removed), derived from two looks at its sysfs
tree, so the order the campaign's other steps run in decides them, not a thread's timing. They reach
the agent through its event source (:class:`CampaignEvents`), as udev's would.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from hypothesis import strategies as st

from dra_bridge.agent.hotplug import LOST, Deliver, Lost, Uevent
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from tests.campaign.steps import Checks
from tests.campaign.world import World

FAULTS = ("lose", "duplicate", "reorder", "storm", "overflow")


class CampaignEvents:
    """The agent's event source in the campaign: a step delivers (from its own thread)."""

    def __init__(self) -> None:
        self.deliver: Deliver | None = None

    def start(self, deliver: Deliver) -> None:
        self.deliver = deliver

    def stop(self) -> None:
        self.deliver = None


Look = dict[str, tuple[str, str, str | None]]  # name -> (subsystem, DEVPATH, driver)


def look(env: HostEnv) -> Look:
    """The host's PCI functions (with their drivers) and mdevs, as the kernel's events name them."""
    out: Look = {}
    for subsystem, where in (("pci", env.pci_devices), ("mdev", env.mdev_devices)):
        for name in sorted(os.listdir(where)) if where.is_dir() else []:
            path = os.path.realpath(where / name)
            driver = os.path.basename(os.readlink(os.path.join(path, "driver"))) \
                if subsystem == "pci" and os.path.lexists(os.path.join(path, "driver")) else None
            out[name] = (subsystem, "/" + os.path.relpath(path, env.sys_root), driver)
    return out


def events_between(before: Look, after: Look) -> list[Uevent]:
    """The uevents the kernel sent for the change from ``before`` to ``after``, in its order."""
    out: list[Uevent] = []
    for name, (subsystem, path, driver) in before.items():
        now = after.get(name)
        if now is None or now[1] != path:
            if driver:
                out.append(Uevent("unbind", subsystem, path))
            out.append(Uevent("remove", subsystem, path))
        elif now[2] != driver:
            if driver:
                out.append(Uevent("unbind", subsystem, path))
            if now[2]:
                out.append(Uevent("bind", subsystem, path, {"DRIVER": now[2]}))
    for name, (subsystem, path, driver) in after.items():
        if name not in before or before[name][1] != path:
            out.append(Uevent("add", subsystem, path))
            if driver:
                out.append(Uevent("bind", subsystem, path, {"DRIVER": driver}))
    return out


def faulty(events: list[Uevent], fault: str, now: Look, rng: random.Random) -> list[Uevent | Lost]:
    """``events`` as the agent gets them under ``fault``."""
    if fault == "lose":
        return [e for e in events if rng.random() < 0.25]
    if fault == "duplicate":
        return [e for e in events for _ in range(rng.randint(1, 3))]
    if fault == "reorder":
        return rng.sample(events, len(events))
    storm: list[Uevent | Lost] = [*events]
    storm += [Uevent(a, s, p) for s, p, _ in now.values() for a in ("add", "change") if s == "pci"] * 5
    rng.shuffle(storm)
    if fault == "overflow":  # the socket overflowed in the middle: the rest of the storm lost
        cut = rng.randrange(len(storm) + 1)
        storm = [*storm[:cut], LOST]
    return storm


def converged(world: World) -> list[str]:
    """The agent's state of each GPU is the node's."""
    inv = discover(world.env, world.node.io, node=world.node.node)
    agent = world.daemon.inventory if world.daemon is not None else None
    if agent is None:
        return []
    if [g.address for g in agent.gpus] != [g.address for g in inv.gpus]:
        return [f"after uevents the agent knows GPUs {[g.address for g in agent.gpus]}, the node has "
                f"{[g.address for g in inv.gpus]}"]
    return [f"after uevents the agent's state of GPU {g.address} is not the node's"
            for g in inv.gpus if agent.gpu(g.address) != g]


@dataclass(frozen=True)
class Uevents:
    """The kernel's uevents since the last such step reach the agent with ``fault``; then the agent's
    periodic resync."""

    fault: str  # lose | duplicate | reorder | storm | overflow
    n: int

    def run(self, world: World) -> Checks:
        now = look(world.env)
        events = events_between(world.host_seen, now)
        world.host_seen = now
        delivered = faulty(events, self.fault, now, random.Random(self.n))
        deliver = world.uevents.deliver
        if deliver is not None:
            for event in delivered:
                deliver(event)
        err = world.resync(force=False)
        world.log.append(f"{len(events)} uevents, {len(delivered)} delivered ({self.fault}); periodic resync: "
                         f"{err or 'ok'}")
        return Checks(problems=converged(world) if err is None and deliver is not None else [])


def kinds(n: st.SearchStrategy) -> list[tuple[int, st.SearchStrategy]]:
    """The uevent steps with their weights, appended to :func:`tests.campaign.steps.steps`'s kinds."""
    return [(4, st.builds(Uevents, st.sampled_from(FAULTS), n))]
