"""The simulated host over FUSE: real file I/O, and Debian's mdevctl, against the model.

``mdev_manager.sim.fuse`` mounts a simulated host's ``sys/`` tree; these tests check that
reads through the mount are the backing tree's, that writes are the model's kernel
writes (with its errnos), that our discovery reads the same node through the mount as
in-process, and that mdevctl 1.2.0 (bind-mounted over ``/sys`` and ``/etc/mdevctl.d``
in a private mount namespace, ``tests/mdevctl_ns.py``) sees the types, devices and saved
definitions we see, drives the model with ``start``/``stop``, and that what it defines
is adopted by our reconcile instead of being duplicated.

Mount-only tests need /dev/fuse and fusermount3; mdevctl tests also need root, unshare
and /usr/bin/mdevctl. Each mount lives in its own daemon process, is killed by a
watchdog after ``WATCHDOG`` seconds (a hung request then fails with ENOTCONN instead
of hanging the run), and is always unmounted when the test ends.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import threading
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from mdev_manager import persist
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import RealIO
from mdev_manager.reconcile import reconcile
from mdev_manager.sim import SimHost, SimIO, load_host
from tests.support.mdevctl_ns import mdevctl_json, missing_facilities, run_mdevctl

WATCHDOG = 120.0
MDEV_PRESETS = ["default", "t4-node", "a16-node", "workstation"]  # presets with mdev parents
# every framework (default), several GPUs per board (a16), GVT-g (workstation), iommufd (l40s);
# a100-node and bench-large add only size (and ~20 s each through the mount).
DISCOVERY_PRESETS = ["default", "t4-node", "a16-node", "workstation", "l40s-node"]


def _fuse_missing() -> list[str]:
    why = []
    if not os.path.exists("/dev/fuse"):
        why.append("no /dev/fuse")
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        why.append("/dev/fuse is not readable and writable by this user")
    if shutil.which("fusermount3") is None:
        why.append("no fusermount3 (apt-get install fuse3)")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: mfusepy found no libfuse
        why.append(f"mfusepy unusable: {e}")
    return why


FUSE_MISSING = _fuse_missing()
NS_MISSING = FUSE_MISSING + missing_facilities()
needs_fuse = pytest.mark.skipif(bool(FUSE_MISSING), reason="FUSE unavailable: " + "; ".join(FUSE_MISSING))
needs_mdevctl = pytest.mark.skipif(bool(NS_MISSING), reason="cannot run mdevctl in a namespace: " + "; ".join(NS_MISSING))

# Every test mounts with FUSE; the mdevctl ones add root and unshare (markers in pyproject).
pytestmark = [pytest.mark.fuse]
mdevctl_test = [pytest.mark.root, pytest.mark.unshare, needs_mdevctl]


def with_marks(*marks):
    def deco(fn):
        for m in reversed(marks):
            fn = m(fn)
        return fn
    return deco


# ---------------------------------------------------------------------------------------------- fixtures

@dataclass
class Sim:
    host: SimHost
    mnt: Path  # the FUSE mount of host.sys

    @property
    def etc(self) -> Path:
        return self.host.root / "etc/mdevctl.d"

    @property
    def env(self) -> HostEnv:
        """In-process view: the backing tree."""
        return HostEnv.under(self.host.root)

    @property
    def menv(self) -> HostEnv:
        """The same host read through the mount (everything but sys/ is the same)."""
        return self.env.with_(sys_root=self.mnt)

    @property
    def io(self) -> SimIO:
        return SimIO(self.host)

    def mdevctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_mdevctl(self.mnt, self.etc, *args, check=check)

    def mdevctl_json(self, *args: str):
        return mdevctl_json(self.mnt, self.etc, *args)


@pytest.fixture
def fsim(tmp_path):
    """``fsim(preset, vfs=False, threads=False)`` -> a fresh host of ``preset`` with its sys/ mounted."""
    from mdev_manager.sim.fuse import mounted

    if FUSE_MISSING:
        pytest.skip("FUSE unavailable: " + "; ".join(FUSE_MISSING))
    stack = contextlib.ExitStack()
    count = 0

    def make(preset: str = "default", vfs: bool = False, threads: bool = False) -> Sim:
        nonlocal count
        count += 1
        base = tmp_path / f"{preset}-{count}"
        host = SimHost.create(base / "host", load_host(preset))
        if vfs:
            enable_vfs(host)
        mnt = stack.enter_context(mounted(host, base / "mnt", max_seconds=WATCHDOG, threads=threads))
        return Sim(host, mnt)

    with stack:
        yield make


def enable_vfs(host: SimHost) -> None:
    """Every SR-IOV GPU gets all its VFs, through the in-process transport."""
    io = SimIO(host)
    for g in host.gpus():
        if g["vf_total"]:
            io.write(host.sys / "bus/pci/devices" / g["pf"] / "sriov_numvfs", f"{g['vf_total']}\n")


def populate(host: SimHost) -> None:
    """One vGPU per GPU (in-process), so instance counts, links and groups are not trivial."""
    io = SimIO(host)
    env = HostEnv.under(host.root)
    for gpu in discover(env, io, node="sim").gpus:
        for parent in gpu.parents:
            t = next((t for t in parent.types if t.available_instances > 0), None)
            if t is None:
                continue
            if t.framework == "mdev":
                io.write(env.pci(parent.address) / "mdev_supported_types" / t.id / "create", f"{uuidlib.uuid4()}\n")
            else:
                io.write(env.pci(parent.address) / "nvidia/current_vgpu_type", f"{t.id}\n")
            break


def type_dir(sim: Sim, parent: str, type_id: str, through_mount: bool = True) -> Path:
    root = sim.mnt if through_mount else sim.host.sys
    return root / "class/mdev_bus" / parent / "mdev_supported_types" / type_id


def write_attr(path: Path, data: str) -> None:
    """Plain Python file I/O, as an admin's script would do it."""
    with open(path, "w") as f:
        f.write(data)


def mdev_gpu_address(sim: Sim, index: int = 0) -> str:
    return discover(sim.env, sim.io, node="sim").gpus[index].address


def json_of(path: Path):
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------- reads

def _walk(root: Path):
    """(relative path, kind) of everything in the tree, without following links."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        for name in dirnames + filenames:
            p = d / name
            yield p.relative_to(root), ("link" if p.is_symlink() else "dir" if p.is_dir() else "file")


@needs_fuse
def test_reads_through_the_mount_equal_the_backing_tree(fsim):
    s = fsim("default", vfs=True)
    populate(s.host)
    seen = {"file": 0, "link": 0, "dir": 0}
    for rel, kind in _walk(s.host.sys):
        back, front = s.host.sys / rel, s.mnt / rel
        st = os.lstat(front)
        seen[kind] += 1
        if kind == "link":
            assert stat.S_ISLNK(st.st_mode), rel
            assert os.readlink(front) == os.readlink(back), rel
            # relative links resolve inside the mount
            assert os.path.realpath(front).startswith(str(s.mnt) + os.sep), rel
        elif kind == "dir":
            assert stat.S_IMODE(st.st_mode) == 0o755 and stat.S_ISDIR(st.st_mode), rel
            assert sorted(os.listdir(front)) == sorted(os.listdir(back)), rel
        else:
            assert stat.S_ISREG(st.st_mode), rel
            assert st.st_size == 4096, rel  # as sysfs reports every attribute
            writable = rel.name in ("create", "remove", "sriov_numvfs", "driver_override", "bind", "unbind",
                                    "new_id", "remove_id", "drivers_probe", "current_vgpu_type", "vgpu_params",
                                    "warm_update", "placement_id", "gpu_instance_id")
            write_only = rel.name in ("create", "remove", "bind", "unbind", "new_id", "remove_id", "drivers_probe")
            assert stat.S_IMODE(st.st_mode) == (0o200 if write_only else 0o644 if writable else 0o444), rel
            if write_only:  # as sysfs: no read open, root or not
                with pytest.raises(PermissionError):
                    front.read_bytes()
                continue
            assert front.read_bytes() == back.read_bytes(), rel
    assert seen["file"] > 500 and seen["link"] > 100 and seen["dir"] > 100, seen
    assert sorted(os.listdir(s.mnt)) == sorted(os.listdir(s.host.sys))


@needs_fuse
def test_readers_that_read_until_eof_get_the_content(fsim):
    s = fsim("t4-node")
    attr = s.mnt / "bus/pci/devices/0000:10:00.0/mdev_supported_types/nvidia-222/description"
    want = (s.host.sys / attr.relative_to(s.mnt)).read_bytes()
    assert len(want) > 40 and os.stat(attr).st_size == 4096
    # python, whole file (the 4096 st_size is only a size hint; EOF ends the read)
    assert open(attr, "rb").read() == want
    assert attr.read_text() == want.decode()
    # one byte per read(2), until read returns b""
    fd = os.open(attr, os.O_RDONLY)
    try:
        chunks = []
        while b := os.read(fd, 1):
            chunks.append(b)
        assert b"".join(chunks) == want
        assert os.pread(fd, 10, 5) == want[5:15]
        assert os.pread(fd, 100, len(want)) == b""
    finally:
        os.close(fd)
    # tools: cat and wc read until EOF; head stops early
    run = lambda *cmd: subprocess.run(cmd, capture_output=True, timeout=30, check=True).stdout  # noqa: E731
    assert run("cat", str(attr)) == want
    assert int(run("wc", "-c", str(attr)).split()[0]) == len(want)  # 4096 is a page: wc reads
    assert run("head", "-c", "7", str(attr)) == want[:7]
    assert run("dd", f"if={attr}", "bs=3", "status=none") == want


@needs_fuse
def test_reads_are_never_stale(fsim):
    """No attribute, entry or negative caching: changes made in-process show at once."""
    s = fsim("t4-node")
    tdir = type_dir(s, "0000:10:00.0", "nvidia-231")  # T4-2Q, 8 per GPU
    uid = "6c2b0f2e-7f4e-4c39-9a44-1e0d3f7a5b10"
    ghost = s.mnt / "bus/mdev/devices" / uid
    assert (tdir / "available_instances").read_text() == "8\n"
    assert not os.path.lexists(ghost)  # a negative lookup the kernel could cache
    with open(tdir / "available_instances") as held:  # an open file re-reads at offset 0
        assert held.read() == "8\n"
        s.io.write(type_dir(s, "0000:10:00.0", "nvidia-231", through_mount=False) / "create", uid)
        held.seek(0)
        assert held.read() == "7\n"
    assert (tdir / "available_instances").read_text() == "7\n"
    assert os.path.lexists(ghost) and uid in os.listdir(tdir / "devices")
    assert os.readlink(ghost) == os.readlink(s.host.sys / "bus/mdev/devices" / uid)
    # equal-size mode: the 1 GB T4-1Q now reads 0, the 2 GB T4-2B shares the GPU's 7 left
    assert type_dir(s, "0000:10:00.0", "nvidia-230").joinpath("available_instances").read_text() == "0\n"
    assert type_dir(s, "0000:10:00.0", "nvidia-223").joinpath("available_instances").read_text() == "7\n"


@needs_fuse
@pytest.mark.parametrize("preset", DISCOVERY_PRESETS)
def test_discovery_through_the_mount_equals_in_process(fsim, preset):
    s = fsim(preset, vfs=True)
    populate(s.host)
    inside = discover(s.env, s.io, node="sim")
    # the mount carries sysfs; NVML (MIG) is the simulated host's own transport either way
    through = discover(s.menv, RealIO(nvml=s.io.nvml()), node="sim")
    assert through.model_dump() == inside.model_dump()
    assert inside.gpus and any(g.vgpus for g in inside.gpus)


# ---------------------------------------------------------------------------------------------- writes

@needs_fuse
def test_writes_through_the_mount_are_kernel_writes(fsim):
    s = fsim("default")
    pf = "0000:10:00.0"
    tdir = type_dir(s, pf, "nvidia-231")
    uid = "0b3c6a2e-1d4f-4e5a-8b7c-9d0e1f2a3b4c"
    write_attr(tdir / "create", uid)
    assert os.path.isdir(s.host.sys / "bus/mdev/devices" / uid)  # in the model
    assert os.path.islink(s.mnt / "bus/mdev/devices" / uid)      # and through the mount
    assert (tdir / "available_instances").read_text() == "7\n"
    assert os.path.basename(os.readlink(s.mnt / "bus/mdev/devices" / uid / "mdev_type")) == "nvidia-231"

    def errno_of(path: Path, data: str) -> int | None:
        try:
            write_attr(path, data)
        except OSError as e:
            return e.errno
        return None

    assert errno_of(tdir / "create", "not-a-uuid") == errno.EINVAL
    assert errno_of(tdir / "create", uid) == errno.EEXIST
    assert errno_of(tdir / "create", uid.upper() + "\n") == errno.EEXIST  # same UUID, any case
    # equal-size mode: a 1 GB type cannot join a 2 GB vGPU (available 0 -> EUSERS)
    assert errno_of(type_dir(s, pf, "nvidia-230") / "create", str(uuidlib.uuid4())) == errno.EUSERS
    a100 = next(g["pf"] for g in s.host.gpus() if g["vf_total"])
    total = int((s.mnt / "bus/pci/devices" / a100 / "sriov_totalvfs").read_text())
    assert errno_of(s.mnt / "bus/pci/devices" / a100 / "sriov_numvfs", f"{total + 1}\n") == errno.ERANGE
    # not a number (the kernel's kstrtoul fails): EINVAL, nothing removed
    assert errno_of(s.mnt / "bus/mdev/devices" / uid / "remove", "x") == errno.EINVAL
    # a read-only attribute cannot even be opened for writing, as on sysfs
    assert errno_of(tdir / "name", "x") == errno.EACCES
    # the vendor driver refuses to remove an mdev whose VFIO group a process holds open
    group = os.path.basename(os.readlink(s.mnt / "bus/mdev/devices" / uid / "iommu_group"))
    with open(s.host.dev / "vfio" / group):
        assert errno_of(s.mnt / "bus/mdev/devices" / uid / "remove", "1") == errno.EBUSY
    assert os.path.isdir(s.host.sys / "bus/mdev/devices" / uid)
    # `echo 1 > remove` from a shell: O_TRUNC (a no-op) then one write
    sh = subprocess.run(["sh", "-c", f'echo 1 > "{s.mnt}/bus/mdev/devices/{uid}/remove"'],
                        capture_output=True, text=True, timeout=30)
    assert sh.returncode == 0, sh.stderr
    assert not os.path.lexists(s.host.sys / "bus/mdev/devices" / uid)
    assert (tdir / "available_instances").read_text() == "8\n"
    # a file removed while held open: ENODEV, as sysfs says for a deleted kobject
    write_attr(tdir / "create", uid)
    held = os.open(s.mnt / "bus/mdev/devices" / uid / "remove", os.O_WRONLY)
    try:
        write_attr(s.mnt / "bus/mdev/devices" / uid / "remove", "1")
        with pytest.raises(OSError) as e:
            os.write(held, b"1")
        assert e.value.errno == errno.ENODEV
    finally:
        os.close(held)
    # truncate(2) of an attribute is accepted and changes nothing
    os.truncate(s.mnt / "bus/pci/devices" / a100 / "sriov_numvfs", 0)
    assert (s.mnt / "bus/pci/devices" / a100 / "sriov_numvfs").read_text() == "0\n"
    # nothing can be created, removed or renamed in the tree
    with pytest.raises(PermissionError):
        open(s.mnt / "bus/pci/devices" / pf / "new_attr", "w")
    with pytest.raises(PermissionError):
        os.unlink(s.mnt / "bus/pci/devices" / pf / "vendor")


@needs_fuse
def test_every_write_call_is_one_kernel_write(fsim):
    """Nothing is buffered across write(2) calls: half a UUID is a bad UUID (EINVAL)."""
    s = fsim("t4-node")
    tdir = type_dir(s, "0000:10:00.0", "nvidia-231")
    uid = "5e0f3c1a-2b4d-4e6f-8a9b-0c1d2e3f4a5b"
    fd = os.open(tdir / "create", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, uid[:18].encode())
        assert e.value.errno == errno.EINVAL
        assert os.write(fd, f"{uid}\n".encode()) == 37  # the next write(2) stands alone
        with pytest.raises(OSError) as e:
            os.write(fd, uid.encode())
        assert e.value.errno == errno.EEXIST
    finally:
        os.close(fd)
    assert os.listdir(s.host.sys / "bus/mdev/devices") == [uid]
    # the production transport: one write(2), errno passed through
    RealIO().write(s.mnt / "bus/mdev/devices" / uid / "remove", "1\n")
    assert os.listdir(s.host.sys / "bus/mdev/devices") == []


@needs_fuse
def test_vendor_vfio_and_driver_writes_through_the_mount(fsim):
    s = fsim("l40s-node", vfs=True)
    gpu = discover(s.env, s.io, node="sim").gpus[0]
    vf = gpu.vfs[0].address
    cur = s.mnt / "bus/pci/devices" / vf / "nvidia/current_vgpu_type"
    tid = gpu.parents[0].types[0].id
    write_attr(cur, f"{tid}\n")
    assert cur.read_text() == f"{tid}\n"
    with pytest.raises(OSError) as e:
        write_attr(cur, f"{tid}\n")
    assert e.value.errno == errno.EBUSY
    write_attr(cur, "0\n")
    assert (s.host.sys / "bus/pci/devices" / vf / "nvidia/current_vgpu_type").read_text() == "0\n"
    with pytest.raises(OSError) as e:  # VFs exist: a nonzero count must go through 0 first
        write_attr(s.mnt / "bus/pci/devices" / gpu.address / "sriov_numvfs", "2\n")
    assert e.value.errno == errno.EBUSY


@needs_fuse
@pytest.mark.parametrize("threads", [False, True], ids=["one-thread", "multithreaded"])
def test_concurrent_writers_and_readers(fsim, threads):
    """Writers through the mount and in-process are serialised by SimHost's lock; readers
    never see half of a write (an empty or partial attribute)."""
    s = fsim("t4-node", threads=threads)
    parent = "0000:10:00.0"
    tdir = type_dir(s, parent, "nvidia-231")  # T4-2Q: 8 per GPU
    stop = threading.Event()
    seen: list[str] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                seen.append((tdir / "available_instances").read_text())
                os.listdir(s.mnt / "bus/mdev/devices")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def writer(uids, through_mount):
        try:
            for uid in uids:
                if through_mount:
                    write_attr(tdir / "create", uid)
                else:
                    s.io.write(type_dir(s, parent, "nvidia-231", through_mount=False) / "create", uid)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for _ in range(2):
            uids = [str(uuidlib.uuid4()) for _ in range(9)]  # one more than fits
            writers = [threading.Thread(target=writer, args=(uids[i::3], i != 2)) for i in range(3)]
            for t in writers:
                t.start()
            for t in writers:
                t.join(60)
            made = sorted(os.listdir(s.host.sys / "bus/mdev/devices"))
            assert len(made) == 8 and set(made) <= set(uids)
            assert len(errors) == 1 and isinstance(errors[0], OSError) and errors[0].errno == errno.EUSERS, errors
            errors.clear()
            assert (tdir / "available_instances").read_text() == "0\n"
            for uid in made:
                write_attr(s.mnt / "bus/mdev/devices" / uid / "remove", "1")
            assert (tdir / "available_instances").read_text() == "8\n"
    finally:
        stop.set()
        for t in readers:
            t.join(60)
    assert not errors, errors
    assert len(seen) > 20 and all(re.fullmatch(r"[0-8]\n", v) for v in seen), sorted(set(seen))


# ---------------------------------------------------------------------------------------------- mdevctl

def _our_types(inv) -> dict[str, dict[str, dict]]:
    """parent -> type id -> mdevctl's fields, from our inventory (mdev parents only).

    Normalisation (mdevctl 1.2.0, checked on this tree): it prints ``description`` with
    its newlines joined by ", " (GVT-g's multi-line description) and leaves the key out
    when the type has no description file; we read the attribute stripped, "" if absent.
    """
    out: dict[str, dict[str, dict]] = {}
    for gpu in inv.gpus:
        for p in gpu.parents:
            mdev = [t for t in p.types if t.framework == "mdev"]
            if not mdev:
                continue
            out[p.address] = {}
            for t in mdev:
                fields = {"available_instances": t.available_instances, "device_api": t.device_api, "name": t.name}
                if t.description:
                    fields["description"] = ", ".join(t.description.split("\n"))
                out[p.address][t.id] = fields
    return out


def _their_types(dump) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for entry in dump:
        for parent, types in entry.items():
            assert parent not in out, f"{parent} listed twice"
            out[parent] = {}
            for t in types:
                ((tid, fields),) = t.items()
                out[parent][tid] = fields
    return out


def _their_devices(dump) -> dict[str, tuple[str, str, str]]:
    """uuid -> (parent, type, start) from ``mdevctl list [--defined] --dumpjson``."""
    out = {}
    for entry in dump:
        for parent, devs in entry.items():
            for d in devs:
                ((uid, fields),) = d.items()
                out[uid] = (parent, fields["mdev_type"], fields["start"])
    return out


@with_marks(*mdevctl_test)
@pytest.mark.parametrize("preset", MDEV_PRESETS)
def test_mdevctl_types_equal_our_discovery(fsim, preset):
    s = fsim(preset, vfs=True)
    populate(s.host)
    ours = _our_types(discover(s.env, s.io, node="sim"))
    theirs = _their_types(s.mdevctl_json("types"))
    assert ours, "the preset has mdev parents"
    assert sorted(theirs) == sorted(ours) == sorted(os.listdir(s.host.sys / "class/mdev_bus"))
    for parent in ours:
        assert theirs[parent] == ours[parent], parent
    # the counts are not all the boot-time ones: populate() took instances
    assert any(f["available_instances"] == 0 for types in ours.values() for f in types.values())


@with_marks(*mdevctl_test)
def test_mdevctl_leaves_out_a_missing_description(fsim):
    s = fsim("t4-node")
    # a vendor driver without a description attribute (the kernel makes it optional)
    os.unlink(type_dir(s, "0000:10:00.0", "nvidia-222", through_mount=False) / "description")
    theirs = _their_types(s.mdevctl_json("types"))
    ours = _our_types(discover(s.env, s.io, node="sim"))
    assert "description" not in theirs["0000:10:00.0"]["nvidia-222"]
    assert next(t for g in discover(s.env, s.io).gpus for t in g.types if t.id == "nvidia-222").description == ""
    assert theirs == ours


def _layouts(vgpus: dict[str, int], index: int = 0):
    """GPU ``index`` gets ``vgpus`` (our config format, layout "default")."""
    return parse_config({"version": "vgpuctl/v1", "layouts": {"default": [{"index": index, "vgpus": vgpus}]}})


@with_marks(*mdevctl_test)
def test_definitions_we_persist_are_mdevctls(fsim):
    s = fsim("default")
    out = reconcile(s.env, s.io, _layouts({"T4-2Q": 4}), node="sim")
    assert out.ok, out
    gpu = out.inventory.gpus[0]
    ours = {v.id: (v.parent, v.type_id) for v in gpu.vgpus}
    assert len(ours) == 4 and {t for _, t in ours.values()} == {"nvidia-231"}
    defs, problems = persist.load_definitions(s.env, s.io)
    assert not problems and {d.uuid: (d.parent, d.mdev_type) for d in defs} == ours
    defined = _their_devices(s.mdevctl_json("list", "--defined"))
    assert {u: (p, t) for u, (p, t, _) in defined.items()} == ours
    assert {start for _, _, start in defined.values()} == {"auto"}
    active = _their_devices(s.mdevctl_json("list"))
    assert {u: (p, t) for u, (p, t, _) in active.items()} == ours
    text = s.mdevctl("list", "--defined").stdout
    for uid in ours:
        assert f"{uid} {ours[uid][0]} nvidia-231 auto" in text


@with_marks(*mdevctl_test)
def test_mdevctl_start_and_stop_drive_the_model(fsim):
    s = fsim("default")
    parent = mdev_gpu_address(s)
    uid = "3f1e2d3c-4b5a-4698-8776-655443322110"
    s.mdevctl("define", "-u", uid, "-p", parent, "-t", "nvidia-231")
    assert json_of(s.etc / parent / uid)["mdev_type"] == "nvidia-231"
    assert not os.path.lexists(s.host.sys / "bus/mdev/devices" / uid)
    s.mdevctl("start", "-u", uid)
    dev = s.host.sys / "bus/mdev/devices" / uid
    assert os.path.isdir(dev) and os.path.basename(os.readlink(dev / "mdev_type")) == "nvidia-231"
    inv = discover(s.env, s.io, node="sim")
    assert [(v.id, v.parent, v.type_id) for v in inv.gpus[0].vgpus] == [(uid, parent, "nvidia-231")]
    assert type_dir(s, parent, "nvidia-231", through_mount=False).joinpath("available_instances").read_text() == "7\n"
    assert _their_devices(s.mdevctl_json("list")) == {uid: (parent, "nvidia-231", "manual")}
    s.mdevctl("stop", "-u", uid)
    assert not os.path.lexists(dev) and not os.path.lexists(s.host.sys / "bus/pci/devices" / parent / uid)
    assert discover(s.env, s.io, node="sim").gpus[0].vgpus == []
    assert (s.etc / parent / uid).exists()  # stop keeps the definition
    # a transient device (start with -p/-t, no definition), upper-case UUID: mdevctl lower-cases it
    s.mdevctl("start", "-u", uid.upper(), "-p", parent, "-t", "nvidia-231")
    assert os.path.isdir(dev)
    # the vendor driver's EBUSY reaches mdevctl: it cannot stop a device in use
    group = os.path.basename(os.readlink(dev / "iommu_group"))
    with open(s.host.dev / "vfio" / group):
        busy = s.mdevctl("stop", "-u", uid, check=False)
    assert busy.returncode != 0 and "os error 16" in busy.stderr and os.path.isdir(dev), busy  # EBUSY
    s.mdevctl("stop", "-u", uid)
    assert not os.path.lexists(dev)


@with_marks(*mdevctl_test)
def test_mdevctl_refusals_leave_the_model_unchanged(fsim):
    s = fsim("default")
    parent = mdev_gpu_address(s)
    s.mdevctl("start", "-u", str(uuidlib.uuid4()), "-p", parent, "-t", "nvidia-234")  # T4-16Q: the whole GPU
    before = sorted(os.listdir(s.host.sys / "bus/mdev/devices"))
    full = s.mdevctl("start", "-u", str(uuidlib.uuid4()), "-p", parent, "-t", "nvidia-234", check=False)
    assert full.returncode != 0 and "No available instances" in full.stderr, full
    again = s.mdevctl("start", "-u", before[0], "-p", mdev_gpu_address(s, 1), "-t", "nvidia-234", check=False)
    assert again.returncode != 0 and "exists" in again.stderr, again
    assert sorted(os.listdir(s.host.sys / "bus/mdev/devices")) == before


@with_marks(*mdevctl_test)
def test_reconcile_adopts_a_device_mdevctl_defined_and_started(fsim):
    s = fsim("default")
    parent = mdev_gpu_address(s)
    theirs = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
    s.mdevctl("define", "--auto", "-u", theirs, "-p", parent, "-t", "nvidia-231")
    s.mdevctl("start", "-u", theirs)
    assert os.path.isdir(s.host.sys / "bus/mdev/devices" / theirs)
    out = reconcile(s.env, s.io, _layouts({"T4-2Q": 4}), node="sim")
    assert out.ok, out
    vgpus = out.inventory.gpus[0].vgpus
    assert len(vgpus) == 4 and {v.type_id for v in vgpus} == {"nvidia-231"}
    assert theirs in {v.id for v in vgpus}
    assert sorted(os.listdir(s.host.sys / "bus/mdev/devices")) == sorted(v.id for v in vgpus)
    defined = _their_devices(s.mdevctl_json("list", "--defined"))
    assert set(defined) == {v.id for v in vgpus}  # one definition each, theirs kept
    assert defined[theirs] == (parent, "nvidia-231", "auto")
    # and a second apply changes nothing
    again = reconcile(s.env, s.io, _layouts({"T4-2Q": 4}), node="sim")
    assert again.ok and again.changed == 0
    assert sorted(os.listdir(s.host.sys / "bus/mdev/devices")) == sorted(v.id for v in vgpus)


@with_marks(*mdevctl_test)
def test_reconcile_starts_a_definition_mdevctl_left_stopped(fsim):
    s = fsim("default")
    parent = mdev_gpu_address(s)
    theirs = "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"
    s.mdevctl("define", "--auto", "-u", theirs, "-p", parent, "-t", "nvidia-231")
    assert not os.path.lexists(s.host.sys / "bus/mdev/devices" / theirs)
    out = reconcile(s.env, s.io, _layouts({"T4-2Q": 4}), node="sim")
    assert out.ok, out
    ids = {v.id for v in out.inventory.gpus[0].vgpus}
    assert len(ids) == 4 and theirs in ids  # its uuid reused, not a fifth device
    assert os.path.isdir(s.host.sys / "bus/mdev/devices" / theirs)
    active = _their_devices(s.mdevctl_json("list"))
    assert set(active) == ids and active[theirs][:2] == (parent, "nvidia-231")
    assert set(_their_devices(s.mdevctl_json("list", "--defined"))) == ids


@with_marks(*mdevctl_test)
def test_reconcile_through_the_mount_with_plain_file_io(fsim):
    """The production path: RealIO on a /sys that is the FUSE mount; mdevctl agrees."""
    s = fsim("default")
    out = reconcile(s.menv, RealIO(nvml=s.io.nvml()), _layouts({"T4-2Q": 4}), node="sim")
    assert out.ok, out
    ids = {v.id for v in out.inventory.gpus[0].vgpus}
    assert len(ids) == 4
    assert sorted(os.listdir(s.host.sys / "bus/mdev/devices")) == sorted(ids)
    assert discover(s.env, s.io, node="sim").model_dump() == out.inventory.model_dump()
    assert set(_their_devices(s.mdevctl_json("list", "--defined"))) == ids
    assert set(_their_devices(s.mdevctl_json("list"))) == ids
