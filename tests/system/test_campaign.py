"""The node-safety fault campaign, bounded (issues 12, 23 and 29): seeds 6, 9, 13 and 17, 100 steps each
(episodes of 25 steps on a fresh node), about 35 s of CPU a seed on an idle machine.

Each seed runs random sequences of applies (by the agent and by hand, beside the agent's own
threads), claims through the plugin's gRPC server, VMs and libvirt domains, kubelet restarts,
kills and power cuts mid-operation, reboots (some with new pods admitted first), corrupted
checkpoints, kernel, disk and API faults, lost, duplicated and reordered uevents, GPUs off the bus,
GPU health faults, bursts of mixed sizes through the binding verdicts, the simulated host's rebuild
interrupted by a signal, against one simulated node, and checks the contract's invariants after
every step (tests/campaign/invariants.py).
``python -m tests.campaign.mutations --ci`` shows these seeds and steps catch the in-use, overlap,
node-lock and libvirt-holder mutations on every seed. The seeds were chosen again (2026-12-07) after
a weight-3 reboot with new pods first (the reboot placements, issue 36.5) joined the step table and
the uevent fault steps became part of the default draws, which changed every seed's draws.
``python -m tests.campaign.predict`` at CI's steps (2026-12-07): seeds 3, 6, 9, 10, 11, 13, 14, 15,
16, 17, 22 and (since their fixes) 18 and 24 pass 100 steps; 6, 9, 13 and 17 reach a
selected layout blocked only by a libvirt domain (at steps 72, 48, 42 and 49) and edit the selected
layout under a libvirt-held vGPU; `mutations --ci --no-baseline` caught libvirt holders ignored (h)
at steps 72, 48, 42 and 40.
A longer run: ``python -m tests.campaign --steps 2000 --seed 1 --seed 2 --seed 3``.

To choose the seeds again (a change to the step table changes every seed's draws):
``python -m tests.campaign.predict --seed 1 --seed 2 ... --seed 12`` runs each seed at CI's steps and
says whether it passes, at which step the selected layout is first blocked only by a libvirt domain
(where (h) removes a device) and what it covered (LIBVIRT_EDIT); take four passing seeds that reach
both, put those with LIBVIRT_EDIT in :data:`COVERS`, and confirm with
``python -m tests.campaign.mutations --ci --no-baseline`` (every seed must catch every mutation).

:data:`COVERS` says which seed must reach what (the selected layout edited while a libvirt domain
names a vGPU that exists: issue 29, :data:`tests.campaign.run.LIBVIRT_EDIT`, counted in
``Result.covered``), so a change to the steps' draws that loses it is said here instead of passing
quietly.

A run that fails only on bugs the campaign has found and that are not fixed yet
(tests/campaign/known.py, empty today) is an expected failure naming them; any other violation fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.campaign import known
from tests.campaign.run import DRA_ALL, LIBVIRT_EDIT, run, seed_episode, seeded_process
from tests.campaign.world import World
from tests.support.simnodes import needs_libvirt
from tests.support.tmp import short_root

SEEDS = (6, 9, 13, 17)
#: what a seed's run must reach at CI's steps (besides passing)
COVERS = {6: (LIBVIRT_EDIT,), 9: (LIBVIRT_EDIT,), 13: (LIBVIRT_EDIT,), 17: (LIBVIRT_EDIT,)}
STEPS = int(os.environ.get("VGPUCTL_CAMPAIGN_STEPS", "100"))
EPISODE_STEPS = 25


@pytest.mark.libvirt  # its libvirt domains are read through libvirt-python, as the node reads them
@needs_libvirt
@pytest.mark.parametrize("seed", SEEDS)
def test_campaign(seed, caplog):
    caplog.set_level(logging.CRITICAL)  # the agent logs every fault it survives; the invariants judge
    result = run(STEPS, seed, episode_steps=EPISODE_STEPS, shrink=False,
                 workdir=Path(short_root()))  # tmpfs where there is one
    if result.failure is not None and (bugs := known.which(result.failure)):
        pytest.xfail(f"known bugs {', '.join(bugs)} (tests/campaign/known.py) after step {result.failed_at}")
    assert result.failure is None, result.failure
    assert result.line == f"{STEPS} steps, 0 invariant violations"
    # the run did what it says: most kinds of step ran
    assert sum(result.kinds.values()) == STEPS and len(result.kinds) >= 12, result.kinds
    if STEPS >= 100:  # a shorter run (VGPUCTL_CAMPAIGN_STEPS) need not get there
        # said, not asserted: under a loaded CI (xdist workers side by side) the agent's threads can take
        # another path, and seed 4 once reached no such edit (2026-11-29) though it does alone, every time.
        # The bug these edits found is guarded deterministically (test_mig.py, a libvirt domain's vGPU
        # keeps its GPU instance across a reboot).
        missed = [what for what in COVERS.get(seed, ()) if not result.covered.get(what)]
        if missed:
            warnings.warn(f"seed {seed} did not reach {missed} this run: {result.covered}", stacklevel=1)


@contextlib.contextmanager
def _campaign_dir(prefix: str) -> Iterator[tuple[Path, Path]]:
    """A run's directory (short, removed afterwards) and the campaign host's template in it, while the
    process is seeded as the campaign seeds it: yields ``(work, template)``."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=short_root()))
    with seeded_process(work), contextlib.ExitStack() as clean:
        clean.callback(shutil.rmtree, work, True)
        yield work, World.template(work / "template")


@contextlib.contextmanager
def _episode(work: Path, template: Path, name: str, layouts: dict[str, list[dict]] | None = None,
             seed: int = 0) -> Iterator[World]:
    """One episode's world in ``work/name``, a fresh copy of ``template`` (layouts: DRA on every GPU
    unless given), seeded with ``seed``; closed afterwards."""
    seed_episode(seed)
    (work / name).mkdir()
    world = World.create(work / name, template, layouts or {"dra": DRA_ALL}, seed)
    try:
        yield world
    finally:
        world.close()


@contextlib.contextmanager
def _fresh_world(prefix: str) -> Iterator[World]:
    """One episode (seed 0) on a fresh campaign node whose GPUs are all offered through DRA."""
    with _campaign_dir(prefix) as (work, template), _episode(work, template, "e") as world:
        yield world


@pytest.mark.libvirt
@needs_libvirt
def test_gpu_gone_step_passes_where_each_gpu_leaves_the_bus(caplog):
    """The campaign's GpuGone step (issue 36, point 5) on a node laid out by address: the first, the
    middle and the last GPU off the bus and back, applied by hand by index with the agent stopped,
    leave no violation. Seeds reach this step rarely; with mutation (k) or (m) of
    tests.campaign.mutations each of these three runs fails (the apply by index exits 2 or lays out
    the wrong GPU), measured 2026-12-07."""
    from tests.campaign import invariants
    from tests.campaign.gone import PLACES, GpuGone
    from tests.campaign.run import gpu_types
    from tests.campaign.steps import SelectLayout

    caplog.set_level(logging.CRITICAL)
    with _campaign_dir("gg") as (work, template):
        first, middle, last = (g.address for g in gpu_types(template))
        layout = [{"pciAddress": first, "mode": "vgpu", "vgpus": {"T4-2Q": 2}},
                  {"pciAddress": middle, "mode": "vgpu", "vgpus": {"A100-4C": 2}},
                  {"pciAddress": last, "mode": "vgpu", "vgpus": {"L40S-8Q": 2}}]
        for i, where in enumerate(PLACES):
            with _episode(work, template, where, {"dra": DRA_ALL, "a": layout}, i) as world:
                assert invariants.check_all(world, SelectLayout("a").run(world)) == []
                assert invariants.check_all(world, GpuGone(where, "a").run(world)) == [], where
                assert any("is back" in line for line in world.log), world.log  # it did unplug


@pytest.mark.libvirt
@needs_libvirt
def test_binding_burst_and_interrupted_rebuild_steps_pass_on_a_fresh_node(caplog):
    """The campaign's steps of issue #36.5 that seeds reach a few times a run, each once on a node whose
    GPUs are all offered with binding conditions: a burst of four sizes on the T4 confirms one size and
    prepares it, refusing the others at binding (with mutation (v) of tests.campaign.mutations, the
    verdict per claim, the mix is confirmed and its prepares refused: measured 2026-12-07); then the
    host's rebuild, interrupted by SIGTERM at its second GPU, is refused by every command until the
    reset again, after which the claim is prepared again on the rebuilt host."""
    from tests.campaign import invariants
    from tests.campaign.binding import BindingBurst
    from tests.campaign.simbuild import SimRebuild

    caplog.set_level(logging.CRITICAL)
    with _fresh_world("bb") as world:
        assert invariants.check_all(world, BindingBurst(0, (0, 1, 2, 3), 5, 0.3).run(world)) == [], world.log
        assert [c.devices for c in world.prepared.values()] == [["gpu-0-vgpu-1gb-0"]], world.log
        assert sum("refused at binding" in line for line in world.log) == 3, world.log
        assert invariants.check_all(world, SimRebuild("SIGTERM", 1).run(world)) == [], world.log
        assert any(line.startswith("sim reset, SIGTERM at GPU 1: exit 143") for line in world.log), world.log
        assert any(line.startswith("prepared claim-1") for line in world.log), world.log


@pytest.mark.libvirt
@needs_libvirt
def test_after_a_reboot_new_pods_first_leave_the_old_claims_their_vfs(caplog):
    """The campaign's Reboot with new pods admitted first (issue 36.5, the reboot placements): two
    claims prepared on the A100 (mdev on VFs), the node reboots, three new pods' claims allocated the
    free slots beside them are prepared before the old ones are prepared again. The new claims take
    other VFs; the old claims get their own back (their records hold them). With mutation (l) of
    tests.campaign.mutations (an earlier boot's record holds no VF) the new claims take the old
    claims' VFs and the step says so."""
    from tests.campaign import invariants
    from tests.campaign.steps import Reboot, _devices, _vfs

    caplog.set_level(logging.CRITICAL)
    with _fresh_world("rb") as world:
        slots = sorted(n for n in _devices(world) if n.startswith("gpu-1-vgpu-4gb-"))  # A100-4C: ten a GPU
        assert len(slots) >= 5, _devices(world)
        old = [world.new_claim([n]) for n in slots[:2]]
        assert all(world.prepare(c) is None for c in old), world.log
        before = _vfs(world)
        assert sorted(before) == sorted(c.ref.uid for c in old) and all(before.values()), before
        assert invariants.check_all(world, Reboot(first=0).run(world)) == [], world.log
        assert len(world.prepared) == 5 and not world.pending, world.log  # three new claims, then the old two
        after = _vfs(world)
        assert {uid: after[uid] for uid in before} == before
        assert not {vf for m in before.values() for vf in m.values()} & \
            {vf for uid, m in after.items() if uid not in before for vf in m.values()}
