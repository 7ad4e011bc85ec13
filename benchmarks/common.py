"""Small helpers shared by the benchmarks: timing, percentiles, a fresh simulated host."""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mdev_manager.sim.node import sim_node
from tests.support.kubelet.fake_kubelet import FakeKubelet


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def best_of(fn, repeat: int = 3) -> float:
    """Fastest of ``repeat`` runs: the figure least disturbed by the rest of the machine."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@contextmanager
def sim_host(preset: str):
    # sysfs lives in memory on a real host: keep the simulated one on tmpfs where there is one
    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix="vgbench") as d:
        sim = sim_node(Path(d) / "host", preset)
        yield sim.host, sim.env, sim.io


def register_plugin(kubelet_root: Path, timeout: float = 20.0):
    """A kubelet model that found the agent's registration socket and registered its DRA plugin."""
    kubelet = FakeKubelet(kubelet_root)
    deadline = time.monotonic() + timeout
    while not kubelet.discover_dra_plugins():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no DRA plugin registration socket under {kubelet_root}")
        time.sleep(0.05)
    return kubelet.register_dra_plugin(kubelet.discover_dra_plugins()[0])


def row(name: str, ours: str, peer: str, ratio: float | None, note: str = "") -> str:
    r = "-" if ratio is None else f"{ratio:.2f}x"
    return f"{name:44} {ours:>14} {peer:>14} {r:>9}  {note}"


HEADER = f"{'measure':44} {'vgpuctl':>14} {'peer':>14} {'ratio':>9}"

#: which scheduler allocator the race and packing benchmarks measure: "auto" (Kubernetes' own
#: allocator where its program is built, else the Python model), "upstream" or "model"
#: (``python -m benchmarks --allocator ...``)
ALLOCATOR = "auto"

#: where the prepare and storm benchmarks run the simulated kernel: "process" (a process of its own, as
#: a real kernel is no part of the agent's process: :mod:`mdev_manager.sim.kproc`) or "in-process" (in the
#: benchmark's process, beside the agent, under its GIL: the figures then charge the model's Python to
#: the agent); ``python -m benchmarks --sim-kernel ...``
SIM_KERNEL = "process"

#: sizes (``--claims``: the prepare benchmark's claims; ``--per-gpu``: the storm's claims per GPU); None: the
#: benchmark's default (or its environment variable)
SIZES: dict[str, int | None] = {"claims": None, "per_gpu": None}


def scheduler_allocator(minor: str) -> tuple[Any, str]:
    """(the running upstream allocator of ``minor``, or None for the Python scheduler model; a line
    saying which one the benchmark ran and why)."""
    from tests.support.upstream_allocator import binary_path, running, why_unavailable

    if ALLOCATOR == "model":
        return None, "allocator: the Python scheduler model (--allocator model)"
    why = why_unavailable(minor)
    if why is None:
        up = running(minor)
        return up, f"allocator: Kubernetes' own, k8s.io/dynamic-resource-allocation {minor} ({binary_path(minor)})"
    if ALLOCATOR == "upstream":
        raise RuntimeError(f"--allocator upstream: {why}")
    return None, f"allocator: the Python scheduler model (the upstream allocator is not available: {why})"


__all__ = ["percentile", "best_of", "sim_host", "register_plugin", "row", "HEADER", "statistics", "ALLOCATOR",
           "SIM_KERNEL", "SIZES", "scheduler_allocator"]
