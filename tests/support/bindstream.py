"""Seeded random streams of vGPU claims through the agent's binding verdicts (issue #36.2).

A stream plays kube-scheduler against a :class:`~dra_bridge.sim.cluster.SimCluster` whose agent runs
its real threads: the binding loop on its claim watch, and resyncs back to back (the load). Each
step tears some pods down, then allocates a few new pods of random T4 sizes from one snapshot of
the slices (the scheduler's allocations running ahead of its binding cycles) with the cluster's
allocator (the model, or Kubernetes' own through ``tests/oracle``), writes each allocation and, as
PreBind does, waits for the agent's verdict: a confirmed pod is bound and prepared through the
kubelet's gRPC, a refused one deallocated. Some pods are force-deleted: their claims go before the
kubelet unprepares them, at the end of the step, or as soon as the scheduler waits on a verdict for
a device one still holds (the agent withholds it until the unprepare; the kubelet does not wait on
the scheduler). What a stream must show: no prepare refused for a claim the agent confirmed, never
two sizes on one GPU. (A slot of a GPU that holds vGPUs is published without conditions; one the
scheduler gives away while a force-deleted claim still holds it is refused at prepare and prepared
once that claim is unprepared, as the kubelet retries.)
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from dra_bridge.apiclient.objects import raw
from dra_bridge.scheduling.allocator import Unsatisfiable
from dra_bridge.sim.cluster import SimCluster
from dra_bridge.sim.workloads import Workload
from kubevirt_templates.render import render

VERDICT_WAIT = 60.0  # seconds: the scheduler waits up to 10 minutes; the agent answers in milliseconds


@dataclass
class StreamResult:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # prepares refused, confirmed claims not prepared


def t4_types(c: SimCluster) -> list[str]:
    """The time-sliced T4 vGPU types the node publishes."""
    return sorted({t for s in c.slices() for d in s["spec"].get("devices") or []
                   for t in ((d["attributes"].get("vgpuTypes") or {}).get("string") or "").split()
                   if t.startswith("T4-")})


class AgentThreads:
    """The agent's binding loop (its watch of the claims) and a thread resyncing back to back."""

    def __init__(self, c: SimCluster, *, seed: int = 0, discovery_faults: float = 0.0) -> None:
        assert c.daemon is not None
        self.daemon = c.daemon
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.resyncs = 0
        self.faults = 0
        self._fault_rng = random.Random(seed)
        self._discovery_faults = discovery_faults
        self.threads = [threading.Thread(target=self.daemon._bind_loop, name="bind", daemon=True),
                        threading.Thread(target=self._resyncs, name="resyncs", daemon=True)]

    def _resyncs(self) -> None:
        """As the agent's main loop: a resync that runs when something changed (a prepare, an
        unprepare), at random short intervals, so discoveries lag the host by varying amounts."""
        rng = random.Random(0)
        while not self.stop.wait(rng.random() * 0.05):
            try:
                self.daemon.resync(force=False)
                self.resyncs += 1
            except Exception as exc:  # noqa: BLE001 - said by the test
                if "injected" not in str(exc):
                    self.errors.append(exc)

    def _discover(self, *args, **kwargs):
        """Discovery as the agent calls it, failing now and then (sysfs, the node lock, the API):
        a resync that fails, the one a binding round asks for included."""
        if self._fault_rng.random() < self._discovery_faults:
            self.faults += 1
            raise OSError("injected discovery fault")
        return self._real_discover(*args, **kwargs)

    def __enter__(self) -> AgentThreads:
        states = self.daemon.gpu_states  # the agent's reads of the host, whole or per GPU
        self._real_discover = states.current
        if self._discovery_faults:
            states.current = self._discover  # type: ignore[method-assign]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.daemon._stop.set()  # the binding loop's stop
        if self.daemon.claim_cache is not None:
            self.daemon.claim_cache.changed.set()
        for t in self.threads:
            t.join(timeout=30)
        self.daemon.gpu_states.current = self._real_discover  # type: ignore[method-assign]
        self.daemon._stop.clear()  # the cluster goes on (another stream, its own stop)


def _verdict(c: SimCluster, w: Workload, allocations: list[dict]) -> bool | None:
    """PreBind: True when every binding condition of the pod's devices is True, False when a
    failure condition is; None while the agent has not answered."""
    ok = True
    for (name, _), allocation in zip(w.claims, allocations, strict=True):
        stored = raw(c.resource.read_namespaced_resource_claim, name, w.namespace)
        entries = {(e["driver"], e["pool"], e["device"]): {x["type"]: x["status"] for x in e.get("conditions") or []}
                   for e in (stored.get("status") or {}).get("devices") or []}
        for r in allocation["devices"]["results"]:
            if not r.get("bindingConditions"):
                continue
            state = entries.get((r["driver"], r["pool"], r["device"]), {})
            if any(state.get(t) == "True" for t in r.get("bindingFailureConditions") or []):
                return False
            ok = ok and all(state.get(t) == "True" for t in r["bindingConditions"])
    return True if ok else None


def wait_verdict(c: SimCluster, w: Workload, allocations: list[dict], lagging: list[Workload] | None = None) -> bool:
    """PreBind's wait. Meanwhile the kubelet goes on: a force-deleted pod (``lagging``) still prepared
    with a device of ``allocations`` is unprepared (the agent withholds that device's verdict until
    then), the others after this step's prepares."""
    deadline = time.monotonic() + VERDICT_WAIT
    wanted = {r["device"] for a in allocations for r in a["devices"]["results"]}
    while (v := _verdict(c, w, allocations)) is None:
        for old in [x for x in lagging or [] if wanted & {d.device for d in x.devices}]:
            lagging.remove(old)  # type: ignore[union-attr]
            c.teardown(old)
        if time.monotonic() > deadline:
            raise AssertionError(f"no binding verdict for {w.name} in {VERDICT_WAIT}s")
        time.sleep(0.002)
    return v


def sizes_on_host(c: SimCluster) -> dict[str, set[str]]:
    """GPU -> the vGPU types it holds (a T4 type's number is its size)."""
    out: dict[str, set[str]] = {}
    for g in c.inventory().gpus:
        for v in g.vgpus:
            out.setdefault(g.address, set()).add(v.type_name)
    return out


def _size(type_name: str) -> str:
    """``GRID T4-2B4`` -> ``2`` (GiB)."""
    m = re.search(r"T4-(\d+)", type_name)
    return m.group(1) if m else type_name


def _force_delete(c: SimCluster, w: Workload) -> None:
    """``kubectl delete pod --force``: the pod and its claims go from the API before the kubelet
    has unprepared them (:meth:`SimCluster.teardown` does that later)."""
    for name, _ in w.claims:
        c.resource.delete_namespaced_resource_claim(name, w.namespace)
    c.rest("DELETE", c.pod_path(w.namespace, w.pod))


def run_stream(c: SimCluster, seed: int, steps: int, *, discovery_faults: float = 0.0) -> StreamResult:
    """One seeded stream (see the module docstring) on a started cluster; the agent's threads run
    for its length, ``discovery_faults`` of the agent's discoveries failing. Pods left running are
    torn down at the end."""
    rng = random.Random(seed)
    types = t4_types(c)
    assert types, "no T4 vGPU type published"
    out = StreamResult()
    running: list[Workload] = []
    n = 0
    with AgentThreads(c, seed=seed, discovery_faults=discovery_faults) as agent:
        for _ in range(steps):
            lagging = []  # force-deleted pods: their claims go now, the kubelet unprepares after this step
            while running and rng.random() < 0.6:
                w = running.pop(rng.randrange(len(running)))
                if rng.random() < 0.3:
                    _force_delete(c, w)
                    lagging.append(w)
                else:
                    c.teardown(w)
                out.counts["torn down"] += 1
            batch = []
            for _ in range(rng.randint(2, 4)):
                n += 1
                profile = rng.choice(types)
                objs = render("claim-template", {"profile": profile, "name": f"s{seed}-t{n}"}) + \
                    render("passthrough-pod", {"name": f"s{seed}-w{n}", "claim_template": f"s{seed}-t{n}"})
                batch.append(c.submit(objs, name=f"{profile}#{n}"))
            alloc = c.allocator()  # one snapshot for the batch
            planned, retry = [], []
            for w in batch:
                claims = c.claim_objects(w)
                try:
                    _, allocations = alloc.allocate(claims, node=c.node)
                except Unsatisfiable:
                    out.counts["unschedulable"] += 1
                    c.teardown(w)
                    continue
                c._reserve(w, claims, allocations)
                planned.append((w, allocations))
            for w, allocations in planned:
                if not wait_verdict(c, w, allocations, lagging):
                    out.counts["refused"] += 1
                    for name, _ in w.claims:  # the scheduler drops the allocation
                        c.resource.patch_namespaced_resource_claim_status(
                            name, w.namespace, {"status": {"allocation": None, "reservedFor": None, "devices": None}})
                    c.teardown(w)
                    continue
                conditioned = any(r.get("bindingConditions") for a in allocations for r in a["devices"]["results"])
                out.counts["confirmed" if conditioned else "bound without conditions"] += 1
                c.rest("PATCH", c.pod_path(w.namespace, w.pod), {"spec": {"nodeName": c.node}}, patch=True)
                w.node = c.node
                if c.run(w):
                    out.counts["prepared"] += 1
                    running.append(w)
                elif not conditioned and "already prepared for" in (w.reason or ""):
                    # a slot of a GPU that holds vGPUs (published without conditions) still prepared
                    # for a force-deleted pod's claim: the kubelet tries again after that unprepare
                    retry.append(w)
                else:
                    out.failures.append(f"seed {seed}: {w.name} {'confirmed' if conditioned else 'bound'}, "
                                        f"prepare refused: {w.reason}")
                    c.teardown(w)
            for w in lagging:
                c.teardown(w)
            for w in retry:
                if c.run(w):
                    out.counts["prepared after a retry"] += 1
                    running.append(w)
                else:
                    out.failures.append(f"seed {seed}: {w.name} refused again after the unprepare: {w.reason}")
                    c.teardown(w)
            for gpu, held in sizes_on_host(c).items():
                if len({_size(t) for t in held}) > 1:
                    out.failures.append(f"seed {seed}: GPU {gpu} holds {sorted(held)}")
        if agent.errors:
            out.failures.append(f"seed {seed}: resync failed: {agent.errors[0]!r}")
        out.counts["resyncs"] += agent.resyncs
        out.counts["discovery faults"] += agent.faults
    for w in running:
        c.teardown(w)
    return out
