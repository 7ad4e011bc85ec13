"""Scenarios on the simulated cluster: capacity with the demo's workloads, and the conformance
checks. Scaffolding (``vgpuctl capacity`` / ``conformance`` without ``--kubeconfig``, and tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict, Unpack

from dra_bridge.conformance.backend import KubeBackend
from dra_bridge.conformance.checks import run_conformance
from dra_bridge.conformance.report import ConformanceReport
from dra_bridge.scheduling.capacity import CapacityReport, compute
from dra_bridge.sim.cluster import Render, SimCluster
from dra_bridge.sim.controlplane import ControlPlane
from dra_bridge.sim.demo import WORKLOADS, demo_device_classes, render_workload
from dra_bridge.sim.workloads import DEMO_LAYOUT


class ConformanceOptions(TypedDict, total=False):
    """The backend's timing (``timeout``, ``settle``) and :class:`~dra_bridge.conformance.checks.Conformance`'s options."""

    timeout: float
    settle: float
    profile: str | None
    node: str | None
    max_workloads: int


def simulated_capacity(version: str = "1.35", layout: str | None = None, workloads: bool = True,
                       feature_gates: dict[str, bool] | None = None, *, render: Render) -> CapacityReport:
    """Capacity of the simulated cluster of ``vgpuctl demo``, with its workloads running (or none), on a
    server of ``version`` with ``feature_gates`` over its defaults (None: every gate on); ``render`` makes
    the objects (:data:`.cluster.Render`)."""
    with SimCluster(render=render, version=version, layout_name=layout or "demo", health=False,
                    device_classes=demo_device_classes(), feature_gates=feature_gates) as c:
        if workloads:
            for w in WORKLOADS:
                c.launch(render_workload(w, render), name=w.name)
        report = compute(c.slices(), c.claims(), driver=c.driver, selectors=c.selectors)
        report.notes.append(f"simulated cluster ({c.preset} node, layout {c.layout_name}, Kubernetes {version})"
                            + (", with the demo's workloads running" if workloads else ", empty"))
        return report


def run_conformance_simulated(*, render: Render, version: str = "1.37", feature_gates: dict[str, bool] | None = None,
                              layout: str = "mixed", layout_text: str | None = None, preset: str = "default",
                              prepare: Callable[[SimCluster], None] | None = None,
                              **kw: Unpack[ConformanceOptions]) -> ConformanceReport:
    """The checks against the simulated cluster (every GPU offering every profile, the L40S in
    mixed-size mode; a server of
    ``version`` with ``feature_gates`` over its defaults, None: every gate on). ``prepare(cluster)``
    may change the cluster before the checks (the tests break each property this way). ``render``
    makes the objects (:data:`.cluster.Render`)."""
    with SimCluster(render=render, version=version, layout=layout_text or DEMO_LAYOUT, layout_name=layout, preset=preset,
                    device_classes={"profiles": ["T4-1Q"], "extended_resources": True},
                    feature_gates=feature_gates) as c:
        if prepare is not None:
            prepare(c)

        cp = ControlPlane(c)

        def host(namespace: str, pod: str) -> list[str] | None:
            with cp.lock:  # not while the control plane is changing the host
                w = c.workload_of_pod(namespace, pod)
                return c.host_problems(w) if w is not None else None

        with cp:
            backend = KubeBackend(c.api, timeout=kw.pop("timeout", 30.0), settle=kw.pop("settle", 1.0),
                                  poll=0.1, selectors=c.selectors, host_problems=host,
                                  label=f"simulated ({c.preset} node {c.node}, layout {layout}, Kubernetes {version})")
            rep = run_conformance(backend, **kw)
        if cp.errors:
            rep.cleanup += [f"control plane: {e}" for e in cp.errors[:5]]
        return rep
