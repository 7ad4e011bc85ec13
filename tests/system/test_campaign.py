"""The node-safety fault campaign, bounded (issue 12): three fixed seeds, a few minutes in all.

Each seed runs random sequences of applies, claims, VMs, kills, reboots, corrupted checkpoints,
kernel and API faults against one simulated node with the agent running, and checks the
contract's invariants after every step (tests/campaign/invariants.py). A longer run:
``python -m tests.campaign --steps 2000 --seed 1 --seed 2 --seed 3``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.campaign.run import run
from tests.support.tmp import short_root

STEPS = int(os.environ.get("VGPUCTL_CAMPAIGN_STEPS", "50"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_campaign(seed, caplog):
    caplog.set_level(logging.CRITICAL)  # the agent logs every fault it survives; the invariants judge
    result = run(STEPS, seed, episode_steps=25, workdir=Path(short_root()))  # tmpfs where there is one
    assert result.failure is None, result.failure
    assert result.line == f"{STEPS} steps, 0 invariant violations"
    # the run did what it says: every kind of step ran at least once over the three seeds' mix
    assert sum(result.kinds.values()) == STEPS and len(result.kinds) >= 8, result.kinds
