"""A full disk under the node's state (issue #29, point 6): named, reported once, and no wedge.

* the product: a step the disk refused is reported once (failed, or skipped after the step it
  needs), with no warning printed beside the report, and the verdict says steps failed (never that
  the node lacks steps "the apply reported done"); the node lock is taken without its holder note;
  a ``create`` answered EEXIST for the vGPU the step meant to make (that uuid, that parent, that
  type) is adopted; once the disk has room the same apply converges;
* the simulator: its sysfs is files on a real filesystem (a kernel's is on no disk), so a write it
  has no room to model is refused before anything changes, never left half made (a device
  directory without its links answered EEXIST, a tree its state does not list answered EACCES).

The disk faults are injected by the transport; one test (root, ``mount``) fills a real tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mdev_manager import applied, numbering, persist
from mdev_manager.config import load_config
from mdev_manager.executor import Executor
from mdev_manager.sim.io import SimIO
from tests.support.dra import make_node
from vgpuctl.cli import host as host_module  # the commands import open_host from it when they run
from vgpuctl.cli.host import Host
from vgpuctl.main import main

REPO = Path(__file__).resolve().parents[2]
LAYOUT = str(REPO / "examples" / "layout.yaml")
T4 = "0000:10:00.0"
T4_2Q, T4_4Q = "nvidia-231", "nvidia-232"


class FullDisk(SimIO):
    """The filesystem of the node's saved state (``var/lib/vgpuctl``, ``etc/mdevctl.d``) is full while
    ``full``: every file written there fails with ENOSPC and nothing is written."""

    def __init__(self, host, env):
        super().__init__(host)
        self.roots = (str(env.state_root), str(env.mdevctl_root))
        self.full = True
        self.refused = 0

    def _disk(self, path) -> None:
        if self.full and str(path).startswith(self.roots):
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def write(self, path, data):
        if not self._is_sys(path):
            self._disk(path)
        super().write(path, data)

    def write_atomic(self, path, data, durable=True):
        self._disk(path)
        super().write_atomic(path, data, durable)

    def rename(self, src, dst):
        self._disk(dst)
        super().rename(src, dst)

    def _is_sys(self, path) -> bool:
        real = os.path.realpath(path)
        return real == self._sys or real.startswith(self._sys + os.sep)


def _use(monkeypatch, node, io) -> None:
    monkeypatch.setattr(host_module, "open_host", lambda args: Host(env=node.env, io=io, node=node.node,
                                                                 kubelet_root=node.root / "kubelet"))


def _numbered(node) -> None:
    """An earlier command numbered the node's GPUs (mdev_manager.numbering): apply writes no numbering."""
    numbering.record(node.env, node.io, [(g.address, g.vendor_id) for g in node.inventory().gpus])


def test_gpus_never_numbered_on_a_full_disk_is_one_line_naming_the_numbering(tmp_path, monkeypatch, capsys):
    """Nothing is changed before the node's GPU numbering is saved: an index must name one GPU for good."""
    node = make_node(tmp_path, prepare_gpus=False)
    before = node.inventory()
    _use(monkeypatch, node, FullDisk(node.host, node.env))
    assert main(["apply", "-f", LAYOUT]) == 1
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert out == "" and str(node.env.gpu_ids) in line and "No space left on device" in line, line
    assert node.inventory() == before


def test_discover_and_plan_still_read_on_a_full_disk(tmp_path, monkeypatch, capsys):
    """Issue #36: a read-only command lists the GPUs though it cannot save their numbering (exit 0, one
    warning naming the numbering and the cause); apply still refuses (the test above)."""
    node = make_node(tmp_path, prepare_gpus=False)
    _use(monkeypatch, node, FullDisk(node.host, node.env))
    for argv in (["discover"], ["plan", "-f", LAYOUT]):
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        (line,) = err.strip().splitlines()
        assert line.startswith("warning: the GPU numbering was not saved (No space left on device"), line
        assert str(node.env.gpu_ids) in line and out, (out, err)


def _results(doc: dict) -> list[dict]:
    return [r for rnd in doc["rounds"] if rnd["report"] for r in rnd["report"]["results"]]


def test_a_full_state_disk_reports_each_step_once_and_converges_once_freed(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path, prepare_gpus=False)
    # the layout was recorded by an earlier apply: the record is not written again, the steps run
    applied.record(node.env, node.io, load_config(LAYOUT, "default"), name="default", source=LAYOUT,
                   by="vgpuctl apply")
    _numbered(node)
    io = FullDisk(node.host, node.env)
    _use(monkeypatch, node, io)
    code = main(["apply", "-f", LAYOUT])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert err == "", err  # no warning beside the report: each failure is said once, in it
    verdict = out.strip().splitlines()[-1]
    assert "step(s) failed" in verdict and "apply again once the cause is fixed" in verdict, verdict
    assert "reported done" not in out
    # each refused write names its file, once; a step after it says which failure it follows
    assert f"ENOSPC (No space left on device: {node.env.mdevctl_root}/" in out, out
    assert "skipped (not run: persist mdev " in out and "failed first)" in out, out
    # machines: every step once, done or failed (ENOSPC) or skipped after the one it needs
    code = main(["apply", "-f", LAYOUT, "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    steps = _results(doc)
    assert code == 1 and steps
    assert len({s["step"] for s in steps}) == len(steps)
    assert {s["error"] for s in steps if not s["ok"] and not s["skipped"]} == {"ENOSPC"}
    # nothing the state does not know: every vGPU made has its definition or record
    defs, _ = persist.load_definitions(node.env, node.io)
    known = {d.uuid for d in defs} | set(persist.load_vendor_vfio(node.env, node.io))
    assert all(v.id in known for v in node.inventory().all_vgpus())
    # space freed: the same apply converges, and stays converged
    io.full = False
    assert main(["apply", "-f", LAYOUT]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("node matches the layout")
    assert main(["apply", "-f", LAYOUT]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "0 changes; node matches the layout"


def test_the_record_of_the_layout_on_a_full_disk_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path, prepare_gpus=False)
    _numbered(node)
    _use(monkeypatch, node, FullDisk(node.host, node.env))
    code = main(["apply", "-f", LAYOUT])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert str(node.env.applied_layout) in line and "No space left on device" in line, line


class CreatedMeanwhile(SimIO):
    """Before the first ``create`` of the apply reaches the kernel, the same uuid is created there (as
    mdevctl's own start does when a parent appears, or an earlier apply whose report was lost):
    of the same type (``type_id`` None) or of ``type_id``."""

    def __init__(self, host, type_id: str | None = None):
        super().__init__(host)
        self.type_id, self.done = type_id, False

    def write(self, path, data):
        p = Path(path)
        if p.name == "create" and not self.done:
            self.done = True
            super().write(p.parent.parent / (self.type_id or p.parent.name) / "create", data)
        super().write(path, data)


def _t4_layout(tmp_path: Path) -> Path:
    f = tmp_path / "t4.yaml"
    f.write_text(f'version: vgpuctl/v1\nlayouts:\n  default:\n    - pciAddress: "{T4}"\n      mode: vgpu\n'
                 "      vgpus: {T4-2Q: 4}\n")
    return f


def test_create_adopts_the_vgpu_it_meant_to_create(tmp_path, monkeypatch, capsys):
    node = make_node(tmp_path, prepare_gpus=False)
    _use(monkeypatch, node, CreatedMeanwhile(node.host))
    code = main(["apply", "-f", str(_t4_layout(tmp_path)), "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    steps = _results(doc)
    assert all(s["ok"] for s in steps) and sum("create mdev" in s["step"] for s in steps) == 4
    assert doc["unapplied"] == []
    assert len(node.inventory().gpu(T4).vgpus) == 4


def test_a_uuid_held_by_another_vgpu_fails_the_create_named(tmp_path):
    node = make_node(tmp_path, prepare_gpus=False)
    ex = Executor(node.env, node.io)
    u = str(uuid.uuid4())
    ex.create_mdev(T4, T4_4Q, u)
    ex.create_mdev(T4, T4_4Q, u)  # the same vGPU again: adopted, no error
    with pytest.raises(OSError) as exc:
        ex.create_mdev(T4, T4_2Q, u)
    assert exc.value.errno == errno.EEXIST
    assert f"a device {u} exists as type {T4_4Q} on {T4}" in str(exc.value), exc.value


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(root / "sys"):
        for n in dirs + files:
            p = os.path.join(d, n)
            out[p] = os.readlink(p) if os.path.islink(p) else ""
    return out


def test_the_simulator_refuses_a_write_it_has_no_room_to_model_before_changing_anything(tmp_path, monkeypatch):
    node = make_node(tmp_path, prepare_gpus=False)
    host = node.host
    before, state = _tree(node.root), (node.root / ".sim/state.json").read_bytes()
    monkeypatch.setattr(host, "room", lambda: (4096, None))
    create = node.env.pci(T4) / "mdev_supported_types" / T4_2Q / "create"
    u = str(uuid.uuid4())
    with pytest.raises(OSError) as exc:
        node.io.write(create, u + "\n")
    assert exc.value.errno == errno.ENOSPC and "nothing was changed" in str(exc.value)
    assert _tree(node.root) == before and (node.root / ".sim/state.json").read_bytes() == state
    monkeypatch.undo()
    node.io.write(create, u + "\n")  # room again: the same write works
    assert [v.id for v in node.inventory().gpu(T4).vgpus] == [u]


def _mount_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not installed"
    return None


@pytest.mark.root
@pytest.mark.skipif(_mount_skip() is not None, reason=_mount_skip() or "")
def test_a_real_full_tmpfs_under_the_simulated_node(tmp_path):
    """The reporter's case: the simulated node (its state directories with it) on a tmpfs filled to
    the last page. Exit 1 with each failure once; once freed, the same apply converges."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    env = {**os.environ, "VGPUCTL_SIM_DIR": str(mnt)}

    def vgpuctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "vgpuctl.main", "--simulate", "default", *args],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=300)

    try:
        assert vgpuctl("apply", "-f", LAYOUT, "--layout", "dra").returncode == 0
        small = mnt / "fill-small"
        small.write_bytes(b"\0" * 8192)  # freed below: room for the layout record, none for the rest
        with open(mnt / "fill", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        small.unlink()
        p = vgpuctl("apply", "-f", LAYOUT)
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert p.stderr == "" and f"No space left on device: {mnt}/default/" in p.stdout, (p.stdout, p.stderr)
        assert "step(s) failed" in p.stdout.splitlines()[-1] and "reported done" not in p.stdout
        (mnt / "fill").unlink()
        p = vgpuctl("apply", "-f", LAYOUT)
        assert p.returncode == 0 and p.stdout.splitlines()[-1].endswith("node matches the layout"), p.stdout
        p = vgpuctl("apply", "-f", LAYOUT)
        assert p.returncode == 0 and p.stdout.splitlines()[-1] == "0 changes; node matches the layout", p.stdout
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_node_lock_is_held_without_its_note_on_a_full_disk(tmp_path, monkeypatch):
    """The holder's pid and command are a note for a waiting writer; ENOSPC writing it keeps the lock."""
    from mdev_manager.host import lock as lock_mod
    from mdev_manager.host.env import HostEnv

    env = HostEnv.under(tmp_path)
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(lock_mod.os, "pwrite", full)
    with lock_mod.NodeLock(env, "vgpuctl apply").hold(wait=False):
        monkeypatch.setattr(lock_mod.os, "pwrite", real_pwrite)
        with pytest.raises(lock_mod.NodeLockBusy) as busy:  # held all the same
            lock_mod.NodeLock(env, "another").hold(wait=False).__enter__()
        assert "pid not recorded" in str(busy.value)


def test_a_simulator_whose_tree_and_state_disagree_says_so(tmp_path):
    """What a half-made simulated write left before the room check: a device in the tree its state does
    not list. The simulator says that (ENODEV, the fix), never that ``create`` is read-only."""
    node = make_node(tmp_path, prepare_gpus=False)
    state_file = node.root / ".sim/state.json"
    state = json.loads(state_file.read_text())
    del state["functions"][T4]
    state_file.write_text(json.dumps(state))
    with pytest.raises(OSError) as exc:
        node.io.write(node.env.pci(T4) / "mdev_supported_types" / T4_2Q / "create", str(uuid.uuid4()) + "\n")
    assert exc.value.errno == errno.ENODEV and "vgpuctl sim reset" in str(exc.value)
    assert "read-only" not in str(exc.value)
