"""#37: a GPU read again after a claim's vGPU (:func:`mdev_manager.gpurefresh.refresh_vgpus`) keeps discovery's
one shared record per type and reading: a copy per parent brought back the 11,776 records of a 16 x 32-VF node
once claims had touched every GPU (~17 MB in the agent)."""

from __future__ import annotations

from mdev_manager import catalog
from mdev_manager.config import parse_config
from mdev_manager.gpurefresh import refresh_vgpus
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import GpuGroup, HostSpec


def test_a_gpu_read_again_after_its_vgpus_changed_shares_one_record_per_type_and_reading(make_sim):
    sim = make_sim(HostSpec(gpus=[GpuGroup(board="L40S", framework="mdev-sriov", vfs_enabled=True, count=1)]))
    before = sim.discover().gpus[0]
    reconcile(sim.env, sim.io, parse_config({"version": "vgpuctl/v1", "layouts": {"default": [
        {"all": True, "vgpus": {"L40S-1Q": 3}}]}}))
    again = refresh_vgpus(sim.env, sim.io, before)
    whole = sim.discover().gpus[0]
    assert again is not None and len(again.vgpus) == 3
    assert [p.types for p in again.parents] == [p.types for p in whole.parents]  # what a whole read says
    records = {id(t) for p in again.parents for t in p.types}
    readings = {(t.id, t.available_instances) for p in again.parents for t in p.types}
    assert len(again.parents) == catalog.board("L40S").sriov_total_vfs
    assert len(records) == len(readings) < 3 * len(again.parents[0].types)
