"""The tests' own home: the suite never reads or changes the user's simulated hosts or cluster.

``vgpuctl --simulate PRESET`` keeps its host under ``$VGPUCTL_SIM_DIR`` or ``~/.local/state`` and
reads a cluster from ``$KUBECONFIG`` or ``~/.kube/config``: run with the caller's environment, a
test would find the layout the user applied (issue #36, point 4) or the user's cluster. The
controller points ``HOME``, ``XDG_STATE_HOME`` and ``VGPUCTL_SIM_DIR`` into a temporary directory
and drops ``$KUBECONFIG`` before xdist's workers and any subprocess start, so they inherit it;
``tests/conftest.py`` then gives each test a simulation directory of its own.
"""

from __future__ import annotations

import os
import shutil
import site
import tempfile
from pathlib import Path

#: set by the controller: the user's real home (the tests' own is in ``HOME``)
REAL_HOME = "VGPUCTL_TESTS_REAL_HOME"
#: set by the controller: the directory holding the tests' home (removed at the session's end)
ROOT = "VGPUCTL_TESTS_SANDBOX"
#: where the user's own simulated hosts live
STATE = Path(".local/state/vgpuctl")


def enter() -> bool:
    """Point this process's (and its children's) home and state at a fresh temporary directory.
    False where a parent already did (an xdist worker): the environment is inherited as it is."""
    if os.environ.get(ROOT):
        return False
    root = Path(tempfile.mkdtemp(prefix="vgpuctl-tests-home-"))
    home = root / "home"
    (home / ".local/state").mkdir(parents=True)
    real = Path.home()
    # what the tools the tests run keep under the home stays theirs: Python's per-user packages (a
    # `pip install --user` of the test extra), pip's cache and configuration (an index mirror), found
    # through their XDG variables; vgpuctl reads neither
    os.environ.setdefault("PYTHONUSERBASE", site.getuserbase())
    os.environ.setdefault("XDG_CACHE_HOME", str(real / ".cache"))
    os.environ.setdefault("XDG_CONFIG_HOME", str(real / ".config"))
    os.environ[REAL_HOME] = str(real)
    os.environ[ROOT] = str(root)
    os.environ["HOME"] = str(home)
    os.environ["XDG_STATE_HOME"] = str(home / ".local/state")
    os.environ["VGPUCTL_SIM_DIR"] = str(root / "sim")
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        os.environ.pop(name, None)
    return True


def leave() -> None:
    """Remove the tests' home (the controller's, at the session's end)."""
    root = os.environ.get(ROOT)
    if root:
        shutil.rmtree(root, ignore_errors=True)


def real_home() -> Path:
    """The user's home, as it was before :func:`enter`."""
    return Path(os.environ.get(REAL_HOME) or Path.home())


def snapshot(top: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``top`` with its modification time and size: what a change would alter."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[p] = (st.st_mtime_ns, st.st_size)
    return out
