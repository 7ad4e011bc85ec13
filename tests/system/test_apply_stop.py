"""SIGTERM / SIGINT stop an apply before its next write, whatever the step (issue #29, point 5).

A step may write several files (a passthrough bind writes ``driver_override``, ``unbind``,
``drivers_probe`` and the passthrough record): the stop is asked before every write, not only
between steps, and the next round is not planned once a stop is pending. The tests send the signal
from inside write number N (an event of the transport, never a timer) and count the writes made
after it: at most the one in flight. The node is left as a stop between two writes leaves it, the
saved state says what was made, and the same apply again converges.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from mdev_manager import numbering, persist
from mdev_manager.sim.io import SimIO
from tests.support.dra import make_node
from vgpuctl.cli import host as host_module  # the commands import open_host from it when they run
from vgpuctl.cli.host import Host
from vgpuctl.main import main

LAYOUT = str(Path(__file__).resolve().parents[2] / "examples" / "layout.yaml")
PASSTHROUGH = "0000:13:00.0"


class SignalAtWrite(SimIO):
    """Counts every write (kernel attribute, saved file, removal, rename); during write number ``at``
    it sends this process ``signum`` (the handler runs before that write is made)."""

    def __init__(self, host, signum: int = signal.SIGTERM, at: int = 0):
        super().__init__(host)
        self.signum, self.at, self.n = signum, at, 0
        self.paths: list[str] = []

    def _count(self, path) -> None:
        self.n += 1
        self.paths.append(str(path))
        if self.n == self.at:
            os.kill(os.getpid(), self.signum)

    @property
    def after_signal(self) -> int:
        """Writes made once the signal was delivered (the one it was sent in counts)."""
        return self.n - self.at + 1 if self.n >= self.at > 0 else 0

    def write(self, path, data):
        self._count(path)
        super().write(path, data)

    def write_atomic(self, path, data, durable=True):
        self._count(path)
        super().write_atomic(path, data, durable)

    def remove(self, path):
        self._count(path)
        super().remove(path)

    def rename(self, src, dst):
        self._count(dst)
        super().rename(src, dst)

    def rmdir(self, path):
        self._count(path)
        super().rmdir(path)


def _use(monkeypatch, node, io) -> None:
    monkeypatch.setattr(host_module, "open_host", lambda args: Host(env=node.env, io=io, node=node.node,
                                                                 kubelet_root=node.root / "kubelet"))


def _node(path):
    """A node whose GPUs an earlier command numbered (mdev_manager.numbering): the apply's writes are its own."""
    node = make_node(path, prepare_gpus=False)
    numbering.record(node.env, node.io, [(g.address, g.vendor_id) for g in node.inventory().gpus])
    return node


def _writes_of_a_whole_apply(tmp_path_factory) -> list[str]:
    node = _node(tmp_path_factory.mktemp("count"))
    io = SignalAtWrite(node.host)
    with pytest.MonkeyPatch.context() as mp:
        _use(mp, node, io)
        assert main(["apply", "-f", LAYOUT]) == 0
    return io.paths


@pytest.fixture(scope="module")
def every_write(tmp_path_factory) -> list[str]:
    paths = _writes_of_a_whole_apply(tmp_path_factory)
    # the layout walks every kind of step: a bind (several writes), VFs, definitions, mdevs, vendor VFIO
    names = {Path(p).name for p in paths}
    assert {"driver_override", "unbind", "drivers_probe", "sriov_numvfs", "create",
            "current_vgpu_type", "vendor-vfio.json", "passthrough.json"} <= names, names
    return paths


def _check_stop(tmp_path, monkeypatch, capsys, at: int, signum=signal.SIGTERM) -> str:
    node = _node(tmp_path)
    io = SignalAtWrite(node.host, signum, at)
    _use(monkeypatch, node, io)
    code = main(["apply", "-f", LAYOUT])
    out, err = capsys.readouterr()
    assert code == 128 + signum, (at, out, err)
    assert io.after_signal <= 1, (at, io.paths[at - 1:])  # the write in flight, nothing after it
    (line,) = err.strip().splitlines()
    assert line.startswith(f"{signal.Signals(signum).name}: stopped after ") and "again converges" in line, line
    # what was made is recorded: every vGPU on the node has its definition or vendor-VFIO record
    inv = node.inventory()
    defs, _ = persist.load_definitions(node.env, node.io)
    records = persist.load_vendor_vfio(node.env, node.io)
    defined = {d.uuid for d in defs}
    for g in inv.gpus:
        for v in g.vgpus:
            assert v.id in defined or v.id in records, (at, v.id)
    # a passthrough function is recorded before it leaves its driver
    if node.host._driver(PASSTHROUGH) != "nvidia":
        assert PASSTHROUGH in persist.load_passthrough(node.env, node.io)
    monkeypatch.undo()
    code = main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", LAYOUT])
    out, _ = capsys.readouterr()
    assert code == 0 and out.strip().splitlines()[-1].endswith("node matches the layout"), (at, out)
    return line


def test_a_stop_at_any_write_waits_for_that_write_only(tmp_path_factory, monkeypatch, capsys, every_write):
    """The signal sent at each write of a whole apply in turn: never more than that write is made."""
    for at in range(1, len(every_write) + 1):
        _check_stop(tmp_path_factory.mktemp(f"at{at}"), monkeypatch, capsys, at)


def test_a_stop_inside_a_bind_leaves_its_last_writes_undone(tmp_path, monkeypatch, capsys, every_write):
    """Sent while ``driver_override`` is written, the unbind and the probe of that step are not made; the
    line names the step cut in two, and the rerun finishes the bind."""
    at = next(i for i, p in enumerate(every_write, 1) if p.endswith(f"{PASSTHROUGH}/driver_override"))
    line = _check_stop(tmp_path, monkeypatch, capsys, at, signal.SIGINT)
    assert f"one stopped between two of its writes (bind {PASSTHROUGH} to vfio-pci)" in line, line
