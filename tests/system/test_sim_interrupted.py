"""Interrupted simulations are never used as if whole (issue 29, item 7): a simulated host is marked
complete only by its build's last, atomic write, a host whose build or reset was interrupted is
refused in one line naming the fix (exit 2), and ``sim mount`` ends cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdev_manager.sim.tree import IncompleteHost, SysfsTree
from tests.mdev_manager.test_fuse_mdevctl import FUSE_MISSING
from tests.support.simnodes import EXAMPLE_LAYOUT, REPO
from vgpuctl.main import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _interrupt_after_first_gpu(monkeypatch) -> None:
    populate = SysfsTree._populate

    def interrupted(self, spec, on_gpu):
        def once():
            on_gpu()
            raise KeyboardInterrupt  # Ctrl-C half-way through the build

        populate(self, spec, once)

    monkeypatch.setattr(SysfsTree, "_populate", interrupted)


REFUSED = ("error: {root}: the simulated host default is incomplete (its build or reset was interrupted); "
           "rebuild it: vgpuctl --simulate default --sim-dir {root} sim reset\n")


def test_an_interrupted_reset_leaves_a_host_every_command_refuses(tmp_path, capsys, monkeypatch):
    root = tmp_path / "host"
    sim = ["--simulate", "default", "--sim-dir", str(root)]
    assert run(capsys, *sim, "discover")[0] == 0  # a whole host first
    with monkeypatch.context() as m:
        _interrupt_after_first_gpu(m)
        code, out, err = run(capsys, *sim, "sim", "reset")
    assert code == 130 and out == ""
    assert err == (f"interrupted: simulated host default at {root} is incomplete; run vgpuctl --simulate default "
                   f"--sim-dir {root} sim reset again\n")
    for argv in (["discover"], ["discover", "-o", "json"], ["apply", "-f", str(EXAMPLE_LAYOUT)], ["slices"],
                 ["sim", "reboot"], ["sim", "unplug", "0000:13:00.0"]):
        code, out, err = run(capsys, *sim, *argv)
        assert (code, out, err) == (2, "", REFUSED.format(root=root)), argv  # never "0 GPUs"
    code, out, err = run(capsys, *sim, "sim", "reset")  # the fix it names
    assert code == 0 and err == ""
    code, out, err = run(capsys, *sim, "discover")
    assert code == 0 and out.startswith("Node ") and ": 4 GPUs" in out.splitlines()[0]


def test_an_interrupted_removal_is_refused_too(tmp_path, capsys, monkeypatch):
    """``sim reset`` removes the state file first: a removal cut short leaves no host that reads as whole."""
    root = tmp_path / "host"
    sim = ["--simulate", "default", "--sim-dir", str(root)]
    assert run(capsys, *sim, "discover")[0] == 0
    import shutil

    def cut_short(path, ignore_errors=False):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", cut_short)
        code, _, err = run(capsys, *sim, "sim", "reset")
    assert code == 130 and err.startswith("interrupted: ")
    assert run(capsys, *sim, "discover") == (2, "", REFUSED.format(root=root))


def test_the_library_marks_the_host_complete_last(tmp_path):
    from mdev_manager.sim import load_host

    spec = load_host("default")
    root = tmp_path / "h"
    calls = []

    def on_gpu():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        SysfsTree.create(root, spec, on_gpu)
    with pytest.raises(IncompleteHost):
        SysfsTree(root)
    with pytest.raises(IncompleteHost):
        SysfsTree.open_or_create(root, spec)  # never built over, never opened
    (root / ".sim/state.json").write_text('{"spec": ')  # torn
    with pytest.raises(IncompleteHost):
        SysfsTree(root)
    SysfsTree.remove(root)
    assert not root.exists()
    host = SysfsTree.open_or_create(root, spec)
    assert len(host.state["gpus"]) == 4 and "building" not in host.state


@pytest.mark.fuse
@pytest.mark.skipif(bool(FUSE_MISSING), reason="FUSE unavailable: " + "; ".join(FUSE_MISSING))
def test_sim_mount_ends_cleanly_on_ctrl_c(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, VGPUCTL_SIM_DIR=str(tmp_path / "sims"))
    p = subprocess.Popen([sys.executable, "-m", "vgpuctl", "sim", "mount", "default", str(mnt)], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (mnt / "bus/pci/devices").is_dir():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    assert p.returncode == 0, err
    assert out == "" and err.splitlines() == [f"mounting {tmp_path}/sims/default/sys on {mnt} (Ctrl-C to unmount)",
                                              f"unmounted {mnt}"]
    assert not Path(mnt / "bus").exists()  # unmounted


#: ``sim reset`` of the default preset in a subprocess that sends itself SIGNAL once the first GPU is built
_SIGNAL_AFTER_FIRST_GPU = """
import os, signal, sys
from mdev_manager.sim.tree import SysfsTree
from vgpuctl.main import main
populate = SysfsTree._populate
def signalled(self, spec, on_gpu):
    def first():
        on_gpu()
        os.kill(os.getpid(), signal.{sig})  # delivered here; the handler runs before the next bytecode
    populate(self, spec, first)
SysfsTree._populate = signalled
sys.exit(main(["--simulate", "default", "--sim-dir", sys.argv[1], "sim", "reset"]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_sim_reset_is_said_and_exits_as_the_signal(tmp_path, sig):
    """Issue #36: SIGTERM during ``sim reset`` killed it with no message, and a SIGINT landing where Python
    drops a KeyboardInterrupt (a finalizer) was once ignored. A handler remembers either, the build stops
    at the next GPU, one line says so, exit 128 + the signal's number."""
    root = tmp_path / "host"
    p = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_FIRST_GPU.format(sig=sig), str(root)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + getattr(signal, sig), (p.returncode, p.stderr)
    assert p.stdout == "" and p.stderr == (f"{sig}: interrupted: simulated host default at {root} is incomplete; "
                                           f"run vgpuctl --simulate default --sim-dir {root} sim reset again\n")
