"""``vgpuctl conformance`` on the simulated cluster with Kubernetes' own allocator scheduling
(issue #39.1): on every supported minor before 1.37 (1.37: test_conformance's ``passing``), with
all gates on as ``run_conformance_simulated`` runs them, the five checks pass with
k8s.io/dynamic-resource-allocation of that minor making every allocation, and every allocation it
makes is made again by the Python model over the same snapshot and
compared whole (node, devices, tolerations, configs, binding conditions). Where Go is absent the
model stands in and the test says so (a ``ModelFallback`` warning); under CI it must be there."""

from __future__ import annotations

import pytest

from dra_bridge.sim.scenarios import run_conformance_simulated
from kubevirt_templates.render import render
from tests.dra_bridge.test_conformance import detail, republish, statuses, without_counters
from tests.support.upstream_allocator import MINORS, real_or_model, use_upstream

pytestmark = pytest.mark.go


@pytest.mark.parametrize("minor", MINORS[:-1])
def test_the_five_checks_pass_with_the_upstream_allocator_scheduling(minor):
    up = real_or_model(minor)
    before = up.requests if up else 0
    differences: list[str] = []
    rep = run_conformance_simulated(render=render, version=minor, prepare=lambda c: use_upstream(c, up, differences))
    assert statuses(rep) == {n: "passed" for n in range(1, 6)}, rep.to_dict()
    assert rep.ok and rep.cleanup == []
    # check 1's count is the model's (capacity); check 3 fills the GPU with the scheduler's allocator
    assert "allocates 2 of them at once" in detail(rep, 1)
    assert "stays Pending" in detail(rep, 3)
    assert "mixed-size: 3 sizes on GPU 0000:19:00.0 at once" in detail(rep, 4)
    assert "MIG-backed ['gpu-2-mig-1g5gb-19-0'] on 0000:16:00.0" in detail(rep, 4)
    assert differences == []
    if up is not None:
        assert up.requests > before


def test_check_3_fails_on_the_upstream_allocator_when_counters_are_removed():
    """The checks can fail on the upstream allocator too: without counters it puts one more vGPU on
    the full GPU."""
    up = real_or_model(MINORS[-1])

    def broken(c):
        republish(c, without_counters)
        use_upstream(c, up)

    rep = run_conformance_simulated(render=render, prepare=broken)
    st = statuses(rep)
    assert st[1] == "passed" and st[2] == "passed" and st[3] == "failed", rep.to_dict()
    assert "one more logical GPU of any profile was allocated although the GPU was full" in detail(rep, 3)
