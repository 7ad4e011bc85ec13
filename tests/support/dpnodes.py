"""Several simulated nodes on the device-plugin (classic) path, sharing one API server: each node a
simulated host, its own node agent (``vgpuctl serve --device-plugin``: :class:`Daemon` with its
real device plugin servers on unix sockets) and a kubelet (:class:`DpKubelet`).

The kubelet is the test's part, as a real kubelet's device manager does it: it takes the plugin's
registration and ``ListAndWatch`` stream (:class:`~tests.support.kubelet.fake_kubelet.FakeKubelet`),
writes the healthy count as the Node's capacity and allocatable, admits a pod by picking free devices
(``GetPreferredAllocation``) and calling ``Allocate`` over gRPC, keeps which pod holds which device
until the pod is deleted, and serves the PodResources API the agent reads its users from. A VM's
QEMU is a simulated process holding the vfio group ``Allocate`` handed out.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2 as pr_pb2
from dra_bridge.rpc.proto import vgpuctl_podresources_v1_pb2_grpc as pr_grpc
from dra_bridge.scheduling.classic import pod_requests
from mdev_manager.discovery import discover
from mdev_manager.models import Inventory
from mdev_manager.sim.node import SimNode, sim_node
from tests.support.kubelet.fake_kubelet import FakeKubelet

HEALTHY = "Healthy"


class AdmissionError(RuntimeError):
    """The kubelet refuses a pod (``UnexpectedAdmissionError``: not enough healthy free devices)."""


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: DpKubelet) -> None:
        self.kubelet = kubelet

    def List(self, request, context):  # noqa: N802 - gRPC method name
        resp = pr_pb2.ListPodResourcesResponse()
        for pod, by_resource in sorted(self.kubelet.allocated().items()):
            ns, name = pod.split("/", 1)
            ctr = resp.pod_resources.add(name=name, namespace=ns).containers.add(name="compute")
            for resource, ids in sorted(by_resource.items()):
                ctr.devices.add(resource_name=resource, device_ids=ids)
        return resp


class DpKubelet(FakeKubelet):
    """The kubelet's device manager (see the module docstring). ``rest`` is the API client's call."""

    def __init__(self, root: Path, node: str, rest) -> None:
        super().__init__(root)
        self.node = node
        self.rest = rest
        self._allocs: dict[str, dict[str, list[str]]] = {}  # "ns/pod" -> resource -> device ids
        self._pr: grpc.Server | None = None
        self.pod_resources_socket = self.root / "pod-resources" / "kubelet.sock"

    def start(self) -> None:
        super().start()
        if self._pr is None:
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            self._pr = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="pod-resources"))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), self._pr)
            self._pr.add_insecure_port(f"unix:{os.path.abspath(self.pod_resources_socket)}")
            self._pr.start()

    def close(self) -> None:
        self.stop()
        if self._pr is not None:
            self._pr.stop(0).wait(5)
            self._pr = None

    # ------------------------------------------------------------ the device manager's accounting
    def allocated(self) -> dict[str, dict[str, list[str]]]:
        with self._cond:
            return {p: {r: list(ids) for r, ids in by.items()} for p, by in self._allocs.items()}

    def in_use(self, resource: str) -> list[str]:
        return sorted(i for by in self.allocated().values() for i in by.get(resource, []))

    def healthy(self, resource: str) -> list[str]:
        """The devices the plugin's latest list calls healthy (kept while the plugin restarts, as the
        kubelet keeps them through its grace period)."""
        with self._cond:
            lists = self.device_lists.get(resource) or [[]]
            return sorted(d["id"] for d in lists[-1] if d["health"] == HEALTHY)

    def free(self, resource: str) -> list[str]:
        used = set(self.in_use(resource))
        return [d for d in self.healthy(resource) if d not in used]

    def sync_node_status(self) -> None:
        """Capacity and allocatable: the healthy count of every resource a plugin registered."""
        with self._cond:
            names = sorted(self.device_lists)
        counts = {r: str(len(self.healthy(r))) for r in names}
        self.rest("PATCH", f"/api/v1/nodes/{self.node}/status",
                  {"status": {"capacity": counts, "allocatable": counts}}, patch=True)

    def admit(self, pod: dict) -> dict[str, dict[str, Any]]:
        """Admit a pod bound to this node: per resource it asks, free healthy devices picked by the
        plugin's preference and handed out by its ``Allocate``; resource -> the container's answer."""
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        out: dict[str, dict[str, Any]] = {}
        for resource, n in sorted(pod_requests(pod).items()):
            free = self.free(resource)
            if len(free) < n:
                raise AdmissionError(f"UnexpectedAdmissionError: {resource}: requested {n}, available {len(free)}")
            with self.device_plugin(resource) as plugin:
                ids = plugin.preferred(free, [], n)
                (answer,) = plugin.allocate([ids])
            with self._cond:
                self._allocs.setdefault(key, {})[resource] = ids
            out[resource] = {**answer, "ids": ids}
        return out

    def pod_deleted(self, namespace: str, name: str) -> None:
        """The pod's containers ended and it is gone: its devices return to the free pool."""
        with self._cond:
            self._allocs.pop(f"{namespace}/{name}", None)


@dataclass
class DpNode:
    """One node: simulated host, kubelet, node agent."""

    name: str
    root: Path
    sim: SimNode
    kubelet: DpKubelet
    api_client: Any
    layout_file: Path
    daemon: Daemon | None = None
    loop: threading.Thread | None = None  # the agent's own loop (Daemon.run), where a test runs it
    qemus: dict[str, int] = field(default_factory=dict)  # pod (ns/name) -> QEMU pid

    def start_agent(self) -> Daemon:
        cfg = ServeConfig(node_name=self.name, layout_file=self.layout_file, device_plugin=True,
                          resync_seconds=3600, server_version=(1, 35), metrics_port=None,
                          kubelet_root=self.kubelet.root, cdi_root=self.root / "cdi", health_poll_seconds=60)
        lists = self.kubelet.device_lists
        before = {r: len(v) for r, v in lists.items()}
        self.daemon = Daemon(cfg, self.sim.env, self.sim.io, self.api_client).start()
        # registered, and the kubelet holds the new stream's first list of every resource it knew
        self.kubelet.wait_for(lambda: bool(lists) and all(len(lists.get(r, [])) > n for r, n in before.items()))
        return self.daemon

    def run_loop(self) -> None:
        """The agent's own loop (``Daemon.run``): it resyncs when its Node's cordon changes."""
        assert self.daemon is not None
        self.loop = threading.Thread(target=self.daemon.run, name=f"agent-{self.name}", daemon=True)
        self.loop.start()

    def stop_agent(self) -> None:
        """SIGTERM: the agent's servers stop and their sockets go; the devices stay."""
        if self.daemon is not None:
            self.daemon.stop()
            if self.loop is not None:  # its loop shuts the servers down on its way out
                self.loop.join(30)
                self.loop = None
            else:
                self.daemon._shutdown()
            self.daemon = None

    def restart_agent(self) -> None:
        self.stop_agent()
        self.start_agent()

    def inventory(self) -> Inventory:
        return discover(self.sim.env, self.sim.io, node=self.name)

    def agent_free(self) -> dict[tuple[str, str], int]:
        """The agent's own count of free vGPUs per GPU and profile (its metric), after a resync."""
        assert self.daemon is not None
        self.daemon.resync()
        out = {}
        for metric in self.daemon.metrics.registry.collect():
            if metric.name == "vgpuctl_gpu_free_vgpus":
                for s in metric.samples:
                    out[(s.labels["gpu"], s.labels["profile"])] = int(s.value)
        return out

    def start_qemu(self, pod: str, answer: dict[str, Any]) -> int:
        """The VM's QEMU opens the vfio group (and container) ``Allocate`` handed its pod."""
        paths = [d["host_path"] for d in answer["devices"]]
        pid = self.sim.host.spawn_holder(paths, cmdline=["qemu-kvm", "-name", pod])
        self.qemus[pod] = pid
        return pid

    def stop_qemu(self, pod: str) -> None:
        self.sim.host.kill(self.qemus.pop(pod))


def make_dp_node(base: Path, name: str, preset: str, layout: str, api_client, rest, *,
                 driver_version: str | None = None) -> DpNode:
    """A node called ``name`` built from ``preset`` under ``base/name``, its layout file written, its
    kubelet started (the agent is not)."""
    root = base / name
    root.mkdir(parents=True)
    sim = sim_node(root / "host", preset)
    if driver_version is not None:
        sim.host.upgrade_driver(driver_version)
    layout_file = root / "layout.yaml"
    layout_file.write_text(layout)
    rest("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name}}})
    kubelet = DpKubelet(root / "kl", name, rest)
    kubelet.start()
    return DpNode(name=name, root=root, sim=sim, kubelet=kubelet, api_client=api_client, layout_file=layout_file)


__all__ = ["AdmissionError", "DpKubelet", "DpNode", "make_dp_node"]
