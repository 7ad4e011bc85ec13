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
                 gates: dict[str, bool] | None = None) -> None:
        self.up, self.slices, self.classes, self.gates = up, slices, classes, gates
        self.allocated = [c for c in allocated if (c.get("status") or {}).get("allocation")]
        self.nodes = sorted({s["spec"]["nodeName"] for s in slices if s["spec"].get("nodeName")})

    def allocate(self, claims: list[dict], node: str | None = None) -> tuple[str, list[dict]]:
        from dra_bridge.scheduling.allocator import AllocationError, Unsatisfiable

        reasons = []
        for n in [node] if node else self.nodes:
            answer = self.up.allocate(slices=self.slices, classes=self.classes, claims=claims, node=n,
                                      allocated=self.allocated, gates=self.gates)
            if answer["status"] == "allocated":
                self.allocated += [dict(c, status={"allocation": a}) for c, a in zip(claims, answer["allocations"],
                                                                                     strict=True)]
                return n, answer["allocations"]
            if answer["status"] == "error" and not answer.get("perNode"):
                raise AllocationError(f"upstream allocator: {answer['error']}")
            reasons.append(f"{n}: " + (answer.get("error") or "the claims do not fit (upstream allocator)"))
        raise Unsatisfiable("; ".join(reasons))
