"""The simulated kernel orders an mdev's create per GPU, as the kernel does, not node-wide.

mdev_core.c holds its one global mutex only for the UUID's duplicate check; the create itself runs
under its parent's lock, so a create on one GPU never waits for a create on another (a boot storm
prepares on every GPU at once). Whole-host writes still wait for the GPU writes in progress. And the
model can run in a process of its own (:mod:`mdev_manager.sim.kproc`), answering as it does in-process.
Each test holds one GPU's create in the middle (its refresh waits on an event) and looks at what the
others can do meanwhile; no timings.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mdev_manager.sim.kernel import SimHost
from mdev_manager.sim.kproc import kernel_process
from tests.mdev_manager.test_sim_kernel import U1, U2, gpu_of, link_base, type_dir

WAIT = 60  # a safety net for a deadlock, never reached when the code is right


class Held:
    """The create on ``pf`` stops in its refresh (after its checks and its claim) until released."""

    def __init__(self, sim, pf: str, monkeypatch):
        self.entered, self.release = threading.Event(), threading.Event()
        inner = sim.host._refresh

        def refresh(gpu: dict) -> None:
            if gpu["pf"] == pf and not self.release.is_set():
                self.entered.set()
                assert self.release.wait(WAIT)
            inner(gpu)

        monkeypatch.setattr(sim.host, "_refresh", refresh)
        self.errors: list[BaseException] = []
        path = type_dir(sim, pf, "T4", "T4-2Q") / "create"
        self.thread = threading.Thread(target=self._run, args=(sim, path), daemon=True)
        self.thread.start()
        assert self.entered.wait(WAIT)

    def _run(self, sim, path: Path) -> None:
        try:
            sim.io.write(path, U1)
        except BaseException as exc:
            self.errors.append(exc)

    def finish(self) -> None:
        self.release.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive() and not self.errors, self.errors


def in_thread(fn) -> tuple[threading.Event, list]:
    done, out = threading.Event(), []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_a_create_on_one_gpu_does_not_wait_for_a_create_on_another(sim, monkeypatch):
    a, b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    held = Held(sim, a, monkeypatch)
    done, out = in_thread(lambda: sim.io.write(type_dir(sim, b, "T4", "T4-2Q") / "create", U2))
    assert done.wait(WAIT) and out == [None], out  # done while the create on the other GPU is in progress
    assert held.thread.is_alive() and (sim.env.pci(b) / U2).is_dir()
    held.finish()
    groups = {link_base(sim.env.pci(a) / U1 / "iommu_group"), link_base(sim.env.pci(b) / U2 / "iommu_group")}
    assert len(groups) == 2  # the host's group numbers are shared: taken one at a time


def test_the_same_uuid_on_two_gpus_at_once_is_refused_while_the_first_create_runs(sim, monkeypatch):
    a, b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    held = Held(sim, a, monkeypatch)
    done, out = in_thread(lambda: sim.io.write(type_dir(sim, b, "T4", "T4-2Q") / "create", U1))
    assert done.wait(WAIT) and isinstance(out[0], OSError) and out[0].errno == errno.EEXIST, out
    held.finish()
    assert (sim.env.pci(a) / U1).is_dir() and not (sim.env.pci(b) / U1).exists()
    # the claim is let go with the create: the UUID is refused for existing now, and free once removed
    with pytest.raises(OSError) as exc:
        sim.io.write(type_dir(sim, b, "T4", "T4-2Q") / "create", U1)
    assert exc.value.errno == errno.EEXIST
    sim.io.write(sim.env.pci(a) / U1 / "remove", "1")
    sim.io.write(type_dir(sim, b, "T4", "T4-2Q") / "create", U1)
    assert (sim.env.pci(b) / U1).is_dir()


def test_a_whole_host_write_waits_for_a_gpu_write_in_progress(sim, monkeypatch):
    held = Held(sim, gpu_of(sim, "T4", 0), monkeypatch)
    with open(sim.root / ".sim/lock", "a") as lf:  # what a whole-host write (binding, SR-IOV) takes
        with pytest.raises(BlockingIOError):
            fcntl.flock(lf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.finish()
        fcntl.flock(lf, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the create is done
        fcntl.flock(lf, fcntl.LOCK_UN)


def test_creates_on_two_gpus_at_once_keep_every_gpu_and_every_number(sim):
    gpus = [gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)]
    before = json.loads((sim.root / ".sim/state.json").read_text())
    jobs = [(pf, str(uuid.uuid4())) for _ in range(4) for pf in gpus]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda j: sim.io.write(type_dir(sim, j[0], "T4", "T4-2Q") / "create", j[1]), jobs))
    groups = {link_base(sim.env.pci(pf) / u / "iommu_group") for pf, u in jobs}
    assert len(groups) == len(jobs)
    after = json.loads((sim.root / ".sim/state.json").read_text())
    assert after["next_group"] == before["next_group"] + len(jobs)
    assert sorted(os.listdir(sim.env.mdev_devices)) == sorted(u for _, u in jobs)
    for pf in gpus:  # each GPU's capacity saw its own 4 creates: 8 - 4 T4-2Q left
        assert (type_dir(sim, pf, "T4", "T4-2Q") / "available_instances").read_text() == "4\n"
    assert not os.listdir(sim.root / ".sim/creating")  # every claim let go


def test_the_kernel_in_its_own_process_answers_as_the_model_in_process(sim, monkeypatch):
    t4 = gpu_of(sim, "T4")
    create = type_dir(sim, t4, "T4", "T4-2Q") / "create"
    with pytest.raises(OSError) as bad:
        sim.io.write(create, "not-a-uuid")
    with kernel_process(sim.host) as io:
        def not_here(*_args, **_kw):
            raise AssertionError("a kernel write ran in the caller's process")

        monkeypatch.setattr(sim.host, "write", not_here)
        io.write(create, U1 + "\n")
        assert (sim.env.pci(t4) / U1).is_dir()
        with pytest.raises(OSError) as again:
            io.write(create, U1)
        assert again.value.errno == errno.EEXIST
        with pytest.raises(OSError) as bad2:
            io.write(create, "not-a-uuid")
        assert (bad2.value.errno, bad2.value.strerror) == (bad.value.errno, bad.value.strerror)
        assert io.kernel_cpu() > 0
        outside = sim.root / "etc/mdevctl.d/note"
        outside.touch()
        io.write(outside, "plain file")  # not sysfs: an ordinary file write, here
        assert outside.read_text() == "plain file"


def test_the_kernel_process_remembers_capacity_files_but_rewrites_one_changed_behind_its_back(sim, monkeypatch):
    """The kernel's own process skips re-reading the capacity files it wrote (``remember_attrs``); a file
    another writer changed since (another process's model, a rebind) is still set right."""
    monkeypatch.setattr(SimHost, "remember_attrs", True)
    host = SimHost(sim.root)
    t4 = gpu_of(sim, "T4")
    two, four = type_dir(sim, t4, "T4", "T4-2Q"), type_dir(sim, t4, "T4", "T4-4Q")
    host.write(two / "create", U1)
    assert (four / "available_instances").read_text() == "0\n"  # equal-size: another size no longer fits
    (four / "available_instances").write_text("3\n")  # behind its back
    host.write(two / "create", U2)
    assert (four / "available_instances").read_text() == "0\n"
    assert (two / "available_instances").read_text() == "6\n"


def test_a_whole_host_write_waiting_for_a_gpu_write_is_not_overtaken_by_later_ones(sim, monkeypatch):
    """A flock grants a shared request while an exclusive one waits: without a turnstile, a storm of GPU
    writes would keep a whole-host write (or NVML's view of the host) waiting for the whole storm.

    The order is the order in which the two writes take the node lock, recorded as each flock returns
    (inside the critical section): recorded after each write returned, the whole-host write's record could
    come second although it ran first."""
    a, b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    held = Held(sim, a, monkeypatch)
    waiting, order = threading.Event(), []
    real_flock = fcntl.flock
    who = {"whole-host": "whole host", "gpu-write": "gpu"}

    def flock(f, mode):
        name = threading.current_thread().name
        node_lock = getattr(f, "name", None) is not None and os.path.basename(f.name) == "lock"
        if mode == fcntl.LOCK_EX and name == "whole-host" and node_lock:
            waiting.set()  # holding the turnstile, about to wait for the GPU write in flight
        got = real_flock(f, mode)
        if node_lock and mode in (fcntl.LOCK_EX, fcntl.LOCK_SH) and name in who:
            order.append(who[name])  # the node lock is held: the other write cannot take it meanwhile
        return got

    monkeypatch.setattr(fcntl, "flock", flock)
    t = threading.Thread(target=sim.host.upgrade_driver, args=("999.1",), name="whole-host", daemon=True)
    t.start()
    assert waiting.wait(WAIT)
    out: list = []

    def gpu_write() -> None:
        try:
            out.append(sim.io.write(type_dir(sim, b, "T4", "T4-2Q") / "create", U2))
        except BaseException as exc:
            out.append(exc)

    g = threading.Thread(target=gpu_write, name="gpu-write", daemon=True)
    g.start()
    held.finish()
    t.join(WAIT)
    g.join(WAIT)
    assert not t.is_alive() and not g.is_alive() and len(out) == 1 and not isinstance(out[0], BaseException), out
    assert order == ["whole host", "gpu"]


def test_an_nvml_query_waits_for_a_write_to_its_gpu_only(sim, monkeypatch):
    """A real NVML answers a query on one GPU while a vGPU is made on another: the simulated NVML reads
    one GPU under that GPU's lock and the node lock, both shared. It never sees a write to its own GPU
    half done: it waits for it (the order in which the write leaves and the query takes the GPU's lock
    is recorded inside both critical sections)."""
    a, b = gpu_of(sim, "T4", 0), gpu_of(sim, "T4", 1)
    order: list[str] = []
    inner = sim.host._refresh

    def refresh(gpu: dict) -> None:  # inside the held create's critical section, once released
        inner(gpu)
        if gpu["pf"] == a:
            order.append("write a")

    monkeypatch.setattr(sim.host, "_refresh", refresh)
    held = Held(sim, a, monkeypatch)  # its hold wraps the refresh above
    nvml = sim.io.nvml()
    done, out = in_thread(lambda: nvml.retired_pages_pending(b))
    assert done.wait(WAIT) and out == [False], out  # answered while the create on the other GPU is in progress
    assert held.thread.is_alive()

    asking, real_flock = threading.Event(), fcntl.flock

    def flock(f, mode):
        mine = threading.current_thread().name == "nvml-a" and os.path.basename(getattr(f, "name", "")) == f"lock.{a}"
        if mine:
            asking.set()  # about to wait for GPU a's lock
        got = real_flock(f, mode)
        if mine and mode == fcntl.LOCK_SH:
            order.append("read a")
        return got

    monkeypatch.setattr(fcntl, "flock", flock)
    out_a: list = []
    t = threading.Thread(target=lambda: out_a.append(nvml.retired_pages_pending(a)), name="nvml-a", daemon=True)
    t.start()
    assert asking.wait(WAIT)
    held.finish()
    t.join(WAIT)
    assert out_a == [False] and order == ["write a", "read a"], (out_a, order)
