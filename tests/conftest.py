"""Shared fixtures: simulated hosts (sysfs tree + kernel write model) under ``tmp_path``.

``sim`` is the default preset; ``make_sim(preset_or_spec)`` builds any other one, each in
its own directory. The builders themselves live in :mod:`tests.support.simnodes`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mdev_manager.sim import HostSpec
from tests.support.simnodes import Holder, Sim, build_sim


@pytest.fixture
def make_sim(tmp_path):
    """Factory: ``make_sim("a100-node")`` or ``make_sim(HostSpec(...))``, each in its own directory."""
    made = []

    def make(preset: str | HostSpec = "default", **env_changes) -> Sim:
        name = preset if isinstance(preset, str) else f"spec{len(made)}"
        root = tmp_path / f"host-{len(made)}-{name}"
        sim = build_sim(root, preset, **env_changes)
        made.append(sim)
        return sim

    return make


@pytest.fixture
def sim(make_sim) -> Sim:
    """The default preset: 2 x T4 (mdev on the PF), A100 40GB (mdev on VFs), L40S (vendor VFIO)."""
    return make_sim("default")


@pytest.fixture
def hold(tmp_path):
    """``hold(path, ...)`` starts a child process holding the paths open; killed at teardown."""
    holders: list[Holder] = []

    def start(*paths: Path) -> Holder:
        for p in paths:
            assert Path(p).exists(), f"{p} does not exist"
        h = Holder(list(paths), tmp_path)
        holders.append(h)
        return h

    yield start
    for h in holders:
        h.release()
