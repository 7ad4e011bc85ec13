"""The node lock's shared mode (#37.2): the agent's prepares hold it side by side, the file stays
locked while any does (a hand-run ``vgpuctl apply`` is kept out), and an exclusive holder of the
process (the agent's reconcile) waits for every shared one, and they for it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mdev_manager.host.env import HostEnv
from mdev_manager.host.lock import NodeLock, NodeLockBusy


@pytest.fixture
def env(tmp_path: Path) -> HostEnv:
    return HostEnv(state_root=tmp_path / "state")


def in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_shared_holders_run_together_and_keep_another_process_out(env):
    agent = NodeLock(env, "vgpuctl serve")
    first_in, release = threading.Event(), threading.Event()

    def prepare_a():
        with agent.hold(shared=True):
            first_in.set()
            release.wait(10)

    t = in_thread(prepare_a)
    assert first_in.wait(10)
    entered = threading.Event()

    def prepare_b():
        with agent.hold(shared=True):
            entered.set()
            release.wait(10)

    t2 = in_thread(prepare_b)
    assert entered.wait(10), "a second shared holder waited for the first"
    # a hand-run vgpuctl apply opens the file itself: its flock is refused while a prepare runs
    with pytest.raises(NodeLockBusy, match="vgpuctl serve"):
        with NodeLock(env, "vgpuctl apply").hold(wait=False):
            pass
    # the agent's own exclusive holder (reconcile) does not enter beside them either
    with pytest.raises(NodeLockBusy):
        with agent.hold(wait=False):
            pass
    release.set()
    t.join(10)
    t2.join(10)


def test_an_exclusive_holder_waits_for_the_shared_ones_and_they_for_it(env):
    agent = NodeLock(env, "vgpuctl serve")
    order: list[str] = []
    shared_in, release_shared = threading.Event(), threading.Event()
    excl_in, release_excl = threading.Event(), threading.Event()

    def shared():
        with agent.hold(shared=True):
            order.append("shared")
            shared_in.set()
            release_shared.wait(10)
            order.append("shared leaving")

    def exclusive():
        with agent.hold():
            order.append("exclusive")
            excl_in.set()
            release_excl.wait(10)

    t1 = in_thread(shared)
    assert shared_in.wait(10)
    t2 = in_thread(exclusive)
    assert not excl_in.is_set()
    release_shared.set()
    assert excl_in.wait(10)
    assert order == ["shared", "shared leaving", "exclusive"]
    with pytest.raises(NodeLockBusy):  # a prepare now finds the reconcile in
        with agent.hold(wait=False, shared=True):
            pass
    release_excl.set()
    t1.join(10)
    t2.join(10)
    with NodeLock(env, "vgpuctl apply").hold(wait=False):  # all left: the file is free
        pass


def test_a_shared_holder_may_not_take_it_exclusively(env):
    agent = NodeLock(env)
    with agent.hold(shared=True):
        with agent.hold(shared=True):  # nested shared: fine
            pass
        with pytest.raises(RuntimeError, match="wait for itself"):
            with agent.hold():
                pass
    with agent.hold():  # an exclusive holder may take it shared inside (one more re-entry)
        with agent.hold(shared=True):
            pass
