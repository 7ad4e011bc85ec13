"""The campaign's uevents (#37.5) are the kernel's: what :func:`tests.campaign.uevent_steps.events_between`
derives from two looks at the host is what the simulated kernel itself announced meanwhile, and the
faults keep their promises (an overflow ends in a loss marker, a loss never adds an event)."""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections import Counter

from dra_bridge.agent.hotplug import LOST, SocketSource, Uevent
from mdev_manager.sim.uevents import RELAY, send
from tests.campaign.uevent_steps import FAULTS, events_between, faulty, look
from tests.support.dra import make_node, short_tmp


def test_derived_events_are_the_ones_the_kernel_sent():
    with short_tmp("cu") as d:
        node = make_node(d, "default", prepare_gpus=False)
        heard: list[Uevent] = []
        barrier = threading.Event()

        def deliver(event) -> None:
            if isinstance(event, Uevent) and event.subsystem == "barrier":
                barrier.set()
            elif isinstance(event, Uevent):
                heard.append(event)

        source = SocketSource(node.root / RELAY)
        source.start(deliver)
        try:
            before = look(node.env)
            gpu = next(a for a in sorted(os.listdir(node.env.pci_devices))
                       if (node.env.pci_devices / a / "sriov_totalvfs").exists())
            node.io.write(node.env.pci(gpu) / "sriov_numvfs", "4")
            t4 = next(a for a in sorted(os.listdir(node.env.pci_devices))
                      if (node.env.pci_devices / a / "mdev_supported_types").is_dir())
            types = node.env.pci(t4) / "mdev_supported_types"
            t = next(t for t in sorted(os.listdir(types)) if int((types / t / "available_instances").read_text()))
            uid = str(uuid.uuid4())
            node.io.write(types / t / "create", uid)
            send(node.root, "change", "barrier", "/devices/virtual/barrier")
            assert barrier.wait(60), "the barrier never arrived"
            after = look(node.env)
        finally:
            source.stop()
        derived = events_between(before, after)

        def key(e: Uevent) -> tuple[str, str, str]:
            return e.action, e.subsystem, e.devpath

        assert Counter(map(key, derived)) == Counter(map(key, heard))
        assert ("add", "mdev") in {(e.action, e.subsystem) for e in derived}
        rng = random.Random(1)
        for fault in FAULTS:
            got = faulty(derived, fault, after, rng)
            keys = {key(e) for e in got if isinstance(e, Uevent)}
            if fault == "lose":
                assert keys <= set(map(key, derived))
            elif fault == "overflow":
                assert got[-1] is LOST
            else:
                assert set(map(key, derived)) <= keys
