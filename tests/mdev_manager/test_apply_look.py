"""``apply`` plans under the node lock on what it read before taking it only where nothing changed (#37).

The look before the lock (bad input rejected before anything is written) is reused under the lock
when the node's settled fingerprint is the same, instead of a second discovery. Another process
(mdevctl, a rebind by hand, a second apply) may change the node while the apply waits: each change
here is made through the simulated host while the apply is blocked on the lock, and the apply must
plan on the node as it is then. Missing the change ends in a failed step or, worse, in "node matches
the layout" over a node that does not.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml

from mdev_manager.executor import Executor
from mdev_manager.host.lock import NodeLock, lock_path
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.io import SimIO
from tests.support.dra import make_node
from vgpuctl.cli import host as host_module  # the commands import open_host from it when they run
from vgpuctl.cli.host import Host
from vgpuctl.main import main

T4 = "0000:10:00.0"
A16 = "0000:10:00.0"


def _layout(tmp_path: Path, gpu: str, vgpus: dict[str, int]) -> Path:
    f = tmp_path / "layout.yaml"
    f.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": gpu, "mode": "vgpu", "vgpus": vgpus}]}}))
    return f


def _someone_waits(path: Path) -> bool:
    """Whether a flock on ``path`` is waited for (``/proc/locks`` lists a blocked request as ``->``)."""
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return any("->" in line and line.split()[6].endswith(f":{ino}") for line in f if len(line.split()) > 6)


def _apply_meanwhile(node, layout: Path, change: Callable[[], None]) -> int:
    """Run ``vgpuctl apply`` while another writer holds the node lock; once the apply has looked at the
    node and waits for the lock, ``change`` the node (as another process would), then let go."""
    taken, failed = threading.Event(), []

    def other_writer():
        try:
            with NodeLock(node.env, "the other writer").hold():
                taken.set()
                deadline = time.monotonic() + 120
                while not _someone_waits(lock_path(node.env)):  # the apply's look is done: it waits
                    assert time.monotonic() < deadline, "the apply never waited for the node lock"
                    time.sleep(0.01)
                change()
        except BaseException as exc:  # said by the test, not lost in the thread
            failed.append(exc)
            taken.set()

    t = threading.Thread(target=other_writer)
    t.start()
    assert taken.wait(60)
    code = main(["--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout), "-o", "json"])
    t.join()
    assert not failed, failed
    return code


def _type_id(node, gpu: str, name: str) -> str:
    return next(t.id for t in node.inventory().gpu(gpu).types if t.name.endswith(name))


def _created(out: str) -> list[str]:
    doc = json.loads(out)
    return [r["step"] for rnd in doc["rounds"] if rnd["report"] for r in rnd["report"]["results"]
            if r["ok"] and r["step"].startswith("create")]


def test_a_vgpu_made_meanwhile_is_planned_on(tmp_path, capsys):
    node = make_node(tmp_path)
    tid = _type_id(node, T4, "T4-2Q")

    def mdevctl_start():
        node.io.write(node.env.pci(T4) / "mdev_supported_types" / tid / "create", str(uuid.uuid4()))

    code = _apply_meanwhile(node, _layout(tmp_path, T4, {"T4-2Q": 8}), mdevctl_start)
    out, err = capsys.readouterr()
    assert "waiting for the node lock" in err
    assert code == 0, (out, err)
    assert len(_created(out)) == 7  # the one made meanwhile is kept: only 7 more fit
    assert len(node.inventory().gpu(T4).vgpus) == 8


def test_a_vgpu_removed_meanwhile_is_made_again(tmp_path, capsys):
    node = make_node(tmp_path)
    layout = _layout(tmp_path, T4, {"T4-2Q": 8})
    from mdev_manager.config import load_config

    assert reconcile(node.env, node.io, load_config(str(layout), "default"), node=node.node).ok
    gone = node.inventory().gpu(T4).vgpus[0].id

    def mdevctl_stop():
        node.io.write(node.env.pci(T4) / gone / "remove", "1")

    code = _apply_meanwhile(node, layout, mdevctl_stop)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert len(_created(out)) == 1  # not "0 changes; node matches the layout" over 7 vGPUs
    assert len(node.inventory().gpu(T4).vgpus) == 8


def test_a_driver_bound_meanwhile_is_planned_on(tmp_path, capsys):
    node = make_node(tmp_path)

    def rebind():
        Executor(node.env, node.io).bind(T4, "vfio-pci")

    code = _apply_meanwhile(node, _layout(tmp_path, T4, {"T4-2Q": 8}), rebind)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    gpu = node.inventory().gpu(T4)
    assert gpu.driver == "nvidia" and len(gpu.vgpus) == 8


def test_vfs_enabled_meanwhile_are_planned_on(tmp_path, capsys):
    node = make_node(tmp_path, "a16-node", prepare_gpus=False)
    assert node.inventory().gpu(A16).sriov_num_vfs == 0  # the apply's look plans to enable all 16
    numvfs = 4  # another number: enabling 16 over them is EBUSY (the same number again would be a no-op)

    def enable():
        node.io.write(node.env.pci(A16) / "sriov_numvfs", f"{numvfs}\n")

    code = _apply_meanwhile(node, _layout(tmp_path, A16, {"A16-2Q": 2}), enable)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)  # not EBUSY from enabling VFs that are there
    gpu = node.inventory().gpu(A16)
    assert gpu.sriov_num_vfs == numvfs and len(gpu.vgpus) == 2


def test_a_vgpu_made_again_under_its_uuid_as_another_type_is_seen(tmp_path, capsys):
    """Removed and made again under the same UUID as another type: the mdevs' names are the same,
    their types are not."""
    node = make_node(tmp_path)
    layout = _layout(tmp_path, T4, {"T4-2Q": 1})
    from mdev_manager.config import load_config

    assert reconcile(node.env, node.io, load_config(str(layout), "default"), node=node.node).ok
    (vgpu,) = node.inventory().gpu(T4).vgpus
    other = _type_id(node, T4, "T4-1Q")

    def remake():
        node.io.write(node.env.pci(T4) / vgpu.id / "remove", "1")
        node.io.write(node.env.pci(T4) / "mdev_supported_types" / other / "create", vgpu.id)

    code = _apply_meanwhile(node, layout, remake)
    out, err = capsys.readouterr()
    assert code == 0, (out, err)  # not "0 changes; node matches the layout" over a T4-1Q
    assert [v.type_name for v in node.inventory().gpu(T4).vgpus] == [vgpu.type_name]


def test_a_vgpu_held_meanwhile_is_kept(tmp_path, capsys):
    """The look before the lock looks for no users: they are scanned under the lock, right before the
    plan that is run, so a VM that opened vGPUs while the apply waited keeps them (exit 3)."""
    node = make_node(tmp_path)
    from mdev_manager.config import load_config

    assert reconcile(node.env, node.io, load_config(str(_layout(tmp_path, T4, {"T4-2Q": 8})), "default"),
                     node=node.node).ok
    held = node.inventory().gpu(T4).vgpus

    def vm_starts():
        node.host.spawn_holder([node.env.vfio_group(v.iommu_group) for v in held])

    code = _apply_meanwhile(node, _layout(tmp_path, T4, {"T4-2Q": 4}), vm_starts)
    out, err = capsys.readouterr()
    assert code == 3, (out, err)
    assert {v.id for v in node.inventory().gpu(T4).vgpus} == {v.id for v in held}
    assert len(json.loads(out)["blocked"]) == 4


class CountsProcScans(SimIO):
    """The simulated host, counting the listings of ``/proc`` (one per look for users)."""

    def __init__(self, host, proc: Path):
        super().__init__(host)
        self.proc, self.scans = proc, 0

    def listdir(self, path: Path) -> list[str]:
        if Path(path) == self.proc:
            self.scans += 1
        return super().listdir(path)


def test_an_apply_looks_for_users_once(tmp_path, monkeypatch, capsys):
    """Before the lock nothing is looked up (that plan is never run); under it once, for the plan that
    is run; the read-back of a node that matches judges with those users."""
    node = make_node(tmp_path)
    io = CountsProcScans(node.host, node.env.proc_root)
    monkeypatch.setattr(host_module, "open_host", lambda args: Host(env=node.env, io=io, node=node.node,
                                                                 kubelet_root=node.root / "kubelet"))
    assert main(["apply", "-f", str(_layout(tmp_path, T4, {"T4-2Q": 8}))]) == 0, capsys.readouterr()
    assert io.scans == 1
    assert len(node.inventory().gpu(T4).vgpus) == 8
