"""The suite runs against its own state, never the user's (issue #36, point 4): ``vgpuctl --simulate``
in a test's subprocess builds its hosts in the tests' own home (tests/support/sandbox.py), and each
test in a directory of its own (tests/conftest.py), so ``~/.local/state`` is left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import sandbox
from tests.support.simnodes import EXAMPLE_LAYOUT

REPO = Path(__file__).resolve().parents[2]


def vgpuctl(*argv: str) -> subprocess.CompletedProcess:
    """As a test runs it: the test process's own environment, inherited."""
    return subprocess.run([sys.executable, "-m", "vgpuctl", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_the_readme_apply_in_a_test_leaves_the_users_state_untouched():
    users = sandbox.real_home() / sandbox.STATE
    before = sandbox.snapshot(users)
    p = vgpuctl("--simulate", "apply", "-f", str(EXAMPLE_LAYOUT))  # the README's own first apply
    assert p.returncode == 0, p.stderr
    own = Path(os.environ["VGPUCTL_SIM_DIR"])
    assert (own / "default").is_dir()  # the host this test changed is in its own directory
    assert not own.is_relative_to(sandbox.real_home())
    assert sandbox.snapshot(users) == before


def test_a_test_reads_no_home_and_no_cluster_of_the_users():
    assert Path.home() != sandbox.real_home()
    assert not Path(os.environ["XDG_STATE_HOME"]).is_relative_to(sandbox.real_home())
    assert "KUBECONFIG" not in os.environ and "KUBERNETES_SERVICE_HOST" not in os.environ


def test_each_test_starts_with_no_simulated_host():
    """A test's ``VGPUCTL_SIM_DIR`` is its own and empty: no layout another test applied is there."""
    mine = Path(os.environ["VGPUCTL_SIM_DIR"])
    assert mine.is_dir() and not any(mine.iterdir())
    assert mine != Path(os.environ[sandbox.ROOT]) / "sim"  # not even the session's shared one
