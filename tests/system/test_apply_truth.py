"""What ``vgpuctl apply`` says is what the node is (issue #23, points 5, 6, 7).

* an apply that waited for the node lock plans and reports the node as it found it after the wait;
* every report is read back from the node after the work: a write the kernel took without effect
  is a failure named in the output (exit 1), never "node matches the layout";
* SIGINT / SIGTERM end the work before the next write: one line says what was done and what is left,
  the exit status is 128 + the signal, and the same apply again converges;
* an operational failure (a full disk) names the path and exits 1; 2 stays for bad input.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

import yaml

from mdev_manager.host.lock import NodeLock
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.io import SimIO
from tests.support.dra import make_node
from vgpuctl.cli import host as host_module  # the commands import open_host from it when they run
from vgpuctl.cli.host import Host
from vgpuctl.main import main

T4 = "0000:10:00.0"


def _layout(tmp_path: Path, vgpus: dict[str, int], name: str = "layout.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": T4, "mode": "vgpu", "vgpus": vgpus}]}}))
    return f


def _use_transport(monkeypatch, node, io) -> None:
    """Run the CLI on ``node`` through ``io`` (a test transport), as --simulate would open it."""
    monkeypatch.setattr(host_module, "open_host", lambda args: Host(env=node.env, io=io, node=node.node,
                                                                 kubelet_root=node.root / "kubelet"))


class CreatesNothing(SimIO):
    """A kernel that accepts every ``create`` write and makes no device."""

    def write(self, path: Path, data: str) -> None:
        if Path(path).name == "create":
            return
        super().write(path, data)


class SignalAtWrite(SimIO):
    """Sends this process ``signum`` during its ``at``-th write to ``create``: mid-step."""

    def __init__(self, host, signum: int, at: int):
        super().__init__(host)
        self.signum, self.at, self.creates = signum, at, 0

    def write(self, path: Path, data: str) -> None:
        if Path(path).name == "create":
            self.creates += 1
            if self.creates == self.at:
                os.kill(os.getpid(), self.signum)
        super().write(path, data)


class FullDisk(SimIO):
    """A state and definitions filesystem with no space left: every file write fails."""

    def write_atomic(self, path: Path, data: str, durable: bool = True) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_write_without_effect_is_a_failure_read_back(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path)
    _use_transport(monkeypatch, node, CreatesNothing(node.host))
    code = main(["apply", "-f", str(_layout(tmp_path, {"T4-2Q": 8}))])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    last = out.strip().splitlines()[-1]
    assert "read back, the node still needs 8 step(s)" in last and "node matches" not in out
    assert node.inventory().gpu(T4).vgpus == []
    # machines see it too: the outcome lists what the node lacks
    code = main(["apply", "-f", str(_layout(tmp_path, {"T4-2Q": 8})), "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and len(doc["unapplied"]) == 8 and all("create" in s for s in doc["unapplied"])


def test_the_daemon_read_back_fails_the_layout_too(tmp_path):
    node = make_node(tmp_path, prepare_gpus=False)
    from mdev_manager.config import parse_config

    layouts = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 2}}]}}, "default")
    out = reconcile(node.env, CreatesNothing(node.host), layouts, read_back=True)
    assert not out.ok and not out.matches and len(out.unapplied) == 2
    out = reconcile(node.env, node.io, layouts, read_back=True)
    assert out.ok and out.unapplied == [] and len(out.inventory.gpu(T4).vgpus) == 2


def test_an_apply_that_waited_reports_the_node_it_found(tmp_path, capsys):
    """Another writer holds the lock and changes the node meanwhile: the waiting apply plans again
    under the lock and says the node already matched (0 changes), not what it planned before."""
    node = make_node(tmp_path)
    layout = _layout(tmp_path, {"T4-2Q": 8})
    taken, go = threading.Event(), threading.Event()

    def other_writer():
        with NodeLock(node.env, "the other apply").hold():
            taken.set()
            go.wait(30)
            out = reconcile(node.env, node.io, _parse(layout), node=node.node)
            assert out.ok

    t = threading.Thread(target=other_writer)
    t.start()
    assert taken.wait(10)
    threading.Timer(1.0, go.set).start()  # once this apply has planned and waits for the lock
    code = main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout), "-o", "json"])
    t.join()
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert "waiting for the node lock" in err
    assert code == 0
    done = [r for rnd in doc["rounds"] if rnd["report"] for r in rnd["report"]["results"]]
    assert done == []  # nothing left to do once it held the lock
    (gpu,) = [g for g in doc["inventory"]["gpus"] if g["address"] == T4]
    assert len(gpu["vgpus"]) == 8


def _parse(layout: Path):
    from mdev_manager.config import load_config

    return load_config(str(layout), "default")


def test_sigterm_finishes_the_step_in_flight_and_a_rerun_converges(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path)
    layout = _layout(tmp_path, {"T4-2Q": 8})
    io = SignalAtWrite(node.host, signal.SIGTERM, at=3)
    _use_transport(monkeypatch, node, io)
    previous = signal.getsignal(signal.SIGTERM)
    code = main(["apply", "-f", str(layout)])
    out, err = capsys.readouterr()
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back
    assert code == 128 + signal.SIGTERM, (out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("SIGTERM: stopped after ") and "not started" in line and "again converges" in line
    vgpus = node.inventory().gpu(T4).vgpus
    assert len(vgpus) == 3  # the create in flight finished; nothing after it started
    # the node is consistent: every vGPU made has its definition, and the same apply converges
    monkeypatch.undo()
    code = main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout)])
    out, _ = capsys.readouterr()
    assert code == 0 and out.strip().splitlines()[-1].endswith("node matches the layout")
    assert len(node.inventory().gpu(T4).vgpus) == 8


def test_sigint_is_130(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path)
    _use_transport(monkeypatch, node, SignalAtWrite(node.host, signal.SIGINT, at=1))
    code = main(["apply", "-f", str(_layout(tmp_path, {"T4-2Q": 8}))])
    _, err = capsys.readouterr()
    assert code == 130 and err.startswith("SIGINT: stopped after ")
    assert len(node.inventory().gpu(T4).vgpus) == 1  # the create in flight, then nothing


def test_a_full_disk_names_the_path_and_exits_1(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path)
    _use_transport(monkeypatch, node, FullDisk(node.host))
    code = main(["apply", "-f", str(_layout(tmp_path, {"T4-2Q": 8}))])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "ENOSPC" in out or "No space left on device" in (out + err)
    assert node.inventory().gpu(T4).vgpus == []  # a definition is written before its device: none made


def test_the_real_write_path_names_the_file_on_enospc(tmp_path):
    """``RealIO.write_atomic`` on a full filesystem (``/dev/full`` stands in for its file) raises with
    the path, and leaves no temporary behind."""
    from mdev_manager.host.io import RealIO

    target = tmp_path / "state" / "x.json"
    target.parent.mkdir()
    tmp = target.with_name(".x.json.tmp")
    os.symlink("/dev/full", tmp)  # open(tmp, "w") writes into /dev/full: ENOSPC at flush
    try:
        RealIO().write_atomic(target, "x" * 100_000)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC and exc.filename == str(target)
    else:
        raise AssertionError("no ENOSPC")
    assert not target.exists() and not os.path.lexists(tmp)


def test_wait_then_stop_leaves_the_lock_free(tmp_path, monkeypatch, capsys):
    """After a stop the node lock is released: the next writer does not wait."""
    node = make_node(tmp_path)
    _use_transport(monkeypatch, node, SignalAtWrite(node.host, signal.SIGTERM, at=2))
    main(["apply", "-f", str(_layout(tmp_path, {"T4-2Q": 8}))])
    capsys.readouterr()
    t0 = time.monotonic()
    with NodeLock(node.env, "after").hold(wait=False):
        pass
    assert time.monotonic() - t0 < 5
