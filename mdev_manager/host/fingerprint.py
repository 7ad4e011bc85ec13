"""A cheap fingerprint of what discovery would find changed: devices, bindings, vGPUs.

The agent's periodic resync discovers the whole node (hundreds of ms on a 16-GPU node with
512 VFs) only to find, almost always, that nothing changed. What a change to the inventory
always changes is cheap to read: the PCI functions present (VFs come and go), which driver
each is bound to (the drivers' directories list their devices), the mdevs present, each
vendor-VFIO VF's ``nvidia/current_vgpu_type`` and each GPU's ``sriov_numvfs``. A resync whose
fingerprint, layout, claims and published slices are unchanged can skip everything else;
devices appearing or leaving also change the fingerprint between two resyncs, so a change made
by hand (``mdevctl start``, a rebind) is seen at the next resync, not the next full one.
"""

from __future__ import annotations

import hashlib

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO


def fingerprint(env: HostEnv, io: HostIO) -> str:
    h = hashlib.sha256()

    def add(*parts: object) -> None:
        h.update(repr(parts).encode())

    add("pci", sorted(io.listdir(env.pci_devices)))
    for driver in sorted(io.listdir(env.pci_drivers)):
        add("driver", driver, sorted(d for d in io.listdir(env.pci_drivers / driver) if ":" in d))
    add("mdev", sorted(io.listdir(env.mdev_devices)))
    for addr, attrs in io.read_children(env.pci_devices, ["nvidia/current_vgpu_type", "sriov_numvfs"]).items():
        if attrs["nvidia/current_vgpu_type"] not in (None, "0") or attrs["sriov_numvfs"] not in (None, "0"):
            add(addr, attrs["nvidia/current_vgpu_type"], attrs["sriov_numvfs"])
    return h.hexdigest()
