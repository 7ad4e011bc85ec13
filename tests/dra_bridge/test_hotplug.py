"""Which GPUs a uevent names (#37.1): a PCI function is its GPU or one of its VFs (``physfn``), an
mdev's parent is the directory above it; a function no GPU accounts for means "read everything".
Paths are shaped as the kernel sends them (``DEVPATH``: below the sysfs root, the PCI bridges above
the function), literal and as the simulated host lays its tree out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_bridge.agent.gpustate import owners
from dra_bridge.agent.hotplug import Uevent, event_gpus, function_of, gpus_named, parse_uevent
from tests.support.dra import make_node, short_tmp

PF = "0000:3b:00.0"
BRIDGE = "/devices/pci0000:3a/0000:3a:00.0"
VF = "0000:3b:00.4"
UUID = "0b7c6a3e-1d2f-4e5a-9b8c-7d6e5f4a3b2c"
OWNERS = {PF: PF, VF: PF, "0000:3b:00.1": PF}  # the GPU, a VF, its audio function (IOMMU group member)


@pytest.mark.parametrize(("action", "subsystem", "devpath", "expected"), [
    ("add", "pci", f"{BRIDGE}/{PF}", {PF}),
    ("bind", "pci", f"{BRIDGE}/{VF}", {PF}),  # a VF rebound: its GPU
    ("remove", "pci", f"{BRIDGE}/0000:3b:00.1", {PF}),  # the GPU's audio function
    ("add", "mdev", f"{BRIDGE}/{VF}/{UUID}", {PF}),  # an mdev on a VF: the VF's GPU
    ("remove", "mdev", f"{BRIDGE}/{PF}/{UUID}/", {PF}),  # an mdev on the GPU's own function (T4)
    ("change", "pci", f"{BRIDGE}/{PF}", {PF}),  # MDEV_STATE=registered on the parent
])
def test_an_event_on_a_known_function_names_its_gpu(action, subsystem, devpath, expected):
    assert gpus_named(Uevent(action, subsystem, devpath), OWNERS) == frozenset(expected)


@pytest.mark.parametrize(("subsystem", "devpath"), [
    ("pci", "/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0"),  # a new GPU
    ("pci", f"{BRIDGE}/0000:3b:01.2"),  # a VF the agent has not seen, no physfn read
    ("mdev", f"/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0/{UUID}"),  # an mdev on an unknown parent
    ("pci", "/devices/pci0000:3a"),  # a root bus: no PCI address
    ("mdev", f"/devices/virtual/mtty/{UUID}"),  # an mdev of a non-PCI parent (mtty)
])
def test_an_event_no_gpu_accounts_for_means_read_everything(subsystem, devpath):
    assert gpus_named(Uevent("add", subsystem, devpath), OWNERS) is None


def test_a_new_vf_names_its_gpu_through_its_physfn():
    event = Uevent("add", "pci", f"{BRIDGE}/0000:3b:01.2")
    assert gpus_named(event, OWNERS, physfn=PF) == {PF}
    assert gpus_named(event, OWNERS, physfn="0000:5e:00.0") is None  # a VF of a GPU the agent has not read


def test_another_subsystem_names_no_gpu():
    assert gpus_named(Uevent("add", "block", "/devices/virtual/block/loop0"), OWNERS) == frozenset()
    assert function_of(Uevent("add", "block", "/devices/virtual/block/loop0")) is None


def test_the_kernels_netlink_format_parses():
    msg = (f"add@{BRIDGE}/{VF}/{UUID}\0ACTION=add\0DEVPATH={BRIDGE}/{VF}/{UUID}\0SUBSYSTEM=mdev\0"
           "MDEV_TYPE=nvidia-222\0SEQNUM=4242\0").encode()
    event = parse_uevent(msg)
    assert event == Uevent("add", "mdev", f"{BRIDGE}/{VF}/{UUID}", event.env if event else {})
    assert event is not None and event.env["MDEV_TYPE"] == "nvidia-222" and event.name == UUID
    assert gpus_named(event, OWNERS) == {PF}


@pytest.mark.parametrize("msg", [
    b"libudev\0\xfe\xed\xca\xfe",  # libudev's own messages (a binary header)
    b"add@/devices/x\0ACTION=remove\0DEVPATH=/devices/x\0SUBSYSTEM=pci\0",  # header and fields disagree
    b"add@/devices/x\0ACTION=add\0DEVPATH=/devices/x\0",  # no subsystem
    b"\xff\xfe",
])
def test_what_is_no_uevent_parses_as_none(msg):
    assert parse_uevent(msg) is None


@pytest.fixture(scope="module")
def sim():
    with short_tmp("hp") as d:
        yield make_node(d, "default")


def devpath(sim, address: str) -> str:
    """The function's DEVPATH: its directory below the sysfs root, as the kernel names it."""
    return "/" + os.path.relpath(os.path.realpath(sim.env.pci(address)), sim.env.sys_root)


def test_every_function_of_the_simulated_host_names_its_gpu(sim):
    """Each GPU's functions, VFs and mdevs at their sysfs paths name that GPU; so does a VF the agent
    has not read, through the physfn link the kernel made (read through the host's transport)."""
    inv = sim.inventory()
    owner = owners(inv)
    gpus = [g for g in inv.gpus if g.vfs]
    assert gpus, "the default preset has GPUs with VFs"
    for g in inv.gpus:
        for function in [g.address, *(vf.address for vf in g.vfs)]:
            path = devpath(sim, function)
            assert Path(path).parts[1] == "devices" and path.endswith(function)
            assert gpus_named(Uevent("add", "pci", path), owner) == {g.address}
            assert gpus_named(Uevent("add", "mdev", f"{path}/{UUID}"), owner) == {g.address}
    g = gpus[0]
    vf = g.vfs[0].address
    unknown_vf = {k: v for k, v in owner.items() if k != vf}
    assert gpus_named(Uevent("add", "pci", devpath(sim, vf)), unknown_vf) is None
    for action in ("add", "bind"):  # the kernel adds a VF, then binds it to its driver
        assert event_gpus(Uevent(action, "pci", devpath(sim, vf)), unknown_vf, sim.env, sim.io) == {g.address}
    assert event_gpus(Uevent("remove", "pci", devpath(sim, vf)), unknown_vf, sim.env, sim.io) is None  # gone: no link
    # a PF has no physfn link: unknown, read everything
    no_pf = {k: v for k, v in owner.items() if v != g.address}
    assert event_gpus(Uevent("add", "pci", devpath(sim, g.address)), no_pf, sim.env, sim.io) is None
