"""The classic kubelet device plugin (``deviceplugin/v1beta1``) for KubeVirt VMs.

What admins run today is NVIDIA's kubevirt-gpu-device-plugin; VMs name its resources in
``spec.domain.devices.gpus[].deviceName`` / ``hostDevices[].deviceName``. This module
advertises the node manager's vGPUs and passthrough GPUs under the same names, so those
VMs keep working when vgpuctl takes over:

- one resource per vGPU type name, spaces to ``_`` (``nvidia.com/GRID_T4-1Q``,
  ``nvidia.com/NVIDIA_A100-4C``); mdev vGPUs have their UUID as device id, vendor-specific
  VFIO vGPUs (a VF with ``nvidia/current_vgpu_type`` set) their VF's PCI address;
- one resource per passthrough GPU model (a GPU PF bound to ``vfio-pci``), named from
  pci.ids the way NVIDIA's plugin names it (``TU104GL [Tesla T4]`` ->
  ``nvidia.com/TU104GL_TESLA_T4``), else from the hex device id; device id = PCI address.

Pieces:

- :func:`compute_resources`: inventory -> ``{resource name: ResourceSpec}`` (pure).
- :class:`HostWatcher`: inotify (ctypes on libc, no dependency) on ``/dev/vfio``,
  ``/sys/bus/mdev/devices`` and ``/sys/bus/pci/devices``, plus a listing poll for what
  inotify cannot see (sysfs sends no events for devices coming and going); bumps a
  version that wakes every ``wait_for_change``.
- :class:`VgpuResource`: the :class:`~dra_bridge.kubelet.deviceplugin_grpc.DevicePluginBackend`
  of one resource: live health, ``Allocate`` answering what virt-launcher reads
  (``MDEV_PCI_RESOURCE_<R>`` / ``PCI_RESOURCE_<R>``, ``/dev/vfio`` device specs) and a
  NUMA- and GPU-packing ``GetPreferredAllocation``.
- :class:`DevicePluginManager`: one :class:`DevicePluginServer` per resource, started
  and stopped as resources come and go on :meth:`DevicePluginManager.refresh`, kept
  registered across kubelet restarts by a :class:`KubeletWatcher`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import re
import select
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO, link_name, read_attr
from mdev_manager.models import Inventory
from mdev_manager.usage import Usage

from dra_bridge.kubelet.deviceplugin_grpc import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_SOCKET_PREFIX,
    ContainerAllocation,
    DevicePluginServer,
    DeviceSpec,
    DpDevice,
    KubeletWatcher,
)
from dra_bridge.kubelet.podresources import DEFAULT_POD_RESOURCES_SOCKET, allocated_devices

log = logging.getLogger(__name__)

DEFAULT_RESOURCE_PREFIX = "nvidia.com/"
MDEV_ENV_PREFIX = "MDEV_PCI_RESOURCE_"
PCI_ENV_PREFIX = "PCI_RESOURCE_"
DEVICE_PERMISSIONS = "rw"

DeviceKind = Literal["mdev", "pci", "vendor-vfio"]
ResourceKind = Literal["mdev", "pci"]  # which environment variable virt-launcher reads

_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# --------------------------------------------------------------------------- naming


def normalize_prefix(prefix: str) -> str:
    """``nvidia.com`` or ``nvidia.com/`` -> ``nvidia.com/``; ValueError unless a DNS subdomain."""
    domain = prefix.strip().removesuffix("/")
    if not domain or len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        raise ValueError(f"resource prefix {prefix!r}: expected a DNS domain such as nvidia.com/")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain == "k8s.io" or domain.endswith(".k8s.io"):
        raise ValueError(f"resource prefix {prefix!r}: extended resources cannot use the {domain} domain")
    return domain + "/"


def is_valid_name_part(name: str) -> bool:
    """The part after ``/`` of an extended resource name (a qualified name's name part)."""
    return bool(_NAME_PART.match(name))


def _tidy(name: str) -> str:
    """Make a name part valid: other characters to ``_``, ends trimmed, at most 63 characters."""
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    s = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", s)
    s = re.sub(r"[^A-Za-z0-9]+$", "", s[:63])
    return s


def nvidia_device_name(pci_ids_name: str) -> str:
    """A pci.ids device name as NVIDIA's kubevirt plugin turns it into a resource name.

    Upper-cased; ``/`` and ``.`` become ``_``; each run of whitespace one ``_``; then
    every character other than ``A-Z``, ``0-9``, ``_`` is dropped (brackets, dashes,
    parentheses): ``TU104GL [Tesla T4]`` -> ``TU104GL_TESLA_T4``,
    ``GA100 [A100 PCIe 40GB]`` -> ``GA100_A100_PCIE_40GB``.
    """
    s = pci_ids_name.strip().upper().replace("/", "_").replace(".", "_")
    s = re.sub(r"\s+", "_", s)
    return re.sub(r"[^A-Z0-9_]+", "", s)


def passthrough_name(product_name: str | None, device_id: str) -> str:
    """Name part for a passthrough GPU model; the hex device id (``1eb8``) without a usable name."""
    hex_id = device_id.strip().lower().removeprefix("0x")
    if product_name:
        name = nvidia_device_name(product_name)
        if not is_valid_name_part(name):
            name = _tidy(name)
        if name:
            return name
    return hex_id


def vgpu_type_name(type_name: str) -> str:
    """Name part for a vGPU type: runs of whitespace to ``_`` (``GRID T4-1Q`` -> ``GRID_T4-1Q``).

    Anything still invalid in a resource name becomes ``_`` (NVIDIA's plugin would fail
    to register such a name, so no existing VM can depend on it).
    """
    name = re.sub(r"\s+", "_", type_name.strip())
    return name if is_valid_name_part(name) else _tidy(name)


def resource_env_var(resource_name: str, kind: ResourceKind) -> str:
    """``nvidia.com/GRID_T4-1Q`` -> ``MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q`` (kind mdev),
    ``nvidia.com/TU104GL_TESLA_T4`` -> ``PCI_RESOURCE_NVIDIA_COM_TU104GL_TESLA_T4`` (kind pci):
    upper-cased, ``/`` and ``.`` to ``_``, dashes kept, as KubeVirt builds the name."""
    suffix = resource_name.upper().replace("/", "_").replace(".", "_")
    return (MDEV_ENV_PREFIX if kind == "mdev" else PCI_ENV_PREFIX) + suffix


# --------------------------------------------------------------------------- resources


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceInfo(_Model):
    """One advertised device and what its health and allocation need."""

    id: str
    kind: DeviceKind
    gpu: str
    numa_node: int | None = None
    iommu_group: int | None = None
    type_id: str | None = None
    type_name: str | None = None


class ResourceSpec(_Model):
    name: str
    kind: ResourceKind
    devices: list[DeviceInfo] = []


def _env_kind(kind: DeviceKind) -> ResourceKind:
    return "mdev" if kind == "mdev" else "pci"


def compute_resources(
    inventory: Inventory, prefix: str = DEFAULT_RESOURCE_PREFIX, exclude: Iterable[str] = ()
) -> tuple[dict[str, ResourceSpec], list[str]]:
    """The resources the node's inventory yields, and warnings about what was left out.

    ``exclude``: GPU PCI addresses (all their devices) and device ids (mdev UUIDs, PCI
    addresses) not to advertise, e.g. GPUs handed to the DRA driver.
    """
    prefix = normalize_prefix(prefix)
    skip = {e.strip().lower() for e in exclude}
    out: dict[str, ResourceSpec] = {}
    warnings: list[str] = []

    def add(name_part: str, info: DeviceInfo) -> None:
        if not name_part:
            warnings.append(f"{info.kind} device {info.id}: no usable resource name; not advertised")
            return
        name = prefix + name_part
        kind = _env_kind(info.kind)
        spec = out.setdefault(name, ResourceSpec(name=name, kind=kind))
        if spec.kind != kind:
            warnings.append(f"{info.kind} device {info.id}: resource {name} already holds {spec.kind} devices; not advertised")
            return
        spec.devices.append(info)

    for gpu in inventory.gpus:
        if gpu.address in skip:
            continue
        if gpu.driver == "vfio-pci":
            add(passthrough_name(gpu.product_name, gpu.device_id),
                DeviceInfo(id=gpu.address, kind="pci", gpu=gpu.address, numa_node=gpu.numa_node,
                           iommu_group=gpu.iommu_group, type_name=gpu.product_name))
        for v in gpu.vgpus:
            if v.id.lower() in skip or v.parent in skip:
                continue
            kind: DeviceKind = "mdev" if v.framework == "mdev" else "vendor-vfio"
            add(vgpu_type_name(v.type_name),
                DeviceInfo(id=v.id, kind=kind, gpu=gpu.address, numa_node=gpu.numa_node,
                           iommu_group=v.iommu_group, type_id=v.type_id, type_name=v.type_name))
    for spec in out.values():
        spec.devices.sort(key=lambda d: d.id)
    return dict(sorted(out.items())), warnings


# --------------------------------------------------------------------------- inotify

IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
WATCH_MASK = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_EVENT = struct.Struct("iIII")


class Inotify:
    """A minimal inotify instance through ctypes; OSError where the kernel or libc lacks it."""

    _libc: ctypes.CDLL | None = None

    @classmethod
    def _lib(cls) -> ctypes.CDLL:
        if cls._libc is None:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_init1.restype = ctypes.c_int
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.inotify_add_watch.restype = ctypes.c_int
            lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.inotify_rm_watch.restype = ctypes.c_int
            cls._libc = lib
        return cls._libc

    def __init__(self) -> None:
        try:
            lib = self._lib()
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"inotify unavailable: {exc}") from None
        fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd
        self._lib_ref = lib

    def add_watch(self, path: Path, mask: int = WATCH_MASK) -> int:
        wd = self._lib_ref.inotify_add_watch(self.fd, os.fsencode(str(path)), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch {path}: {os.strerror(e)}")
        return wd

    def rm_watch(self, wd: int) -> None:
        self._lib_ref.inotify_rm_watch(self.fd, wd)

    def read_events(self) -> list[tuple[int, int, str]]:
        """Pending events as (wd, mask, name); [] when none."""
        out: list[tuple[int, int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return out
            if not buf:
                return out
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                raw = buf[off + _EVENT.size: off + _EVENT.size + length]
                out.append((wd, mask, os.fsdecode(raw.rstrip(b"\0"))))
                off += _EVENT.size + length

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HostWatcher:
    """Wakes device plugin streams when ``/dev/vfio``, mdevs or PCI devices change.

    ``version`` grows on every change seen: an inotify event on one of ``paths``, or a
    change in their listings (checked every ``poll_interval`` seconds, which covers
    sysfs, where the kernel sends no inotify events for devices coming and going, and
    hosts without inotify). Watches on paths that do not exist yet are added once they do.
    """

    def __init__(self, paths: Iterable[Path], *, poll_interval: float = 2.0, use_inotify: bool = True) -> None:
        self.paths = [Path(p) for p in paths]
        self.poll_interval = poll_interval
        self.use_inotify = use_inotify
        self._cond = threading.Condition()
        self._version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inotify: Inotify | None = None
        self._wds: dict[int, Path] = {}
        self._pipe: tuple[int, int] | None = None
        self.inotify_error: str | None = None
        self.events = 0  # inotify events seen (observability, tests)

    @classmethod
    def for_env(cls, env: HostEnv, **kw) -> HostWatcher:
        return cls([env.vfio_dir, env.mdev_devices, env.pci_devices], **kw)

    # ----------------------------------------------------------------- change signal
    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def bump(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def wait(self, seen: int | None, timeout: float) -> bool:
        """True as soon as ``version`` differs from ``seen`` (at once if ``seen`` is None)."""
        if seen is None:
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._version != seen, timeout)

    @property
    def watched(self) -> list[Path]:
        return sorted(self._wds.values())

    @property
    def inotify_active(self) -> bool:
        return self._inotify is not None and bool(self._wds)

    # ----------------------------------------------------------------- thread
    def start(self) -> HostWatcher:
        if self._thread is not None:
            raise RuntimeError("HostWatcher already started")
        self._stop.clear()
        if self.use_inotify:
            try:
                self._inotify = Inotify()
            except OSError as exc:
                self.inotify_error = str(exc)
                log.info("inotify unavailable (%s); polling %s every %ss", exc, self.paths, self.poll_interval)
        self._pipe = os.pipe()
        self._ensure_watches()
        self._last = self._fingerprint()
        self._thread = threading.Thread(target=self._run, name="vgpu-host-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._wds.clear()
        if self._pipe is not None:
            for fd in self._pipe:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._pipe = None

    def __enter__(self) -> HostWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ensure_watches(self) -> None:
        if self._inotify is None:
            return
        have = set(self._wds.values())
        for p in self.paths:
            if p in have or not p.is_dir():
                continue
            try:
                self._wds[self._inotify.add_watch(p)] = p
            except OSError as exc:
                self.inotify_error = str(exc)
                log.debug("cannot watch %s: %s (polled instead)", p, exc)

    def _fingerprint(self) -> tuple:
        out = []
        for p in self.paths:
            try:
                out.append(tuple(sorted(os.listdir(p))))
            except OSError:
                out.append(None)
        return tuple(out)

    def _run(self) -> None:
        assert self._pipe is not None
        while not self._stop.is_set():
            fds = [self._pipe[0]] + ([self._inotify.fd] if self._inotify is not None else [])
            try:
                ready, _, _ = select.select(fds, [], [], self.poll_interval)
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                ready = []
            if self._stop.is_set():
                return
            changed = False
            if self._inotify is not None and self._inotify.fd in ready:
                try:
                    changed = self._handle_events(self._inotify.read_events())
                except OSError as exc:
                    log.warning("reading inotify events failed: %s", exc)
            try:
                self._ensure_watches()
                fp = self._fingerprint()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("host watcher poll failed")
                continue
            if fp != self._last:
                self._last = fp
                changed = True
            if changed:
                self.bump()

    def _handle_events(self, events: list[tuple[int, int, str]]) -> bool:
        changed = False
        for wd, mask, _name in events:
            self.events += 1
            changed = True
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                path = self._wds.pop(wd, None)
                if path is not None and mask & IN_MOVE_SELF and self._inotify is not None:
                    self._inotify.rm_watch(wd)  # the watch follows the moved inode; re-add by path
            if mask & IN_Q_OVERFLOW:
                log.info("inotify queue overflow; re-reading every device")
        return changed


# --------------------------------------------------------------------------- preferred allocation


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

        def key(g: str) -> tuple:
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


# --------------------------------------------------------------------------- backend


class VgpuResource:
    """The :class:`~dra_bridge.kubelet.deviceplugin_grpc.DevicePluginBackend` of one resource.

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
            why = self.problem(info)
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


# --------------------------------------------------------------------------- manager


class _ManagedServer(DevicePluginServer):
    """A server that refuses to start again once retired (the kubelet watcher may race
    us), and whose streams end at once on stop instead of after their next wait."""

    def __init__(self, backend: VgpuResource, *a, **kw) -> None:
        super().__init__(backend, *a, **kw)
        self._life = threading.RLock()
        self.retired = False

    def start(self) -> None:
        with self._life:
            if self.retired:
                raise RuntimeError(f"device plugin {self.resource_name} was retired")
            super().start()

    def stop(self, grace: float | None = 1.0) -> None:
        with self._lock:
            streams = list(self._streams)
        for ev in streams:
            ev.set()
        self.backend.watcher.bump()  # wakes their wait_for_change: they see the end now
        super().stop(grace)

    def retire(self, grace: float | None = 0.5) -> None:
        with self._life:
            self.retired = True
            self.stop(grace)


class _KubeletWatcher(KubeletWatcher):
    """A :class:`KubeletWatcher` that can also forget a server."""

    def remove(self, server: DevicePluginServer) -> None:
        with self._lock:
            self._servers = [s for s in self._servers if s is not server]
            self._pending = [s for s in self._pending if s is not server]

    def check_once(self) -> None:
        super().check_once()
        with self._lock:
            self._pending = [s for s in self._pending if any(s is t for t in self._servers)]


class ResourceStatus(_Model):
    resource: str
    kind: ResourceKind
    env_var: str
    socket: str
    running: bool
    devices: dict[str, str | None]  # id -> problem (None: healthy)


class RefreshResult(_Model):
    added: list[str] = []
    removed: list[str] = []
    updated: list[str] = []
    warnings: list[str] = []


InventorySource = Inventory | Callable[[], Inventory]


class DevicePluginManager:
    """Serve one device plugin per resource of the node's inventory.

    ``inventory``: an :class:`Inventory` or a callable returning a fresh one (default:
    ``discover(env, io)``), used when :meth:`start` / :meth:`refresh` get none.
    ``exclude``: GPU addresses / device ids not to advertise (or a callable taking the
    inventory), e.g. GPUs whose layout mode is ``dra``.
    ``host_dev_root``: the host's ``/dev`` as the kubelet sees it (device spec host
    paths), default ``env.dev_root``. ``pod_resources_socket``: for :meth:`usage`; None
    skips it. ``poll_interval``: host listing poll behind inotify. ``watch_timeout`` /
    ``resync_interval``: see :class:`DevicePluginServer`.
    """

    def __init__(
        self,
        env: HostEnv,
        io: HostIO | None = None,
        inventory: InventorySource | None = None,
        prefix: str = DEFAULT_RESOURCE_PREFIX,
        device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR,
        *,
        exclude: Iterable[str] | Callable[[Inventory], Iterable[str]] | None = None,
        host_dev_root: Path | None = None,
        pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET,
        node: str = "",
        socket_prefix: str = DEFAULT_SOCKET_PREFIX,
        poll_interval: float = 2.0,
        kubelet_poll_interval: float = 1.0,
        watch_timeout: float = 1.0,
        resync_interval: float | None = 30.0,
        register_timeout: float = 5.0,
        use_inotify: bool = True,
    ) -> None:
        self.env = env
        self.io = io or RealIO()
        self.prefix = normalize_prefix(prefix)
        self.device_plugin_dir = Path(device_plugin_dir)
        self.node = node
        self._source = inventory
        self._exclude = exclude
        self.host_dev_root = host_dev_root
        self.pod_resources_socket = pod_resources_socket
        self._server_kw = dict(socket_prefix=socket_prefix, watch_timeout=watch_timeout,
                               resync_interval=resync_interval, register_timeout=register_timeout)
        self.watcher = HostWatcher.for_env(env, poll_interval=poll_interval, use_inotify=use_inotify)
        self.kubelet = _KubeletWatcher((), self.device_plugin_dir, poll_interval=kubelet_poll_interval)
        self._lock = threading.RLock()
        self._backends: dict[str, VgpuResource] = {}
        self._servers: dict[str, _ManagedServer] = {}
        self.warnings: list[str] = []
        self._started = False

    # ----------------------------------------------------------------- views
    @property
    def resources(self) -> dict[str, VgpuResource]:
        with self._lock:
            return dict(self._backends)

    @property
    def servers(self) -> dict[str, DevicePluginServer]:
        with self._lock:
            return dict(self._servers)

    @property
    def running(self) -> bool:
        return self._started

    def status(self) -> list[ResourceStatus]:
        out = []
        servers = self.servers
        for name, b in self.resources.items():
            srv = servers.get(name)
            out.append(ResourceStatus(
                resource=name, kind=b.kind, env_var=b.env_var, socket=str(srv.socket_path) if srv else "",
                running=bool(srv and srv.running), devices={d.id: b.problem(d) for d in b.device_infos()}))
        return out

    def usage(self, timeout: float = 5.0) -> Usage:
        """Our resources' devices the kubelet allocated to pods (PodResources API)."""
        if self.pod_resources_socket is None:
            return Usage()
        return allocated_devices(self.pod_resources_socket, self.prefix, env=self.env, timeout=timeout)

    # ----------------------------------------------------------------- lifecycle
    def _inventory(self, inventory: Inventory | None) -> Inventory:
        if inventory is not None:
            return inventory
        if isinstance(self._source, Inventory):
            return self._source
        if callable(self._source):
            return self._source()
        return discover(self.env, self.io, node=self.node)

    def start(self, inventory: Inventory | None = None) -> DevicePluginManager:
        """Compute the resources, watch the host and the kubelet socket.

        Servers start and register once ``kubelet.sock`` exists (at once if it does).
        """
        with self._lock:
            if self._started:
                raise RuntimeError("DevicePluginManager already started")
            self.watcher.start()
            try:
                self.refresh(inventory)
                self.kubelet.start()
            except BaseException:
                self.watcher.stop()
                raise
            self._started = True
        return self

    def refresh(self, inventory: Inventory | None = None) -> RefreshResult:
        """Re-read the inventory: start plugins for new resources, stop those gone, update devices."""
        inv = self._inventory(inventory)
        excl = self._exclude(inv) if callable(self._exclude) else (self._exclude or ())
        specs, warnings = compute_resources(inv, self.prefix, excl)
        result = RefreshResult(warnings=warnings)
        for w in warnings:
            log.warning("device plugin: %s", w)
        with self._lock:
            self.warnings = warnings
            for name in [n for n in self._backends if n not in specs or specs[n].kind != self._backends[n].kind]:
                self._retire(name)
                result.removed.append(name)
            for name, spec in specs.items():
                backend = self._backends.get(name)
                if backend is not None:
                    if [d.model_dump() for d in backend.device_infos()] != [d.model_dump() for d in spec.devices]:
                        backend.set_devices(spec.devices)
                        result.updated.append(name)
                    continue
                backend = VgpuResource(name, spec.kind, self.env, self.io, self.watcher, spec.devices,
                                       host_dev_root=self.host_dev_root)
                server = _ManagedServer(backend, self.device_plugin_dir, **self._server_kw)
                self._backends[name] = backend
                self._servers[name] = server
                self.kubelet.add(server)
                result.added.append(name)
                if name in result.removed:
                    result.removed.remove(name)
                    result.updated.append(name)
        for name in result.added:
            log.info("device plugin: new resource %s", name)
        for name in result.removed:
            log.info("device plugin: resource %s is gone", name)
        return result

    def _retire(self, name: str) -> None:
        server = self._servers.pop(name, None)
        self._backends.pop(name, None)
        if server is not None:
            self.kubelet.remove(server)
            server.retire()

    def stop(self) -> None:
        """Stop every plugin (sockets removed) and the watchers; the devices stay."""
        with self._lock:
            self.kubelet.stop()
            names = list(self._servers)
            threads = [threading.Thread(target=self._retire, args=(n,), name=f"dp-stop-{i}", daemon=True)
                       for i, n in enumerate(names)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10.0)
            self.watcher.stop()
            self._started = False

    def __enter__(self) -> DevicePluginManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
