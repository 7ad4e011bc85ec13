"""RealIO's directory-relative reads and writes give the results plain path I/O gives."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from mdev_manager.host.io import RealIO


def _attr(path: Path, value: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)
    return path


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_writes_in_a_reusing_block_land_where_plain_writes_do(tmp_path):
    io = RealIO()
    a, b = _attr(tmp_path / "t/a/create"), _attr(tmp_path / "t/b/create")
    with io.reusing_dirs():
        io.write(a, "1")
        io.write(b, "2")
        io.write(a.parent / "create", "3")  # same directory again, through the kept fd
    assert a.read_text() == "3" and b.read_text() == "2"


def test_a_directory_made_again_is_looked_up_afresh(tmp_path):
    io = RealIO()
    d = tmp_path / "devices/vf0"
    _attr(d / "current_vgpu_type", "0")
    with io.reusing_dirs():
        io.write(d / "current_vgpu_type", "5")
        shutil.rmtree(d)  # VFs disabled and enabled again: same path, new directory
        _attr(d / "current_vgpu_type", "0")
        io.write(d / "current_vgpu_type", "7")
    assert (d / "current_vgpu_type").read_text() == "7"


def test_errors_are_the_plain_ones(tmp_path):
    io = RealIO()
    _attr(tmp_path / "t/create")
    with io.reusing_dirs():
        io.write(tmp_path / "t/create", "x")
        with pytest.raises(FileNotFoundError):
            io.write(tmp_path / "t/missing", "x")  # the kept directory is fine, the file is not
        with pytest.raises(FileNotFoundError):
            io.write(tmp_path / "gone/create", "x")
        io.write(tmp_path / "t/create", "y")  # the block still works after a failure
    assert (tmp_path / "t/create").read_text() == "y"


def test_kept_fds_are_closed_when_the_outer_block_ends(tmp_path):
    io = RealIO()
    files = [_attr(tmp_path / f"d{i}/create") for i in range(5)]
    before = _open_fds()
    with io.reusing_dirs():
        with io.reusing_dirs():  # nested: the outer block owns the fds
            for f in files:
                io.write(f, "1")
        assert len(_open_fds() - before) == 5  # still kept after the inner block
    assert _open_fds() <= before


def test_other_threads_do_not_use_this_threads_fds(tmp_path):
    import threading

    io = RealIO()
    f = _attr(tmp_path / "d/create")
    seen = []
    with io.reusing_dirs():
        io.write(f, "1")
        t = threading.Thread(target=lambda: seen.append(getattr(io._local, "dirs", None)))
        t.start()
        t.join()
    assert seen == [None]


def test_read_children_reads_each_subdirectory(tmp_path):
    io = RealIO()
    base = tmp_path / "mdev_supported_types"
    _attr(base / "nvidia-222/name", "GRID T4-1B\n")
    _attr(base / "nvidia-222/available_instances", "16\n")
    _attr(base / "nvidia-230/name", "GRID T4-1Q\n")
    _attr(base / "stray-file", "not a type")
    got = io.read_children(base, ["name", "available_instances"])
    assert got == {
        "nvidia-222": {"name": "GRID T4-1B", "available_instances": "16"},
        "nvidia-230": {"name": "GRID T4-1Q", "available_instances": None},
    }
    assert io.read_children(tmp_path / "absent", ["name"]) == {}


def test_read_children_keeps_a_type_directory_without_the_attributes_asked(tmp_path):
    """A child none of whose attributes opens is still listed when it is a directory (all None), and left
    out when it is a file or a dangling link; with several attributes asked and with one (``child/name``)."""
    base = tmp_path / "mdev_supported_types"
    (base / "nvidia-1").mkdir(parents=True)
    _attr(base / "nvidia-2/name", "GRID T4-2Q\n")
    _attr(base / "a-file", "x")
    (base / "dangling").symlink_to(tmp_path / "gone")
    got = RealIO().read_children(base, ["name", "available_instances"])
    assert got == {"nvidia-1": {"name": None, "available_instances": None},
                   "nvidia-2": {"name": "GRID T4-2Q", "available_instances": None}}
    assert RealIO().read_children(base, ["name"]) == {"nvidia-1": {"name": None}, "nvidia-2": {"name": "GRID T4-2Q"}}


def test_read_attrs_missing_directory_gives_none(tmp_path):
    assert RealIO().read_attrs(tmp_path / "absent", ["a", "b"]) == {"a": None, "b": None}


def test_a_write_into_a_file_path_is_refused_as_plainly(tmp_path):
    io = RealIO()
    f = _attr(tmp_path / "attr")
    with io.reusing_dirs(), pytest.raises(OSError) as exc:
        io.write(f / "child", "x")  # parent is a file
    assert exc.value.errno == errno.ENOTDIR


def test_a_subclass_that_skips_init_still_works(tmp_path):
    class Bare(RealIO):
        def __init__(self):  # noqa: D401 - deliberately no super().__init__()
            pass

    io = Bare()
    f = _attr(tmp_path / "d/create")
    io.write(f, "1")
    with io.reusing_dirs():
        io.write(f, "2")
    assert f.read_text() == "2"
