"""Prepare latency over the kubelet's gRPC socket, with resyncs running (issue #15).

The largest preset (16 L40S x 32 VFs, mdev on VFs: 23 types per VF) in ``dra`` mode, the real agent
(``Daemon.start()``: kubelet plugin on its unix socket, publisher on the local API server) and a
kubelet model registering it and calling ``NodePrepareResources`` / ``NodeUnprepareResources``
for one-vGPU claims, one claim at a time, spread over the GPUs: once with no resync running, once
while the agent's own loop resyncs every second (each prepare changes the node, so each resync runs:
it reads again the GPUs the prepares touched, not the whole node, docs/agent-state.md; before #37 it
was a whole discovery, a second of Python on this preset sharing the GIL with the gRPC worker).
Reported: p50 / p99 of prepare and of unprepare; beside them the simulated kernel's own share
(the time spent in its model of ``create`` / ``remove`` writes, measured in the transport) and
the p99 without it: what a real kernel's sysfs write would replace. Bound: 20 ms p99.

The simulated kernel runs in a process of its own by default (``--sim-kernel process``,
:mod:`mdev_manager.sim.kproc`), as a real kernel is no part of the agent's process: its Python then
holds no GIL the agent's gRPC workers need, and "the simulated kernel's share" is the time a write
waits for that process. ``--sim-kernel in-process`` keeps the older shape (the model's Python in the
agent's process, under its GIL); every report says which ran.
"""

from __future__ import annotations

import gc
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import parse_config
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.io import SimIO
from mdev_manager.sim.kproc import ProcIO, kernel_process
from mdev_manager.sim.node import SimNode, sim_node
from tests.support.dra import add_claim

from . import common
from .common import HEADER, percentile, register_plugin, row

CLAIMS = int(os.environ.get("VGPUCTL_BENCH_CLAIMS", "200"))
DRA_ALL = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}})
BOUND_MS = 20.0


class _Timed:
    """A transport adding up the time the kernel model takes to create and remove vGPUs (the writes a
    prepare makes; a steady resync makes none): in-process its Python, else the wait for its process."""

    def _start_timing(self) -> None:
        self._lock = threading.Lock()
        self.kernel = 0.0
        self.mine = threading.local()  # this thread's CPU in the kernel model's writes (or the transport's)

    def write(self, path, data):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return super().write(path, data)  # type: ignore[misc]
        finally:
            if Path(path).name in ("create", "remove", "current_vgpu_type"):
                self.mine.cpu = getattr(self.mine, "cpu", 0.0) + time.thread_time() - c0
                with self._lock:
                    self.kernel += time.perf_counter() - t0

    def take(self) -> float:
        with self._lock:
            spent, self.kernel = self.kernel, 0.0
        return spent

    def kernel_cpu(self) -> float | None:
        """The kernel process's CPU seconds so far (None in-process: it is the agent's own)."""
        return None


class TimedIO(_Timed, SimIO):
    """The simulated kernel in the benchmark's own process, beside the agent (``--sim-kernel in-process``)."""

    def __init__(self, host):
        super().__init__(host)
        self._start_timing()


class TimedProcIO(_Timed, ProcIO):
    """The simulated kernel in a process of its own (``--sim-kernel process``, the default)."""

    def __init__(self, host, address):
        super().__init__(host, address)
        self._start_timing()

    def kernel_cpu(self) -> float | None:
        return ProcIO.kernel_cpu(self)


def kernel_where() -> str:
    return ("the simulated kernel in its own process" if common.SIM_KERNEL == "process" else
            "the simulated kernel IN the agent's process, under its GIL (--sim-kernel in-process)")


def run() -> list[str]:
    return measure(resync_seconds=3600.0, what="no resync running") + [""] + \
        measure(resync_seconds=1.0, what="the agent resyncing every second")


@dataclass
class Agent:
    """The real agent on a simulated ``bench-large`` node, served over gRPC to a registered kubelet model."""

    srv: LocalApiServer
    sim: SimNode
    io: TimedIO | TimedProcIO
    daemon: Daemon
    reg: Any  # the kubelet's registration of the plugin: ``reg.client(...)``
    loop: threading.Thread  # the agent's own resync loop, started by :meth:`run_loop`
    #: each prepare call's CPU on its own thread, the kernel model's writes taken out (load-independent)
    cpu: list[float] = field(default_factory=list)

    def run_loop(self) -> None:
        self.loop.start()

    def time_prepares(self) -> None:
        """Record each prepare's thread CPU without the simulated kernel's (the gRPC worker's own work)."""
        inner, io = self.daemon.driver.prepare, self.io

        def prepare(claims):
            io.mine.cpu, c0 = 0.0, time.thread_time()
            try:
                return inner(claims)
            finally:
                self.cpu.append(time.thread_time() - c0 - io.mine.cpu)

        self.daemon.driver.prepare = prepare  # type: ignore[method-assign]


@contextmanager
def running_agent(resync_seconds: float, prefix: str) -> Iterator[Agent]:
    """``bench-large`` in ``dra`` mode (sysfs on tmpfs), the local API server, the simulated kernel's
    writes timed (:class:`TimedProcIO`: the kernel in its own process; :class:`TimedIO`: in this one, as
    ``common.SIM_KERNEL`` says), ``Daemon.start()`` with its plugin registered by a kubelet model (a
    short kubelet root: unix socket paths must stay short); stopped and its loop joined on the way out."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix=prefix) as d, LocalApiServer(version="1.36") as srv, \
            tempfile.TemporaryDirectory(prefix="vgk", dir="/tmp") as kl, ExitStack() as stack:
        sim = sim_node(Path(d) / "host", "bench-large")
        reconcile(sim.env, sim.io, DRA_ALL)
        io: TimedIO | TimedProcIO = (stack.enter_context(kernel_process(sim.host, TimedProcIO))
                                     if common.SIM_KERNEL == "process" else TimedIO(sim.host))
        cfg = ServeConfig(node_name=sim.node, kubelet_root=Path(kl), cdi_root=Path(d) / "cdi", metrics_port=None,
                          resync_seconds=resync_seconds, health_poll_seconds=3600)
        daemon = Daemon(cfg, sim.env, io, srv.api_client()).start()
        gc.collect()  # as vgpuctl serve does after the start: full collections then skip what the start built
        gc.freeze()
        loop = threading.Thread(target=daemon.run, daemon=True)
        try:
            agent = Agent(srv, sim, io, daemon, register_plugin(Path(kl)), loop)
            agent.time_prepares()
            yield agent
        finally:
            gc.unfreeze()
            daemon.stop()
            if loop.is_alive():
                loop.join(timeout=120)
            else:
                daemon._shutdown()


def measure(resync_seconds: float, what: str) -> list[str]:
    claims = common.SIZES["claims"] or CLAIMS
    lines = [f"Prepare over gRPC (bench-large, {claims} one-vGPU claims, {what}; {kernel_where()})", HEADER]
    with running_agent(resync_seconds, "vgprep") as agent:
        io, srv, sim = agent.io, agent.srv, agent.sim
        pool = agent.daemon._pool
        # one type per GPU, claims spread over the GPUs as a scheduler would
        by_gpu: dict[str, list[str]] = {}
        for dev in pool.devices:
            if dev.kind == "vgpu" and dev.type_id == next(x.type_id for x in pool.devices
                                                          if x.kind == "vgpu" and x.gpu == dev.gpu):
                by_gpu.setdefault(dev.gpu, []).append(dev.name)
        order = [devs[i] for i in range(max(map(len, by_gpu.values()))) for devs in by_gpu.values()
                 if i < len(devs)][:claims]
        refs = [add_claim(srv, f"c{i}", [("vgpu", name)], node=sim.node) for i, name in enumerate(order)]
        agent.run_loop()
        prep, unprep, kernel = [], [], []
        k0, c0 = agent.io.kernel_cpu(), time.process_time()
        with agent.reg.client("v1") as client:
            for ref in refs:
                io.take()
                t0 = time.perf_counter()
                out = client.prepare([(ref.namespace, ref.uid, ref.name)])
                prep.append(time.perf_counter() - t0)
                assert out[ref.uid]["error"] == "", out[ref.uid]["error"]
                kernel.append(io.take())
            k1, c1 = agent.io.kernel_cpu(), time.process_time()
            for ref in refs:
                t0 = time.perf_counter()
                assert client.unprepare([(ref.namespace, ref.uid, ref.name)])[ref.uid] == ""
                unprep.append(time.perf_counter() - t0)
        resyncs = agent.daemon.metrics.resyncs.labels("ok")._value.get()
        cpu = agent.cpu
    p99 = percentile(prep, 99) * 1000
    k99 = percentile(kernel, 99) * 1000
    bare = [p - k for p, k in zip(prep, kernel, strict=False)]
    bare50, bare99 = percentile(bare, 50) * 1000, percentile(bare, 99) * 1000
    lines += [
        row("prepare p50", f"{percentile(prep, 50) * 1000:.1f} ms", f"{BOUND_MS:.0f} ms", None, "peer: the bound (p99)"),
        row("prepare p99", f"{p99:.1f} ms", f"{BOUND_MS:.0f} ms", p99 / BOUND_MS,
            f"of which the simulated kernel p99 {k99:.1f} ms"),
        row("prepare p99 without the simulated kernel", f"{bare99:.1f} ms", f"{BOUND_MS:.0f} ms", None,
            f"what a real sysfs write replaces; p50 {bare50:.1f} ms"),
        row("prepare CPU without the simulated kernel p50 / p99",
            f"{percentile(cpu, 50) * 1000:.1f} / {percentile(cpu, 99) * 1000:.1f} ms", f"{BOUND_MS:.0f} ms", None,
            "the gRPC worker thread's own CPU: what the machine's load does not change"),
        row("CPU of all prepares: this process / kernel", f"{c1 - c0:.1f} / "
            + ("-" if k0 is None or k1 is None else f"{k1 - k0:.1f} s"), "-", None,
            "this process: the agent, the kubelet model and the API server; the kernel's own process"),
        row("unprepare p50 / p99", f"{percentile(unprep, 50) * 1000:.1f} / {percentile(unprep, 99) * 1000:.1f} ms",
            "-", None, f"{resyncs:.0f} resyncs ran meanwhile"),
    ]
    return lines
