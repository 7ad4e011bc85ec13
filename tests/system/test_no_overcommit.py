"""No over-commit on any server shape (#14): on 1.34-1.37 with default gates and with them flipped,
the agent publishes what that server keeps, the scheduler model allocates from the slices as the
server stored them, and every allocation it makes is then created by the kubelet plugin on the
simulated host: random workloads (every published vGPU type, MIG placements, mixed-size placements,
whole GPUs) are launched until nothing more fits, and none fails at prepare; a mixed-size vGPU sits
at its device's placement (host_problems)."""

from __future__ import annotations

import random

import pytest

from dra_bridge.scheduling.objects import dev_attr
from dra_bridge.sim.cluster import SimCluster
from kubevirt_templates.render import render

SHAPES = [
    ("1.34", {}),  # counters dropped: the safe shape
    ("1.35", {}),
    ("1.35", {"DRAPartitionableDevices": True}),  # counters kept, no groups: one size per GPU
    ("1.36", {}),
    ("1.36", {"DRAPartitionableDevices": False}),
    ("1.37", {}),  # groups dropped (alpha): one size per GPU
    ("1.37", {"DRADeviceCompatibilityGroups": True}),  # everything kept: every size, apart by groups
]
LAYOUT = """\
version: vgpuctl/v1
layouts:
  mixed:
    - all: true
      mode: dra
      passthrough: true
      migMode: true
"""
#: The mixed-size boards (L40S, L4, H100 80GB, A100 40GB) in mixed-size mode, every size at its
#: placements, beside the A40 in equal-size mode (no known table)
MIXED_SIZE = """\
version: vgpuctl/v1
layouts:
  mixed:
""" + "".join(f"""\
    - index: {i}
      mode: dra
      passthrough: true
      mixedSize: {'true' if i < 4 else 'false'}
""" for i in range(5))
NODES = [("mig-node", LAYOUT), ("mixed-node", MIXED_SIZE)]


def offered(c: SimCluster) -> list[tuple[str, str | None]]:
    """(kind, vGPU type) of every published device, as workloads would ask for them."""
    out = set()
    for s in c.slices():
        for d in s["spec"].get("devices") or []:
            kind = dev_attr(d, "type", c.driver)
            if kind == "passthrough":
                out.add(("passthrough", dev_attr(d, "productName", c.driver)))
            for t in (dev_attr(d, "vgpuTypes", c.driver) or "").split():
                out.add(("vgpu", t))
    return sorted(out, key=lambda x: (x[0], x[1] or ""))


def workload(kind: str, what: str | None, i: int) -> list[dict]:
    values = {"passthrough": True, "product": what} if kind == "passthrough" else {"profile": what}
    values["name"] = f"t{i}"
    template = render("claim-template", values)
    return template + render("passthrough-pod", {"name": f"w{i}", "claim_template": f"t{i}"})


@pytest.mark.parametrize("preset,layout", NODES, ids=[p for p, _ in NODES])
@pytest.mark.parametrize("version,gates", SHAPES, ids=[f"{v}-{'-'.join(f'{k}={x}' for k, x in g.items()) or 'defaults'}"
                                                       for v, g in SHAPES])
def test_every_allocation_the_scheduler_makes_is_prepared(version, gates, preset, layout):
    fill_and_check(version, gates, preset, layout)


#: the shapes re-proven with Kubernetes' own allocator scheduling (issue #30): the counter era's
#: defaults, and everything kept on 1.37
UPSTREAM_SHAPES = [("1.36", {}, "mig-node", LAYOUT), ("1.37", {"DRADeviceCompatibilityGroups": True}, "mixed-node",
                                                      MIXED_SIZE)]


@pytest.mark.go
@pytest.mark.parametrize("version,gates,preset,layout", UPSTREAM_SHAPES, ids=[f"{v}-{p}" for v, _, p, _ in UPSTREAM_SHAPES])
def test_every_allocation_the_real_allocator_makes_is_prepared(version, gates, preset, layout):
    """The same guarantee with the scheduler's allocations made by k8s.io/dynamic-resource-allocation
    (tests/oracle) instead of the model."""
    from dra_bridge.scheduling.taints import tainted_slices
    from tests.support.upstream_allocator import UpstreamAllocator, UpstreamScheduler, require

    with UpstreamAllocator(version, require(version)) as up:
        known = up.gates()
        flips = {k: v for k, v in gates.items() if k in known}

        def scheduler(c: SimCluster) -> UpstreamScheduler:
            return UpstreamScheduler(up, tainted_slices(c.slices(), c.taint_rules()), c.classes(), c.claims(), flips)

        fill_and_check(version, gates, preset, layout, scheduler)
        assert up.requests > 0


def fill_and_check(version, gates, preset, layout, scheduler=None):
    """Launch random workloads until the node is full; every allocation made is prepared."""
    rng = random.Random(f"{version}{sorted(gates.items())}{'' if preset == 'mig-node' else preset}")
    with SimCluster(version=version, feature_gates=gates, layout=layout, layout_name="mixed", preset=preset,
                    health=False) as c:
        if scheduler is not None:
            c.allocator = lambda: scheduler(c)  # the scheduler's allocator, in place of the model
        choices = offered(c)
        assert choices, "nothing published"
        counters_kept = any(s["spec"].get("sharedCounters") for s in c.slices())
        running, pending, failed = [], 0, []
        for i in range(40):
            kind, what = rng.choice(choices)
            w = c.launch(workload(kind, what, i), name=f"w{i}")
            if w.phase == "Running":
                running.append(w)
                assert c.host_problems(w) == []
            elif w.phase == "Pending":
                pending += 1
                c.teardown(w)
            else:
                failed.append(f"{kind} {what}: {w.phase}: {w.reason}")
        assert failed == []  # no allocation reached prepare that the node could not make
        assert running and pending  # the GPUs filled up and the scheduler said no, rather than prepare
        if preset == "mixed-node":  # sizes side by side on a GPU where counters keep them apart, one size where not
            sizes: dict[str | None, set[int]] = {}
            for w in running:
                for d in w.devices:
                    if d.slots is not None:
                        sizes.setdefault(d.gpu, set()).add(d.slots[1])
            assert sizes, "no mixed-size vGPU ran"
            most = max(len(s) for s in sizes.values())
            assert (most >= 2) if counters_kept else (most == 1), sizes
        # what runs is exactly what the host holds
        held = {d.host_id for w in running for d in w.devices if d.kind == "vgpu"}
        assert held == {v.id for v in c.inventory().all_vgpus()}
        for w in running:
            c.teardown(w)
        assert c.inventory().all_vgpus() == []
