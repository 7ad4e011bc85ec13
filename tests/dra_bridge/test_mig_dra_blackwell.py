"""DRA on Blackwell boards in MIG mode (#38.3): a GB20x GPU instance offered whole (for now), B200's
instances as any MIG GPU's; the counters keep instances from overlapping and prepare makes each."""

from __future__ import annotations

from dra_bridge.pool.devices import PoolPolicy, build_pool, co_allocatable
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from tests.support.dra import DictClaims, claim_object, make_driver, make_node

GPU = "0000:10:00.0"


def test_dra_offers_each_instance_whole_and_prepare_makes_it_with_its_vgpu(tmp_path, paths):
    """For now DRA gives a claim on a GB20x GPU in MIG mode a GPU instance to itself (the type that
    fills it: DC-1-24Q on 1g.24gb), on the memory-slice counters: never over-allocated, one vGPU per
    instance (publishing several per instance is the open part of #38.3: docs/blackwell.md)."""
    node = make_node(tmp_path, "rtxpro-node", prepare_gpus=False)
    dra = [GpuLayout(all=True, mode="dra", passthrough=True, migMode=True)]
    assert reconcile(node.env, node.io, dra, node=node.node).matches
    pool = build_pool(discover(node.env, node.io), PoolPolicy.default(), server_version=(1, 35))
    mine = [d for d in pool.devices if d.gpu == GPU and d.placement is not None]
    assert {d.attributes["vgpuType"]["string"] for d in mine} == {"DC-1-24Q", "DC-2-48Q", "DC-4-96Q"}
    assert not co_allocatable(pool, ["gpu-0-mig-1g24gb-14-2", "gpu-0-mig-2g48gb-5-2"])  # slices 2-3 once
    assert co_allocatable(pool, ["gpu-0-mig-1g24gb-14-2", "gpu-0-mig-1g24gb-14-3", "gpu-0-mig-2g48gb-5-0"])
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: build_pool(discover(node.env, node.io), PoolPolicy.default(),
                                                             server_version=(1, 35)))
    claim = claim_object("vm", [("gpu", "gpu-0-mig-1g24gb-14-3")], node=node.node)
    ref = claims.add(claim, "0b5e3e6c-4f3c-4a55-9a0e-6f1f2c3d4e5f")
    assert drv.prepare([ref])[ref.uid].error is None
    g = discover(node.env, node.io).gpu(GPU)
    (gi,) = g.mig.instances
    assert (gi.placement.start, len(gi.vgpus)) == (3, 1) and g.vgpus[0].type_name.endswith("DC-1-24Q")
    assert drv.unprepare([ref]) == {ref.uid: None}
    assert not discover(node.env, node.io).gpu(GPU).mig.instances
