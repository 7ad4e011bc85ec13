"""One classic resource as the kubelet sees it: :class:`VgpuResource`, the
:class:`~dra_bridge.rpc.types.DevicePluginBackend` the gRPC server calls.

Health is read live from the host (a vGPU or a vfio group can vanish between inventories);
``Allocate`` answers what virt-launcher reads (``MDEV_PCI_RESOURCE_<R>`` /
``PCI_RESOURCE_<R>`` and the ``/dev/vfio`` device specs); ``GetPreferredAllocation`` packs
a request on as few GPUs and NUMA nodes as possible (:func:`preferred_devices`, pure).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from dra_bridge.api.names import ResourceKind, resource_env_var
from dra_bridge.deviceplugin.resources import DeviceInfo
from dra_bridge.rpc.types import ContainerAllocation, DeviceSpec, DpDevice
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, link_name, read_attr
from mdev_manager.host.watch import HostWatcher

DEVICE_PERMISSIONS = "rw"


def preferred_devices(
    infos: Mapping[str, DeviceInfo], available: Iterable[str], must_include: Iterable[str], size: int
) -> list[str]:
    """``size`` ids from ``available`` (``must_include`` first), packed on as few physical
    GPUs and NUMA nodes as possible.

    Each step takes the next GPU by: already holding a chosen device; on the NUMA node
    of the chosen devices (before any is chosen: on a node that can hold the whole
    rest); able to hold the whole rest alone, the tightest such fit first; else the one
    with the most free devices. Ids we do not know come last.
    """
    chosen: list[str] = []
    for d in must_include:
        if d not in chosen:
            chosen.append(d)
    if len(chosen) >= size:
        return chosen
    pool = [d for d in dict.fromkeys(available) if d not in chosen]
    by_gpu: dict[str, list[str]] = {}
    numa_of: dict[str, int | None] = {}
    unknown: list[str] = []
    for d in sorted(pool):
        info = infos.get(d)
        if info is None:
            unknown.append(d)
            continue
        by_gpu.setdefault(info.gpu, []).append(d)
        numa_of[info.gpu] = info.numa_node
    anchor_gpus = {infos[d].gpu for d in chosen if d in infos}
    anchor_numas = {infos[d].numa_node for d in chosen if d in infos}
    while len(chosen) < size and by_gpu:
        need = size - len(chosen)
        numa_free: dict[int | None, int] = {}
        for g, ids in by_gpu.items():
            numa_free[numa_of[g]] = numa_free.get(numa_of[g], 0) + len(ids)

        def key(g: str, need: int = need, numa_free: dict = numa_free) -> tuple:
            n = len(by_gpu[g])
            off_numa = numa_of[g] not in anchor_numas if anchor_numas else numa_free[numa_of[g]] < need
            return (g not in anchor_gpus, off_numa, n < need, n if n >= need else -n, g)

        g = min(by_gpu, key=key)
        take = by_gpu.pop(g)[:need]
        chosen.extend(take)
        anchor_gpus.add(g)
        anchor_numas.add(numa_of[g])
    chosen.extend(unknown[: max(0, size - len(chosen))])
    return chosen


class VgpuResource:
    """The :class:`~dra_bridge.rpc.types.DevicePluginBackend` of one resource.

    Devices come from the inventory (:meth:`set_devices`); health is read live from the
    host on every :meth:`devices` call, so it follows the host between inventories.
    ``host_dev_root`` is where the kubelet finds ``/dev`` (the host's), default ``env.dev_root``.
    """

    def __init__(
        self,
        resource_name: str,
        kind: ResourceKind,
        env: HostEnv,
        io: HostIO,
        watcher: HostWatcher,
        devices: Iterable[DeviceInfo] = (),
        *,
        host_dev_root: Path | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.kind: ResourceKind = kind
        self.env = env
        self.io = io
        self.watcher = watcher
        self.host_dev_root = Path(host_dev_root) if host_dev_root is not None else env.dev_root
        self._lock = threading.Lock()
        self._devices: dict[str, DeviceInfo] = {}
        self._withheld: dict[str, str] = {}  # device id -> why it is advertised Unhealthy (a cordon)
        self._cordoned: dict[str, str] = {}  # GPU address -> why Allocate refuses its devices
        self._seen = threading.local()
        self.allocations: list[list[str]] = []  # observability / tests
        self.set_devices(devices)

    @property
    def env_var(self) -> str:
        return resource_env_var(self.resource_name, self.kind)

    def set_devices(self, devices: Iterable[DeviceInfo]) -> None:
        with self._lock:
            self._devices = {d.id: d for d in devices}
        self.watcher.bump()

    def set_withheld(self, cordoned: dict[str, str], devices: dict[str, str]) -> None:
        """A cordon (:func:`dra_bridge.pool.cordon.withheld_classic`): ``devices`` advertised Unhealthy,
        and every device of a ``cordoned`` GPU refused by Allocate, also one freed since the devices
        were chosen (so no new pod lands there between two resyncs); a change wakes ListAndWatch."""
        with self._lock:
            changed = (self._cordoned, self._withheld) != (cordoned, devices)
            self._cordoned, self._withheld = dict(cordoned), dict(devices)
        if changed:
            self.watcher.bump()

    def device_infos(self) -> list[DeviceInfo]:
        with self._lock:
            return list(self._devices.values())

    # ----------------------------------------------------------------- host reads
    def _sysfs_dir(self, info: DeviceInfo) -> Path:
        return self.env.mdev_devices / info.id if info.kind == "mdev" else self.env.pci(info.id)

    def iommu_group(self, info: DeviceInfo) -> int | None:
        """Read live: a re-created mdev gets a new group."""
        name = link_name(self.io, self._sysfs_dir(info) / "iommu_group")
        return int(name) if name and name.isdigit() else None

    def problem(self, info: DeviceInfo) -> str | None:
        """Why ``info`` is unhealthy now; None when healthy."""
        io, env = self.io, self.env
        if why := self._withheld.get(info.id):
            return why
        if not io.is_dir(env.pci(info.gpu)):
            return f"GPU {info.gpu} is not on the PCI bus"
        if not io.is_dir(self._sysfs_dir(info)):
            return f"{'mdev' if info.kind == 'mdev' else 'PCI device'} {info.id} is gone"
        if info.kind == "pci":
            drv = link_name(io, env.pci(info.id) / "driver")
            if drv != "vfio-pci":
                return f"{info.id} is bound to {drv or 'no driver'}, not vfio-pci"
        elif info.kind == "vendor-vfio":
            current = read_attr(io, env.pci(info.id) / "nvidia/current_vgpu_type", "0") or "0"
            if current != info.type_id:
                return f"VF {info.id} holds vGPU type {current}, not {info.type_id}"
        group = self.iommu_group(info)
        if group is None:
            return f"{info.id} has no IOMMU group"
        if not io.exists(env.vfio_group(group)):
            return f"{env.vfio_group(group)} is missing"
        return None

    # ----------------------------------------------------------------- DevicePluginBackend
    def devices(self) -> list[DpDevice]:
        self._seen.version = self.watcher.version  # read first: a change during the reads wakes the next wait
        return [DpDevice(id=d.id, healthy=self.problem(d) is None, numa_node=d.numa_node)
                for d in self.device_infos()]

    def wait_for_change(self, timeout: float) -> bool:
        return self.watcher.wait(getattr(self._seen, "version", None), timeout)

    def _host(self, dev_path: Path) -> str:
        return str(self.host_dev_root / dev_path.relative_to(self.env.dev_root))

    def _spec(self, dev_path: Path) -> DeviceSpec:
        container = "/dev/" + dev_path.relative_to(self.env.dev_root).as_posix()
        return DeviceSpec(container_path=container, host_path=self._host(dev_path), permissions=DEVICE_PERMISSIONS)

    def allocate(self, device_ids: list[str]) -> ContainerAllocation:
        with self._lock:
            infos = []
            for dev_id in device_ids:
                info = self._devices.get(dev_id) or self._devices.get(dev_id.lower())
                if info is None:
                    raise KeyError(f"{dev_id} is not a device of {self.resource_name}")
                infos.append(info)
        specs = [self._spec(self.env.vfio_dir / "vfio")]
        cdevs: list[DeviceSpec] = []
        groups: set[int] = set()
        iommufd = self.io.exists(self.env.iommufd)
        for info in infos:
            why = self._cordoned.get(info.gpu) or self.problem(info)
            if why is not None:
                raise RuntimeError(f"{info.id} is unhealthy: {why}")
            group = self.iommu_group(info)
            assert group is not None
            if group not in groups:
                groups.add(group)
                specs.append(self._spec(self.env.vfio_group(group)))
            if iommufd:
                for name in self.io.listdir(self._sysfs_dir(info) / "vfio-dev"):
                    node = self.env.vfio_dir / "devices" / name
                    if self.io.exists(node):
                        cdevs.append(self._spec(node))
        if cdevs:
            specs.append(self._spec(self.env.iommufd))
            specs.extend(cdevs)
        self.allocations.append([i.id for i in infos])
        return ContainerAllocation(envs={self.env_var: ",".join(i.id for i in infos)}, devices=specs)

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        with self._lock:
            infos = dict(self._devices)
        return preferred_devices(infos, available, must_include, size)


__all__ = ["DEVICE_PERMISSIONS", "VgpuResource", "preferred_devices"]
