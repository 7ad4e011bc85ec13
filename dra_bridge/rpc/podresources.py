"""Which devices the kubelet has handed to pods: a client of the PodResources API (v1).

The kubelet serves ``v1.PodResourcesLister`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``. ``List`` returns, per pod and container,
the device plugin devices allocated to it (resource name + device ids). A device our
device plugin advertised and the kubelet allocated is in use for the node manager even
before QEMU opens it, so :func:`allocated_devices` turns the answer into a
:class:`mdev_manager.models.Usage` to merge into ``collect_usage(extra=...)``.

Never raises: without the socket (no kubelet, or an old one) or on any RPC error the
answer is an empty ``Usage`` whose ``warnings`` say why, so callers can decide how
cautious to be.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import grpc

from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2 as pr_pb2
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2_grpc as pr_grpc
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO
from mdev_manager.models import Usage
from mdev_manager.names import NameError_, check_pci_address

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = NodePaths().pod_resources_socket
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class PodDevice:
    """One device id the kubelet allocated to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str

    @property
    def label(self) -> str:
        return f"pod {self.namespace}/{self.pod}"


def list_pod_devices(socket_path: Path | str = DEFAULT_POD_RESOURCES_SOCKET, *, timeout: float = 5.0,
                     io: HostIO | None = None) -> list[PodDevice]:
    """Every device plugin device allocated to a container; raises grpc.RpcError / OSError."""
    path = Path(socket_path)
    st = (io or RealIO()).stat(path)  # FileNotFoundError when the kubelet does not serve the API
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"{path} is not a socket")
    with grpc.insecure_channel(f"unix:{os.path.abspath(path)}") as channel:
        resp = pr_grpc.PodResourcesListerStub(channel).List(pr_pb2.ListPodResourcesRequest(), timeout=timeout)
    out: list[PodDevice] = []
    for pod in resp.pod_resources:
        for ctr in pod.containers:
            for dev in ctr.devices:
                for dev_id in dev.device_ids:
                    out.append(PodDevice(pod.namespace, pod.name, ctr.name, dev.resource_name, dev_id))
    return out


def _group_members(env: HostEnv | None, io: HostIO, device_id: str) -> list[str]:
    """NVIDIA's passthrough plugin used IOMMU group numbers as device ids: resolve them."""
    if env is None or not device_id.isdigit():
        return []
    try:
        return io.listdir(env.iommu_groups / device_id / "devices")
    except OSError:
        return []


def usage_from_devices(devices: list[PodDevice], resource_prefix: str = "nvidia.com/",
                       env: HostEnv | None = None, io: HostIO | None = None) -> Usage:
    """mdev UUIDs and PCI addresses of ``devices`` under ``resource_prefix`` -> ``Usage``.

    Labels are ``pod <namespace>/<name>``. Ids that are neither (other plugins' ids)
    are ignored, except IOMMU group numbers, which resolve to their members when
    ``env`` is given (read through ``io``, the real host's by default).
    """
    io = io or RealIO()
    mdevs: dict[str, list[str]] = {}
    pci: dict[str, list[str]] = {}

    def add(table: dict[str, list[str]], key: str, label: str) -> None:
        users = table.setdefault(key, [])
        if label not in users:
            users.append(label)

    for d in devices:
        if resource_prefix and not d.resource_name.startswith(resource_prefix):
            continue
        dev_id = d.device_id.strip()
        if _UUID.match(dev_id):
            add(mdevs, dev_id.lower(), d.label)
            continue
        try:
            add(pci, check_pci_address(dev_id), d.label)
            continue
        except NameError_:
            pass
        members = _group_members(env, io, dev_id)
        for m in members:
            add(pci, m, d.label)
        if not members:
            log.debug("pod %s/%s: device id %r of %s is neither an mdev UUID nor a PCI address",
                      d.namespace, d.pod, dev_id, d.resource_name)
    return Usage(mdevs=mdevs, pci=pci)


def allocated_devices(socket_path: Path | str = DEFAULT_POD_RESOURCES_SOCKET, resource_prefix: str = "nvidia.com/",
                      *, env: HostEnv | None = None, io: HostIO | None = None, timeout: float = 5.0) -> Usage:
    """Devices of resources named ``<resource_prefix>...`` that the kubelet allocated to pods.

    Returns ``Usage(mdevs={uuid: ["pod ns/name"]}, pci={address: [...]})``; an empty
    ``Usage`` with a warning (logged and in ``warnings``) when the socket is absent or
    the call fails.
    """
    path = Path(socket_path)
    io = io or RealIO()
    try:
        devices = list_pod_devices(path, timeout=timeout, io=io)
    except FileNotFoundError:
        msg = f"kubelet PodResources socket {path} is absent; pod device allocations not checked"
    except grpc.RpcError as exc:
        detail = f"{exc.code().name}: {exc.details()}" if hasattr(exc, "code") else str(exc)
        msg = f"kubelet PodResources List on {path} failed ({detail}); pod device allocations not checked"
    except Exception as exc:  # noqa: BLE001 - never let the usage check take the caller down
        msg = f"kubelet PodResources List on {path} failed ({type(exc).__name__}: {exc}); pod device allocations not checked"
    else:
        return usage_from_devices(devices, resource_prefix, env, io)
    log.warning(msg)
    return Usage(warnings=[msg])
