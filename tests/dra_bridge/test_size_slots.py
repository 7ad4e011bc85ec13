"""Time-sliced vGPUs as size slots: one device per (framebuffer size, instance) that the A, B, C
and Q types of that size share, the claim's opaque VgpuConfig choosing the type at prepare.
"""

from __future__ import annotations

import uuid

import pytest

from dra_bridge.kubeletplugin.claimconfig import VgpuConfigError, pick_type, requested_type
from dra_bridge.pool.devices import PoolPolicy, build_pool
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from mdev_manager.sim.node import sim_node
from tests.support.dra import DRA_LAYOUT, DRIVER, DictClaims, claim_object, make_driver, make_node

L40S = "0000:19:00.0"


def with_config(claim: dict, *entries: tuple[list[str], dict]) -> dict:
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": reqs, "opaque": {"driver": DRIVER, "parameters": params}}
        for reqs, params in entries]
    return claim


def vgpu_config(t: str) -> dict:
    return {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig", "vgpuType": t}


def test_requested_type_follows_the_request_and_the_last_entry_wins():
    c = with_config(claim_object("c", [("vgpu", "d")], node="n"), ([], vgpu_config("T4-2Q")),
                    (["vgpu/t4-2a"], vgpu_config("T4-2A")), (["other"], vgpu_config("T4-2B")))
    assert requested_type(c, "vgpu", DRIVER) == "T4-2Q"
    assert requested_type(c, "vgpu/t4-2a", DRIVER) == "T4-2A"
    assert requested_type(c, "other", DRIVER) == "T4-2B"
    assert requested_type(claim_object("c", [("vgpu", "d")], node="n"), "vgpu", DRIVER) is None
    bad = with_config(claim_object("c", [("vgpu", "d")], node="n"), ([], {"kind": "GpuConfig"}))
    with pytest.raises(VgpuConfigError, match="VgpuConfig"):
        requested_type(bad, "vgpu", DRIVER)
    choices = {"T4-2Q": "nvidia-231", "T4-2A": "nvidia-226"}
    assert pick_type(choices, "nvidia-231", "GRID T4-2A", "d") == "nvidia-226"
    assert pick_type(choices, "nvidia-231", None, "d") == "nvidia-231"
    with pytest.raises(VgpuConfigError, match="offers T4-2Q, T4-2A"):
        pick_type(choices, "nvidia-231", "T4-4Q", "d")


def test_an_8_l40s_node_publishes_one_device_per_size_slot(tmp_path):
    sim = sim_node(tmp_path / "h", HostSpec(name="l40s-8", node="n", gpus=[GpuGroup(board="L40S", count=8)]))
    assert reconcile(sim.env, sim.io, DRA_LAYOUT).ok
    inv = discover(sim.env, sim.io)
    pool = build_pool(inv, PoolPolicy.default(), server_version=(1, 37))
    per_gpu = 1 + 32 + 24 + 16 + 12 + 8 + 6 + 4 + 3 + 2 + 1  # whole GPU + every size's slots
    assert len(inv.gpus) == 8 and len(pool.devices) == 8 * per_gpu == 872  # issue #13: at most ~900
    # every type of the board is offered by the slots of its size
    offered = {t for d in pool.devices for t in d.type_choices}
    assert offered == {t.short_name for g in inv.gpus for t in g.types}


def test_prepare_makes_the_type_the_claim_asks_for(tmp_path, paths):
    node = make_node(tmp_path, "default", version=(1, 37))
    pool = node.build_pool()
    claims = DictClaims()
    drv = make_driver(node, paths, claims, pool)
    slot = next(d for d in pool.devices if d.gpu == L40S and "L40S-2B" in d.type_choices)
    refs = [claims.add(with_config(claim_object("b", [("vgpu", slot.name)], node=node.node),
                                   (["vgpu"], vgpu_config("L40S-2B"))), str(uuid.uuid4())),
            claims.add(claim_object("q", [("vgpu", slot.name.rsplit("-", 1)[0] + "-1")], node=node.node),
                       str(uuid.uuid4()))]
    res = drv.prepare(refs)
    assert all(r.error is None for r in res.values()), res
    made = sorted(v.type_name.split()[-1] for v in discover(node.env, node.io).gpu(L40S).vgpus)
    assert made == ["L40S-2B", "L40S-2Q"]  # the config's type, and the slot's default without one
    wrong = claims.add(with_config(claim_object("w", [("vgpu", slot.name.rsplit("-", 1)[0] + "-2")], node=node.node),
                                   (["vgpu"], vgpu_config("L40S-4Q"))), str(uuid.uuid4()))
    err = drv.prepare([wrong])[wrong.uid].error
    assert "vgpuType 'L40S-4Q' is not offered by device" in err
    assert len(discover(node.env, node.io).gpu(L40S).vgpus) == 2  # nothing made for it


def test_a_per_type_device_class_carries_the_type_from_scheduler_to_prepare(tmp_path, paths):
    """`vgpuctl render deviceclasses --set profiles=[L40S-2B]`: a claim naming the class, with no
    selector or config of its own, gets a 2 GB slot (the allocator copies the class config into the
    allocation, as kube-scheduler does), and prepare makes an L40S-2B on it."""
    from dra_bridge.pool.slices import build_slices
    from dra_bridge.scheduling.allocator import Allocator
    from dra_bridge.scheduling.selectors import default_selectors
    from kubevirt_templates.render import render

    node = make_node(tmp_path, "default", version=(1, 37))
    pool = node.build_pool()
    slices = build_slices(pool, driver=DRIVER, node_name=node.node, pool_name=node.node, generation=1,
                          server_version=(1, 37))
    classes = render("deviceclasses", {"profiles": ["L40S-2B"]})
    assert [c["metadata"]["name"] for c in classes][-1] == "vgpu-l40s-2b"
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "vm", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu-l40s-2b"}}]}}}
    _, (alloc,) = Allocator(slices, classes, default_selectors()).allocate([claim])
    (result,) = alloc["devices"]["results"]
    assert "L40S-2B" in pool.device(result["device"]).type_choices
    # kube-scheduler 1.37 leaves "requests" empty where a config names every request ("empty means all")
    assert alloc["devices"]["config"] == [{"source": "FromClass", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "vgpu.kubevirt.io/v1alpha1", "kind": "VgpuConfig",
                                         "vgpuType": "L40S-2B"}}}]
    claims = DictClaims()
    ref = claims.add({**claim, "status": {"allocation": alloc}}, str(uuid.uuid4()))
    assert make_driver(node, paths, claims, pool).prepare([ref])[ref.uid].error is None
    (v,) = discover(node.env, node.io).gpu(L40S).vgpus
    assert v.type_name.endswith("L40S-2B")
