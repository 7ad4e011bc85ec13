"""Seeded interleavings of real threads: the campaign's concurrency steps replay from their seed.

Actors run in real threads — the agent's resync and binding rounds, the kubelet's gRPC calls (served
on the plugin's own gRPC worker threads), an admin's ``vgpuctl`` command on the main thread — but
one at a time. An actor runs until its next *scheduling point*: every call of a campaign transport
(:class:`tests.campaign.faults.FaultIO`, reads and writes alike) and every take or release of the
locks the campaign hands the agent. There a seeded RNG decides whether another ready actor runs
instead. An actor that would block says so first and is parked until what it waits for is free:

* the agent's in-process locks (the daemon's, the driver's, the plugin's, the node lock's thread
  lock) are :class:`SchedLock` / :class:`SchedRLock`, swapped onto the agent's objects like a
  transport (their owner is known, so is whether they are free);
* the node lock's ``flock`` between "processes" (the agent's :class:`SchedNodeLock`, ``vgpuctl
  apply``'s own :class:`~mdev_manager.host.lock.NodeLock`): the agent's waits before its real
  ``flock``; ``vgpuctl`` says it waits (``waiting for the node lock held by ...`` on stderr, which
  the campaign reads, :class:`Stderr`) right before it blocks. Free is probed with a fresh descriptor.

So which actor runs when is a function of the seed and of the node's state alone, and a failing
seed replays. A gRPC call's server thread is adopted as the calling actor at its first point (one
call in flight at a time: the caller holds the turn while it waits). No actor ready and some
blocked on what another blocked actor holds is a deadlock: every actor is then unwound with
:class:`Aborted` and the step reports it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdev_manager.host.lock import NodeLock

WAIT_LIMIT = 300.0  # seconds an actor may wait for its turn before the harness calls it a hang


class Aborted(BaseException):
    """The step was abandoned (a deadlock, a hang): an actor unwinds with this."""


class HarnessError(RuntimeError):
    """The scheduler itself went wrong (a hang it cannot explain): not a finding about the code."""


@dataclass(eq=False)
class Actor:
    name: str
    job: Callable[[], Any]
    main: bool = False  # runs on the calling thread (a CLI command: signal handlers need the main thread)
    state: str = "new"  # new | ready | running | blocked | done
    waits: Any = None  # what a blocked actor waits for (a SchedLock, or a flock path)
    result: Any = None
    error: BaseException | None = None
    rpc: bool = False  # in a call whose server thread will run as this actor
    threads: set[int] = field(default_factory=set)
    points: int = 0

    def __repr__(self) -> str:
        return f"<{self.name} {self.state}>"


class Scheduler:
    """One per simulated node; inactive (every hook a no-op) outside :meth:`run`."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.active = False
        self.actors: list[Actor] = []
        self.turn: Actor | None = None
        self.by_thread: dict[int, Actor] = {}
        self.rng = random.Random(0)
        self.switch = 0.0
        self.deadlock: str | None = None
        self.trace: list[str] = []  # the switches, for a failure report and for replay checks

    # ------------------------------------------------------------------ running a step
    def run(self, actors: list[Actor], *, seed: int, switch: float) -> list[Actor]:
        """Run ``actors`` to completion, interleaved by ``seed``: at each point another ready actor
        runs with probability ``switch``. At most one actor is ``main`` (run on this thread)."""
        assert not self.active, "one concurrent step at a time"
        self.rng, self.switch, self.deadlock = random.Random(seed), switch, None
        self.actors, self.trace, self.by_thread = list(actors), [], {}
        threads = []
        with self.cv:
            self.active = True
            for a in self.actors:
                a.state = "ready"
            for a in self.actors:
                if not a.main:
                    t = threading.Thread(target=self._thread, args=(a,), name=f"campaign-{a.name}", daemon=True)
                    threads.append(t)
            self.turn = self.rng.choice(self.actors)
            self.trace.append(f"start {self.turn.name}")
        try:
            for t in threads:
                t.start()
            main = next((a for a in self.actors if a.main), None)
            if main is not None:
                self._thread(main)
            with self.cv:
                while not all(a.state == "done" for a in self.actors):
                    if not self.cv.wait(WAIT_LIMIT):
                        raise HarnessError(f"actors did not finish: {self.actors}\n{_stacks()}")
            for t in threads:
                t.join(WAIT_LIMIT)
        finally:
            with self.cv:
                self.active = False
                self.turn = None
                self.by_thread = {}
                self.cv.notify_all()
        return self.actors

    def _thread(self, actor: Actor) -> None:
        me = threading.get_ident()
        with self.cv:
            self.by_thread[me] = actor
            actor.threads.add(me)
            self._wait_turn(actor)
            actor.state = "running"
        try:
            actor.result = actor.job()
        except BaseException as exc:  # noqa: BLE001 - the step judges what each actor ended with
            actor.error = exc
        finally:
            with self.cv:
                actor.state = "done"
                self.trace.append(f"{actor.name} done" + (f" ({type(actor.error).__name__})" if actor.error else ""))
                self.by_thread.pop(me, None)
                if self.turn is actor:
                    self._pass(actor)
                self.cv.notify_all()

    # ------------------------------------------------------------------ hooks (called by the code under test)
    def current(self) -> Actor | None:
        """The actor the calling thread runs (adopting a gRPC server thread for the actor in a call)."""
        if not self.active:
            return None
        me = threading.get_ident()
        actor = self.by_thread.get(me)
        if actor is not None:
            return actor
        with self.cv:
            caller = self.turn
            if caller is not None and caller.rpc:
                self.by_thread[me] = caller
                caller.threads.add(me)
                return caller
        return None

    def point(self) -> None:
        """A scheduling point: maybe let another ready actor run first."""
        actor = self.current()
        if actor is None:
            return
        with self.cv:
            actor.points += 1
            self._check_abort(actor)
            if self.turn is not actor:  # woken without the turn (cannot happen; be safe): wait for it
                self._wait_turn(actor)
            if self.switch and self.rng.random() < self.switch:
                ready = [a for a in self.actors if a.state in ("ready", "running") or self._free(a)]
                nxt = self.rng.choice(ready)
                if nxt is not actor:
                    actor.state = "ready"
                    self._give(nxt, f"{actor.name} -> {nxt.name}")
                    self._wait_turn(actor)
                    actor.state = "running"
            self._check_abort(actor)

    def block(self, what: Any) -> None:
        """The calling actor would block on ``what`` (a SchedLock, or a flock's path): run others
        until it is free. A no-op outside a step and for threads that are no actor."""
        actor = self.current()
        if actor is None:
            return
        with self.cv:
            actor.state, actor.waits = "blocked", what
            self.trace.append(f"{actor.name} waits for {_what(what)}")
            self._pass(actor)
            self._wait_turn(actor)
            actor.state, actor.waits = "running", None
            self._check_abort(actor)

    def begin_rpc(self) -> None:
        actor = self.current()
        if actor is not None:
            actor.rpc = True

    def end_rpc(self) -> None:
        """The caller has its answer: the server threads it lent its turn to are no longer it."""
        me = threading.get_ident()
        actor = self.by_thread.get(me)
        if actor is None:
            return
        with self.cv:
            actor.rpc = False
            for t in list(actor.threads):
                if t != me and self.by_thread.get(t) is actor:
                    del self.by_thread[t]
            actor.threads = {me}
            self._wait_turn(actor)  # a server thread may have handed the turn on; ours again before going on

    # ------------------------------------------------------------------ internals (self.cv held)
    def _free(self, actor: Actor) -> bool:
        """A blocked actor whose resource is free now (probed only while every actor is parked)."""
        if actor.state != "blocked":
            return False
        what = actor.waits
        if isinstance(what, SchedLock):
            return what.free_for(actor)
        if isinstance(what, Path):
            return flock_free(what)
        return False

    def _give(self, nxt: Actor, why: str) -> None:
        self.trace.append(why)
        if nxt.state == "blocked":
            nxt.state = "ready"
        self.turn = nxt
        self.cv.notify_all()

    def _pass(self, actor: Actor) -> None:
        """``actor`` cannot go on (blocked or done): another runs, or a deadlock is declared."""
        ready = [a for a in self.actors if a is not actor and (a.state == "ready" or self._free(a))]
        if ready:
            nxt = self.rng.choice(ready)
            self._give(nxt, f"{actor.name} -> {nxt.name}")
            return
        waiting = [a for a in self.actors if a.state == "blocked"]
        if not waiting:
            self.turn = None
            self.cv.notify_all()
            return
        if self.deadlock is None:
            self.deadlock = "deadlock: " + "; ".join(f"{a.name} waits for {_what(a.waits)}" for a in waiting)
            self.trace.append(self.deadlock)
        self._give(waiting[0], f"abort {waiting[0].name}")

    def _wait_turn(self, actor: Actor) -> None:
        while self.turn is not actor:
            if not self.cv.wait(WAIT_LIMIT):
                raise HarnessError(f"{actor.name} waited {WAIT_LIMIT:.0f} s for its turn ({self.turn} has it)\n"
                                   f"{_stacks()}")

    def _check_abort(self, actor: Actor) -> None:
        if self.deadlock is not None and actor.state != "done":
            raise Aborted(self.deadlock)


def _what(what: Any) -> str:
    if isinstance(what, SchedLock):
        return what.name
    return f"flock {what}"


def _stacks() -> str:
    frames = sys._current_frames()
    out = []
    for t in threading.enumerate():
        f = frames.get(t.ident)
        if f is not None and t.name.startswith(("campaign-", "MainThread", "dra-")):
            out.append(f"--- {t.name}\n" + "".join(traceback.format_stack(f)[-8:]))
    return "\n".join(out)


# --------------------------------------------------------------------------- locks the scheduler sees


class SchedLock:
    """A ``threading.Lock`` whose waits are scheduling decisions (see the module docstring)."""

    reentrant = False

    def __init__(self, sched: Scheduler, name: str):
        self.sched = sched
        self.name = name
        self._inner = threading.RLock() if self.reentrant else threading.Lock()
        self._owner: int | None = None  # thread ident
        self._depth = 0

    def free_for(self, actor: Actor) -> bool:
        return self._owner is None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        while True:
            if self._inner.acquire(False):
                self._owner = threading.get_ident()
                self._depth += 1
                return True
            if not blocking:
                return False
            if self.sched.current() is None:  # not an actor (no step running): a plain wait
                got = self._inner.acquire(True, timeout)
                if got:
                    self._owner = threading.get_ident()
                    self._depth += 1
                return got
            self.sched.block(self)

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._inner.release()
        self.sched.point()

    def locked(self) -> bool:
        return self._owner is not None

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SchedRLock(SchedLock):
    reentrant = True


def flock_free(path: Path) -> bool:
    """Whether no open file description holds ``path``'s flock (probed with a fresh one)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


class SchedNodeLock(NodeLock):
    """The agent's node lock with its waits made visible: its thread lock is a :class:`SchedRLock`,
    and before its blocking ``flock`` it waits (as a scheduling decision) until no other open file
    holds it. The locking itself is :class:`NodeLock`'s, unchanged."""

    def __init__(self, env, command: str, sched: Scheduler):
        super().__init__(env, command)
        self._thread_lock = SchedRLock(sched, f"{command}: node lock")
        self._sched = sched

    def _take(self, wait, on_wait, command):
        if wait and self._sched.current() is not None:
            os.makedirs(self.path.parent, exist_ok=True)
            while not flock_free(self.path):
                self._sched.block(self.path)
        return super()._take(wait, on_wait, command)


class Stderr:
    """The campaign's ``sys.stderr`` while a step runs ``vgpuctl``: keeps the text for the report,
    and turns ``vgpuctl``'s "waiting for the node lock" (said right before its blocking ``flock``)
    into a scheduling decision: the actor is parked until the lock is free."""

    def __init__(self, sched: Scheduler, lock_path: Path):
        self.sched = sched
        self.lock_path = lock_path
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        if "waiting for the node lock held by" in text and self.sched.current() is not None:
            while not flock_free(self.lock_path):
                self.sched.block(self.lock_path)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def getvalue(self) -> str:
        return "".join(self.parts)
