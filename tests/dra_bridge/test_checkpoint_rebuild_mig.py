"""A corrupted checkpoint rebuilt with MIG-backed claims (#38): each rebuilt record carries the GPU
instance and the placements its prepare recorded, read back from the node (NVML's instances, the
vGPU's ``gpu_instance_id`` and ``placement_id`` as discovery reads them), or, when a reboot took the
vGPUs, from the device the claim was allocated (a mixed-size vGPU's slots likewise). So the overlap
refusal still sees the instance a claim holds, and its unprepare removes the instance its prepare made.
At the plugin's start after a reboot (no pool published yet, the vGPUs gone), a vGPU that shared its
instance has a type (so a size) nothing tells: its record holds the whole instance until its claim
prepares again or is unprepared; the claims that shared it make their vGPUs beside each other.

Nodes: rtxpro-node (several vGPUs per GB20x GPU instance, vendor VFIO) and mig-node (one vGPU per
instance: an A100 on mdev, an A100 and an H100 on vendor VFIO).
"""

from __future__ import annotations

import re
import uuid

import pytest

from dra_bridge.pool.devices import GpuPolicy, Pool, PoolPolicy, build_pool
from dra_bridge.pool.policy import policy_from_layout
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from tests.support.dra import DictClaims, claim_object, make_driver, make_node

MIG = [GpuLayout(all=True, mode="dra", passthrough=True, migMode=True)]
RTX = "0000:10:00.0"
#: preset, pool policy, the claims' devices, a device over the first claim's instance (another
#: profile, so another name)
CASES = {
    "rtxpro-node": (PoolPolicy(gpus={RTX: GpuPolicy(passthrough=True, vgpu_types=["DC-1-6Q", "DC-2-24Q"])}),
                    ["gpu-0-mig-1g24gb-14-0-at-12", "gpu-0-mig-1g24gb-14-0-at-0", "gpu-0-mig-2g48gb-5-2-at-24"],
                    "gpu-0-mig-2g48gb-5-0-at-0"),
    "mig-node": (PoolPolicy.default(),
                 ["gpu-2-mig-3g40gb-9-4", "gpu-0-mig-1g5gb-19-6", "gpu-1-mig-2g10gb-14-2"],
                 "gpu-2-mig-2g20gb-14-4"),
}
FIELDS = ("gpu", "type_id", "gi_profile", "gi_start", "gi_size", "gpu_instance", "placement", "placement_size")


@pytest.fixture(params=list(CASES))
def case(request, tmp_path):
    node = make_node(tmp_path, request.param, prepare_gpus=False)
    assert reconcile(node.env, node.io, MIG, node=node.node).matches
    policy, devices, clash = CASES[request.param]
    return node, policy, devices, clash


def instances(node) -> set[tuple[str, int, int]]:
    return {(g.address, gi.profile_id, gi.placement.start)
            for g in discover(node.env, node.io).gpus if g.mig for gi in g.mig.instances}


def placed(drv) -> dict[str, list[tuple]]:
    return {uid: [tuple(getattr(d, f) for f in FIELDS) for d in rec.devices] for uid, rec in drv.cp.claims.items()}


def prepared(node, paths, policy, devices):
    claims = DictClaims()
    pool = build_pool(discover(node.env, node.io), policy, server_version=(1, 35))
    drv = make_driver(node, paths, claims, pool)
    refs = [claims.add(claim_object(f"vm-{i}", [("gpu", d)], node=node.node), str(uuid.uuid4()))
            for i, d in enumerate(devices)]
    for ref in refs:
        assert drv.prepare([ref])[ref.uid].error is None
    return claims, pool, drv, refs


@pytest.mark.parametrize("published", ["pool", "daemon-start"])
def test_a_rebuilt_mig_claim_keeps_its_instance_and_placement(case, paths, published):
    """The vGPUs are there: the records come from the node (NVML's instances, each VF's type,
    instance and placement), with or without a pool published."""
    node, policy, devices, clash = case
    claims, pool, drv, refs = prepared(node, paths, policy, devices)
    before, made = placed(drv), instances(node)
    assert all(r[2] is not None and r[5] is not None for recs in before.values() for r in recs), before
    paths.checkpoint.write_text("{")
    current = [pool if published == "pool" else Pool()]
    drv = make_driver(node, paths, claims, lambda: current[0])  # the plugin starts again: the state is rebuilt
    current[0] = pool
    assert placed(drv) == before
    other = claims.add(claim_object("vm-other", [("gpu", clash)], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([other])[other.uid].error
    assert err and re.search(r"prepared for claim default/vm-[01] ", err), err  # the records' refusal, before the node's
    assert instances(node) == made
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert instances(node) == set()  # each instance its prepare made is removed with it


@pytest.mark.parametrize("published", ["pool", "daemon-start"])
def test_after_a_reboot_a_rebuilt_mig_claim_still_holds_its_placement(case, paths, published):
    """The vGPUs went with a reboot, then the checkpoint was corrupted (a power cut): the records
    take the instance and placements from the allocated device, or at the daemon's start (no pool
    published yet) from its name and the GPU's MIG profiles (a shared instance whole, where several
    types of the board take its profile); no other claim gets them, and each claim makes its vGPU
    there again, beside those that shared its instance."""
    node, policy, devices, clash = case
    claims, pool, drv, refs = prepared(node, paths, policy, devices)
    before, made = placed(drv), instances(node)
    node.host.reboot()
    assert reconcile(node.env, node.io, MIG, node=node.node).ok and instances(node) == set()
    paths.checkpoint.write_text("{")
    current = [pool if published == "pool" else Pool()]
    drv = make_driver(node, paths, claims, lambda: current[0])
    current[0] = pool
    unmade = {uid: [r[:5] + (None,) + r[6:] for r in recs] for uid, recs in before.items()}  # no instance yet
    if published == "daemon-start" and node.node == "sim-rtxpro":  # the type unknown: each instance held whole
        unmade = {uid: [r[:1] + (None,) + r[2:5] + (None, r[6], None) for r in recs] for uid, recs in unmade.items()}
    assert placed(drv) == unmade
    other = claims.add(claim_object("vm-other", [("gpu", clash)], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([other])[other.uid].error
    assert err and re.search(r"prepared for claim default/vm-[01] ", err), err
    for ref in refs:
        assert drv.prepare([ref])[ref.uid].error is None
    assert instances(node) == made
    assert drv.unprepare(refs) == {r.uid: None for r in refs}
    assert instances(node) == set()


def test_a_rebuilt_mixed_size_claim_keeps_its_slots(tmp_path, paths):
    node = make_node(tmp_path, "mixed-node", prepare_gpus=False)
    layout = [GpuLayout(index=0, mode="dra", passthrough=True, mixed_size=True)]  # an L40S
    assert reconcile(node.env, node.io, layout, node=node.node).matches
    inv = discover(node.env, node.io)
    claims, pool, drv, refs = prepared(node, paths, policy_from_layout(inv, layout), ["gpu-0-vgpu-16gb-at-32"])
    before = placed(drv)
    assert [r[6:] for recs in before.values() for r in recs] == [(32, 16)]
    paths.checkpoint.write_text("{")
    drv = make_driver(node, paths, claims, pool)
    assert placed(drv) == before
    other = claims.add(claim_object("vm-other", [("gpu", "gpu-0-vgpu-12gb-at-36")], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([other])[other.uid].error
    assert err and "overlap 32-47 of gpu-0-vgpu-16gb-at-32 prepared for claim default/vm-0" in err, err


@pytest.mark.parametrize("then", ["prepared again", "unprepared"])
def test_a_shared_instance_held_whole_since_the_start_is_given_back(tmp_path, paths, then):
    """The rebuild at the plugin's start after a reboot holds each shared instance whole (its vGPUs'
    type, so their size, is not known): a claim allocated a placement that is free inside it (at 6,
    between DC-1-6Q's at 0 and at 12) is refused while either claim that shared the instance is held
    so, and prepares once both prepared again or were unprepared."""
    node = make_node(tmp_path, "rtxpro-node", prepare_gpus=False)
    assert reconcile(node.env, node.io, MIG, node=node.node).matches
    policy, devices, _ = CASES["rtxpro-node"]
    claims, pool, drv, refs = prepared(node, paths, policy, devices[:2])  # at 12 and at 0 of one instance
    node.host.reboot()
    assert reconcile(node.env, node.io, MIG, node=node.node).ok
    paths.checkpoint.write_text("{")
    current = [Pool()]
    drv = make_driver(node, paths, claims, lambda: current[0])
    current[0] = pool
    free = claims.add(claim_object("vm-free", [("gpu", "gpu-0-mig-1g24gb-14-0-at-6")], node=node.node),
                      str(uuid.uuid4()))
    for i, ref in enumerate(refs):
        err = drv.prepare([free])[free.uid].error
        assert err and "held whole" in err and "prepared for claim default/vm-" in err, err
        if then == "prepared again":
            assert drv.prepare([ref])[ref.uid].error is None
            assert placed(drv)[ref.uid][0][6:] == ((12, 6), (0, 6))[i]  # its placement known again
        else:
            assert drv.unprepare([ref]) == {ref.uid: None}
    assert drv.prepare([free])[free.uid].error is None
    assert instances(node) == {(RTX, 14, 0)}
    assert drv.unprepare([free] + (refs if then == "prepared again" else [])) == \
        {r.uid: None for r in [free] + (refs if then == "prepared again" else [])}
    assert instances(node) == set()
