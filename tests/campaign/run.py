"""The campaign runner: hypothesis draws episodes of steps; the invariants are checked after each.

An episode is a fresh node (the campaign host, a local API server, the agent started) with
four named layouts (``dra`` and three drawn ones) and up to ``episode_steps`` drawn steps.
Episodes run until ``steps`` steps ran. On the first violation hypothesis shrinks the episode
and prints the smallest failing sequence (its draws: the layouts, then one line per step).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from mdev_manager import catalog
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.campaign import invariants
from tests.campaign.steps import EditLayout, steps
from tests.campaign.world import World

DRA_ALL = [{"all": True, "mode": "dra", "passthrough": True}]
NAMES = ["a", "b", "c"]


class Violation(AssertionError):
    """An invariant does not hold after a step."""


def gpu_types(template: Path) -> dict[str, list[tuple[str, int]]]:
    """Each GPU's layout-able vGPU types (short name, most per GPU), from the catalog board it is."""
    node = sim_node(template, None)
    by_device = {b.device_id: b for b in catalog.BOARDS.values()}
    out = {}
    for g in discover(node.env, node.io).gpus:
        board = by_device[g.device_id]
        out[g.address] = [(t.short_name, t.max_instances) for t in board.types if not t.mig_backed]
    return out


def entry(address: str, types: list[tuple[str, int]]) -> st.SearchStrategy:
    """One GPU's line of a layout: dra (maybe with passthrough), passthrough, or vGPUs of one type."""
    def vgpus(t: tuple[str, int]) -> st.SearchStrategy:
        return st.integers(1, t[1]).map(lambda n: {"pciAddress": address, "mode": "vgpu", "vgpus": {t[0]: n}})

    return st.one_of(
        st.booleans().map(lambda p: {"pciAddress": address, "mode": "dra", "passthrough": p}),
        st.just({"pciAddress": address, "mode": "passthrough"}),
        st.sampled_from(types).flatmap(vgpus),
    )


def layout(gpus: dict[str, list[tuple[str, int]]]) -> st.SearchStrategy:
    """A layout over a drawn subset of the GPUs (a GPU left out is left alone)."""
    return st.tuples(*[st.one_of(st.none(), entry(a, t)) for a, t in sorted(gpus.items())]).map(
        lambda es: [e for e in es if e is not None])


@dataclass
class Result:
    steps: int = 0
    episodes: int = 0
    violations: int = 0
    failure: str | None = None
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def line(self) -> str:
        return f"{self.steps} steps, {self.violations} invariant violations"


def run(total: int, seed_value: int, *, episode_steps: int = 50, shrink: bool = True,
        workdir: Path | None = None, progress=None) -> Result:
    """Run ``total`` steps with hypothesis seeded by ``seed_value``."""
    result = Result()
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="cp", dir=workdir or "/tmp"))  # short: unix sockets live below it
    try:
        template = World.template(work / "template")
        gpus = gpu_types(template)
        step_at = steps(["dra", *NAMES], st.builds(EditLayout, st.sampled_from(NAMES), layout(gpus).map(tuple)))
        failing = {"seen": False}

        phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

        @settings(max_examples=max(1, math.ceil(total / episode_steps)), database=None, deadline=None,
                  phases=phases, suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False)
        @seed(seed_value)
        @given(st.data())
        def episode(data) -> None:
            # every example draws the same shape (hypothesis insists); past ``total`` steps it runs none
            limit = episode_steps if failing["seen"] else min(episode_steps, total - result.steps)
            drawn = {n: data.draw(layout(gpus), label=f"layout {n}") for n in NAMES}
            if limit <= 0:
                for i in range(episode_steps):
                    data.draw(step_at(i))
                return
            base = Path(tempfile.mkdtemp(prefix="e", dir=work))
            world = World.create(base, template, {"dra": DRA_ALL, **drawn})
            try:
                for i in range(episode_steps):
                    s = data.draw(step_at(i), label=f"step {i + 1}")
                    if i >= limit:
                        continue
                    world.log.clear()
                    checks = s.run(world)
                    if not failing["seen"]:
                        result.steps += 1
                        kind = type(s).__name__
                        result.kinds[kind] = result.kinds.get(kind, 0) + 1
                        if progress:
                            progress(result.steps, total)
                    bad = invariants.check_all(world, checks)
                    if bad:
                        failing["seen"] = True
                        note("what the failing step saw:\n  " + "\n  ".join(world.log))
                        raise Violation(f"after step {i + 1} ({s!r}):\n  " + "\n  ".join(bad))
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = time.monotonic() - t0
    return result
