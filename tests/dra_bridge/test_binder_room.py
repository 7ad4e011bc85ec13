"""dra_bridge.agent.binder.decide: a verdict confirms an allocation only while the counters published now
hold it with everything counted before it (#36.2: a claim the agent confirmed must prepare)."""

from __future__ import annotations

from dra_bridge.agent.binder import decide
from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.pool.devices import PoolPolicy, binding_conditions, build_pool
from dra_bridge.pool.policy import with_outside
from mdev_manager.models import Vgpu
from tests.dra_bridge.test_devices import inventory, t4

POOL = "node-a"
BC, BFC = binding_conditions(DEFAULT_DRIVER)


def claim(name: str, device: str, *, at: str, conditions: bool = True) -> dict:
    result = {"driver": DEFAULT_DRIVER, "pool": POOL, "device": device, "request": "vgpu"}
    if conditions:
        result |= {"bindingConditions": BC, "bindingFailureConditions": BFC}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": at},
            "status": {"allocation": {"allocationTimestamp": at, "devices": {"results": [result]}}}}


def pool_with(outside: int, claimed: int = 0):
    """An empty-looking T4 published with binding conditions (every size), as the scheduler saw it, or the
    T4 holding ``outside`` 2 GiB vGPUs no claim holds (and ``claimed`` that claims hold)."""
    gpu = t4()
    vgpus = [Vgpu(id=f"v{k}", framework="mdev", type_id="nvidia-231", type_name="GRID T4-2Q", parent=gpu.address,
                  gpu=gpu.address) for k in range(outside + claimed)]
    inv = inventory(gpu.model_copy(update={"vgpus": vgpus}))
    policy = with_outside(PoolPolicy.default(), inv, {v.id for v in vgpus[outside:]})
    return build_pool(inv, policy, DEFAULT_DRIVER, server_version=(1, 36), binding_conditions=True)


def test_the_first_allocations_that_fit_are_confirmed_and_the_rest_refused():
    pool = pool_with(outside=6)  # room for two 2 GiB vGPUs
    claims = [claim(f"c{k}", f"gpu-0-vgpu-2gb-{k}", at=f"2026-12-07T00:00:0{k}Z") for k in range(3)]
    verdicts, assigned = decide(claims, pool, {"0000:3b:00.0": {2048}}, driver=DEFAULT_DRIVER, pool_name=POOL)
    assert [(v.claim, v.ok) for v in verdicts] == [("c0", True), ("c1", True), ("c2", False)]
    assert "has no room left for gpu-0-vgpu-2gb-2" in verdicts[2].message
    assert assigned == {"0000:3b:00.0": 2048}


def test_allocations_confirmed_or_bound_before_count_first_whatever_their_order():
    pool = pool_with(outside=6)
    bound = claim("z-bound", "gpu-0-vgpu-2gb-5", at="2026-12-07T00:00:09Z", conditions=False)
    claims = [claim(f"c{k}", f"gpu-0-vgpu-2gb-{k}", at=f"2026-12-07T00:00:0{k}Z") for k in range(2)]
    confirmed = {("uid-c1", "gpu-0-vgpu-2gb-1"): ("0000:3b:00.0", 2048)}  # the agent's own, not yet read back
    verdicts, _ = decide([*claims, bound], pool, {"0000:3b:00.0": {2048}}, driver=DEFAULT_DRIVER, pool_name=POOL,
                         confirmed=confirmed)
    assert [(v.claim, v.ok) for v in verdicts] == [("c0", False)]  # c1 and the bound one hold the room


def test_a_claim_deleted_before_its_unprepare_keeps_its_room():
    """A force-deleted pod's claim is gone from the API, its vGPU still there (the checkpoint's record):
    the scheduler's counters no longer count it, the verdict does."""
    pool = pool_with(outside=0, claimed=7)  # 7 claimed vGPUs: the published counters are whole
    live = [claim(f"c{k}", f"gpu-0-vgpu-2gb-{k}", at=f"2026-12-07T00:00:0{k}Z", conditions=False) for k in range(6)]
    waiting = claim("new", "gpu-0-vgpu-2gb-7", at="2026-12-07T00:00:09Z")
    prepared = {f"gpu-0-vgpu-2gb-{k}": f"uid-c{k}" for k in range(6)} | {"gpu-0-vgpu-2gb-6": "uid-gone"}
    args = dict(driver=DEFAULT_DRIVER, pool_name=POOL)
    (v,) = decide([*live, waiting], pool, {"0000:3b:00.0": {2048}}, prepared=prepared, **args)[0]
    assert v.ok  # 6 live + the gone claim's + this one: 8 x 2 GiB fill the T4 exactly
    other = claim("more", "gpu-0-vgpu-2gb-6", at="2026-12-07T00:00:08Z")  # the gone claim's own slot: withheld
    verdicts, _ = decide([*live, other, waiting], pool, {"0000:3b:00.0": {2048}}, prepared=prepared, **args)
    assert [(v.claim, v.ok) for v in verdicts] == [("new", True)]
    # a vGPU made by hand besides: 14 GiB for claims, 6 live + the gone one's take it all
    fuller = pool_with(outside=1, claimed=7)
    (v,) = decide([*live, waiting], fuller, {"0000:3b:00.0": {2048}}, prepared=prepared, **args)[0]
    assert not v.ok and "no room left" in v.message
    del prepared["gpu-0-vgpu-2gb-6"]  # once the kubelet unprepared it
    (v,) = decide([*live, waiting], fuller, {"0000:3b:00.0": {2048}}, prepared=prepared, **args)[0]
    assert v.ok
