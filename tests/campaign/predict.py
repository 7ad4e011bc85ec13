"""``python -m tests.campaign.predict --seed N --steps M``: where a seed's run reaches what mutation (h)
of :mod:`.mutations` (libvirt holders ignored) breaks, without running the mutation.

After each step of the run a dry run of the selected layout (``reconcile(..., dry_run=True)``) looks
for a Blocked entry held only by libvirt domains: there a node that does not read libvirt removes a
device a domain names, the violation (h) makes. The first such step is where (h) is caught, give or
take the steps the mutated run takes differently before it. The dry run spends none of the seeded
randomness (UUIDs, ``random``), so the run it watches is the run CI makes. Used to choose CI's seeds
(tests/system/test_campaign.py) when a change to the steps' draws loses (h) on them.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.campaign.world import World


@dataclass
class Prediction:
    seed: int
    line: str = ""
    failed_at: int | None = None  # the run's own first violation (then what follows means little)
    failure: str | None = None
    libvirt_only: list[tuple[int, str]] = field(default_factory=list)  # (step, device) where (h) removes
    covered: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # dry runs that failed (a layout the node refuses)

    def text(self) -> str:
        at = [s for s, _ in self.libvirt_only]
        where = f"first at step {at[0]} ({self.libvirt_only[0][1]}), {len(at)} steps in all" if at else "never"
        return (f"seed {self.seed}: {self.line}" + (f" (first after step {self.failed_at})" if self.failed_at else "")
                + f"; a block held only by libvirt domains: {where}; covered: {self.covered or 'nothing'}")


def libvirt_only_block(world: World) -> str | None:
    """The device of the first Blocked entry of the selected layout's dry run held only by libvirt domains."""
    from mdev_manager.config import load_config
    from mdev_manager.reconcile import reconcile

    out = reconcile(world.env, world.node.io, load_config(world.base / "layouts.yaml", world.selected), dry_run=True,
                    node=world.node.node)
    return next((b.device for b in out.blocked if b.held_by and all(h.startswith("libvirt domain") for h in b.held_by)),
                None)


def predict(seed: int, steps: int, episode_steps: int) -> Prediction:
    from tests.campaign.run import run

    p = Prediction(seed)

    def observe(world: World, n: int) -> None:
        saved = uuid.uuid4, getattr(uuid.uuid4, "rng", random.Random()).getstate(), random.getstate()
        try:
            if (device := libvirt_only_block(world)) is not None:
                p.libvirt_only.append((n, device))
        except Exception as exc:  # noqa: BLE001 - said, the run goes on
            p.errors.append(f"step {n}: {type(exc).__name__}: {str(exc)[:200]}")
        finally:  # the run's seeded UUIDs and random draws as they were: the run is CI's
            uuid.uuid4 = saved[0]  # type: ignore[misc]
            if hasattr(uuid.uuid4, "rng"):
                uuid.uuid4.rng.setstate(saved[1])
            random.setstate(saved[2])

    result = run(steps, seed, episode_steps=episode_steps, shrink=False, observe=observe)
    p.line, p.failed_at, p.covered, p.failure = result.line, result.failed_at, result.covered, result.failure
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.campaign.predict", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, action="append", required=True, help="hypothesis seed (repeat for several)")
    ap.add_argument("--steps", type=int, default=100, help="steps to run (CI's: 100)")
    ap.add_argument("--episode-steps", type=int, default=25, help="steps per fresh node (CI's: 25)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    from tests.campaign.__main__ import missing_test_extra

    if missing := missing_test_extra():
        print(missing, file=sys.stderr)
        return 2
    code = 0
    for s in args.seed:
        p = predict(s, args.steps, args.episode_steps)
        print(p.text(), flush=True)
        for e in p.errors[:3]:
            print(f"  dry run failed after {e}")
        if p.failure:
            print("  " + "\n  ".join(p.failure.splitlines()[:40]))
        code |= p.failed_at is not None
    return code


if __name__ == "__main__":
    sys.exit(main())
