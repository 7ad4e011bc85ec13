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
import os
from collections.abc import Callable

from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO


def _functions(h: hashlib._Hash, env: HostEnv, io: HostIO) -> Callable[..., None]:
    """Start ``h`` with the PCI functions present and each driver's bound functions (what both prints
    read first); returns the ``add`` that feeds it more parts."""
    def add(*parts: object) -> None:
        h.update(repr(parts).encode())

    add("pci", sorted(io.listdir(env.pci_devices)))
    for driver in sorted(io.listdir(env.pci_drivers)):
        add("driver", driver, sorted(d for d in io.listdir(env.pci_drivers / driver) if ":" in d))
    return add


def fingerprint(env: HostEnv, io: HostIO) -> str:
    h = hashlib.sha256()
    add = _functions(h, env, io)
    add("mdev", sorted(io.listdir(env.mdev_devices)))
    for addr, attrs in io.read_children(env.pci_devices, ["nvidia/current_vgpu_type", "sriov_numvfs"]).items():
        if attrs["nvidia/current_vgpu_type"] not in (None, "0") or attrs["sriov_numvfs"] not in (None, "0"):
            add(addr, attrs["nvidia/current_vgpu_type"], attrs["sriov_numvfs"])
    return h.hexdigest()


def settled_print(env: HostEnv, io: HostIO) -> str:
    """:func:`fingerprint` made exact for reusing an inventory read a moment before (``apply``'s look
    before the node lock, reused under it): besides the functions, their drivers, the mdevs' names,
    ``sriov_numvfs`` and the vendor-VFIO types, each mdev's parent and type (an mdev removed and made
    again under its UUID elsewhere, or of another type, lists the same name), every function's
    ``driver_override``, the GPU numbering and ``/dev/iommu``. What lives in the driver (MIG mode,
    GPU instances, mixed-size mode and placements) shows in no sysfs listing: a GPU that has any is
    read again by the caller (:func:`mdev_manager.gpurefresh.still_current`)."""
    h = hashlib.sha256()
    add = _functions(h, env, io)
    for uuid in sorted(io.listdir(env.mdev_devices)):
        try:
            add("mdev", uuid, io.readlink(env.mdev_devices / uuid), io.readlink(env.mdev_devices / uuid / "mdev_type"))
        except OSError as exc:  # gone meanwhile, or not a link: what was read says so
            add("mdev", uuid, exc.errno)
    attrs = ["nvidia/current_vgpu_type", "sriov_numvfs", "driver_override"]
    add("attrs", sorted(io.read_children(env.pci_devices, attrs).items()))
    try:
        add("ids", io.read(env.gpu_ids))
    except FileNotFoundError:
        add("ids", None)
    add("iommufd", io.exists(env.iommufd))
    return h.hexdigest()


def host_marks(env: HostEnv, io: HostIO, mdev_parent: dict[str, str]) -> list[tuple[str, ...]]:
    """The same reads as :func:`fingerprint`, each mark ``(function, what...)`` naming the PCI
    function it is about, so :func:`gpu_prints` can tell them apart per GPU. ``mdev_parent``
    caches each mdev's parent (its sysfs link names it and never changes while the mdev exists)."""
    marks: list[tuple[str, ...]] = [(addr, "present") for addr in sorted(io.listdir(env.pci_devices))]
    for driver in sorted(io.listdir(env.pci_drivers)):
        marks += [(d, "driver", driver) for d in sorted(io.listdir(env.pci_drivers / driver)) if ":" in d]
    names = sorted(io.listdir(env.mdev_devices))
    for gone in set(mdev_parent) - set(names):
        del mdev_parent[gone]
    for uuid in names:
        if uuid not in mdev_parent:
            try:
                mdev_parent[uuid] = os.path.basename(os.path.dirname(io.readlink(env.mdev_devices / uuid)))
            except OSError:  # not a link (a hand-made tree), or gone meanwhile: no GPU's
                mdev_parent[uuid] = ""
        marks.append((mdev_parent[uuid], "mdev", uuid))
    for addr, attrs in sorted(io.read_children(env.pci_devices, ["nvidia/current_vgpu_type", "sriov_numvfs"]).items()):
        if attrs["nvidia/current_vgpu_type"] not in (None, "0") or attrs["sriov_numvfs"] not in (None, "0"):
            marks.append((addr, str(attrs["nvidia/current_vgpu_type"]), str(attrs["sriov_numvfs"])))
    return marks


def gpu_prints(marks: list[tuple[str, ...]], owner: dict[str, str]) -> tuple[dict[str, str], str]:
    """Each GPU's fingerprint from :func:`host_marks`, ``owner`` mapping each PCI function (a GPU,
    its VFs, its IOMMU group's members) to its GPU; and one of every mark no GPU owns (functions that
    came, mdevs on them). A GPU whose fingerprint is unchanged needs no second read; a changed rest
    means functions no GPU accounts for (a new GPU, VFs of an unknown one): read the whole node."""
    parts: dict[str, list[tuple[str, ...]]] = {g: [] for g in set(owner.values())}
    rest: list[tuple[str, ...]] = []
    for mark in marks:
        gpu = owner.get(mark[0])
        (parts[gpu] if gpu is not None else rest).append(mark)

    def digest(items: list[tuple[str, ...]]) -> str:
        return hashlib.sha256(repr(items).encode()).hexdigest()

    return {g: digest(p) for g, p in parts.items()}, digest(rest)
