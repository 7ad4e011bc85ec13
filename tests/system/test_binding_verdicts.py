"""The agent's binding verdicts are one decision per GPU that never flips, over every claim that
holds the GPU (issue #36.2), and a GPU freed is offered whole within one resync (#36.3).

Kubernetes 1.37 defaults on the ``default`` preset (T4 GPU 1 is 0000:13:00.0): binding conditions,
no compatibility groups. Each case drives the agent's own calls in the order the race took: a
binding round that reads claims from a watch behind the agent's own writes, a claim deleted before
its unprepare, a resync that discovers a GPU emptied after the round that saw its claim go.
"""

from __future__ import annotations

import copy

import pytest

from dra_bridge.apiclient.objects import body, raw
from dra_bridge.sim.cluster import SimCluster
from kubevirt_templates.render import render
from tests.system.test_binding_conditions import DRIVER, LAYOUT, gpu_sizes, on_gpu

GPU1 = "0000:13:00.0"


@pytest.fixture
def cluster():
    with SimCluster(render=render, version="1.37", feature_gates={}, layout=LAYOUT, layout_name="all", health=False) as c:
        assert c.daemon.shape().binding == "conditions"
        yield c


def make_claim(c: SimCluster, name: str, profile: str, gpu_index: int) -> dict:
    """A ResourceClaim named ``name`` for ``profile`` on GPU ``gpu_index``."""
    (t,) = render("claim-template", {"profile": profile, "name": "t"})
    spec = copy.deepcopy(t["spec"]["spec"])
    spec["devices"]["requests"][0]["exactly"]["selectors"].append(
        {"cel": {"expression": f'device.attributes["{DRIVER}"].gpuIndex == {gpu_index}'}})
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": c.namespace}, "spec": spec}
    c.resource.create_namespaced_resource_claim(c.namespace, body(obj))
    return raw(c.resource.read_namespaced_resource_claim, name, c.namespace)


def write_allocation(c: SimCluster, claim: dict, allocation: dict) -> dict:
    """The scheduler's write of ``allocation``; the claim as stored after it."""
    name = claim["metadata"]["name"]
    c.resource.patch_namespaced_resource_claim_status(name, c.namespace, {"status": {"allocation": allocation}})
    return raw(c.resource.read_namespaced_resource_claim, name, c.namespace)


def conditions(c: SimCluster, name: str) -> dict[str, str]:
    stored = raw(c.resource.read_namespaced_resource_claim, name, c.namespace)
    (entry,) = (stored.get("status") or {}).get("devices") or [{}]
    return {x["type"].split("/")[1]: x["status"] for x in entry.get("conditions") or []}


def test_a_confirmed_size_is_never_refused_by_a_round_that_reads_a_stale_claim(cluster, monkeypatch):
    """Two sizes allocated on GPU 1 from one snapshot; the 2 GiB one is confirmed first, and the
    republish that should narrow GPU 1 to 2 GiB fails (a discovery error: the API, the node lock,
    sysfs). The next round reads the claims from a watch that has not yet seen the confirmation, and
    the 1 GiB claim is older. Before #36.2 that round confirmed the 1 GiB claim and refused the 2 GiB
    one it had confirmed already (which the scheduler may have bound: both reached prepare), and the
    periodic resync did not retry the republish (nothing it keyed on had changed)."""
    c = cluster
    one = make_claim(c, "a-one", "T4-1Q", 1)  # older, and first by name
    two = make_claim(c, "b-two", "T4-2Q", 1)
    alloc = c.allocator()  # one snapshot: GPU 1 offers every size
    _, (a_two,) = alloc.allocate([two])
    _, (a_one,) = alloc.allocate([one])
    assert {r["device"] for a in (a_one, a_two) for r in a["devices"]["results"]} == \
        {"gpu-1-vgpu-1gb-0", "gpu-1-vgpu-2gb-0"}
    two_waiting = write_allocation(c, two, a_two)
    states = c.daemon.gpu_states  # the agent's reads of the host (whole or per GPU)
    real = states.current

    def failing(*a, **kw):
        monkeypatch.setattr(states, "current", real)  # once
        raise OSError("sysfs read failed")

    monkeypatch.setattr(states, "current", failing)
    with pytest.raises(OSError):
        c.daemon.bind([two_waiting])  # confirmed; the republish fails
    assert conditions(c, "b-two") == {"SizeAssigned": "True", "SizeConflict": "False"}
    one_waiting = write_allocation(c, one, a_one)
    c.daemon.bind([two_waiting, one_waiting])  # the watch has b-two as it was before its verdict
    assert conditions(c, "b-two") == {"SizeAssigned": "True", "SizeConflict": "False"}  # never flipped
    assert conditions(c, "a-one") == {"SizeAssigned": "False", "SizeConflict": "True"}
    c.daemon.resync(force=False)  # the periodic resync: the size settled since the last publish counts
    assert list(gpu_sizes(c, 1)) == ["2Gi"]


def test_a_claim_deleted_before_its_unprepare_still_holds_its_gpus_size(cluster):
    """A force-deleted pod: its claim goes before the kubelet unprepares it. The vGPU it holds keeps
    the GPU's size (the checkpoint says so before any discovery does), so a 1 GiB claim on GPU 1 is
    not allocated there. Once the kubelet unprepares, the next resync offers the GPU whole."""
    c = cluster
    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    assert x.phase == "Running", x.reason
    assert not c.daemon.inventory.gpu(GPU1).vgpus  # the last discovery was before the prepare
    for name, _ in x.claims:
        c.resource.delete_namespaced_resource_claim(name, c.namespace)
    c.daemon.bind()  # the round the claim's deletion brings
    assert list(gpu_sizes(c, 1)) == ["2Gi"]
    y = c.submit(on_gpu("T4-1Q", 1, 2), name="y")
    assert not c.schedule(y) and "no device matches" in (y.reason or "")
    # the kubelet unprepares; the next resync sees GPU 1 empty and offers it whole
    assert not any(c.kubelet.unprepare(x.claim_refs()).values())
    c.daemon.resync(force=False)
    assert len(gpu_sizes(c, 1)) == 5
    assert c.schedule(y) and c.run(y), y.reason
    assert [v.type_name for v in c.inventory().gpu(GPU1).vgpus] == ["GRID T4-1Q"]


def test_a_gpu_freed_after_the_round_that_saw_its_claim_go_is_offered_whole_by_the_next_resync(cluster, monkeypatch):
    """#36.3: the periodic resync after a prepare sees the vGPU; the claim is unprepared and deleted;
    the watch's round after the deletion still reads that discovery (the GPU holds 2 GiB); the next
    resync discovers the GPU empty. Before the fix it republished the GPU narrowed to 2 GiB, and
    only the binding loop's next round, a minute later without another claim change, offered it
    whole: other sizes were unschedulable meanwhile."""
    c = cluster
    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    assert x.phase == "Running", x.reason
    c.daemon.resync(force=False)  # the periodic resync after the prepare
    assert c.daemon.inventory.gpu(GPU1).vgpus
    c.release(x)  # the kubelet unprepares, the claim is deleted
    states = c.daemon.gpu_states
    real = states.current

    def failing(*a, **kw):  # the round's own read of the host fails: it decides on the last discovery
        monkeypatch.setattr(states, "current", real)  # once
        raise OSError("sysfs read failed")

    monkeypatch.setattr(states, "current", failing)
    c.daemon.bind()  # the watch's round: the last discovery still shows the vGPU
    assert list(gpu_sizes(c, 1)) == ["2Gi"]
    c.daemon.resync(force=False)  # the next periodic resync (a prepare or unprepare makes it run)
    assert len(gpu_sizes(c, 1)) == 5


def test_a_binding_round_reads_the_host_before_it_decides(cluster):
    """The watch's round after a GPU is freed reads the host first (one listing of its marks), so the
    GPU is offered whole by that round already, not by the next periodic resync."""
    c = cluster
    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    assert x.phase == "Running", x.reason
    c.daemon.resync(force=False)
    c.release(x)
    c.daemon.bind()
    assert len(gpu_sizes(c, 1)) == 5


def _by_hand(c: SimCluster, n: int, profile: str = "T4-2Q") -> list:
    """``n`` vGPUs of ``profile`` made on GPU 1 outside any claim (``mdevctl start`` by hand); they appear
    in no discovery of the agent's until it reads the host again."""
    import uuid

    t = next(t for t in c.inventory().gpu(GPU1).types if t.short_name == profile)
    for _ in range(n):
        c.io.write(c.env.pci(GPU1) / "mdev_supported_types" / t.id / "create", f"{uuid.uuid4()}\n")
    return c.inventory().gpu(GPU1).vgpus


def _allocate_from_one_snapshot(c: SimCluster, ws: list) -> list:
    """The scheduler's allocations of ``ws`` from the slices as they are now (GPU 1 empty: every size, each
    slot under binding conditions), written before any PreBind: what :meth:`SimCluster.schedule_together`
    does, stopped before its binds so the host can change in between."""
    alloc = c.allocator()
    out = []
    for w in ws:
        claims = c.claim_objects(w)
        chosen, allocations = alloc.allocate(claims)
        assert all(r["bindingConditions"] for a in allocations for r in a["devices"]["results"])
        c._reserve(w, claims, allocations)
        out.append((w, claims, allocations, chosen))
    return out


def test_vgpus_made_by_hand_while_allocations_wait_are_seen_before_the_verdict(cluster):
    """The campaign's seed 18 (#36.2): GPU 1 is filled by hand (8 x T4-2Q, ``mdevctl start``: not the
    layout's, not a claim's; the agent leaves them alone) while two allocations there wait on the
    agent's verdict, and the agent had not read the host since. Before the fix its round confirmed
    both on that stale state (the size matched) and both prepares were refused ("cannot create"):
    pods stuck after their binding. Now the round reads the host first and refuses both (the
    scheduler tries again at once); the republished slices offer nothing on GPU 1, so they stay
    Pending, and nothing was made for them."""
    c = cluster
    ws = [c.submit(on_gpu("T4-2Q", 1, i), name=f"w{i}") for i in range(2)]
    planned = _allocate_from_one_snapshot(c, ws)
    assert len(_by_hand(c, 8)) == 8
    assert not any(c._bind(*p) for p in planned)
    assert all("binding failed" in (w.reason or "") for w in ws), [w.reason for w in ws]
    for w in ws:
        assert not c.schedule(w) and w.phase == "Pending", w.reason
    assert gpu_sizes(c, 1) == {}
    assert not any(d["name"].startswith("gpu-1-") for sl in c.slices() for d in sl["spec"].get("devices") or [])
    assert len(c.inventory().gpu(GPU1).vgpus) == 8


def test_vgpus_made_by_hand_and_in_use_take_their_room_from_the_claims(cluster):
    """As above, but the 7 hand-made vGPUs are in use (a VM holds them), so the layout keeps them: GPU 1
    has room for one more T4-2Q. The round confirms the first allocation and refuses the second (the
    scheduler tries it again at once) rather than confirm a claim its prepare must refuse; the
    republished counters leave the hand-made vGPUs' room out, so the second pod stays Pending."""
    c = cluster
    ws = [c.submit(on_gpu("T4-2Q", 1, i), name=f"w{i}") for i in range(2)]
    planned = _allocate_from_one_snapshot(c, ws)
    held = _by_hand(c, 7)
    c.host.spawn_holder([c.env.vfio_group(v.iommu_group) for v in held], comm="qemu-kvm")
    first, second = (c._bind(*p) for p in planned)
    assert first and not second
    assert "has no room left" in (ws[1].reason or ""), ws[1].reason
    assert c.run(ws[0]), ws[0].reason
    assert len(c.inventory().gpu(GPU1).vgpus) == 8
    assert not c.schedule(ws[1]) and ws[1].phase == "Pending", ws[1].reason
    (cs,) = [s for sl in c.slices() for s in sl["spec"].get("sharedCounters") or [] if s["name"] == "gpu-1-counter-set"]
    assert cs["counters"] == {"memory": {"value": "2Gi"}, "vgpus": {"value": "9"}}  # 16 GiB less the VM's 7 x 2 GiB


def test_a_failed_binding_round_is_tried_again_without_waiting_for_a_claim_change():
    """A round whose verdict write or republish failed leaves the scheduler waiting: the loop tries
    again after its retry interval, not at the next claim change (up to a minute later)."""
    import threading

    from dra_bridge.agent.binder import bind_loop

    stop = threading.Event()
    calls: list[str] = []

    class Cache:
        synced = True

        def claims(self):
            return []

        def wait(self, timeout):
            calls.append("wait")
            stop.set()  # the test ends at the first wait for a change
            return False

        def stop(self):
            pass

    def bind(claims):
        calls.append("bind")
        if calls.count("bind") == 1:
            raise OSError("API server unavailable")

    bind_loop(Cache(), active=lambda: True, bind=bind, stop=stop, retry_seconds=0)
    assert calls == ["bind", "bind", "wait"]


def test_a_device_still_prepared_for_a_force_deleted_pods_claim_is_not_confirmed_until_its_unprepare(cluster):
    """#36.2, "a claim the agent confirmed must prepare": a pod on GPU 1 is force-deleted, its claim
    goes before the kubelet unprepares it, and the scheduler, whose ResourceSlice informer is behind
    its claim informer (the slices from before the pod's prepare: GPU 1 empty, every size under
    binding conditions), gives the same 2 GiB slot to a new claim. Before the fix the agent
    confirmed it (the size matched the vGPU still there) and prepare refused it: "already prepared
    for" another claim, a pod stuck after its binding. Now its verdict waits for the unprepare,
    which answers it, and the confirmed claim prepares."""
    from dra_bridge.scheduling.allocator import Allocator
    from dra_bridge.scheduling.taints import tainted_slices

    c = cluster
    before = c.slices()  # GPU 1 empty: every size, each slot under binding conditions
    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    assert x.phase == "Running", x.reason
    for name, _ in x.claims:  # kubectl delete pod --force: the claim goes, still prepared here
        c.resource.delete_namespaced_resource_claim(name, c.namespace)
    c.daemon.bind()  # the round the deletion brings
    y = c.submit(on_gpu("T4-2Q", 1, 2), name="y")
    stale = Allocator(tainted_slices(before, c.taint_rules()), c.classes(), c.selectors)
    for claim in c.claims():
        stale.reserve(claim)
    claims = c.claim_objects(y)
    _, allocations = stale.allocate(claims, node=c.node)
    (result,) = allocations[0]["devices"]["results"]
    assert result["bindingConditions"] and result["device"] == x.devices[0].device  # the slot x still holds
    c._reserve(y, claims, allocations)
    ((y_claim, _),) = y.claims
    c.daemon.bind()  # the round the allocation brings
    assert conditions(c, y_claim) == {}  # withheld: neither confirmed nor refused
    assert not any(c.kubelet.unprepare(x.claim_refs()).values())  # the kubelet gets to the force-deleted pod
    c.daemon.bind()  # the round the unprepare brings
    assert conditions(c, y_claim) == {"SizeAssigned": "True", "SizeConflict": "False"}
    c.rest("PATCH", c.pod_path(y.namespace, y.pod), {"spec": {"nodeName": c.node}}, patch=True)
    assert c.run(y), y.reason
    assert [v.type_name for v in c.inventory().gpu(GPU1).vgpus] == ["GRID T4-2Q"]


def test_an_unprepare_wakes_the_binding_loop(cluster):
    """The allocation withheld above is answered by the round after the unprepare; nothing about
    the claims changes then (the claim went before), so the unprepare itself wakes the loop."""
    import threading

    c = cluster

    class Cache:
        changed = threading.Event()

    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    c.daemon.claim_cache = Cache()  # type: ignore[assignment]
    assert not c.daemon.claim_cache.changed.is_set()
    c.release(x)
    assert c.daemon.claim_cache.changed.is_set()


def test_a_discovery_torn_by_a_prepare_does_not_publish_every_size_of_a_gpu_holding_a_vgpu(cluster, monkeypatch):
    """A discovery without the node lock, concurrent with a prepare, saw GPU 1's new 2 GiB vGPU and
    the other sizes still available: a T4 (no NVML mode) is then inferred to be in mixed-size mode,
    and that resync published every size of GPU 1 without binding conditions. The scheduler gave a
    1 GiB slot there; the next resync narrowed GPU 1 to 2 GiB again and the slot was gone at its
    prepare ("no longer exists on this node"; a stream under load, seed 15). A read that infers
    mixed-size mode is made again under the node lock, which the prepare holds."""
    import dra_bridge.agent.daemon as daemon_module

    c = cluster
    x = c.launch(on_gpu("T4-2Q", 1, 1), name="x")
    assert x.phase == "Running", x.reason
    real = daemon_module.discover

    def torn(*a, **kw):  # once: the GPU's vGPU with the availability read before it was made
        monkeypatch.setattr(daemon_module, "discover", real)
        inv = real(*a, **kw)
        gpus = [g.model_copy(update={"mixed_size": True}) if g.address == GPU1 else g for g in inv.gpus]
        return inv.model_copy(update={"gpus": gpus})

    monkeypatch.setattr(daemon_module, "discover", torn)
    c.daemon.resync()
    assert list(gpu_sizes(c, 1)) == ["2Gi"]
