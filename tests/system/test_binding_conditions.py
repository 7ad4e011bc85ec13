"""Every vGPU size on servers without compatibility groups, kept apart by binding conditions
(KEP-5007; 1.36 by default): the agent confirms each allocation's size per GPU before the
scheduler binds, refuses a second size, and republishes the GPU with its size; a GPU freed offers
every size again. A scheduler race that allocates two sizes of one empty GPU from one snapshot
never reaches prepare."""

from __future__ import annotations

import pytest

from dra_bridge.sim.cluster import SimCluster
from kubevirt_templates.render import render

LAYOUT = """\
version: vgpuctl/v1
layouts:
  all:
    - all: true
      mode: dra
      passthrough: true
"""
DRIVER = "vgpu.kubevirt.io"
T4_SIZES = ["T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q", "T4-16Q"]


def on_gpu(profile: str, gpu_index: int, i: int) -> list[dict]:
    """A pod with a claim for ``profile`` on GPU ``gpu_index`` of the node."""
    (t,) = render("claim-template", {"profile": profile, "name": f"t{i}"})
    sels = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    sels.append({"cel": {"expression": f'device.attributes["{DRIVER}"].gpuIndex == {gpu_index}'}})
    return [t] + render("passthrough-pod", {"name": f"w{i}", "claim_template": f"t{i}"})


def gpu_sizes(c: SimCluster, index: int) -> dict[str, list]:
    """vGPU slot size -> bindingConditions of GPU ``index``'s published devices."""
    out = {}
    for s in c.slices():
        for d in s["spec"].get("devices") or []:
            a = d["attributes"]
            if a["gpuIndex"]["int"] == index and a["type"]["string"] == "vgpu":
                out[d["capacity"]["memory"]["value"]] = d.get("bindingConditions") or []
    return out


@pytest.fixture
def cluster():
    with SimCluster(render=render, version="1.36", feature_gates={}, layout=LAYOUT, layout_name="all", health=False) as c:
        yield c


def test_an_empty_gpu_offers_every_size_each_bound_by_the_agent(cluster):
    c = cluster
    assert c.daemon.kept.binding_conditions is True and c.daemon.kept.compatibility_groups is not True
    sizes = gpu_sizes(c, 0)
    assert sorted(sizes) == ["16Gi", "1Gi", "2Gi", "4Gi", "8Gi"]
    assert all(v == [f"{DRIVER}/SizeAssigned"] for v in sizes.values())
    dev = next(d for s in c.slices() for d in s["spec"].get("devices") or [] if d.get("bindingConditions"))
    assert dev["bindingFailureConditions"] == [f"{DRIVER}/SizeConflict"]
    assert not any(cs.get("compatibilityGroups") for d in [dev] for cs in d.get("consumesCounters") or [])


def test_every_offered_size_is_allocatable_without_a_prepare_failure(cluster):
    c = cluster
    for i, profile in enumerate(T4_SIZES):
        w = c.launch(on_gpu(profile, 0, i), name=f"w{i}")
        assert w.phase == "Running", (profile, w.reason)
        assert c.inventory().gpu("0000:10:00.0").vgpus[0].type_name == f"GRID {profile}"
        # the GPU now offers its size only: a claim of another size goes elsewhere, never to prepare
        assert list(gpu_sizes(c, 0)) == [profile[3:-1] + "Gi"]
        c.teardown(w)
        c.daemon.bind()  # the agent notices the GPU is empty again (its watch, in a real cluster)
        assert len(gpu_sizes(c, 0)) == 5
    assert c.prebind_failures == 0


def test_a_scheduler_race_on_one_gpu_fails_at_prebind_not_at_prepare(cluster):
    c = cluster
    a = c.submit(on_gpu("T4-8Q", 0, 1), name="a")
    b = c.submit(on_gpu("T4-1Q", 0, 2), name="b")
    assert c.schedule_together([a, b]) == [True, False]  # one snapshot: both allocated on GPU 0
    assert b.reason.startswith("claim ") and "binding failed: reason=SizeTaken" in b.reason
    assert "runs 8192 MiB vGPUs" in b.reason
    (claim,) = [x for x in c.claims() if x["metadata"]["name"] == b.claims[0][0]]
    assert not (claim.get("status") or {}).get("allocation")  # dropped: the next attempt starts afresh
    assert c.run(a) and a.phase == "Running"
    # the retry sees GPU 0 with 8 GiB slots only: b (pinned to GPU 0) waits, with the scheduler's reason
    assert not c.schedule(b) and "no device matches" in b.reason
    assert gpu_sizes(c, 0) == {"8Gi": []}  # holding a vGPU: its size, nothing left to confirm
    assert c.prebind_failures == 1
    assert len(c.inventory().gpu("0000:10:00.0").vgpus) == 1  # nothing of b's was ever made on GPU 0


@pytest.mark.parametrize("gates", [{"DRADeviceBindingConditions": False}])
def test_without_binding_conditions_one_size_per_gpu(gates):
    with SimCluster(render=render, version="1.36", feature_gates=gates, layout=LAYOUT, layout_name="all", health=False) as c:
        assert c.daemon.kept.binding_conditions is False
        assert len(gpu_sizes(c, 0)) == 1 and not any(gpu_sizes(c, 0).values())


def test_racing_allocations_of_random_sizes_never_reach_prepare(cluster):
    """Rounds of six pods allocated from one snapshot (any GPU, any time-sliced size): those whose
    size conflicts fail at PreBind; every pod that binds is prepared. Conflicts at prepare: 0."""
    import random

    c = cluster
    rng = random.Random(5007)
    sizes = sorted({t for s in c.slices() for d in s["spec"].get("devices") or []
                    for t in (d["attributes"].get("vgpuTypes", {}).get("string") or "").split()})
    prepared, failed_at_prepare = 0, []
    for rnd in range(4):
        ws = []
        for k in range(6):
            i = rnd * 10 + k
            (t,) = render("claim-template", {"profile": rng.choice(sizes), "name": f"t{i}"})
            ws.append(c.submit([t] + render("passthrough-pod", {"name": f"w{i}", "claim_template": f"t{i}"}),
                               name=f"w{i}"))
        for w, bound in zip(ws, c.schedule_together(ws), strict=False):
            if bound:
                if c.run(w):
                    prepared += 1
                else:
                    failed_at_prepare.append(w.reason)
        for w in ws:
            c.teardown(w)
        c.daemon.bind()
    assert failed_at_prepare == []
    assert prepared > 0 and c.prebind_failures > 0  # the race happened, and was caught before prepare


def test_sizes_by_first_allocation_without_binding_conditions_has_a_window():
    """Opt-in (--sizes-by-first-allocation) where the server keeps neither groups nor binding
    conditions: every size of an empty GPU, no conditions; the agent republishes the GPU with the
    size of its first allocation once it sees it. Inside that window a second size is allocated and
    fails at prepare (never created on the host); after it, the GPU offers its size only."""
    with SimCluster(render=render, version="1.36", feature_gates={"DRADeviceBindingConditions": False}, layout=LAYOUT,
                    layout_name="all", health=False, serve_options={"sizes_by_first_allocation": True}) as c:
        sizes = gpu_sizes(c, 0)
        assert len(sizes) == 5 and not any(sizes.values())  # every size, no binding conditions
        a = c.submit(on_gpu("T4-8Q", 0, 1), name="a")
        b = c.submit(on_gpu("T4-1Q", 0, 2), name="b")
        assert c.schedule_together([a, b]) == [True, True]  # nothing stops the mix before prepare
        assert c.run(a) and not c.run(b)  # the window: b reaches prepare and fails there
        assert "cannot create" in b.reason
        assert [v.type_name for v in c.inventory().gpu("0000:10:00.0").vgpus] == ["GRID T4-8Q"]
        c.daemon.bind()  # the agent's watch sees the allocations
        assert list(gpu_sizes(c, 0)) == ["8Gi"]
        c.teardown(b)
        c.teardown(a)
        c.daemon.resync()
        c.daemon.bind()
        assert len(gpu_sizes(c, 0)) == 5  # empty again: every size


def test_without_the_option_one_size_per_gpu_and_no_window():
    with SimCluster(render=render, version="1.36", feature_gates={"DRADeviceBindingConditions": False}, layout=LAYOUT,
                    layout_name="all", health=False) as c:
        a = c.submit(on_gpu("T4-8Q", 0, 1), name="a")
        b = c.submit(on_gpu("T4-1Q", 0, 2), name="b")
        bound = c.schedule_together([a, b])
        assert bound.count(True) <= 1 and all(c.run(w) for w, ok in zip((a, b), bound, strict=False) if ok)
