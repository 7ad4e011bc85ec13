"""The one sync after an apply's non-durable writes flushes the filesystems it wrote to, not the host's.

``sync(2)`` waits for every dirty page of every filesystem (a node's VM disks included): an apply
stopped by SIGTERM would wait for them before it exits (issue #29, point 5). ``syncfs(2)`` of the
state's and the definitions' filesystems makes the same writes durable.
"""

from __future__ import annotations

import os

from mdev_manager.host import io as io_mod
from mdev_manager.host.io import RealIO


def test_sync_flushes_only_the_filesystems_written(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(io_mod, "_syncfs", lambda fd: calls.append(os.fstat(fd).st_dev))
    monkeypatch.setattr(io_mod.os, "sync", lambda: (_ for _ in ()).throw(AssertionError("sync(2) called")))
    rio = RealIO()
    rio.write_atomic(tmp_path / "etc/mdevctl.d/p/u1", "{}", durable=False)
    rio.write_atomic(tmp_path / "var/lib/vgpuctl/passthrough.json", "{}", durable=False)
    rio.remove(tmp_path / "etc/mdevctl.d/p/u1")
    rio.sync()
    assert calls == [os.stat(tmp_path).st_dev]  # one filesystem, flushed once
    rio.sync()
    assert len(calls) == 1  # nothing written since: nothing to flush
    # a directory removed since the write: its filesystem is still flushed, through its parent
    rio.write_atomic(tmp_path / "gone/x", "1", durable=False)
    (tmp_path / "gone/x").unlink()
    (tmp_path / "gone").rmdir()
    rio.sync()
    assert len(calls) == 2


def test_durable_writes_need_no_later_sync(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(io_mod, "_syncfs", lambda fd: calls.append(fd))
    rio = RealIO()
    rio.write_atomic(tmp_path / "a.json", "{}")  # fsynced itself
    rio.sync()
    assert calls == []


def test_the_real_syncfs_runs(tmp_path):
    rio = RealIO()
    rio.write_atomic(tmp_path / "a.json", "{}", durable=False)
    rio.sync()  # libc's syncfs (or sync where there is none): no error
