"""A boot storm over gRPC (#37): 512 one-vGPU claims, as a kubelet starting 512 pods at once.

The largest preset (16 L40S x 32 VFs, mdev on VFs) in ``dra`` mode, the real agent (``Daemon.start()``,
its own resync loop running every ``VGPUCTL_BENCH_RESYNC`` seconds, 1 by default), and a kubelet
model calling ``NodePrepareResources`` with one claim per call, ``IN_FLIGHT`` calls at once (the kubelet
prepares each pod's claims from the pod's own worker): 32 x L40S-1Q per GPU, the claims spread over
the GPUs in the order a scheduler fills them (GPU 0's first, GPU 1's first, ...). Then every claim is
unprepared the same way. Reported: the storm's total time and each call's p50 / p99 (what a pod
waits for), the simulated kernel's share, the resyncs and GPU reads the agent made meanwhile, and the
bound of issue #37 (all prepared in < 15 s, p99 < 200 ms). Checked: every claim prepared, no vGPU twice.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from dra_bridge.agent.daemon import Daemon
from tests.support.dra import claim_object

from .bench_prepare import running_agent
from .common import HEADER, percentile, row

PER_GPU = int(os.environ.get("VGPUCTL_BENCH_STORM_PER_GPU", "32"))
IN_FLIGHT = 8
RESYNC = float(os.environ.get("VGPUCTL_BENCH_RESYNC", "1"))
PROFILE = "L40S-1Q"
BOUND_TOTAL_S, BOUND_P99_MS = 15.0, 200.0


def run() -> list[str]:
    with running_agent(RESYNC, "vgstorm") as agent:
        daemon, io = agent.daemon, agent.io
        refs = [add(agent.srv, f"storm-{i}", dev, agent.sim.node) for i, dev in enumerate(storm_devices(daemon))]
        agent.run_loop()
        reads0, resyncs0 = gpu_reads(daemon), daemon.metrics.resyncs.labels("ok")._value.get()
        with agent.reg.client("v1", timeout=300) as client:
            io.take()
            prep, total = storm(lambda ref: client.prepare([(ref.namespace, ref.uid, ref.name)])[ref.uid]["error"],
                                refs)
            kernel = io.take()
            made = [d.vgpu_id for r in records(daemon) for d in r.devices]
            assert len(made) == len(refs) and len(set(made)) == len(made) and all(made), "a claim not prepared"
            reads = {k: v - reads0.get(k, 0) for k, v in gpu_reads(daemon).items()}
            resyncs = daemon.metrics.resyncs.labels("ok")._value.get() - resyncs0
            unprep, utotal = storm(lambda ref: client.unprepare([(ref.namespace, ref.uid, ref.name)])[ref.uid],
                                   refs)
            assert not records(daemon), "a claim left prepared"
        cpu = agent.cpu
    p50, p99 = percentile(prep, 50) * 1000, percentile(prep, 99) * 1000
    return [f"Boot storm over gRPC (bench-large, {len(refs)} x {PROFILE} claims, one per call, {IN_FLIGHT} calls "
            f"in flight, the agent resyncing every {RESYNC:g} s)", HEADER,
            row("all prepared", f"{total:.1f} s", f"{BOUND_TOTAL_S:.0f} s", total / BOUND_TOTAL_S,
                f"simulated kernel {kernel:.1f} s of it (summed over calls)"),
            row("prepare call p50", f"{p50:.0f} ms", "-", None, "what one pod waits for"),
            row("prepare call p99", f"{p99:.0f} ms", f"{BOUND_P99_MS:.0f} ms", p99 / BOUND_P99_MS),
            row("prepare CPU without the simulated kernel", f"{percentile(cpu, 50) * 1000:.1f} / "
                f"{percentile(cpu, 99) * 1000:.1f} ms", "-", None,
                f"p50 / p99, each call's own thread; {sum(cpu):.1f} s in all"),
            row("resyncs meanwhile / GPU reads", f"{resyncs:.0f} / {reads.get('gpu', 0)}", "-", None,
                f"{reads.get('vgpus', 0)} reads of a GPU's vGPUs only, {reads.get('whole', 0)} whole-node reads"),
            row("all unprepared", f"{utotal:.1f} s", "-", None,
                f"per call p50 {percentile(unprep, 50) * 1000:.0f} / p99 {percentile(unprep, 99) * 1000:.0f} ms")]


def gpu_reads(daemon: Daemon) -> dict[str, int]:
    """The agent's GPU reads so far ("?": an agent without per-GPU state, one that reads the node whole)."""
    states = getattr(daemon, "gpu_states", None)
    return dict(states.reads) if states is not None else {"whole": -1}


def records(daemon: Daemon) -> list:
    return list(daemon.driver.cp.claims.values())


def storm_devices(daemon: Daemon) -> list[str]:
    """``PER_GPU`` devices per GPU that make an L40S-1Q, in a scheduler's fill order."""
    by_gpu: dict[str, list[str]] = {}
    inv = daemon.inventory
    assert inv is not None, "the agent has not discovered the node yet"
    for dev in daemon._pool.devices:
        if dev.kind != "vgpu":
            continue
        gpu = inv.gpu(dev.gpu)
        t = next((t for t in gpu.types if t.name.endswith(PROFILE)), None) if gpu else None
        if t is not None and (dev.type_id == t.id or t.id in dev.type_choices.values()):
            by_gpu.setdefault(dev.gpu, []).append(dev.name)
    return [devs[i] for i in range(PER_GPU) for devs in by_gpu.values() if i < len(devs)]


def add(srv, name: str, device: str, node: str):
    """A claim allocated ``device``, asking for an L40S-1Q (a size slot's type picked by its config)."""
    from dra_bridge.rpc.types import ClaimRef

    obj = claim_object(name, [("vgpu", device)], node=node)
    obj["status"]["allocation"]["devices"]["config"] = [{
        "source": "FromClaim", "requests": ["vgpu"],
        "opaque": {"driver": "vgpu.kubevirt.io", "parameters": {
            "apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": PROFILE}}}]
    meta = srv.add(obj)["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def storm(call, refs) -> tuple[list[float], float]:
    """Each claim in its own call, ``IN_FLIGHT`` at once; (each call's seconds, the total)."""
    def one(ref) -> float:
        t0 = time.perf_counter()
        error = call(ref)
        assert not error, error
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        times = list(pool.map(one, refs))
    return times, time.perf_counter() - t0
