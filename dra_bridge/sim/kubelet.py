"""The kubelet and the container runtime of the simulated cluster.

The kubelet finds the DRA plugin through its registration socket and calls it over gRPC with
the one kubelet client (:mod:`dra_bridge.rpc.dra_client`, our generated stubs); the
runtime resolves the CDI ids the plugin answered into device nodes and mounts; the workload
reads its device's identity from the KEP-5304 metadata file mounted into it. What the
workload got is put together by :func:`workload_devices`, a pure function of those answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.scheduling.objects import dev_attr, dev_gpu, dev_memory
from dra_bridge.sim.workloads import WorkloadDevice

if TYPE_CHECKING:  # the gRPC client loads grpc: imported by register() only, once a cluster runs
    from dra_bridge.rpc.dra_client import DraClient, PluginInfo

DRA_VERSION = "v1.DRAPlugin"
# the labels a GPU node carries where vgpuctl runs: NVIDIA's GPU feature discovery marks it, the
# operator opts it in for the agent's DaemonSet (deploy/base/daemonset.yaml's nodeSelector)
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true", "vgpu.kubevirt.io/agent": "true"}


def node_object(name: str, *, kubelet_version: str = "v1.35.0", labels: dict[str, str] | None = None) -> dict:
    """The Node a kubelet registers for a simulated node: Ready, with its addresses and node info,
    so the agent finds its own Node (labels, annotations) and ``kubectl get nodes`` lists it."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64", **GPU_NODE_LABELS,
                                                  **(labels or {})}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status (simulated)"}],
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "nodeInfo": {"kubeletVersion": kubelet_version, "osImage": "vgpuctl simulated host",
                                    "kernelVersion": "simulated", "containerRuntimeVersion": "simulated://1",
                                    "operatingSystem": "linux", "architecture": "amd64", "machineID": "",
                                    "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}}}


class KubeletClient:
    """The kubelet's half of the DRA plugin protocol, over the plugin's real unix sockets: find
    the plugin through its registration socket (``GetInfo``), confirm the registration, then call
    ``NodePrepareResources`` / ``NodeUnprepareResources`` (v1) on the endpoint it named."""

    def __init__(self, kubelet_root: Path, driver: str = DEFAULT_DRIVER, timeout: float = 30.0):
        self.registration_socket = NodePaths(driver=driver, kubelet_root=Path(kubelet_root)).registration_socket
        self.driver = driver
        self.timeout = timeout
        self.endpoint: str | None = None
        self._dra: DraClient | None = None

    def _refuse(self, info: PluginInfo) -> str | None:
        if info.type != "DRAPlugin" or info.name != self.driver or DRA_VERSION not in info.supported_versions:
            return f"unsupported plugin {info.type}/{info.name}"
        return None

    def register(self) -> KubeletClient:
        from dra_bridge.rpc.dra_client import DraClient, register_plugin  # grpc: only once a cluster runs

        info, refused = register_plugin(self.registration_socket, self._refuse, timeout=self.timeout)
        if refused is not None:
            raise RuntimeError(f"plugin at {self.registration_socket} is {info.type} {info.name} "
                               f"{list(info.supported_versions)}, not a v1 DRAPlugin for {self.driver}")
        self.endpoint = info.endpoint
        self._dra = DraClient(info.endpoint, "v1", self.timeout)
        return self

    def prepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, dict]:
        """(namespace, uid, name) per claim -> uid -> {"devices": [...], "error": str}."""
        return self._client().prepare(claims)

    def unprepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, str]:
        return self._client().unprepare(claims)

    def _client(self) -> DraClient:
        if self._dra is None:
            raise RuntimeError("the kubelet has not registered the plugin (register() first)")
        return self._dra

    def close(self) -> None:
        if self._dra is not None:
            self._dra.close()
            self._dra = None


# --------------------------------------------------------------------------- CDI, as a runtime reads it


@dataclass
class CdiEdits:
    device_nodes: list[dict] = field(default_factory=list)  # {"path", "hostPath", ...}
    mounts: list[dict] = field(default_factory=list)  # {"hostPath", "containerPath", ...}
    env: list[str] = field(default_factory=list)


def resolve_cdi(cdi_root: Path, ids: Iterable[str]) -> CdiEdits:
    """The container edits of qualified CDI ids, from the specs under ``cdi_root``; an id that
    resolves to no device (or to several) is an error, as in the container runtime."""
    specs = []
    for f in sorted(Path(cdi_root).glob("*.json")):
        try:
            specs.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    out = CdiEdits()
    for cdi_id in ids:
        kind, _, name = cdi_id.partition("=")
        found = [d for s in specs if s.get("kind") == kind for d in s.get("devices") or [] if d.get("name") == name]
        if len(found) != 1:
            raise LookupError(f"CDI device {cdi_id} resolves to {len(found)} devices under {cdi_root}")
        edits = found[0].get("containerEdits") or {}
        out.device_nodes += edits.get("deviceNodes") or []
        out.mounts += edits.get("mounts") or []
        out.env += edits.get("env") or []
    return out


def _metadata_id(path: Path, device: str) -> str | None:
    """``mdevUUID`` (or else the PCI address) of ``device`` in a KEP-5304 metadata file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        for req in doc.get("requests") or []:
            for d in req.get("devices") or []:
                if d.get("name") != device:
                    continue
                a = d.get("attributes") or {}
                for key in ("mdevUUID", "resource.kubernetes.io/pciBusID"):
                    if key in a:
                        return a[key].get("string")
    return None


def prepare_errors(claims: list[tuple[str, str]], answers: dict[str, dict]) -> list[str]:
    """``claim: error`` for each claim the plugin failed or did not answer."""
    return [f"{n}: {answers.get(uid, {}).get('error') or 'no answer'}" for n, uid in claims
            if answers.get(uid, {}).get("error") or uid not in answers]


def workload_devices(claims: list[tuple[str, str]], answers: dict[str, dict], published: dict[tuple, dict],
                     driver: str, cdi_root: Path) -> list[WorkloadDevice]:
    """What a workload got: per (claim name, uid) the devices the plugin prepared, described by
    the slice that published them (``published``: ``devices_by_key``), their device nodes from
    the CDI specs, and the host identity the KEP-5304 metadata gives the workload."""
    out = []
    for cname, uid in claims:
        # the runtime gives the container every CDI id of the claim: a request's metadata file
        # (KEP-5304) comes with its first device's ids but names all of the request's devices
        mounts = [m for d in answers[uid]["devices"] for m in resolve_cdi(cdi_root, d["cdi_device_ids"]).mounts]
        for d in answers[uid]["devices"]:
            dev = published.get((driver, d["pool_name"], d["device_name"]), {})
            cs = (dev.get("consumesCounters") or [{}])[0].get("counterSet")
            edits = resolve_cdi(cdi_root, d["cdi_device_ids"])
            nodes = [n for n in edits.device_nodes if n.get("path") != "/dev/vfio/vfio"]
            groups = [int(Path(n["path"]).name) for n in nodes if Path(n["path"]).name.isdigit()]
            wd = WorkloadDevice(claim=cname, request=(d["request_names"] or [""])[0], pool=d["pool_name"],
                                device=d["device_name"], kind=dev_attr(dev, "type") or "?", gpu=dev_gpu(dev),
                                profile=dev_attr(dev, "profile"), memory=dev_memory(dev), counter_set=cs,
                                node=dev.get("_node"), iommu_group=groups[0] if groups else None,
                                device_nodes=edits.device_nodes, cdi_ids=d["cdi_device_ids"])
            if dev_attr(dev, "placementStart") is not None:
                where = (dev_attr(dev, "placementStart"), dev_attr(dev, "placementSize"))
                if dev_attr(dev, "migBacked"):
                    wd.instance = where
                    wd.inside = dev_attr(dev, "vgpuPlacement")  # MIG time-slicing: its placement inside
                else:
                    wd.slots = where  # mixed-size
            wd.env = list(edits.env)
            for m in mounts:
                wd.host_id = wd.host_id or _metadata_id(Path(m["hostPath"]), d["device_name"])
            out.append(wd)
    _classic_ids(out)
    return out


def _classic_ids(devices: list[WorkloadDevice]) -> None:
    """A classic VM's virt-launcher finds its devices in ``MDEV_PCI_RESOURCE_<R>`` / ``PCI_RESOURCE_<R>``
    (comma-separated, one per device of that resource, in order), not in the metadata files."""
    taken: dict[str, int] = {}
    for wd in devices:
        for entry in wd.env:
            name, _, value = entry.partition("=")
            if name.startswith(("MDEV_PCI_RESOURCE_", "PCI_RESOURCE_")):
                ids = value.split(",")
                k = taken.get(name, 0)
                taken[name] = k + 1
                if k < len(ids):
                    wd.host_id = ids[k]
                break


__all__ = ["CdiEdits", "KubeletClient", "prepare_errors", "resolve_cdi", "workload_devices"]
