"""A simulated cluster in one process: what ``vgpuctl demo``, ``capacity`` and ``conformance`` run on.

Every part is the real one except the hardware, the API server and the scheduler:

* a simulated GPU node (:mod:`mdev_manager.sim`, a sysfs tree with the kernel's write rules);
* the node agent (:class:`dra_bridge.agent.daemon.Daemon`): it reconciles the layout with the node
  manager, publishes ResourceSlices and serves the kubelet plugin on real unix sockets;
* an in-process Kubernetes API server (:mod:`dra_bridge.sim.apiserver`) reached through the official
  ``kubernetes`` client;
* the scheduler's allocation is :class:`dra_bridge.scheduling.allocator.Allocator` (a model of it), the
  ResourceClaim controller and the kubelet are a few lines here: claims are made from
  ResourceClaimTemplates as the controller names them, the kubelet side finds the plugin through
  its registration socket and calls ``NodePrepareResources`` / ``NodeUnprepareResources`` over
  gRPC, and "running" a workload means resolving the CDI ids the plugin answered into device
  nodes and mounts, as a container runtime would.

CEL selectors are evaluated with the ``cel`` library (``common-expression-language``) when it
is installed and otherwise with :class:`SubsetSelectors`, which covers the expressions
vgpuctl's templates and DeviceClasses write.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable

from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.models import Inventory

from dra_bridge.scheduling.allocator import Allocator, Device, Unsatisfiable
from dra_bridge.kubeletplugin.paths import DEFAULT_DRIVER
from dra_bridge.kube.objects import raw, sanitize
from dra_bridge.scheduling.objects import dev_attr, dev_gpu, dev_memory, devices_by_key
from dra_bridge.api.quantity import parse_quantity

log = logging.getLogger(__name__)

#: The node layout of the simulated cluster: every GPU handed to the DRA bridge, one vGPU
#: profile each (the equal-size choice on servers before 1.37), and each whole GPU offered for
#: passthrough too. The counts are what the layout allows at most; in ``dra`` mode the bridge
#: creates each vGPU when a claim is prepared.
DEMO_LAYOUT = """\
version: vgpuctl/v1
layouts:
  demo:
    - index: 0                 # Tesla T4, mdev on the PF
      mode: dra
      vgpus: {T4-8Q: 2}
      passthrough: true
    - index: 1                 # second Tesla T4
      mode: dra
      vgpus: {T4-8Q: 2}
      passthrough: true
    - model: A100              # A100 40GB, mdev on SR-IOV VFs
      mode: dra
      vgpus: {A100-10C: 4}
      passthrough: true
    - model: L40S              # L40S, NVIDIA vendor-specific VFIO on VFs
      mode: dra
      vgpus: {L40S-12Q: 4}
      passthrough: true
  all:                         # every GPU, every profile (servers >= 1.37 publish them all)
    - all: true
      mode: dra
      passthrough: true
"""

LAUNCHER_IMAGE = "quay.io/kubevirt/virt-launcher:v1.9.0"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
WAIT = 20.0


def _resource_types():
    from dra_bridge.sim.apiserver import ResourceType

    return (
        ResourceType("kubevirt.io", "v1", "virtualmachines", "VirtualMachine", namespaced=True,
                     singular="virtualmachine", status_subresource=True, has_generation=True, short_names=("vm",)),
        ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, singular="configmap", short_names=("cm",)),
    )


# =========================================================================== CEL


class CelSubsetError(ValueError):
    """An expression outside the subset, or one that fails at run time (the device does not match)."""


class _Q:
    """A Kubernetes Quantity inside an expression."""

    __slots__ = ("v",)

    def __init__(self, v: Fraction):
        self.v = Fraction(v)

    def __eq__(self, other):
        return isinstance(other, _Q) and other.v == self.v

    def __hash__(self):
        return hash(self.v)


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<num>\d+(?:\.\d+)?u?)
  | (?P<op>&&|\|\||==|!=|<=|>=|[<>!()\[\].,?:-])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
""", re.X)


def _tokens(text: str) -> list[tuple[str, Any]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CelSubsetError(f"unexpected character {text[pos]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        value: Any = m.group()
        if kind == "str":
            value = json.loads('"' + value[1:-1].replace('\\\'', "'").replace('"', '\\"') + '"') \
                if value[0] == "'" else json.loads(value)
        elif kind == "num":
            value = float(value) if "." in value else int(value.rstrip("u"))
        elif kind == "id" and value in ("true", "false"):
            kind, value = "lit", value == "true"
        elif kind == "id" and value == "in":
            kind = "op"
        out.append((kind, value))
    out.append(("end", None))
    return out


class _Parser:
    """Recursive descent over the CEL grammar subset; builds nested tuples."""

    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, *values) -> bool:
        k, v = self.toks[self.i]
        return k == "op" and v in values

    def take(self, value: str | None = None):
        k, v = self.toks[self.i]
        if value is not None and not (k == "op" and v == value):
            raise CelSubsetError(f"expected {value!r}, found {v!r}")
        self.i += 1
        return k, v

    def parse(self):
        node = self.ternary()
        if self.toks[self.i][0] != "end":
            raise CelSubsetError(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def ternary(self):
        cond = self.or_()
        if self.peek("?"):
            self.take("?")
            a = self.ternary()
            self.take(":")
            return ("?", cond, a, self.ternary())
        return cond

    def or_(self):
        node = self.and_()
        while self.peek("||"):
            self.take()
            node = ("||", node, self.and_())
        return node

    def and_(self):
        node = self.rel()
        while self.peek("&&"):
            self.take()
            node = ("&&", node, self.rel())
        return node

    def rel(self):
        node = self.unary()
        if self.peek("==", "!=", "<", "<=", ">", ">=", "in"):
            _, op = self.take()
            node = (op, node, self.unary())
        return node

    def unary(self):
        if self.peek("!"):
            self.take()
            return ("!", self.unary())
        if self.peek("-"):
            self.take()
            return ("neg", self.unary())
        return self.member()

    def member(self):
        node = self.primary()
        while True:
            if self.peek("."):
                self.take()
                k, name = self.take()
                if k != "id":
                    raise CelSubsetError(f"expected a field name after '.', found {name!r}")
                if self.peek("("):
                    node = ("call", name, node, self.args())
                else:
                    node = ("field", node, name)
            elif self.peek("["):
                self.take()
                idx = self.ternary()
                self.take("]")
                node = ("index", node, idx)
            else:
                return node

    def args(self) -> list:
        self.take("(")
        out = []
        while not self.peek(")"):
            out.append(self.ternary())
            if not self.peek(")"):
                self.take(",")
        self.take(")")
        return out

    def primary(self):
        k, v = self.take()
        if k in ("str", "num", "lit"):
            return ("lit", v)
        if k == "id":
            if self.peek("("):
                if v == "has":
                    self.take("(")
                    arg = self.ternary()
                    self.take(")")
                    if arg[0] not in ("field", "index"):
                        raise CelSubsetError("has() needs a field selection")
                    return ("has", arg)
                return ("call", v, None, self.args())
            return ("var", v)
        if k == "op" and v == "(":
            node = self.ternary()
            self.take(")")
            return node
        if k == "op" and v == "[":
            items = []
            while not self.peek("]"):
                items.append(self.ternary())
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return ("list", items)
        raise CelSubsetError(f"unexpected {v!r}")


def _num(x: Any, what: str) -> Fraction:
    if isinstance(x, _Q):
        return x.v
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Fraction(x)
    raise CelSubsetError(f"{what}: {x!r} is not a quantity")


_METHODS = {
    "compareTo": lambda a, b: (_num(a, "compareTo") > _num(b, "compareTo")) - (_num(a, "compareTo") < _num(b, "compareTo")),
    "isGreaterThan": lambda a, b: _num(a, "isGreaterThan") > _num(b, "isGreaterThan"),
    "isLessThan": lambda a, b: _num(a, "isLessThan") < _num(b, "isLessThan"),
    "asInteger": lambda a: int(_num(a, "asInteger")),
    "asApproximateFloat": lambda a: float(_num(a, "asApproximateFloat")),
    "sign": lambda a: (_num(a, "sign") > 0) - (_num(a, "sign") < 0),
    "add": lambda a, b: _Q(_num(a, "add") + _num(b, "add")),
    "sub": lambda a, b: _Q(_num(a, "sub") - _num(b, "sub")),
    "isInteger": lambda a: _num(a, "isInteger").denominator == 1,
    "startsWith": lambda a, b: str(a).startswith(b),
    "endsWith": lambda a, b: str(a).endswith(b),
    "contains": lambda a, b: b in str(a),
    "matches": lambda a, b: re.search(b, str(a)) is not None,
    "lowerAscii": lambda a: str(a).lower(),
    "size": lambda a: len(a),
}
_FUNCTIONS = {
    "quantity": lambda s: _Q(parse_quantity(s)),
    "isQuantity": lambda s: _is_quantity(s),
    "size": lambda a: len(a),
    "string": lambda a: str(a),
    "int": lambda a: int(a),
}


def _is_quantity(s: Any) -> bool:
    try:
        parse_quantity(s)
        return True
    except (ValueError, TypeError):
        return False


class _MissingDomain(dict):
    """``device.attributes["other.io"]``: an empty map, as Kubernetes gives for unknown domains."""


def _eval(node, env: dict) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "var":
        if node[1] not in env:
            raise CelSubsetError(f"undeclared reference to {node[1]!r}")
        return env[node[1]]
    if op == "list":
        return [_eval(n, env) for n in node[1]]
    if op in ("&&", "||"):
        want = op == "||"  # the value that decides
        errors = []
        for side in node[1:]:
            try:
                v = _eval(side, env)
            except CelSubsetError as exc:
                errors.append(exc)
                continue
            if not isinstance(v, bool):
                raise CelSubsetError(f"{op} on a {type(v).__name__}")
            if v is want:
                return want
        if errors:
            raise errors[0]
        return not want
    if op == "!":
        v = _eval(node[1], env)
        if not isinstance(v, bool):
            raise CelSubsetError("! on a non-bool")
        return not v
    if op == "neg":
        return -_eval(node[1], env)
    if op == "?":
        return _eval(node[2] if _eval(node[1], env) else node[3], env)
    if op in ("==", "!="):
        a, b = _eval(node[1], env), _eval(node[2], env)
        same = type(a) is type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                     and not isinstance(a, bool) and not isinstance(b, bool))
        eq = same and a == b
        return eq if op == "==" else not eq
    if op in ("<", "<=", ">", ">="):
        a, b = _eval(node[1], env), _eval(node[2], env)
        if isinstance(a, _Q) or isinstance(b, _Q) or isinstance(a, bool) or type(a) is not type(b) and not (
                isinstance(a, (int, float)) and isinstance(b, (int, float))):
            raise CelSubsetError(f"no such overload: {type(a).__name__} {op} {type(b).__name__}")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "in":
        a, b = _eval(node[1], env), _eval(node[2], env)
        return a in b
    if op == "field":
        base = _eval(node[1], env)
        return _select(base, node[2])
    if op == "index":
        base = _eval(node[1], env)
        key = _eval(node[2], env)
        if isinstance(base, list):
            return base[key]
        return _select(base, key)
    if op == "has":
        target = node[1]
        base = _eval(target[1], env)
        key = target[2] if target[0] == "field" else _eval(target[2], env)
        if not isinstance(base, dict):
            raise CelSubsetError("has() on a non-map")
        return key in base
    if op == "call":
        name, recv, args = node[1], node[2], [_eval(a, env) for a in node[3]]
        if recv is not None:
            fn = _METHODS.get(name)
            if fn is None:
                raise CelSubsetError(f"unknown method {name}()")
            return fn(_eval(recv, env), *args)
        fn = _FUNCTIONS.get(name)
        if fn is None:
            raise CelSubsetError(f"unknown function {name}()")
        return fn(*args)
    raise CelSubsetError(f"cannot evaluate {op}")


def _select(base: Any, key: Any) -> Any:
    if not isinstance(base, dict):
        raise CelSubsetError(f"cannot select {key!r} from a {type(base).__name__}")
    if key in base:
        return base[key]
    if isinstance(base, _Domains):
        return _MissingDomain()
    raise CelSubsetError(f"no such key: {key}")


class _Domains(dict):
    """``device.attributes`` / ``device.capacity``: domain -> name -> value."""


def _attr(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1:
        kind, value = next(iter(v.items()))
        return value if kind in ("string", "int", "bool", "version") else v
    return v


def device_env(device: Device) -> dict:
    attributes, capacity = _Domains(), _Domains()
    for k, v in device.attributes.items():
        domain, _, name = k.rpartition("/") if "/" in k else (device.driver, "", k)
        attributes.setdefault(domain, {})[name] = _attr(v)
    for k, v in device.capacity.items():
        domain, _, name = k.rpartition("/") if "/" in k else (device.driver, "", k)
        capacity.setdefault(domain, {})[name] = _Q(parse_quantity(v["value"] if isinstance(v, dict) else v))
    return {"device": {"driver": device.driver, "attributes": attributes, "capacity": capacity,
                       "allowMultipleAllocations": device.multi}}


class SubsetSelectors:
    """DRA CEL selectors without the ``cel`` library: the grammar subset vgpuctl's objects use
    (``== != < <= > >= in && || ! ?:``, field and index selection, ``has()``, ``quantity()`` and the
    Quantity methods, string ``startsWith/endsWith/contains/matches``). A run-time error makes the
    device not match, as the scheduler fails such an allocation; errors are kept in ``errors``."""

    def __init__(self):
        self._programs: dict[str, Any] = {}
        self.errors: list[str] = []

    def compile(self, expression: str):
        prog = self._programs.get(expression)
        if prog is None:
            prog = self._programs[expression] = _Parser(expression).parse()
        return prog

    def matches(self, expression: str, device: Device) -> bool:
        try:
            out = _eval(self.compile(expression), device_env(device))
        except (CelSubsetError, TypeError, ValueError, KeyError, IndexError) as exc:
            self.errors.append(f"{expression!r}: {exc}")
            return False
        if not isinstance(out, bool):
            self.errors.append(f"{expression!r}: evaluated to {out!r}, not a bool")
            return False
        return out


def default_selectors():
    """The real CEL evaluator when ``common-expression-language`` is installed, else the subset."""
    try:
        import cel  # noqa: F401

        from dra_bridge.scheduling.allocator import CelSelectors

        return CelSelectors()
    except ImportError:
        return SubsetSelectors()


# =========================================================================== the kubelet side


class KubeletClient:
    """The kubelet's half of the DRA plugin protocol, over the plugin's real unix sockets: find
    the plugin through its registration socket (``GetInfo``), confirm the registration, then call
    ``NodePrepareResources`` / ``NodeUnprepareResources`` (v1) on the endpoint it named."""

    def __init__(self, kubelet_root: Path, driver: str = DEFAULT_DRIVER, timeout: float = 30.0):
        self.registration_socket = Path(kubelet_root) / "plugins_registry" / f"{driver}-reg.sock"
        self.driver = driver
        self.timeout = timeout
        self.endpoint: str | None = None
        self._channels: list[Any] = []
        self._dra = None

    def register(self) -> "KubeletClient":
        import grpc

        from dra_bridge.kubelet.proto import vgpuctl_dra_v1_pb2_grpc as dra_grpc
        from dra_bridge.kubelet.proto import vgpuctl_pluginregistration_pb2 as reg_pb2
        from dra_bridge.kubelet.proto import vgpuctl_pluginregistration_pb2_grpc as reg_grpc

        ch = grpc.insecure_channel(f"unix://{self.registration_socket}")
        self._channels.append(ch)
        reg = reg_grpc.RegistrationStub(ch)
        info = reg.GetInfo(reg_pb2.InfoRequest(), timeout=self.timeout)
        if info.type != "DRAPlugin" or info.name != self.driver or "v1.DRAPlugin" not in info.supported_versions:
            reg.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(
                plugin_registered=False, error=f"unsupported plugin {info.type}/{info.name}"), timeout=self.timeout)
            raise RuntimeError(f"plugin at {self.registration_socket} is {info.type} {info.name} "
                               f"{list(info.supported_versions)}, not a v1 DRAPlugin for {self.driver}")
        reg.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=self.timeout)
        self.endpoint = info.endpoint
        dch = grpc.insecure_channel(f"unix://{info.endpoint}")
        self._channels.append(dch)
        self._dra = dra_grpc.DRAPluginStub(dch)
        return self

    def prepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, dict]:
        """(namespace, name, uid) per claim -> uid -> {"devices": [...], "error": str}."""
        from dra_bridge.kubelet.proto import vgpuctl_dra_v1_pb2 as pb2

        req = pb2.NodePrepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims])
        resp = self._dra.NodePrepareResources(req, timeout=self.timeout)
        out = {}
        for uid, r in resp.claims.items():
            out[uid] = {"error": r.error, "devices": [
                {"requests": list(d.request_names), "pool": d.pool_name, "device": d.device_name,
                 "cdi": list(d.cdi_device_ids)} for d in r.devices]}
        return out

    def unprepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, str]:
        from dra_bridge.kubelet.proto import vgpuctl_dra_v1_pb2 as pb2

        req = pb2.NodeUnprepareResourcesRequest(
            claims=[pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims])
        resp = self._dra.NodeUnprepareResources(req, timeout=self.timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def close(self) -> None:
        for ch in self._channels:
            ch.close()
        self._channels.clear()


# =========================================================================== CDI, as a runtime reads it


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


# =========================================================================== workloads


def _rand(n: int = 5) -> str:
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))





@dataclass
class WorkloadDevice:
    """One device a workload got: what the scheduler allocated and what the node made of it."""

    claim: str
    request: str
    pool: str
    device: str
    kind: str  # vgpu | passthrough
    gpu: str | None  # PCI address of the physical GPU, from the slice
    profile: str | None
    memory: Fraction | None  # bytes
    counter_set: str | None
    node: str | None
    host_id: str | None = None  # mdevUUID or PCI address, from the KEP-5304 metadata the workload reads
    iommu_group: int | None = None
    device_nodes: list[dict] = field(default_factory=list)
    cdi_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("claim", "request", "pool", "device", "kind", "gpu", "profile",
                                            "counter_set", "node", "host_id", "iommu_group", "cdi_ids")}
        d["memory"] = int(self.memory) if self.memory is not None else None
        d["device_nodes"] = [{"path": n.get("path"), "hostPath": n.get("hostPath")} for n in self.device_nodes]
        return d


@dataclass
class Workload:
    name: str
    kind: str  # VirtualMachine | Pod
    namespace: str
    pod: str  # the pod that holds the claims (virt-launcher-... for a VM)
    pod_uid: str = ""
    claims: list[tuple[str, str]] = field(default_factory=list)  # (claim name, uid)
    phase: str = "Pending"  # Pending | Running | Failed | Deleted
    node: str | None = None
    reason: str | None = None
    devices: list[WorkloadDevice] = field(default_factory=list)
    objects: list[dict] = field(default_factory=list)
    health: Any = None  # healthcheck.HealthResult once the workload ran the health check

    def device_paths(self) -> list[str]:
        """Host paths of the device nodes the workload got (what a container sees), once each."""
        return list(dict.fromkeys(n["hostPath"] for d in self.devices for n in d.device_nodes))

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "namespace": self.namespace, "pod": self.pod,
                "claims": [c for c, _ in self.claims], "phase": self.phase, "node": self.node,
                "reason": self.reason, "devices": [d.to_dict() for d in self.devices],
                **({"health": self.health.to_dict()} if self.health is not None else {})}




class SimCluster:
    """One simulated GPU node with the whole vgpuctl node agent, an in-process API server and the
    models of the control plane (see the module docstring). Use as a context manager."""

    def __init__(self, *, preset: str = "default", layout: str = DEMO_LAYOUT, layout_name: str = "demo",
                 version: str = "1.35", namespace: str = "default", driver: str = DEFAULT_DRIVER,
                 selectors=None, validate: bool = True, base: Path | None = None, health: bool = True):
        self.preset = preset
        self.layout_text = layout
        self.layout_name = layout_name
        self.version = version
        self.namespace = namespace
        self.driver = driver
        self.selectors = selectors or default_selectors()
        self.validate = validate
        self.health = health
        self._base_arg = base
        self.base: Path | None = None
        self.srv = None
        self.daemon = None
        self.kubelet: KubeletClient | None = None
        self.workloads: list[Workload] = []
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "SimCluster":
        from kubernetes import client

        from mdev_manager.sim import SimHost, SimIO, load_host
        from kubevirt_templates.render import render

        from dra_bridge.sim.apiserver import LocalApiServer
        from dra_bridge.agent.daemon import Daemon, ServeConfig

        t0 = time.perf_counter()
        # a short path: unix socket addresses must stay under 108 bytes
        self.base = Path(tempfile.mkdtemp(prefix="vgpuctl-", dir=self._base_arg or "/tmp"))
        spec = load_host(self.preset)
        self.node = spec.node
        self.host = SimHost.create(self.base / "host", spec)
        self.env = HostEnv.under(self.base / "host")
        self.io = SimIO(self.host)
        layout_file = self.base / "layout.yaml"
        layout_file.write_text(self.layout_text)
        self.srv = LocalApiServer(version=self.version, validate=self.validate,
                                  extra_resources=_resource_types()).start()
        self.api = self.srv.api_client()
        self.resource = client.ResourceV1Api(self.api)
        self.rest("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": self.node, "labels": {"kubernetes.io/hostname": self.node}}})
        if self.namespace not in ("default", "kube-system"):
            self.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": self.namespace}})
        self.timings["api"] = time.perf_counter() - t0
        minor = int(self.version.lstrip("v").split(".")[1])
        cfg = ServeConfig(node_name=self.node, driver=self.driver, layout_file=layout_file, layout=self.layout_name,
                          resync_seconds=3600, server_version=(1, minor), metrics_port=None,
                          kubelet_root=self.base / "kl", cdi_root=self.base / "cdi", health_poll_seconds=60)
        self.daemon = Daemon(cfg, self.env, self.io, self.api)
        self.daemon.start()  # reconcile the layout, publish the slices, serve the kubelet
        self.timings["node agent"] = time.perf_counter() - t0 - self.timings["api"]
        self.kubelet = KubeletClient(self.base / "kl", self.driver).register()
        for obj in render("deviceclasses", {"driver": self.driver} if self.driver != DEFAULT_DRIVER else {}):
            self.resource.create_device_class(obj)
        return self

    def stop(self) -> None:
        if self.kubelet:
            self.kubelet.close()
            self.kubelet = None
        if self.daemon:
            self.daemon.stop()
            # what Daemon.run() does on its way out (here run() never ran): servers down, sockets gone
            getattr(self.daemon, "_shutdown", self.daemon.plugin.stop)()
            self.daemon = None
        if self.srv:
            self.srv.stop()
            self.srv = None
        if self.base:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> "SimCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ reading the API
    def rest(self, method: str, path: str, body: dict | None = None, *, patch: bool = False) -> dict:
        """One request through the client's transport (the typed CoreV1Api costs a second to import);
        ``patch`` sends a JSON merge patch. Non-2xx answers raise ``ApiException``."""
        from kubernetes.client.exceptions import ApiException

        ctype = "application/merge-patch+json" if patch else "application/json"
        m, url, headers, data, _ = self.api.param_serialize(
            method, path, header_params={"Content-Type": ctype, "Accept": "application/json"}, body=body,
            auth_settings=["BearerToken"])
        r = self.api.call_api(m, url, headers, data)
        r.read()
        if not 200 <= r.status < 300:
            raise ApiException(status=r.status, reason=r.reason, body=r.data)
        return json.loads(r.data)

    def pod_path(self, namespace: str, name: str = "", sub: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def pod(self, namespace: str, name: str) -> dict:
        return self.rest("GET", self.pod_path(namespace, name))

    def slices(self) -> list[dict]:
        return raw(self.resource.list_resource_slice)["items"]

    def classes(self) -> list[dict]:
        return raw(self.resource.list_device_class)["items"]

    def claims(self, namespace: str | None = None) -> list[dict]:
        if namespace:
            return raw(self.resource.list_namespaced_resource_claim, namespace)["items"]
        return raw(self.resource.list_resource_claim_for_all_namespaces)["items"]

    def inventory(self) -> Inventory:
        return discover(self.env, self.io, node=self.node)

    def allocator(self) -> Allocator:
        """The scheduler model over the API's current slices and classes, with every allocated
        claim reserved."""
        alloc = Allocator(self.slices(), self.classes(), self.selectors)
        for c in self.claims():
            alloc.reserve(c)
        return alloc

    def devices_by_key(self) -> dict[tuple[str, str, str], dict]:
        return devices_by_key(self.slices())

    # ------------------------------------------------------------ workloads
    def submit(self, objects: list[dict], name: str | None = None) -> Workload:
        """Create rendered objects (ResourceClaimTemplates, a VirtualMachine or a Pod), the pod that
        holds the claims (virt-launcher for a VM), and the claims the ResourceClaim controller makes
        from the templates."""
        from kubernetes.client.exceptions import ApiException

        main = None
        for obj in objects:
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["namespace"] = self.namespace
            kind = obj["kind"]
            if kind == "ResourceClaimTemplate":
                try:
                    self.resource.create_namespaced_resource_claim_template(self.namespace, obj)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            elif kind == "ResourceClaim":
                self.resource.create_namespaced_resource_claim(self.namespace, obj)
            elif kind in ("VirtualMachine", "Pod"):
                main = obj
            else:
                raise ValueError(f"submit: cannot run a {kind}")
        if main is None:
            raise ValueError("submit: no VirtualMachine or Pod among the objects")
        if main["kind"] == "VirtualMachine":
            vm = self.rest("POST", f"/apis/kubevirt.io/v1/namespaces/{self.namespace}/virtualmachines", main)
            spec = main["spec"]["template"]["spec"]
            claims = spec.get("resourceClaims") or []
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"virt-launcher-{main['metadata']['name']}-{_rand()}", "namespace": self.namespace,
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": main["metadata"]["name"]},
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                     "name": vm["metadata"]["name"], "uid": vm["metadata"]["uid"]}]},
                "spec": {"resourceClaims": claims, "restartPolicy": "Never", "containers": [{
                    "name": "compute", "image": LAUNCHER_IMAGE, "command": ["/usr/bin/virt-launcher-monitor"],
                    "resources": {"claims": [{"name": c["name"]} for c in claims]}}]}}
        else:
            pod = main
        stored = self.rest("POST", self.pod_path(self.namespace), pod)
        return self.adopt(stored, name=name or main["metadata"]["name"], kind=main["kind"], objects=objects)

    def adopt(self, pod: dict, *, name: str | None = None, kind: str = "Pod", objects: list[dict] = ()) -> Workload:
        """The ResourceClaim controller for a stored pod: a claim per ``resourceClaimTemplateName``
        (named ``<pod>-<claim>-<random>``, annotated with the pod claim name, owned by the pod), the
        pod's ``status.resourceClaimStatuses``; returns the workload."""
        meta = pod["metadata"]
        ns = meta.get("namespace") or self.namespace
        w = Workload(name=name or meta["name"], kind=kind, namespace=ns, pod=meta["name"], pod_uid=meta["uid"],
                     objects=list(objects))
        statuses = []
        for pc in pod["spec"].get("resourceClaims") or []:
            if pc.get("resourceClaimTemplateName"):
                tmpl = sanitize(self.api, self.resource.read_namespaced_resource_claim_template(
                    pc["resourceClaimTemplateName"], ns))
                claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
                    "name": f"{w.pod}-{pc['name']}-{_rand()}", "namespace": ns,
                    "annotations": {POD_CLAIM_NAME: pc["name"]},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": w.pod, "uid": w.pod_uid,
                                         "controller": True, "blockOwnerDeletion": True}]},
                    "spec": tmpl["spec"]["spec"]}
                made = sanitize(self.api, self.resource.create_namespaced_resource_claim(ns, claim))
            else:
                made = sanitize(self.api, self.resource.read_namespaced_resource_claim(pc["resourceClaimName"], ns))
            w.claims.append((made["metadata"]["name"], made["metadata"]["uid"]))
            statuses.append({"name": pc["name"], "resourceClaimName": made["metadata"]["name"]})
        if statuses:
            self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"),
                      {"status": {"resourceClaimStatuses": statuses}}, patch=True)
        self.workloads.append(w)
        return w

    def claim_objects(self, w: Workload) -> list[dict]:
        return [raw(self.resource.read_namespaced_resource_claim, n, w.namespace) for n, _ in w.claims]

    def schedule(self, w: Workload, node: str | None = None) -> bool:
        """The scheduler: allocate the pod's claims together (the model), write ``status.allocation``
        and ``reservedFor``, bind the pod; or leave it Pending with the reason, as the scheduler
        reports it (condition PodScheduled=False, reason Unschedulable, and a FailedScheduling event)."""
        claims = self.claim_objects(w)
        alloc = self.allocator()
        try:
            chosen, allocations = alloc.allocate(claims, node=node)
        except Unsatisfiable as exc:
            n = len(alloc.nodes) if node is None else 1
            if w.phase == "Pending" and w.reason == str(exc):
                return False  # reported already
            w.phase, w.reason = "Pending", str(exc)
            msg = f"0/{n} nodes are available: {n} cannot allocate all claims. {exc}"
            self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": {
                "phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]}},
                patch=True)
            self.rest("POST", f"/api/v1/namespaces/{w.namespace}/events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{w.pod}.{_rand(10)}", "namespace": w.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": w.pod, "namespace": w.namespace,
                                   "uid": w.pod_uid},
                "reason": "FailedScheduling", "message": msg, "type": "Warning",
                "source": {"component": "default-scheduler"}})
            return False
        for claim, allocation in zip(claims, allocations):
            self.resource.patch_namespaced_resource_claim_status(
                claim["metadata"]["name"], w.namespace,
                {"status": {"allocation": allocation,
                            "reservedFor": [{"resource": "pods", "name": w.pod, "uid": w.pod_uid}]}})
        self.rest("PATCH", self.pod_path(w.namespace, w.pod), {"spec": {"nodeName": chosen}}, patch=True)
        self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"}]}}, patch=True)
        w.node, w.reason = chosen, None
        return True

    def run(self, w: Workload) -> bool:
        """The kubelet: prepare the pod's claims through the plugin's socket, resolve the CDI ids it
        answers as the runtime would, read the KEP-5304 metadata the workload would read."""
        refs = [(w.namespace, n, uid) for n, uid in w.claims]
        answers = self.kubelet.prepare(refs)
        errors = [f"{n}: {answers.get(uid, {}).get('error') or 'no answer'}" for n, uid in w.claims
                  if answers.get(uid, {}).get("error") or uid not in answers]
        if errors:
            w.phase, w.reason = "Failed", "; ".join(errors)
            self.rest("POST", f"/api/v1/namespaces/{w.namespace}/events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{w.pod}.{_rand(10)}", "namespace": w.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": w.pod, "namespace": w.namespace,
                                   "uid": w.pod_uid},
                "reason": "FailedPrepareDynamicResources", "message": w.reason, "type": "Warning",
                "source": {"component": "kubelet", "host": w.node or ""}})
            return False
        index = self.devices_by_key()
        w.devices = []
        for (cname, uid), claim in zip(w.claims, self.claim_objects(w)):
            for d in answers[uid]["devices"]:
                dev = index.get((self.driver, d["pool"], d["device"]), {})
                cs = (dev.get("consumesCounters") or [{}])[0].get("counterSet")
                edits = resolve_cdi(self.base / "cdi", d["cdi"])
                nodes = [n for n in edits.device_nodes if n.get("path") != "/dev/vfio/vfio"]
                groups = [int(Path(n["path"]).name) for n in nodes if Path(n["path"]).name.isdigit()]
                wd = WorkloadDevice(claim=cname, request=(d["requests"] or [""])[0], pool=d["pool"],
                                    device=d["device"], kind=dev_attr(dev, "type") or "?", gpu=dev_gpu(dev),
                                    profile=dev_attr(dev, "profile"), memory=dev_memory(dev), counter_set=cs,
                                    node=dev.get("_node"), iommu_group=groups[0] if groups else None,
                                    device_nodes=edits.device_nodes, cdi_ids=d["cdi"])
                for m in edits.mounts:
                    wd.host_id = wd.host_id or _metadata_id(Path(m["hostPath"]), d["device"])
                w.devices.append(wd)
        self.rest("PATCH", self.pod_path(w.namespace, w.pod, "status"), {"status": {"phase": "Running"}}, patch=True)
        w.phase = "Running"
        if self.health:
            self.check_health(w)
        return True

    def check_health(self, w: Workload):
        """The workload runs the shipped health check on the device nodes it was given (their host
        paths), with the simulated host's sysfs as /sys."""
        from dra_bridge.conformance import healthcheck

        w.health = healthcheck.run(w.device_paths(), sys_root=self.env.sys_root)
        return w.health

    def launch(self, objects: list[dict], name: str | None = None, node: str | None = None) -> Workload:
        """submit + schedule + run."""
        w = self.submit(objects, name)
        if self.schedule(w, node=node):
            self.run(w)
        return w

    def host_problems(self, w: Workload) -> list[str]:
        """What the simulated host contradicts: every vGPU the workload got exists on the GPU the
        slice named; every whole GPU is bound to vfio-pci; every device node exists."""
        inv = self.inventory()
        vgpus = {v.id: v for v in inv.all_vgpus()}
        out = []
        for d in w.devices:
            if d.kind == "vgpu":
                v = vgpus.get(d.host_id or "")
                if v is None:
                    out.append(f"{w.name}: vGPU {d.host_id} of device {d.device} is not on the host")
                elif v.gpu != d.gpu:
                    out.append(f"{w.name}: vGPU {d.host_id} lives on GPU {v.gpu}, the slice said {d.gpu}")
            else:
                g = inv.gpu(d.gpu or "")
                if g is None or g.driver != "vfio-pci":
                    out.append(f"{w.name}: GPU {d.gpu} is bound to {g.driver if g else 'nothing'}, not vfio-pci")
            for n in d.device_nodes:
                if not Path(n["hostPath"]).exists():
                    out.append(f"{w.name}: device node {n['hostPath']} does not exist")
        return out

    def release(self, w: Workload) -> None:
        """The kubelet unprepares the workload's claims, the garbage collector deletes them."""
        from kubernetes.client.exceptions import ApiException

        if w.phase == "Running":
            errs = self.kubelet.unprepare([(w.namespace, n, uid) for n, uid in w.claims])
            bad = {uid: e for uid, e in errs.items() if e}
            if bad:
                raise RuntimeError(f"unprepare of {w.name} failed: {bad}")
        for n, _ in w.claims:
            try:
                self.resource.delete_namespaced_resource_claim(n, w.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        w.phase = "Deleted"
        if w in self.workloads:
            self.workloads.remove(w)

    def teardown(self, w: Workload) -> None:
        """Stop the workload: the kubelet unprepares its claims, then the pod, its claims and the VM go."""
        from kubernetes.client.exceptions import ApiException

        self.release(w)
        paths = [self.pod_path(w.namespace, w.pod)]
        if w.kind == "VirtualMachine":
            paths.append(f"/apis/kubevirt.io/v1/namespaces/{w.namespace}/virtualmachines/{w.name}")
        for path in paths:
            try:
                self.rest("DELETE", path)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def workload_of_pod(self, namespace: str, name: str) -> Workload | None:
        return next((w for w in list(self.workloads) if w.namespace == namespace and w.pod == name), None)


def pod_node(pod: dict) -> str | None:
    """The node a pod asks for: ``spec.nodeName``, a ``kubernetes.io/hostname`` node selector, or a
    required node affinity on ``metadata.name`` (the first value)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    if (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname"):
        return spec["nodeSelector"]["kubernetes.io/hostname"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for t in terms:
        for f in t.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return f["values"][0]
    return None


class ControlPlane:
    """What a cluster does with pods created through the API of a :class:`SimCluster`, in a thread:
    the ResourceClaim controller makes their claims, the scheduler (model) allocates them, retrying
    pending pods, the kubelet prepares them through the plugin and the container runs the health
    check (its output becomes the pod's log); when a pod is deleted the kubelet unprepares its
    claims and the garbage collector deletes them. Pods without claims just run. So a client that
    only talks to the API (``vgpuctl conformance --kubeconfig``) sees a working cluster."""

    def __init__(self, cluster: SimCluster, *, interval: float = 0.1, retry: float = 0.5):
        import threading

        self.c = cluster
        self.interval = interval
        self.retry = retry
        self.lock = threading.Lock()  # held while a step changes the host; hold it to look at the host
        self.by_uid: dict[str, Workload] = {}
        self._tried: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> "ControlPlane":
        import threading

        self._thread = threading.Thread(target=self._loop, name="sim-control-plane", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(WAIT)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.step()
            except Exception as exc:  # keep going, as a controller would; the tests read the errors
                if self._stop.is_set():
                    break
                log.exception("control plane step failed")
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def step(self) -> None:
        managed = {w.pod_uid for w in self.c.workloads if w.pod_uid not in self.by_uid}
        pods = self.c.rest("GET", "/api/v1/pods")["items"]
        seen = set()
        now = time.monotonic()
        for p in pods:
            uid = p["metadata"]["uid"]
            seen.add(uid)
            if uid in managed:
                continue  # driven by SimCluster's own calls (the demo)
            w = self.by_uid.get(uid)
            if w is None:
                if not p["spec"].get("resourceClaims"):
                    if (p.get("status") or {}).get("phase") != "Running":
                        self.c.rest("PATCH", self.c.pod_path(p["metadata"]["namespace"], p["metadata"]["name"],
                                                             "status"), {"status": {"phase": "Running"}}, patch=True)
                    continue
                w = self.by_uid[uid] = self.c.adopt(p)
            if w.phase == "Pending" and now - self._tried.get(uid, -1e9) >= self.retry:
                self._tried[uid] = now
                if self.c.schedule(w, node=pod_node(p)):
                    self.c.run(w)
                    out = w.health.output if w.health is not None else ""
                    if w.phase != "Running":
                        out = f"container not started: {w.reason}\n"
                    self.c.srv.set_pod_log(w.namespace, w.pod, out)
        for uid in [u for u in self.by_uid if u not in seen]:
            w = self.by_uid.pop(uid)
            self._tried.pop(uid, None)
            self.c.release(w)


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
