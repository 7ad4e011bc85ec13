"""No over-commit on any server shape (#14): on 1.34-1.37 with default gates and with them flipped,
the agent publishes what that server keeps, the scheduler model allocates from the slices as the
server stored them, and every allocation it makes is then created by the kubelet plugin on the
simulated host: random workloads (every published vGPU type, MIG placements, mixed-size placements,
whole GPUs) are launched until nothing more fits, and none fails at prepare; a mixed-size vGPU sits
at its device's placement (host_problems)."""

from __future__ import annotations

import random

import pytest
import yaml

from dra_bridge.scheduling.objects import dev_attr
from dra_bridge.sim.cluster import SimCluster
from kubevirt_templates.render import render
from tests.support.simnodes import REPO

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


def example_dra(name: str) -> str:
    """An example layout's ``dra`` layout, named ``mixed`` (as the tests here and tests/oracle read it)."""
    doc = yaml.safe_load((REPO / "examples" / name).read_text())
    return yaml.safe_dump({"version": doc["version"], "layouts": {"mixed": doc["layouts"]["dra"]}})


#: the Blackwell nodes (#38) in their example layouts' dra layouts: 4 x RTX PRO 6000 (equal-size,
#: mixed-size on 96 slots, MIG with GB20x instances, whole) and 8 x B200 in MIG mode
RTXPRO, B200 = example_dra("rtxpro-layout.yaml"), example_dra("b200-layout.yaml")


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


def workload(kind: str, what: str | None, i: int, count: int = 1) -> list[dict]:
    """A pod with a claim for ``count`` devices of the kind (``render claim-template``)."""
    values = {"passthrough": True, "product": what} if kind == "passthrough" else {"profile": what}
    values["name"] = f"t{i}"
    template = render("claim-template", values)
    for r in template[0]["spec"]["spec"]["devices"]["requests"]:
        r["exactly"]["count"] = count
    return template + render("passthrough-pod", {"name": f"w{i}", "claim_template": f"t{i}"})


@pytest.mark.parametrize("preset,layout", NODES, ids=[p for p, _ in NODES])
@pytest.mark.parametrize("version,gates", SHAPES, ids=[f"{v}-{'-'.join(f'{k}={x}' for k, x in g.items()) or 'defaults'}"
                                                       for v, g in SHAPES])
def test_every_allocation_the_scheduler_makes_is_prepared(version, gates, preset, layout):
    fill_and_check(version, gates, preset, layout)


#: the shapes re-proven with Kubernetes' own allocator scheduling (issue #30): the counter era's
#: defaults, and everything kept on 1.37; the Blackwell nodes (#38) on both, with churn (workloads
#: stopping, so instances and placements are made again; claims for two devices)
GROUPS = {"DRADeviceCompatibilityGroups": True}
#: the RTX PRO 6000 in MIG mode of rtxpro-node's dra layout: its instances shared by DC-1-6Q (4 per
#: 1g.24gb) and DC-2-24Q (2 per 2g.48gb), and the GPU whole beside them (#38.1)
SHARED = ("DC-1-6Q", "DC-2-24Q", "RTX PRO 6000 Blackwell Server Edition")
UPSTREAM_SHAPES = [("1.36", {}, "mig-node", LAYOUT, False), ("1.37", GROUPS, "mixed-node", MIXED_SIZE, False),
                   ("1.36", {}, "rtxpro-node", RTXPRO, True), ("1.37", GROUPS, "rtxpro-node", RTXPRO, True),
                   ("1.36", {}, "b200-node", B200, True), ("1.37", GROUPS, "b200-node", B200, True),
                   ("1.36", {}, "rtxpro-node", RTXPRO, SHARED), ("1.37", GROUPS, "rtxpro-node", RTXPRO, SHARED)]


@pytest.mark.go
@pytest.mark.parametrize("version,gates,preset,layout,churn", UPSTREAM_SHAPES,
                         ids=[f"{v}-{p}{'-shared' if isinstance(c, tuple) else ''}" for v, _, p, _, c in UPSTREAM_SHAPES])
def test_every_allocation_the_real_allocator_makes_is_prepared(version, gates, preset, layout, churn):
    """The same guarantee with the scheduler's allocations made by k8s.io/dynamic-resource-allocation
    (tests/oracle) instead of the model; the model, asked the same over the same snapshot, answers
    the same whole result (node, devices, tolerations, configs, binding conditions)."""
    from dra_bridge.scheduling.taints import tainted_slices
    from tests.support.upstream_allocator import UpstreamAllocator, UpstreamScheduler, model_of, require

    differences: list[str] = []  # each allocation made again by the model, compared whole (#39.1)
    with UpstreamAllocator(version, require(version)) as up:
        known = up.gates()
        flips = {k: v for k, v in gates.items() if k in known}

        def scheduler(c: SimCluster) -> UpstreamScheduler:
            slices, classes, claims = tainted_slices(c.slices(), c.taint_rules()), c.classes(), c.claims()
            return UpstreamScheduler(up, slices, classes, claims, flips, differences=differences,
                                     model=model_of(slices, classes, claims, c.scheduler_features()))

        fill_and_check(version, gates, preset, layout, scheduler, churn)
        assert up.requests > 0
    assert differences == []


def fill_and_check(version, gates, preset, layout, scheduler=None, churn: bool | tuple[str, ...] = False):
    """Launch random workloads until the node is full; every allocation made is prepared. With
    ``churn`` workloads also stop at random (unprepare, then their devices are allocated again) and a
    claim may ask for two devices; what runs is checked against the host after every step, and once
    everything has stopped no vGPU and no GPU instance is left. ``churn`` as a tuple of types and
    products: with churn, workloads ask for those only, and some GPU instance must have held several
    vGPUs at once (MIG time-slicing)."""
    only = churn if isinstance(churn, tuple) else None
    rng = random.Random(f"{version}{sorted(gates.items())}{'' if preset == 'mig-node' else preset}{only or ''}")
    with SimCluster(render=render, version=version, feature_gates=gates, layout=layout, layout_name="mixed", preset=preset,
                    health=False) as c:
        if scheduler is not None:
            c.allocator = lambda: scheduler(c)  # the scheduler's allocator, in place of the model
        choices = [x for x in offered(c) if only is None or x[1] in only]
        assert choices, "nothing published"
        most_shared = 0
        counters_kept = any(s["spec"].get("sharedCounters") for s in c.slices())
        running, pending, failed, stopped = [], 0, [], 0
        for i in range(40):
            if churn and running and rng.random() < 0.3:
                c.teardown(running.pop(rng.randrange(len(running))))
                stopped += 1
                continue
            kind, what = rng.choice(choices)
            count = 2 if churn and rng.random() < 0.3 else 1
            w = c.launch(workload(kind, what, i, count), name=f"w{i}")
            if w.phase == "Running":
                running.append(w)
                assert c.host_problems(w) == []
            elif w.phase == "Pending":
                pending += 1
                c.teardown(w)
            else:
                failed.append(f"{kind} {what} x{count}: {w.phase}: {w.reason}")
            if churn:
                inv = c.inventory()
                assert held(running) == {v.id for v in inv.all_vgpus()}, f"step {i}"
                most_shared = max([most_shared] + [len(gi.vgpus) for g in inv.gpus if g.mig for gi in g.mig.instances])
        assert failed == []  # no allocation reached prepare that the node could not make
        assert running and pending  # the GPUs filled up and the scheduler said no, rather than prepare
        assert stopped or not churn
        assert most_shared >= 2 or only is None, "no GPU instance was shared"
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
        assert held(running) == {v.id for v in c.inventory().all_vgpus()}
        for w in running:
            c.teardown(w)
        inv = c.inventory()
        assert inv.all_vgpus() == []
        if churn:  # the instances prepare made are gone with their vGPUs
            assert [g.index for g in inv.gpus if g.mig and g.mig.instances] == []


def held(running: list) -> set[str | None]:
    """The host ids of the vGPUs the running workloads got."""
    return {d.host_id for w in running for d in w.devices if d.kind == "vgpu"}


def test_a_claim_of_two_instances_runs_on_both():
    """A claim for two B200 GPU instances: prepare makes both, each with its vGPU on an instance at
    its device's placement, and the workload reads both from its request's one metadata file
    (KEP-5304), which the runtime gives it with the first device's CDI ids (the simulated kubelet
    read only each device's own ids, so the second device had no vGPU). host_problems, which the
    streams rely on, reports a vGPU on an instance other than its device's."""
    with SimCluster(render=render, version="1.36", layout=B200, layout_name="mixed", preset="b200-node", health=False) as c:
        w = c.launch(workload("vgpu", "B200X-1-23C", 0, count=2), name="two")
        assert w.phase == "Running", w.reason
        assert c.host_problems(w) == []
        ids = held([w])
        assert None not in ids and len(ids) == 2
        assert ids == {v.id for v in c.inventory().all_vgpus()}
        assert sorted(d.instance for d in w.devices) == [(0, 1), (1, 1)]
        d = w.devices[0]
        d.instance = (5, 1)
        assert c.host_problems(w) == [f"two: vGPU {d.host_id} lives on a GPU instance at (0, 1), the slice said "
                                      f"(5, 1) ({d.device})"]
        c.teardown(w)
        assert not any(g.mig and g.mig.instances for g in c.inventory().gpus)
