"""Crash injection: kill the applying process right before each write, re-apply, compare.

A child process runs ``reconcile`` through ``CrashingIO``, a transport that calls
``os._exit(137)`` right before write number N (every ``write``, ``write_atomic`` and
``remove`` counts). For every N of a full apply, a fresh copy of the same host is
crashed at N, then re-applied here to completion; the result must equal an uncrashed
apply: the same devices per GPU and type, the same drivers and VFs, every device with
exactly one saved definition and every definition with its device, no duplicate UUIDs,
and a second re-apply that changes nothing.

Each child is forked by one single-threaded helper process that imported the manager once
(:class:`Forker`): a fresh process per crash as before, without a Python start per write.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mdev_manager import persist
from mdev_manager.config import parse_config
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import HostSpec
from mdev_manager.sim.hostspec import GpuGroup
from tests.support.simnodes import REPO, build_sim, open_sim

FORKER = r'''
import json, os, sys, traceback
from pathlib import Path
from mdev_manager.config import parse_config
from mdev_manager.host.env import HostEnv
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import SimHost, SimIO

crash_at = -1


class CrashingIO(SimIO):
    """Dies right before write number ``crash_at`` (0-based); counts them all."""

    writes = 0

    def _before_write(self):
        if self.writes == crash_at:
            os._exit(137)
        self.writes += 1

    def write(self, path, data):
        self._before_write()
        super().write(path, data)

    def write_atomic(self, path, data, **kw):
        self._before_write()
        super().write_atomic(path, data, **kw)

    def remove(self, path):
        self._before_write()
        super().remove(path)


def child(root, layout_file, count_file):
    io = CrashingIO(SimHost(root))
    out = reconcile(HostEnv.under(root), io, parse_config(json.loads(Path(layout_file).read_text())))
    Path(count_file).write_text(str(io.writes))
    return 0 if out.ok else 1


# one request a line: [root, layout file, crash at, count file, stderr file]; answers the child's exit code
for line in sys.stdin:
    root, layout_file, crash_at, count_file, err_file = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
        try:
            code = child(Path(root), layout_file, count_file)
        except BaseException:
            traceback.print_exc()
            code = 2
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
'''


class Forker:
    """The helper that forks the crashing children (single-threaded, so forking is safe)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()

    def run_child(self, root: Path, layout_file: Path, crash_at: int, count_file: Path) -> int:
        err = count_file.with_name(count_file.name + ".stderr")
        with self.lock:
            self.proc.stdin.write(json.dumps([str(root), str(layout_file), crash_at, str(count_file), str(err)]) + "\n")
            self.proc.stdin.flush()
            if not select.select([self.proc.stdout], [], [], 120)[0]:
                self.proc.kill()
                raise AssertionError(f"no answer within 120 s from a child crashing at write {crash_at}")
            answer = self.proc.stdout.readline()
        assert answer, f"the forker died ({self.proc.poll()})"
        code = int(answer)
        if code not in (0, 137):
            raise AssertionError(f"child failed ({code}):\n{err.read_text()}")
        return code

    def __enter__(self) -> Forker:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


# examples/layout.yaml's shape with smaller counts: mdev on the PF, passthrough,
# mdev on SR-IOV VFs (VFs enabled first) and vendor-specific VFIO.
FIRST = {"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "vgpu", "vgpus": {"T4-4Q": 2}},
    {"index": 1, "mode": "passthrough"},
    {"model": "A100", "mode": "vgpu", "vgpus": {"A100-4C": 2, "A100-8C": 0}},
    {"pciAddress": "0000:19:00.0", "mode": "vgpu", "vgpus": {"NVIDIA L40S-8Q": 2}},
]}}

# From FIRST applied: every GPU changes form or size (removals, unbinding, re-binding).
SECOND = {"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "passthrough"},
    {"index": 1, "mode": "vgpu", "vgpus": {"T4-8Q": 2}},
    {"model": "A100", "mode": "vgpu", "vgpus": {"A100-8C": 2}},
    {"pciAddress": "0000:19:00.0", "mode": "vgpu", "vgpus": {"NVIDIA L40S-8Q": 1}},
]}}


def node_state(root: Path) -> dict:
    """What must match an uncrashed apply (device ids aside, which are random)."""
    sim = open_sim(root)
    inv = sim.discover()
    vgpus = inv.all_vgpus()
    ids = [v.id for v in vgpus]
    assert len(ids) == len(set(ids)), "duplicate vGPU ids"
    mdevs = sorted((v.parent, v.id, v.type_id) for v in vgpus if v.framework == "mdev")
    defs = sorted((d.parent, d.uuid, d.mdev_type) for d in sim.definitions())
    assert mdevs == defs, "every mdev needs exactly one definition and every definition its mdev"
    vendor = {v.id: v.type_id for v in vgpus if v.framework == "vendor-vfio"}
    assert vendor == sim.records(), "every vendor-VFIO vGPU needs its record and every record its vGPU"
    per_parent = Counter(v.parent for v in vgpus if v.parent != v.gpu)
    assert all(n == 1 for n in per_parent.values()), "a VF holds at most one vGPU"
    return {
        "vgpus": sorted(Counter((v.gpu, v.type_id) for v in vgpus).items()),
        "gpus": [(g.address, g.driver, g.sriov_num_vfs, sorted(g.iommu_group_drivers.items()),
                  sorted(g.iommu_group_overrides.items())) for g in inv.gpus],
        "vfio_nodes": sorted(p.name for p in sim.env.vfio_dir.iterdir()
                             if p.name.isdigit() and int(p.name) in {g.iommu_group for g in inv.gpus}),
    }


def crash_everywhere(tmp_path: Path, pristine: Path, layout_doc: dict, recover_doc: dict | None = None,
                     check=None) -> int:
    """Crash an apply of ``layout_doc`` at each write; re-apply ``recover_doc`` (default: the same);
    ``check(root)`` adds what the recovered host must show besides :func:`node_state`."""
    layout_file = tmp_path / "layout.json"
    layout_file.write_text(json.dumps(layout_doc))
    layouts = parse_config(recover_doc or layout_doc)
    with Forker() as forker:
        return _crash_everywhere(forker, tmp_path, pristine, layout_file, layouts, recover_doc is not None, check)


def _crash_everywhere(forker: Forker, tmp_path: Path, pristine: Path, layout_file: Path, layouts,
                      recovering: bool, check) -> int:
    # the reference: a full apply without a crash, counting its writes (then the recovery layout)
    ref = tmp_path / "ref"
    shutil.copytree(pristine, ref, symlinks=True)
    assert forker.run_child(ref, layout_file, -1, tmp_path / "count") == 0
    total = int((tmp_path / "count").read_text())
    if recovering:
        sim = open_sim(ref)
        assert reconcile(sim.env, sim.io, layouts).ok
    want = node_state(ref)
    assert want["vgpus"], "the reference apply made no vGPUs"

    def crash(n: int) -> Path:
        root = tmp_path / f"crash-{n}"
        shutil.copytree(pristine, root, symlinks=True)
        assert forker.run_child(root, layout_file, n, tmp_path / f"count-{n}") == 137, f"no crash at write {n}"
        return root

    with ThreadPoolExecutor(max_workers=2) as pool:
        for n, root in enumerate(pool.map(crash, range(total))):
            sim = open_sim(root)
            out = reconcile(sim.env, sim.io, layouts)
            assert out.ok, f"re-apply after a crash at write {n} failed: {out.rounds[-1].report}"
            assert node_state(root) == want, f"state after a crash at write {n} differs"
            if check is not None:
                check(root)
            again = reconcile(sim.env, sim.io, layouts)
            assert again.changed == 0 and all(not r.plan.actions for r in again.rounds), \
                f"second re-apply after a crash at write {n} still changes things"
            shutil.rmtree(root)
    return total


@pytest.fixture
def scratch(tmp_path):
    """Host copies on tmpfs where there is one: a simulated sysfs is thousands of small files."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="vgpuctl-crash-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def pristine(scratch) -> Path:
    root = scratch / "pristine"
    build_sim(root, "default")
    return root


def test_crash_at_every_write_of_a_first_apply(scratch, pristine):
    total = crash_everywhere(scratch, pristine, FIRST)
    # binding (3 writes), two VF enables, and a definition or record plus a create per vGPU
    assert total >= 3 + 2 + 2 * (2 + 2 + 2)


def test_crash_at_every_write_of_a_layout_change(scratch, pristine):
    applied = scratch / "applied"
    shutil.copytree(pristine, applied, symlinks=True)
    sim = open_sim(applied)
    assert reconcile(sim.env, sim.io, parse_config(FIRST)).ok
    total = crash_everywhere(scratch, applied, SECOND)
    # removals and forgetting (T4 2, A100 2, L40S 1), two re-binds of 3 writes, and the new vGPUs
    assert total >= 2 * (2 + 2 + 1) + 3 + 3 + 2 * (2 + 2)


def test_crash_while_passing_through_then_back_to_vgpus(scratch, pristine):
    """The admin changes their mind after a crashed switch to passthrough: no vfio-pci override
    may stay behind on a function back on its native driver (it would take the GPU at its next probe)."""
    t4_vgpus = {"version": "vgpuctl/v1", "layouts": {"default": [{"index": 0, "vgpus": {"T4-4Q": 2}}]}}
    t4_passthrough = {"version": "vgpuctl/v1", "layouts": {"default": [{"index": 0, "mode": "passthrough"}]}}
    applied = scratch / "applied"
    shutil.copytree(pristine, applied, symlinks=True)
    sim = open_sim(applied)
    assert reconcile(sim.env, sim.io, parse_config(t4_vgpus)).ok
    total = crash_everywhere(scratch, applied, t4_passthrough, recover_doc=t4_vgpus)
    assert total >= 2 * 2 + 3  # two removals and forgettings, then override, unbind, probe


MIXED = {"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mixedSize": True, "vgpus": {"L4-12C": 1, "L4-6C": 1}},  # vendor-specific VFIO
    {"index": 1, "mixedSize": True, "vgpus": {"A100-20C": 1, "A100-10C": 1}},  # mdev on VFs
]}}


def placed_exactly(root: Path) -> None:
    """Mixed-size mode on, every vGPU at a placement, none overlapping, the record saying where:
    what restore needs after any crash."""
    sim = open_sim(root)
    saved = persist.load_placements(sim.env, sim.io)
    for g in sim.discover().gpus:
        assert g.mixed_size is True and saved[g.address]["mixed"]
        taken: set[int] = set()
        for v in g.vgpus:
            r = set(range(v.placement_id, v.placement_id + g.placements.types[v.type_id].size))
            assert v.placement_id in g.placements.types[v.type_id].ids and not taken & r, v
            taken |= r
        assert saved[g.address]["vgpus"] == {v.id: v.placement_id for v in g.vgpus}
    assert all(d.start == "manual" for d in sim.definitions())


def test_crash_at_every_write_of_a_mixed_size_apply(scratch):
    pristine = scratch / "pristine-mixed"
    build_sim(pristine, HostSpec(gpus=[GpuGroup(board="L4"), GpuGroup(board="A100-40GB")]))
    total = crash_everywhere(scratch, pristine, MIXED, check=placed_exactly)
    # two VF enables, two records of the mode, and per vGPU a definition or record, a create and a move
    assert total >= 2 + 2 + 4 * 3, total
