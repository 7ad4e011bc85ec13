"""The simulators' children (kernel process, FUSE daemon) fail their start-up with one clear message."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from mdev_manager.sim import child
from mdev_manager.sim.child import child_env, reap, wait_started


def _child(code: str, **kw) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, env=child_env(), **kw)


def test_a_child_that_exits_before_it_is_ready_fails_the_wait_with_its_status_and_output():
    proc = _child("import mdev_manager.sim.child; raise SystemExit(3)")  # the checkout is importable
    with pytest.raises(RuntimeError) as err:
        wait_started(proc, lambda: False, 60, "the test child", "listen on /x", lambda: "its last words")
    assert str(err.value) == "the test child exited with 3 before it could listen on /x:\nits last words"


def test_a_child_that_never_gets_ready_fails_the_wait_at_the_deadline_and_keeps_running():
    proc = _child("import time; time.sleep(3600)")
    try:
        with pytest.raises(RuntimeError, match=r"^the test child did not mount /m within 0s$"):
            wait_started(proc, lambda: False, 0, "the test child", "mount /m")
        assert proc.poll() is None  # the caller, not the wait, stops it
    finally:
        proc.kill()
        proc.wait()


def test_the_wait_returns_once_the_child_is_ready():
    proc = _child("import time; time.sleep(3600)")
    polls = iter([False, False, True])
    try:
        wait_started(proc, lambda: next(polls), 60, "the test child", "start")
        assert next(polls, None) is None  # it asked until ready, and no more
    finally:
        proc.kill()
        proc.wait()


def test_reap_waits_for_a_child_that_stops_on_its_own():
    proc = _child("raise SystemExit(0)")
    reap(proc, 60)
    assert proc.returncode == 0


def test_reap_terminates_a_child_that_does_not_stop_and_kills_one_that_ignores_sigterm(monkeypatch):
    proc = _child("import time; time.sleep(3600)")
    reap(proc, 0)
    assert proc.returncode == -signal.SIGTERM
    stubborn = _child("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('ignoring', flush=True)\n"
                      "time.sleep(3600)", stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ignoring\n"  # SIGTERM ignored now
    monkeypatch.setattr(child, "TERM_GRACE", 0)
    reap(stubborn, 0)
    stubborn.stdout.close()
    assert stubborn.returncode == -signal.SIGKILL
