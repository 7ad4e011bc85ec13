"""The campaign runner: hypothesis draws episodes of steps; the invariants are checked after each.

An episode is a fresh node (the campaign host, a local API server, the agent started) with
four named layouts (``dra`` and three drawn ones) and up to ``episode_steps`` drawn steps.
Episodes run until ``steps`` steps ran. On the first violation hypothesis shrinks the episode
and prints the smallest failing sequence (its draws: the layouts, then one line per step).

Everything random is drawn from the seed, so ``--seed N`` replays: hypothesis's own draws, each
episode's seed, from which come the process's ``uuid.uuid4`` (vGPU UUIDs the planner and the
plugin make, the API server's uids, boot ids: the code calls ``uuid.uuid4`` at call time, so a
seeded stream stands in for it while the campaign runs), the global ``random`` (the API server's
generated names, the publisher's jitter) and every concurrent step's interleaving
(:mod:`.sched`). :attr:`Result.digest` sums up what every step saw: two runs of one seed give one
digest.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from mdev_manager import catalog
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.campaign import invariants
from tests.campaign.steps import EditLayout, SelectLayout, steps
from tests.campaign.world import World

_DATES = re.compile(r"'Date': '[^']*'")  # HTTP headers in API errors: the one clock in what a step sees
DRA_ALL = [{"all": True, "mode": "dra", "passthrough": True}]
NAMES = ["a", "b", "c"]


class Violation(AssertionError):
    """An invariant does not hold after a step."""


@dataclass(frozen=True)
class GpuTypes:
    address: str
    sliced: list[tuple[str, int]]  # (short name, most per GPU)
    mig: list[tuple[str, int]]  # MIG-backed, on a MIG-capable board


def gpu_types(template: Path) -> list[GpuTypes]:
    """Each GPU's layout-able vGPU types, from the catalog board it is."""
    node = sim_node(template, None)
    by_device = {b.device_id: b for b in catalog.BOARDS.values()}
    out = []
    for g in discover(node.env, node.io).gpus:
        board = by_device[g.device_id]
        out.append(GpuTypes(g.address, [(t.short_name, t.max_instances) for t in board.types if not t.mig_backed],
                            [(t.short_name, t.max_instances) for t in board.types if t.mig_backed]))
    return out


def entry(g: GpuTypes) -> st.SearchStrategy:
    """One GPU's line of a layout: dra (maybe with passthrough, maybe a MIG mode), passthrough, or
    vGPUs of one type (time-sliced, or MIG-backed where the board has MIG)."""
    def vgpus(t: tuple[str, int]) -> st.SearchStrategy:
        return st.integers(1, t[1]).map(lambda n: {"pciAddress": g.address, "mode": "vgpu", "vgpus": {t[0]: n}})

    def dra(passthrough: bool, mig) -> dict:
        e = {"pciAddress": g.address, "mode": "dra", "passthrough": passthrough}
        if mig is not None:
            e["migMode"] = mig
        return e

    migs = st.sampled_from([None, True, False, "auto"]) if g.mig else st.none()
    options = [st.builds(dra, st.booleans(), migs), st.just({"pciAddress": g.address, "mode": "passthrough"}),
               st.sampled_from(g.sliced).flatmap(vgpus)]
    if g.mig:
        options.append(st.sampled_from(g.mig).flatmap(vgpus))
    return st.one_of(*options)


def layout(gpus: list[GpuTypes]) -> st.SearchStrategy:
    """A layout over a drawn subset of the GPUs (a GPU left out is left alone)."""
    return st.tuples(*[st.one_of(st.none(), entry(g)) for g in gpus]).map(lambda es: [e for e in es if e is not None])


@dataclass
class Result:
    steps: int = 0
    episodes: int = 0
    violations: int = 0
    failure: str | None = None
    failed_at: int | None = None  # the run's step number (1-based) after which the first violation was seen
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)
    covered: dict[str, int] = field(default_factory=dict)  # situations the steps ran in (see :func:`situations`)
    digest: str = ""

    @property
    def line(self) -> str:
        return f"{self.steps} steps, {self.violations} invariant violations"


class SeededUuids:
    """``uuid.uuid4`` from a seed: random-looking version-4 UUIDs, the same ones for the same seed."""

    def __init__(self, value: int):
        self.rng = random.Random(f"uuid4/{value}")

    def __call__(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)


@contextmanager
def seeded_process(work: Path):
    """While the campaign runs: ``uuid.uuid4`` seeded per episode, temporary files in the run's own
    directory (so the files invariant sees them)."""
    saved_uuid4, saved_tmp = uuid.uuid4, tempfile.tempdir
    tmp = work / "tmp"
    tmp.mkdir()
    tempfile.tempdir = str(tmp)
    try:
        yield
    finally:
        uuid.uuid4, tempfile.tempdir = saved_uuid4, saved_tmp


def seed_episode(value: int) -> None:
    uuid.uuid4 = SeededUuids(value)  # type: ignore[assignment]
    random.seed(value)


#: the selected layout edited while a libvirt domain names a vGPU that exists: the planner must keep the
#: vGPU, its definition and its GPU instance's record (issue 29); :data:`LIBVIRT_SELECT`: another
#: layout selected then
LIBVIRT_EDIT = "layout edits under libvirt-held vGPUs"
LIBVIRT_SELECT = "layout selections under libvirt-held vGPUs"


def situations(world: World, step) -> list[str]:
    """What the node is in as ``step`` starts that CI's seeds must reach (:data:`LIBVIRT_EDIT`)."""
    what = LIBVIRT_SELECT if isinstance(step, SelectLayout) else \
        LIBVIRT_EDIT if isinstance(step, EditLayout) and step.target(world) == world.selected else None
    named = {d.lower() for mdevs, pcis in world.domains.values() for d in [*mdevs, *pcis]}
    if what is None or not named:
        return []
    vgpus = {v.id.lower() for v in discover(world.env, world.node.io).all_vgpus()}
    return [what] if named & vgpus else []


def run(total: int, seed_value: int, *, episode_steps: int = 50, shrink: bool = True,
        workdir: Path | None = None, progress=None, trace=None, observe=None, uevents: bool = True) -> Result:
    """Run ``total`` steps with hypothesis seeded by ``seed_value``; ``trace`` (a text file) gets what
    every step saw; ``observe(world, n)`` is called after the run's step ``n``, before its invariants
    (:mod:`.predict` looks at the node there); ``uevents=False``: draw no uevent fault steps (other draws: not CI's steps)."""
    result = Result()
    digest = hashlib.sha256()
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="cp", dir=workdir or "/tmp"))  # short: unix sockets live below it
    try:
        with seeded_process(work):
            template = World.template(work / "template")
            gpus = gpu_types(template)
            step_at = steps(["dra", *NAMES], st.builds(EditLayout, st.sampled_from(NAMES), layout(gpus).map(tuple)),
                            uevents=uevents)
            failing = {"seen": False}
            phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

            @settings(max_examples=max(1, math.ceil(total / episode_steps)), database=None, deadline=None,
                      phases=phases, suppress_health_check=list(HealthCheck), print_blob=False,
                      report_multiple_bugs=False)
            @seed(seed_value)
            @given(st.data())
            def episode(data) -> None:
                # every example draws the same shape (hypothesis insists); past ``total`` steps it runs none
                limit = episode_steps if failing["seen"] else min(episode_steps, total - result.steps)
                drawn = {n: data.draw(layout(gpus), label=f"layout {n}") for n in NAMES}
                episode_seed = data.draw(st.integers(0, 2**32 - 1), label="episode seed")
                if limit <= 0:
                    for i in range(episode_steps):
                        data.draw(step_at(i))
                    return
                seed_episode(episode_seed)
                failing["examples"] = failing.get("examples", 0) + 1
                base = work / f"e{failing['examples']}"  # named by count, not at random: the trace replays
                base.mkdir()
                outside = invariants.Outside(work, base, skip=[template])
                world = World.create(base, template, {"dra": DRA_ALL, **drawn}, episode_seed)
                try:
                    for i in range(episode_steps):
                        s = data.draw(step_at(i), label=f"step {i + 1}")
                        if i >= limit:
                            continue
                        world.log.clear()
                        seen_in = situations(world, s)
                        checks = s.run(world)
                        if not failing["seen"]:
                            result.steps += 1
                            for what in seen_in:
                                result.covered[what] = result.covered.get(what, 0) + 1
                            kind = type(s).__name__
                            result.kinds[kind] = result.kinds.get(kind, 0) + 1
                            seen = _DATES.sub("<date>", f"{s!r}\n{chr(10).join(world.log)}".replace(str(work), "<run>"))
                            digest.update(seen.encode())
                            if trace is not None:
                                trace.write(f"--- step {result.steps}\n{seen}\n")
                            if progress:
                                progress(result.steps, total)
                            if observe is not None:
                                observe(world, result.steps)
                        bad = invariants.check_all(world, checks, outside)
                        if bad:
                            if not failing["seen"]:
                                result.failed_at = result.steps
                            failing["seen"] = True
                            saw = "\n    ".join(line[:3000] for line in world.log)
                            note(f"what the failing step saw:\n    {saw}")
                            raise Violation(f"after step {i + 1} ({s!r}):\n  " + "\n  ".join(bad)
                                            + f"\n  what the step saw:\n    {saw}")
                finally:
                    world.close()
                    shutil.rmtree(base, ignore_errors=True)
                if not failing["seen"]:
                    result.episodes += 1

            try:
                episode()
            except Violation as exc:
                result.violations = 1
                result.failure = str(exc)
            except FlakyFailure as exc:  # the replay of the failing episode passed: the first failure is the finding
                first = next((e for e in exc.exceptions if isinstance(e, Violation)), exc)
                result.violations = 1
                result.failure = f"{first}\n  (hypothesis' replay of this episode did not fail again: it depends on timing)"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = time.monotonic() - t0
        result.digest = digest.hexdigest()[:16]
    return result
