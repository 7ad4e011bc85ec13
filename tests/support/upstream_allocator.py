"""Kubernetes' own structured DRA allocator as a program the tests run (issue #30).

``tests/oracle/allocator/k8s-<minor>/`` is a small Go main per Kubernetes minor, each its own Go
module pinned to that minor's newest ``k8s.io/dynamic-resource-allocation`` and ``k8s.io/api``;
the shared code (``tests/oracle/allocator/oracle``) only feeds JSON to
``structured.NewAllocator(...).Allocate(ctx, node, claims)`` and writes back what it returns.
``.ci/run`` builds them into ``build/oracle/allocator-<minor>``; where they are missing and Go is
installed, :func:`binary` builds them (Go's build cache makes that fast after the first time).

Tests use the fixture ``upstream`` (or :func:`require`): it skips, saying why, only where Go is
absent; under CI (``CI=true``) a missing program fails the test instead.

One process serves a whole stream of requests (one JSON object per line in, one per line out),
so a test pays the process start once, not per case.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "tests" / "oracle" / "allocator"
BUILD = REPO / "build" / "oracle"
MINORS = ("1.34", "1.35", "1.36", "1.37")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def binary_path(minor: str) -> Path:
    return BUILD / f"allocator-{minor}"


def build(minor: str) -> Path:
    """Build the program for ``minor`` (under a lock: pytest-xdist workers may ask at once)."""
    out = binary_path(minor)
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / f".build-{minor}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        src = SOURCES / f"k8s-{minor}"
        subprocess.run(["go", "build", "-o", str(out), "."], cwd=src, check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    return out


def why_unavailable(minor: str) -> str | None:
    """None when the program for ``minor`` can run (built now if Go is there); else why not."""
    path = binary_path(minor)
    if path.exists() and not _stale(minor, path):
        return None
    if shutil.which("go") is None:
        if path.exists():
            return None  # built before; no Go to rebuild it
        return (f"the upstream allocator for Kubernetes {minor} is not built and Go is not installed "
                f"(install Go 1.26+ and run .ci/run, or `go build -o {path} .` in {SOURCES / f'k8s-{minor}'})")
    try:
        build(minor)
    except subprocess.CalledProcessError as exc:
        return f"building the upstream allocator for {minor} failed:\n{exc.stdout.decode(errors='replace')[-2000:]}"
    return None


def _stale(minor: str, path: Path) -> bool:
    newest = max(p.stat().st_mtime for d in (SOURCES / f"k8s-{minor}", SOURCES / "oracle")
                 for p in d.iterdir() if p.is_file())
    return path.stat().st_mtime < newest


def require(minor: str) -> Path:
    """The program for ``minor``; skips the test where Go is absent, fails it under CI."""
    why = why_unavailable(minor)
    if why is not None:
        if in_ci():
            pytest.fail(f"CI must run the upstream allocator: {why}")
        pytest.skip(why)
    return binary_path(minor)


class UpstreamAllocator:
    """One running allocator program: :meth:`allocate` sends a request and returns its answer:
    ``{"status": "allocated", "allocations": [...]}`` (one AllocationResult per claim),
    ``{"status": "unschedulable"}`` (Allocate returned nil, nil) or ``{"status": "error",
    "error": ..., "perNode": bool}``; ``features`` are the structured.Features it ran with."""

    def __init__(self, minor: str, path: Path | None = None) -> None:
        self.minor = minor
        self.path = path or binary_path(minor)
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.requests = 0

    def __enter__(self) -> UpstreamAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([str(self.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True, bufsize=1)
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
            self._proc = None

    def gates(self) -> dict[str, bool]:
        out = subprocess.run([str(self.path), "gates"], capture_output=True, text=True, check=True).stdout
        return {g["gate"]: g["default"] for g in json.loads(out)["gates"]}

    def allocate(self, *, slices: list[dict], classes: list[dict], claims: list[dict], node: str | dict,
                 allocated: list[dict] | None = None, gates: dict[str, bool] | None = None) -> dict[str, Any]:
        req: dict[str, Any] = {"slices": slices, "classes": classes, "claims": claims,
                               "allocated": allocated or []}
        if isinstance(node, str):
            req["nodeName"] = node
        else:
            req["node"] = node
        if gates:
            req["gates"] = gates
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(req, separators=(",", ":")) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            self.requests += 1
        if not line:
            raise RuntimeError(f"the upstream allocator {self.path} exited (rc {proc.poll()})")
        return json.loads(line)


@functools.cache
def running(minor: str) -> UpstreamAllocator:
    """One :class:`UpstreamAllocator` per minor for a test session (started on first use)."""
    return UpstreamAllocator(minor, require(minor))


def chosen(allocation: dict) -> list[tuple[str, str, str, str]]:
    """(request, driver, pool, device) of each result of an AllocationResult, in order."""
    return [(r["request"], r["driver"], r["pool"], r["device"])
            for r in ((allocation.get("devices") or {}).get("results") or [])]


def _toleration(t: dict) -> dict:
    # the API server's defaults (SetDefaults_DeviceToleration: operator Equal), then Go's omitempty
    return {"key": t.get("key") or "", "operator": t.get("operator") or "Equal", "value": t.get("value") or "",
            "effect": t.get("effect") or "", "tolerationSeconds": t.get("tolerationSeconds")}


def detail(allocation: dict) -> dict:
    """What an AllocationResult hands the driver, in a form the model's and upstream's compare in:
    per result the device, admin access, tolerations, binding (failure) conditions, whether it is a
    share and what it consumes; the config (source, requests, opaque); the node selector. A share's
    ID is random on both sides: only its presence counts."""
    devices = allocation.get("devices") or {}
    results = [{"request": r["request"], "driver": r["driver"], "pool": r["pool"], "device": r["device"],
                "adminAccess": bool(r.get("adminAccess")),
                "tolerations": [_toleration(t) for t in r.get("tolerations") or []],
                "bindingConditions": r.get("bindingConditions") or [],
                "bindingFailureConditions": r.get("bindingFailureConditions") or [],
                "shared": bool(r.get("shareID")), "consumedCapacity": r.get("consumedCapacity") or {}}
               for r in devices.get("results") or []]
    config = [{"source": c["source"], "requests": c.get("requests") or [], "opaque": c.get("opaque")}
              for c in devices.get("config") or []]
    return {"results": results, "config": config, "nodeSelector": allocation.get("nodeSelector")}


class UpstreamScheduler:
    """The upstream allocator where a simulated cluster asks the model (``SimCluster.allocator()``):
    ``allocate(claims, node=None)`` tries the nodes in name order and returns (node, one
    AllocationResult per claim) from Kubernetes' own allocator, or raises ``Unsatisfiable`` with
    its words. Claims it allocates count as allocated for its next calls (one snapshot, as the
    model's allocator)."""

    def __init__(self, up: UpstreamAllocator, slices: list[dict], classes: list[dict], allocated: list[dict],
                 gates: dict[str, bool] | None = None, model: Any = None,
                 differences: list[str] | None = None) -> None:
        self.up, self.slices, self.classes, self.gates = up, slices, classes, gates
        self.allocated = [c for c in allocated if (c.get("status") or {}).get("allocation")]
        self.nodes = sorted({s["spec"]["nodeName"] for s in slices if s["spec"].get("nodeName")})
        # the model over the same snapshot: each answer is compared whole (detail()), differences listed
        self.model, self.differences = model, differences if differences is not None else []

    def allocate(self, claims: list[dict], node: str | None = None) -> tuple[str, list[dict]]:
        from dra_bridge.scheduling.allocator import AllocationError, Unsatisfiable

        reasons = []
        for n in [node] if node else self.nodes:
            answer = self.up.allocate(slices=self.slices, classes=self.classes, claims=claims, node=n,
                                      allocated=self.allocated, gates=self.gates)
            if answer["status"] == "allocated":
                self.allocated += [dict(c, status={"allocation": a}) for c, a in zip(claims, answer["allocations"],
                                                                                     strict=True)]
                self._compare(claims, node, f"{n}: {[detail(a) for a in answer['allocations']]}")
                return n, answer["allocations"]
            if answer["status"] == "error" and not answer.get("perNode"):
                self._compare(claims, node, f"error {answer['error']}")
                raise AllocationError(f"upstream allocator: {answer['error']}")
            reasons.append(f"{n}: " + (answer.get("error") or "the claims do not fit (upstream allocator)"))
        self._compare(claims, node, "unsatisfiable")
        raise Unsatisfiable("; ".join(reasons))

    def _compare(self, claims: list[dict], node: str | None, upstream: str) -> None:
        """The model's answer over the same snapshot, in the same words as ``upstream``'s: the node
        and every result's detail(), "unsatisfiable" or "error ...". The first difference is
        listed and comparing stops (from there the two snapshots hold different allocations)."""
        from dra_bridge.scheduling.allocator import AllocationError, Unsatisfiable

        if self.model is None:
            return
        try:
            n, allocations = self.model.allocate(claims, node=node)
            model = f"{n}: {[detail(a) for a in allocations]}"
        except Unsatisfiable:
            model = "unsatisfiable"
        except AllocationError as exc:
            model = f"error {exc}"
        if model != upstream and not (model.startswith("error") and upstream.startswith("error")):
            names = [c["metadata"]["name"] for c in claims]
            self.differences.append(f"Kubernetes {self.up.minor}, claims {names}:\n  upstream: {upstream}\n"
                                    f"  model:    {model}")
            self.model = None


class ModelFallback(UserWarning):
    """A test meant for the upstream allocator ran on the Python model (Go absent), as it says."""


def real_or_model(minor: str) -> UpstreamAllocator | None:
    """The running upstream allocator of ``minor`` (one process per minor for the session); None
    where Go is absent, with a :class:`ModelFallback` warning saying the Python model stands in.
    Under CI a missing program fails the test."""
    why = why_unavailable(minor)
    if why is None:
        return running(minor)
    if in_ci():
        pytest.fail(f"CI must run the upstream allocator: {why}")
    warnings.warn(ModelFallback(f"Kubernetes {minor}: the Python scheduler model stands in for the upstream "
                                f"allocator: {why}"), stacklevel=2)
    return None


def model_of(slices: list[dict], classes: list[dict], claims: list[dict], features: Any, selectors: Any = None) -> Any:
    """The model over exactly the snapshot the upstream allocator is given (the agent republishes
    concurrently: a second read of the API may see other slices), allocated claims reserved."""
    from dra_bridge.scheduling.allocator import Allocator
    from dra_bridge.scheduling.selectors import default_selectors

    alloc = Allocator(slices, classes, selectors or default_selectors(), features=features)
    for claim in claims:
        alloc.reserve(claim)
    return alloc


@functools.cache
def _known_gates(up: UpstreamAllocator) -> frozenset[str]:
    return frozenset(up.gates())


def use_upstream(c: Any, up: UpstreamAllocator | None, differences: list[str] | None = None) -> None:
    """Make simulated cluster ``c`` schedule with ``up`` (None: keep the model), with the cluster's
    own gates; with ``differences`` each allocation is also made by the model over the same
    snapshot and every difference in the whole result is appended there."""
    if up is None:
        return
    from dra_bridge.scheduling.taints import tainted_slices

    known = _known_gates(up)
    gates = {k: v for k, v in c.srv.feature_gates.items() if k in known}

    def scheduler() -> UpstreamScheduler:
        slices, classes, claims = tainted_slices(c.slices(), c.taint_rules()), c.classes(), c.claims()
        return UpstreamScheduler(up, slices, classes, claims, gates,
                                 model=None if differences is None else model_of(slices, classes, claims,
                                                                                 c.scheduler_features(), c.selectors),
                                 differences=differences)

    c.allocator = scheduler


PROBE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "probe"},
               "spec": {}}


class CoAllocation:
    """Whether the upstream allocator (None: the model, ``Allocator``) allocates every named device
    at once from ``slices`` on ``node``: one claim with a request per name (``device.name == ...``).
    The placement tests ask it where they asked ``co_allocatable``; ``asked`` counts the sets.
    CEL has no ``device.name``, so each device of a copy of the slices carries its name as one
    more attribute, ``probeName`` (the allocator reads attributes only through selectors)."""

    def __init__(self, up: UpstreamAllocator | None, slices: list[dict], node: str,
                 gates: dict[str, bool] | None = None, driver: str = "vgpu.kubevirt.io",
                 devices: set[str] | None = None) -> None:
        self.up, self.node, self.gates, self.driver = up, node, gates, driver
        self.slices = json.loads(json.dumps(slices))
        for s in self.slices:
            if devices is not None and s["spec"].get("devices"):  # only these (a smaller request)
                s["spec"]["devices"] = [d for d in s["spec"]["devices"] if d["name"] in devices]
            for d in s["spec"].get("devices") or []:
                d.setdefault("attributes", {})["probeName"] = {"string": d["name"]}
        self.asked = 0

    def claim(self, names: list[str]) -> dict:
        requests = [{"name": f"r{i}", "exactly": {"deviceClassName": "probe", "selectors": [{"cel": {
            "expression": f'device.driver == "{self.driver}" && device.attributes["{self.driver}"].probeName == "{n}"'}}]}}
            for i, n in enumerate(names)]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid"},
                "spec": {"devices": {"requests": requests}}}

    def __call__(self, names: list[str]) -> bool:
        self.asked += 1
        claim = self.claim(list(names))
        if self.up is None:
            from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
            from dra_bridge.scheduling.pools import Features
            from dra_bridge.scheduling.selectors import default_selectors

            try:
                Allocator(self.slices, [PROBE_CLASS], default_selectors(),
                          features=Features.from_gates(self.gates or {})).allocate([claim], node=self.node)
                return True
            except Unsatisfiable:
                return False
        answer = self.up.allocate(slices=self.slices, classes=[PROBE_CLASS], claims=[claim], node=self.node,
                                  gates=self.gates)
        if answer["status"] == "error":
            raise AssertionError(f"upstream allocator {self.up.minor}: {answer['error']}")
        return answer["status"] == "allocated"


def keeping_counters(minor: str) -> dict[str, bool]:
    """The gates under which a server and scheduler of ``minor`` keep what ``build_pool(...,
    server_version=minor)`` publishes: counters (DRAPartitionableDevices, alpha before 1.36) and on
    1.37 compatibility groups (DRADeviceCompatibilityGroups, alpha; with it off the server drops
    them and the agent publishes another shape)."""
    return {"1.34": {"DRAPartitionableDevices": True}, "1.35": {"DRAPartitionableDevices": True},
            "1.37": {"DRADeviceCompatibilityGroups": True}}.get(minor, {})
