"""The one object that owns every host path (as mdevctl's Environment does).

Every module takes a ``HostEnv`` instead of hard-coding ``/sys`` or ``/etc``, which
is what lets the whole manager run unchanged on a simulated tree in a temp dir.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class HostEnv:
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    mdevctl_root: Path = Path("/etc/mdevctl.d")
    state_root: Path = Path("/var/lib/vgpuctl")
    pci_ids: tuple[Path, ...] = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"))
    libvirt_uri: str | None = "qemu:///system"
    #: a unix datagram socket the host's uevents are relayed to in the kernel's netlink format, where
    #: the agent has no netlink socket of its own (None: udev's, on the host's /sys)
    uevent_socket: Path | None = None

    # --- sysfs ---------------------------------------------------------------
    @property
    def pci_devices(self) -> Path:
        return self.sys_root / "bus/pci/devices"

    @property
    def pci_drivers(self) -> Path:
        return self.sys_root / "bus/pci/drivers"

    @property
    def drivers_probe(self) -> Path:
        return self.sys_root / "bus/pci/drivers_probe"

    @property
    def mdev_bus(self) -> Path:
        return self.sys_root / "class/mdev_bus"

    @property
    def mdev_devices(self) -> Path:
        return self.sys_root / "bus/mdev/devices"

    @property
    def iommu_groups(self) -> Path:
        return self.sys_root / "kernel/iommu_groups"

    @property
    def vfio_dev_class(self) -> Path:
        """``/sys/class/vfio-dev/vfioN``: one per vfio device cdev; its ``device`` link names the
        device (an mdev, a VF or a PCI function) it belongs to."""
        return self.sys_root / "class/vfio-dev"

    def pci(self, address: str) -> Path:
        return self.pci_devices / address

    # --- /dev ------------------------------------------------------------------
    @property
    def vfio_dir(self) -> Path:
        return self.dev_root / "vfio"

    def vfio_group(self, group: int | str) -> Path:
        return self.vfio_dir / str(group)

    @property
    def vfio_cdev_dir(self) -> Path:
        """``/dev/vfio/devices``: the per-device cdevs an iommufd user opens instead of a group."""
        return self.vfio_dir / "devices"

    @property
    def iommufd(self) -> Path:
        return self.dev_root / "iommu"

    # --- /proc -----------------------------------------------------------------
    @property
    def boot_id(self) -> Path:
        """The kernel's random id of this boot (a new one at every boot)."""
        return self.proc_root / "sys/kernel/random/boot_id"

    # --- persistence -----------------------------------------------------------
    @property
    def vendor_vfio_state(self) -> Path:
        """Saved vendor-VFIO vGPUs (mdevctl has no format for them)."""
        return self.state_root / "vendor-vfio.json"

    @property
    def mig_state(self) -> Path:
        """The GPU instances a layout keeps (a reboot loses them; restore re-creates them)."""
        return self.state_root / "mig.json"

    @property
    def applied_layout(self) -> Path:
        """The layout the node was last made to match (mdev_manager.applied)."""
        return self.state_root / "layout.json"

    @property
    def placement_state(self) -> Path:
        """The GPUs a layout runs in mixed-size mode and where their vGPUs sit (a reboot loses both)."""
        return self.state_root / "placements.json"

    @property
    def gpu_ids(self) -> Path:
        """The node's GPU numbering (mdev_manager.numbering): what ``index:`` and ``gpu-N`` mean."""
        return self.state_root / "gpu-ids.json"

    @property
    def passthrough_state(self) -> Path:
        """The functions a layout bound to vfio-pci (a reboot forgets them; restore rebinds them)."""
        return self.state_root / "passthrough.json"

    def with_(self, **changes: Any) -> HostEnv:  # Any: dataclasses.replace's own type for a field's new value
        return replace(self, **changes)

    @classmethod
    def under(cls, root: Path, *, libvirt_uri: str | None = None, proc_root: Path | None = None) -> HostEnv:
        """An environment whose host paths all live below ``root`` (simulated hosts, tests).

        ``proc_root`` too (``<root>/proc``: the simulated host's processes); pass
        ``Path("/proc")`` to see real processes holding files below ``root``.
        """
        root = Path(root)
        return cls(
            sys_root=root / "sys",
            dev_root=root / "dev",
            proc_root=root / "proc" if proc_root is None else Path(proc_root),
            mdevctl_root=root / "etc/mdevctl.d",
            state_root=root / "var/lib/vgpuctl",
            libvirt_uri=libvirt_uri,
        )
