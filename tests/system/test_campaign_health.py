"""The campaign's health steps on their own (issue #40.4), a fixed sequence on one campaign node: a
fault on the GPU a prepared claim holds (a VM holding it), recovery past the quiet period, a fault
during the kubelet's prepare, flapping; each step's checks pass on the code as it is and find the
fault published untainted when the agent's health filter is taken away (what mutation ``t`` of
tests/campaign/mutations.py does in the long runs)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.campaign import invariants
from tests.campaign.health_steps import HealthDuringPrepare, HealthFault, HealthRecover
from tests.campaign.run import DRA_ALL
from tests.campaign.steps import Checks, VmStart, _new_claim
from tests.campaign.world import World
from tests.support.simnodes import needs_libvirt
from tests.support.tmp import short_root

pytestmark = [pytest.mark.libvirt, needs_libvirt]


@pytest.fixture
def world(caplog):
    caplog.set_level(logging.CRITICAL)  # the agent logs each fault; the checks judge
    base = Path(tempfile.mkdtemp(dir=short_root()))  # short: the agent's sockets live below it
    w = World.create(base / "e", World.template(base / "t"), {"dra": DRA_ALL}, 1)
    yield w
    w.close()
    shutil.rmtree(base, ignore_errors=True)


def _ok(world: World, checks: Checks) -> None:
    bad = invariants.check_all(world, checks)
    assert not bad, "\n".join(bad + world.log)


def test_a_fault_on_a_held_gpu_taints_it_keeps_the_vgpu_and_recovery_lifts_it(world):
    claim = _new_claim(world, (0,), free=True)
    assert world.prepare(claim) is None, world.log
    _ok(world, VmStart(0).run(world))
    before = {h.device for h in world.vms.values()}
    _ok(world, HealthFault(0, 2, "held").run(world))  # "lost": a condition, taint gpu-lost
    (gpu,) = world.health
    assert world.daemon.health.tracker.unhealthy().keys() == {gpu}
    assert {h.device for h in world.vms.values()} == before
    _ok(world, HealthRecover(0, early=True).run(world))
    assert not world.health and not world.daemon.health.tracker.unhealthy()


def test_a_fault_during_a_prepare_and_a_flapping_gpu(world):
    _ok(world, HealthDuringPrepare((3,), 0).run(world))  # an Xid: an event, seen once
    assert world.health and world.prepared, world.log
    _ok(world, HealthFault(1, 1, flap=True).run(world))
    while world.health:
        _ok(world, HealthRecover(0).run(world))


def test_the_checks_find_a_fault_published_untainted(world, monkeypatch):
    import dra_bridge.agent.daemon as daemon

    monkeypatch.setattr(daemon, "healthy_pool", lambda pool, *a, **k: (pool, {}))
    checks = HealthFault(0, 2).run(world)
    assert any("without its gpu-lost taint" in p for p in checks.problems), checks.problems
