"""What the kubelet is answered must exist: the plugin repairs what vanished behind its back.

Each case was found by the fault campaign (tests/campaign):

* a prepared claim whose vGPU was removed behind the plugin's back (by hand, by a crashed
  unprepare of an older plugin) is made again on its next prepare, not answered from the
  checkpoint with a device that is gone;
* a prepared claim whose CDI specs are gone while its devices exist (tmpfs cleared, a rebuilt
  record) gets its files written again before the kubelet is answered;
* an unprepare killed half-way leaves its intent (``unpreparing``) in the checkpoint, and the
  next start finishes it: no claim recorded as prepared with its devices gone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dra_bridge.api.nodepaths import NodePaths
from mdev_manager.executor import Executor
from mdev_manager.sim import SimIO
from tests.support.dra import add_claim, devices_of, make_driver, make_node

T4 = "0000:10:00.0"


@pytest.fixture
def setup(tmp_path, srv):
    node = make_node(tmp_path, "default")
    paths = NodePaths.under(tmp_path / "plugin")
    pool = node.build_pool()
    ref = add_claim(srv, "vm1", [("gpu", devices_of(pool, T4, "vgpu")[0])], node=node.node, namespace="default")
    drv = make_driver(node, paths, srv.api_client(), pool)
    assert drv.prepare([ref])[ref.uid].error is None
    return node, paths, pool, ref, drv


def resolves(paths: NodePaths, answer) -> None:
    """Every CDI id the kubelet was given names a device in a spec on disk."""
    known = set()
    for f in paths.cdi_root.iterdir():
        spec = json.loads(f.read_text())
        known |= {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    for dev in answer.devices:
        assert dev.cdi_device_ids and set(dev.cdi_device_ids) <= known


def test_a_vgpu_removed_behind_the_plugins_back_is_made_again(setup):
    node, paths, pool, ref, drv = setup
    (d,) = drv.cp.claims[ref.uid].devices
    Executor(node.env, node.io).remove_mdev(d.parent, d.vgpu_id)  # an admin's mdevctl stop
    assert d.vgpu_id not in node.mdevs()
    answer = drv.prepare([ref])[ref.uid]
    assert answer.error is None
    (again,) = drv.cp.claims[ref.uid].devices
    assert again.vgpu_id in node.mdevs() and again.vgpu_id == d.vgpu_id  # the same UUID, as after a reboot
    resolves(paths, answer)


def test_a_vgpu_in_use_behind_a_vanished_sibling_is_not_made_over(setup, srv):
    """Two devices, one gone: the other may be a VM's; not re-created over it, and the kubelet is told why."""
    node, paths, pool, _ref, drv = setup
    two = add_claim(srv, "vm2", [("a", devices_of(pool, T4, "vgpu")[1]), ("b", devices_of(pool, T4, "vgpu")[2])],
                    node=node.node, namespace="default")
    assert drv.prepare([two])[two.uid].error is None
    first, second = drv.cp.claims[two.uid].devices
    Executor(node.env, node.io).remove_mdev(first.parent, first.vgpu_id)
    answer = drv.prepare([two])[two.uid]
    assert answer.error and second.vgpu_id in answer.error and "not re-creating" in answer.error
    assert second.vgpu_id in node.mdevs()


def test_lost_cdi_specs_are_written_again_before_the_answer(setup):
    node, paths, pool, ref, drv = setup
    shutil.rmtree(paths.cdi_root)  # /var/run is tmpfs: cleared without a reboot by a careless admin
    answer = drv.prepare([ref])[ref.uid]
    assert answer.error is None
    resolves(paths, answer)
    assert all(Path(f).is_file() for f in drv.cp.claims[ref.uid].cdi_files)


class DiesAt(SimIO):
    """Raises (the process dies) before the write whose path ends in ``name``."""

    def __init__(self, host, name: str):
        super().__init__(host)
        self.name = name

    def write(self, path, data):
        if str(path).endswith(self.name):
            raise SystemExit("killed")
        super().write(path, data)

    def remove(self, path):
        if str(path).endswith(self.name):
            raise SystemExit("killed")
        super().remove(path)


def test_an_unprepare_killed_half_way_is_finished_at_the_next_start(setup, srv):
    node, paths, pool, ref, drv = setup
    (d,) = drv.cp.claims[ref.uid].devices
    dying = make_driver(node, paths, srv.api_client(), pool, io=DiesAt(node.host, ".json"))  # after the vGPU
    with pytest.raises(SystemExit):
        dying.unprepare([ref])
    assert d.vgpu_id not in node.mdevs()  # the vGPU went, the record did not
    restarted = make_driver(node, paths, srv.api_client(), pool)
    assert restarted.cp.claims[ref.uid].state == "unpreparing"
    assert restarted.recover() == [ref.uid]
    assert ref.uid not in restarted.cp.claims and not any(paths.cdi_root.iterdir())
    # the kubelet's retried unprepare is a no-op; a new prepare starts clean
    assert restarted.unprepare([ref]) == {ref.uid: None}


def test_recover_never_forces_a_device_a_vm_holds(setup, srv):
    """A half-prepared claim whose vGPU a process holds open (EBUSY): the start goes on, the record
    stays (its device in use), and the next recover finishes once the process lets go."""
    from dra_bridge.kubeletplugin.checkpoint import CheckpointStore

    node, paths, pool, ref, drv = setup
    cp = CheckpointStore(paths.checkpoint).load()
    cp.claims[ref.uid].state = "preparing"  # a crash between making the vGPU and answering
    CheckpointStore(paths.checkpoint).save(cp)
    (d,) = cp.claims[ref.uid].devices
    pid = node.host.spawn_holder([node.env.vfio_group(d.iommu_group)])
    restarted = make_driver(node, paths, srv.api_client(), pool)
    assert restarted.recover() == []
    assert restarted.cp.claims[ref.uid].state == "preparing" and d.vgpu_id in node.mdevs()
    assert d.vgpu_id in restarted.usage().mdevs
    node.host.kill(pid)
    assert restarted.recover() == [ref.uid] and d.vgpu_id not in node.mdevs()


def test_prepare_leaves_a_vf_a_layout_record_names_for_last(node, paths, srv):
    """A dormant layout record (its vGPU gone: a crash mid-apply, a reboot) wants its VF back at the
    next restore: prepare takes other VFs first, so the layout and a claim do not meet on one VF."""
    from mdev_manager import persist

    L40S = next(g["pf"] for g in node.host.gpus() if g["board"] == "L40S")
    pool = node.build_pool()
    device = devices_of(pool, L40S, "vgpu")[0]
    vfs = [vf.address for vf in node.gpu(L40S).vfs]
    type_id = next(d.type_id for d in pool.devices if d.name == device)
    persist.save_vendor_vfio(node.env, node.io, {vfs[0]: type_id})
    ref = add_claim(srv, "vm-l40s", [("gpu", device)], node=node.node, namespace="default")
    drv = make_driver(node, paths, srv.api_client(), pool)
    assert drv.prepare([ref])[ref.uid].error is None
    (d,) = drv.cp.claims[ref.uid].devices
    assert d.vgpu_id != vfs[0] and d.vgpu_id in vfs
