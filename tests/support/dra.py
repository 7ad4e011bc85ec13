"""Shared helpers for the DRA bridge tests: simulated nodes, claims, slice checks, and the fixtures
``base`` (a short temporary directory) and ``srv`` (a local API server), which the conftests of
tests/dra_bridge and tests/system hand their modules (a module may override them).

A :class:`SimNode` is a simulated host (built by :func:`mdev_manager.sim.node.sim_node`) prepared the way the daemon
leaves it in ``dra`` mode (VFs enabled, no vGPUs), plus the pool the bridge would publish
for it. Claims are real ``resource.k8s.io/v1`` ResourceClaims stored in a
:class:`dra_bridge.sim.apiserver.LocalApiServer` and read back through ``ApiClaimSource``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.claims import ApiClaimSource
from dra_bridge.kubeletplugin.claimsource import ClaimSource
from dra_bridge.kubeletplugin.driver import Driver
from dra_bridge.pool.devices import Pool, build_pool
from dra_bridge.pool.policy import policy_from_layout
from dra_bridge.rpc.types import ClaimRef
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover, read_function, read_gpu
from mdev_manager.host.env import HostEnv
from mdev_manager.models import Gpu, Inventory
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import SimHost, SimIO
from mdev_manager.sim.node import sim_node
from tests.support.tmp import short_root

DRIVER = DEFAULT_DRIVER
DRA_LAYOUT = [GpuLayout(all=True, mode="dra", passthrough=True)]
VERSIONS = ["1.34", "1.35", "1.36", "1.37"]

# CDI names (dra.md, CDI section)
CDI_VENDOR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
CDI_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
CDI_SPEC_FIELDS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
CDI_DEVICE_FIELDS = {"name", "annotations", "containerEdits"}
CDI_EDIT_FIELDS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt"}
CDI_NODE_FIELDS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
CDI_MOUNT_FIELDS = {"hostPath", "containerPath", "options", "type"}


def version_tuple(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


@contextmanager
def short_tmp(prefix: str = "vg") -> Iterator[Path]:
    """A short temporary directory (unix socket paths must stay below 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=short_root()))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def base() -> Iterator[Path]:
    """A short temporary directory for a node and its agent (the kubelet's sockets go below it)."""
    with short_tmp() as d:
        yield d


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    """A local API server of a GA DRA release (resource.k8s.io/v1)."""
    with LocalApiServer(version="1.35") as server:
        yield server


# --------------------------------------------------------------------------- simulated node


@dataclass
class SimNode:
    root: Path
    host: SimHost
    env: HostEnv
    io: SimIO
    node: str
    layouts: list[GpuLayout] | None = field(default_factory=lambda: list(DRA_LAYOUT))
    version: tuple[int, int] = (1, 35)

    def inventory(self) -> Inventory:
        return discover(self.env, self.io, node=self.node)

    def gpu(self, address: str) -> Gpu:
        return read_gpu(self.env, self.io, address, 0, read_function(self.env, self.io, address))

    def build_pool(self) -> Pool:
        inv = self.inventory()
        return build_pool(inv, policy_from_layout(inv, self.layouts), DRIVER, server_version=self.version,
                          pcie_roots={g.address: g.pcie_root for g in inv.gpus if g.pcie_root})

    def driver_of(self, address: str) -> str | None:
        link = self.env.pci(address) / "driver"
        return os.path.basename(os.readlink(link)) if os.path.lexists(link) else None

    def mdevs(self) -> set[str]:
        """UUIDs on the mdev bus (what the kernel really holds)."""
        d = self.env.mdev_devices
        return set(os.listdir(d)) if d.is_dir() else set()

    def vgpu_ids(self) -> set[str]:
        return {v.id for v in self.inventory().all_vgpus()}

    def current_vgpu_type(self, vf: str) -> str:
        return (self.env.pci(vf) / "nvidia" / "current_vgpu_type").read_text().strip()


def make_node(root: Path, preset: str = "default", *, version: tuple[int, int] = (1, 35),
              prepare_gpus: bool = True) -> SimNode:
    """A simulated host under ``root``; ``prepare_gpus`` runs the ``dra`` layout (enables VFs)."""
    sim = sim_node(Path(root) / "host", preset)
    node = SimNode(root=sim.root, host=sim.host, env=sim.env, io=sim.io, node=sim.node, version=version)
    set_boot_id(node, str(uuid.uuid4()))  # a real host always has one; the simulator makes one at each reboot
    if prepare_gpus:
        out = reconcile(node.env, node.io, DRA_LAYOUT, node=node.node)
        assert out.ok, out
    return node


def boot_id_file(node) -> Path:
    return node.env.boot_id


def set_boot_id(node, value: str) -> None:
    """The host's boot id (any simulated node: this module's or :func:`mdev_manager.sim.node.sim_node`'s)."""
    path = boot_id_file(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def devices_of(pool: Pool, gpu: str, kind: str, type_id: str | None = None) -> list[str]:
    return [d.name for d in pool.devices if d.gpu == gpu and d.kind == kind
            and (type_id is None or d.type_id == type_id)]


# --------------------------------------------------------------------------- claims


def claim_object(name: str, results: list[tuple[str, str]], *, node: str, namespace: str = "default",
                 driver: str = DRIVER, pool: str | None = None, annotations: dict[str, str] | None = None,
                 device_class: str = "vgpu.kubevirt.io") -> dict:
    """A valid resource.k8s.io/v1 ResourceClaim, allocated: ``results`` are (request, device)."""
    requests = []
    for request, _ in results:
        if request not in [r["name"] for r in requests]:
            requests.append({"name": request, "exactly": {"deviceClassName": device_class}})
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": r, "driver": driver, "pool": pool or node, "device": d}
                                        for r, d in results]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            },
        },
    }


def add_claim(srv, name: str, results: list[tuple[str, str]], *, node: str, **kw) -> ClaimRef:
    """Store the claim in the API server; returns the kubelet's view of it (server-assigned uid)."""
    stored = srv.add(claim_object(name, results, node=node, **kw))
    meta = stored["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


class DictClaims:
    """A ClaimSource over plain dicts (for the crash tests, where no API server is needed)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict] = {}

    def add(self, obj: dict, uid: str) -> ClaimRef:
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["uid"] = uid
        obj["metadata"].setdefault("generation", 1)
        self.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return ClaimRef(namespace=obj["metadata"]["namespace"], name=obj["metadata"]["name"], uid=uid)

    def get(self, namespace: str, name: str) -> dict:
        try:
            return json.loads(json.dumps(self.claims[(namespace, name)]))
        except KeyError:
            raise LookupError(f"resourceclaims {namespace}/{name} not found") from None


def make_driver(node: SimNode, paths: NodePaths, claims: ClaimSource | Any, pool: Pool | Callable[[], Pool],
                io: SimIO | None = None) -> Driver:
    """A Driver for ``node``; ``claims`` is a ClaimSource or a kubernetes ApiClient."""
    source = ApiClaimSource(claims) if hasattr(claims, "call_api") else claims
    get_pool = pool if callable(pool) else (lambda: pool)
    return Driver(env=node.env, paths=paths, pool_name=node.node, claims=source, pool=get_pool, io=io or node.io)


def resync_agent(node: SimNode, srv: LocalApiServer, base: Path, io: Any, events: Any = None) -> Any:
    """The agent (a ``Daemon``) as ``start()`` wires it over ``io``, without its sockets and threads, resynced
    once: its periods are an hour, so only the test (and ``events``, a source it then starts) make it read."""
    from dra_bridge.agent.daemon import Daemon, ServeConfig  # the agent's imports only where a test runs one

    cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=None,
                      resync_seconds=3600, health_poll_seconds=3600, full_resync_seconds=3600)
    daemon = Daemon(cfg, node.env, io, srv.api_client(), events=events)
    daemon._wrap_prepare()
    daemon.resync()
    if events is not None:
        daemon._watch_events()
    return daemon


# --------------------------------------------------------------------------- files written by prepare


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())


def read_metadata_stream(path: Path | str) -> list[dict]:
    """The KEP-5304 file: JSON objects, each followed by a newline."""
    text = Path(path).read_text()
    assert text.endswith("\n"), "every metadata object must end with a newline"
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def cdi_problems(spec: dict) -> list[str]:
    """What a strict CDI parser (cncf-tags/container-device-interface) would reject."""
    errs = []
    extra = set(spec) - CDI_SPEC_FIELDS
    if extra:
        errs.append(f"unknown spec fields {sorted(extra)}")
    if spec.get("cdiVersion") not in {"0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"}:
        errs.append(f"cdiVersion {spec.get('cdiVersion')!r} cannot carry hostPath / digit-led names")
    vendor, _, cls = str(spec.get("kind", "")).partition("/")
    if not (CDI_VENDOR_CLASS.match(vendor) and CDI_VENDOR_CLASS.match(cls)):
        errs.append(f"kind {spec.get('kind')!r} is not vendor/class")
    if not spec.get("devices"):
        errs.append("a spec needs at least one device")
    for dev in spec.get("devices") or []:
        if set(dev) - CDI_DEVICE_FIELDS:
            errs.append(f"device {dev.get('name')}: unknown fields {sorted(set(dev) - CDI_DEVICE_FIELDS)}")
        if not CDI_DEVICE_NAME.match(str(dev.get("name", ""))):
            errs.append(f"device name {dev.get('name')!r} invalid")
        edits = dev.get("containerEdits") or {}
        if set(edits) - CDI_EDIT_FIELDS:
            errs.append(f"device {dev.get('name')}: unknown edits {sorted(set(edits) - CDI_EDIT_FIELDS)}")
        for n in edits.get("deviceNodes") or []:
            if set(n) - CDI_NODE_FIELDS:
                errs.append(f"device node {n}: unknown fields")
            if not str(n.get("path", "")).startswith("/"):
                errs.append(f"device node path {n.get('path')!r} is not absolute")
            if n.get("permissions") is not None and (not n["permissions"] or set(n["permissions"]) - set("rwm")):
                errs.append(f"device node permissions {n['permissions']!r} not a subset of rwm")
        for m in edits.get("mounts") or []:
            if set(m) - CDI_MOUNT_FIELDS:
                errs.append(f"mount {m}: unknown fields")
            if not str(m.get("containerPath", "")).startswith("/") or not m.get("hostPath"):
                errs.append(f"mount {m}: needs hostPath and an absolute containerPath")
    return errs


def cdi_device(cdi_root: Path, cdi_id: str) -> tuple[dict, dict]:
    """(spec, device) for a qualified CDI id, searching every spec under ``cdi_root`` as a runtime would."""
    kind, _, name = cdi_id.partition("=")
    found = []
    for f in sorted(Path(cdi_root).glob("*.json")):
        spec = read_json(f)
        if spec.get("kind") != kind:
            continue
        found += [(spec, d) for d in spec.get("devices", []) if d.get("name") == name]
    assert len(found) == 1, f"CDI id {cdi_id} resolves to {len(found)} devices under {cdi_root}"
    return found[0]


# --------------------------------------------------------------------------- slices


def pool_slices(srv, *, driver: str = DRIVER, node: str | None = None) -> list[dict]:
    return [s for s in srv.objects("resourceslices")
            if s["spec"]["driver"] == driver and (node is None or s["spec"].get("nodeName") == node)]


def published_devices(slices: list[dict]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices") or []}


def gpu_addresses(slices: list[dict]) -> set[str]:
    """The physical GPUs (PCI addresses) the published devices belong to."""
    out = set()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            a = d.get("attributes") or {}
            out.add((a.get("parentPciBusID") or a.get("resource.kubernetes.io/pciBusID"))["string"])
    return out


def assert_consistent_pool(slices: list[dict]) -> int:
    """Every slice of the pool: one generation, resourceSliceCount == number of slices. Returns it."""
    assert slices, "no slices published"
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    pools = {s["spec"]["pool"]["name"] for s in slices}
    assert len(pools) == 1, pools
    assert len(gens) == 1, f"several generations visible: {sorted(gens)}"
    assert counts == {len(slices)}, f"resourceSliceCount {counts} for {len(slices)} slices"
    return gens.pop()


def schema_validate(obj: dict, version: str) -> None:
    """Strict validation against the official OpenAPI schema of ``version`` (kubernetes-validate)."""
    import kubernetes_validate

    kubernetes_validate.validate(obj, desired_version=version, strict=True)


def strip_server_fields(obj: dict) -> dict:
    """An object as a client would write it (no server-set metadata)."""
    out = json.loads(json.dumps(obj))
    for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        out["metadata"].pop(k, None)
    return out
