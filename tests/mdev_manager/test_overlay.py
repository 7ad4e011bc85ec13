"""The copy-on-write host view previews run over (issue #37, point 6): what is written is read back
from memory, and the host is byte-identical afterwards, whatever the preview did."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.host.io import RealIO
from mdev_manager.host.overlay import CannotPreview, OverlayIO
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Every path under ``root``: a link's target, a file's bytes, a directory."""
    out: dict[str, tuple[str, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", None)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", f.read())
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "state/defs").mkdir(parents=True)
    (tmp_path / "state/record.json").write_text("old\n")
    (tmp_path / "state/defs/a").write_text("A\n")
    (tmp_path / "state/defs/b").write_text("B\n")
    (tmp_path / "sys/dev0").mkdir(parents=True)
    (tmp_path / "sys/dev0/sriov_numvfs").write_text("0\n")
    return tmp_path


def test_writes_are_read_back_and_never_reach_the_host(tree: Path):
    before = snapshot(tree)
    io = OverlayIO(RealIO(), kernel_roots=[tree / "sys"])
    io.write(tree / "state/record.json", "new\n")
    io.write_atomic(tree / "state/new/deep/file.json", "{}")
    io.remove(tree / "state/defs/a")
    io.rename(tree / "state/defs/b", tree / "state/defs/c")
    io.makedirs(tree / "state/empty")
    io.rename(tree / "state/defs", tree / "state/moved")

    assert io.read(tree / "state/record.json") == "new\n"
    assert io.read(tree / "state/new/deep/file.json") == "{}"
    assert io.is_dir(tree / "state/new/deep") and io.is_dir(tree / "state/empty")
    assert io.listdir(tree / "state") == ["empty", "moved", "new", "record.json"]
    assert io.listdir(tree / "state/moved") == ["c"]
    assert io.read_children(tree / "state", ["c"]) == {"empty": {"c": None}, "moved": {"c": "B"}, "new": {"c": None}}
    assert io.read_attrs(tree / "state/moved", ["c", "a"]) == {"c": "B", "a": None}
    assert not io.exists(tree / "state/defs") and not io.exists(tree / "state/defs/a")
    with pytest.raises(FileNotFoundError):
        io.read(tree / "state/defs/b")
    assert io.stat(tree / "state/record.json").st_size == 4
    io.rmdir(tree / "state/empty")
    assert not io.exists(tree / "state/empty")
    io.sync()
    assert snapshot(tree) == before


def test_a_directory_removed_and_made_again_is_empty(tree: Path):
    io = OverlayIO(RealIO())
    io.remove(tree / "state/defs/a")
    io.remove(tree / "state/defs/b")
    io.rmdir(tree / "state/defs")
    io.makedirs(tree / "state/defs")
    assert io.listdir(tree / "state/defs") == []
    assert not io.exists(tree / "state/defs/a")
    with pytest.raises(OSError):
        io.rmdir(tree / "state")  # not empty
    assert (tree / "state/defs/a").read_text() == "A\n"


def test_write_to_a_missing_file_fails_as_write2(tree: Path):
    io = OverlayIO(RealIO())
    with pytest.raises(FileNotFoundError):
        io.write(tree / "state/absent", "x")


def test_a_kernel_write_without_a_model_is_refused_and_remembered(tree: Path):
    before = snapshot(tree)
    io = OverlayIO(RealIO(), kernel_roots=[tree / "sys"])
    with pytest.raises(CannotPreview):
        io.write(tree / "sys/dev0/sriov_numvfs", "4")
    assert io.refused == [str(tree / "sys/dev0/sriov_numvfs")]
    assert io.read(tree / "sys/dev0/sriov_numvfs") == "0\n"
    assert snapshot(tree) == before


def test_a_kernel_model_answers_kernel_writes_in_the_overlay(tree: Path):
    def kernel(ov: OverlayIO, path: str, data: str) -> None:
        n = int(data)
        ov.set_file(path, f"{n}\n")
        for i in range(n):
            ov.set_file(Path(path).parent.parent / f"vf{i}/physfn_name", "dev0\n")

    before = snapshot(tree)
    io = OverlayIO(RealIO(), kernel_roots=[tree / "sys"], kernel=kernel)
    io.write(tree / "sys/dev0/sriov_numvfs", "2")
    assert io.listdir(tree / "sys") == ["dev0", "vf0", "vf1"]
    assert io.read(tree / "sys/vf1/physfn_name") == "dev0\n" and not io.refused
    assert snapshot(tree) == before


def test_a_preview_on_a_simulated_node_leaves_it_byte_identical(tmp_path: Path):
    """The agent's rounds over the overlay: its kernel steps (VFs, MIG mode through NVML) are refused,
    nothing reaches the simulated host, neither its tree nor its kernel's state."""
    node = sim_node(tmp_path / "node", "a100-node")
    gpu = discover(node.env, node.io).gpus[0]
    mode = node.io.nvml().mig_mode(gpu.address)  # the simulator makes its own lock file on a first NVML read
    before = snapshot(node.root)
    io = OverlayIO(node.io, kernel_roots=[node.env.sys_root, node.env.dev_root])
    layouts = [GpuLayout.model_validate({"all": True, "mode": "dra", "passthrough": True, "migMode": True})]
    out = reconcile(node.env, io, layouts, node=node.node, final_inventory=False)
    assert not out.ok and io.refused  # the VFs are the kernel's to make
    with pytest.raises(CannotPreview):
        io.nvml().set_mig_mode(gpu.address, 1)
    assert io.nvml().mig_mode(gpu.address) == mode  # reads go through
    assert snapshot(node.root) == before
