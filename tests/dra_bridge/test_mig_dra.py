"""MIG-backed vGPUs through DRA: one counter set per GPU in NVIDIA's vocabulary, placements that
the counters keep apart exactly as NVML does, and prepare / unprepare making the GPU instance
and the vGPU on it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid

import pytest

from dra_bridge.pool.devices import PoolPolicy, build_pool, co_allocatable
from dra_bridge.pool.safe import without_counters
from dra_bridge.pool.slices import build_slices
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.host.nvml import Mig, NvmlError
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node
from mdev_manager.sim.nvml import SimNvml
from tests.support.dra import DictClaims, claim_object, make_driver, make_node

MIG_DRA = [GpuLayout(all=True, mode="dra", passthrough=True, migMode=True)]
A100_MDEV, A100_VFIO, H100, L40S = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"


@pytest.fixture
def node(tmp_path):
    n = make_node(tmp_path, "mig-node", prepare_gpus=False)
    out = reconcile(n.env, n.io, MIG_DRA, node=n.node)
    assert out.matches, out.rounds[-1].plan
    return n


def pool_of(node, version=(1, 35)):
    return build_pool(discover(node.env, node.io), PoolPolicy.default(), server_version=version)


def test_a_dra_layout_puts_mig_gpus_in_mig_mode_and_leaves_others(node):
    inv = discover(node.env, node.io)
    assert [g.mig.enabled if g.mig else None for g in inv.gpus] == [True, True, True, None]
    assert reconcile(node.env, node.io, MIG_DRA, node=node.node).changed == 0


def test_counter_sets_in_nvidia_vocabulary(node):
    pool = pool_of(node)
    cs = pool.counter_set("gpu-2-counter-set")  # the H100
    assert cs.counters == {"multiprocessors": 132, "copy-engines": 8, "decoders": 7, "encoders": 0,
                           "jpeg-engines": 7, "ofa-engines": 1, "memory": "81152Mi",
                           **{f"memory-slice-{k}": 1 for k in range(8)}}
    dev = pool.device("gpu-2-mig-3g40gb-9-4")
    assert dev.consumes[0].counters == {"multiprocessors": "60", "copy-engines": "3", "decoders": "3",
                                        "encoders": "0", "jpeg-engines": "3", "ofa-engines": "0",
                                        "memory": "40448Mi", **{f"memory-slice-{k}": "1" for k in (4, 5, 6, 7)}}
    assert dev.attributes["profile"] == {"string": "3g.40gb"} and dev.attributes["vgpuType"] == {"string": "H100-3-40C"}
    assert dev.capacity["memory"] == "40448Mi" and dev.capacity["multiprocessors"] == "60"
    # the published slices carry them (1.35: counters and devices in separate slices)
    slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name=node.node, pool_name=node.node, generation=1,
                          server_version=(1, 35))
    published = {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}
    assert published["gpu-2-counter-set"]["counters"]["memory-slice-7"] == {"value": "1"}


class _InMemoryHost:
    """Just enough of a simulated host for its NVML: one GPU's state, kept in memory."""

    def __init__(self, state: dict, addr: str):
        self.state = {"gpus": [json.loads(json.dumps(next(g for g in state["gpus"] if g["pf"] == addr)))]}

    @contextlib.contextmanager
    def _locked(self):
        yield

    @contextlib.contextmanager
    def _gpu_read(self, pf):
        yield

    def _existing(self, gpu):
        return []

    def _refresh(self, gpu):
        pass

    def _save(self):
        pass


@pytest.mark.parametrize("gpu_index, board", [(1, "A100"), (2, "H100")])
def test_counters_accept_exactly_the_sets_nvml_creates(node, gpu_index, board):
    """Every set of one GPU's placement devices (the whole GPU included): the counters accept it iff
    the simulated NVML creates all its GPU instances. Grown set by set (an accepted set's subsets are
    accepted), each accepted set created on the host, each one-device extension the counters refuse
    refused by NVML too."""
    pool = pool_of(node)
    gpu = discover(node.env, node.io).gpus[gpu_index]
    addr = gpu.address
    devices = [d for d in pool.devices if d.gpu == addr]
    mig_devices = [d for d in devices if d.placement is not None]
    # the simulated host's NVML rules, on an in-memory copy of this GPU (no sysfs to rewrite per try)
    nvml = Mig(SimNvml(_InMemoryHost(node.host.state, addr)))

    def creatable(chosen) -> bool:
        made = []
        try:
            for d in chosen:
                made.append(nvml.create(addr, d.gpu_instance_profile, d.placement.start, d.placement.size))
            return True
        except NvmlError:
            return False
        finally:
            for gi in made:
                nvml.destroy(addr, gi)

    accepted, refused = 0, 0
    frontier = [()]
    seen = {()}
    while frontier:
        current = frontier.pop()
        for k, _d in enumerate(mig_devices):
            if current and k <= current[-1]:
                continue
            grown = current + (k,)
            chosen = [mig_devices[i] for i in grown]
            ok = co_allocatable(pool, [x.name for x in chosen])
            assert ok == creatable(chosen), ([x.name for x in chosen], ok)
            if ok:
                accepted += 1
                if grown not in seen:
                    seen.add(grown)
                    frontier.append(grown)
            else:
                refused += 1
    whole = next(d for d in devices if d.kind == "passthrough")
    assert not any(co_allocatable(pool, [whole.name, d.name]) for d in mig_devices)
    assert accepted > 100 and refused > 100, (accepted, refused)


def test_safe_pool_without_counters_offers_one_profile_within_its_instance_count(node):
    pool = without_counters(pool_of(node), discover(node.env, node.io))
    h100 = [d for d in pool.devices if d.gpu == H100]
    profiles = {d.gpu_instance_profile for d in h100}
    assert len(profiles) == 1
    assert len(h100) <= h100[0].profile_instances
    # no two of them overlap: any subset is creatable
    for a, b in itertools.combinations(h100, 2):
        assert not set(a.placement.slices) & set(b.placement.slices)


def test_prepare_and_unprepare_a_mig_backed_vgpu_and_a_time_sliced_one(tmp_path, node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    refs = {}
    for name, dev in (("vm-a", "gpu-2-mig-3g40gb-9-4"), ("vm-b", "gpu-1-mig-2g10gb-14-2"),
                      ("vm-c", "gpu-0-mig-1g5gb-19-6"), ("vm-d", "gpu-3-vgpu-1gb-0")):
        refs[name] = claims.add(claim_object(name, [("gpu", dev)], node=node.node), str(uuid.uuid4()))
    res = drv.prepare(list(refs.values()))
    assert all(r.error is None for r in res.values()), {k: r.error for k, r in res.items()}
    inv = discover(node.env, node.io)
    h100 = inv.gpu(H100)
    (gi,) = h100.mig.instances
    assert (gi.profile_id, gi.placement.start, gi.placement.size) == (9, 4, 4)
    (v,) = h100.vgpus
    assert v.type_name.endswith("H100-3-40C") and v.gpu_instance == gi.id and gi.vgpu == v.id
    assert [i.placement.start for i in inv.gpu(A100_VFIO).mig.instances] == [2]
    assert [i.placement.start for i in inv.gpu(A100_MDEV).mig.instances] == [6]
    assert inv.gpu(A100_MDEV).vgpus[0].type_name.endswith("A100-1-5C")
    assert inv.gpu(L40S).vgpus[0].type_name.endswith("L40S-1Q")
    # an overlapping placement on the H100 is refused at prepare, nothing made
    clash = claims.add(claim_object("vm-e", [("gpu", "gpu-2-mig-2g20gb-14-4")], node=node.node), str(uuid.uuid4()))
    err = drv.prepare([clash])[clash.uid].error
    assert "takes memory slices 4-5 of GPU" in err and "overlap 4-7 of gpu-2-mig-3g40gb-9-4" in err, err
    assert len(discover(node.env, node.io).gpu(H100).mig.instances) == 1
    # unprepare removes the vGPU and its GPU instance
    out = drv.unprepare(list(refs.values()))
    assert all(e is None for e in out.values()), out
    inv = discover(node.env, node.io)
    assert all(not g.vgpus for g in inv.gpus)
    assert all(not g.mig.instances for g in inv.gpus if g.mig)


def test_a_prepared_mig_claim_is_recreated_at_its_placement_after_a_reboot(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    ref = claims.add(claim_object("vm", [("gpu", "gpu-2-mig-1g20gb-15-6")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([ref])[ref.uid].error is None
    node.host.reboot()
    assert reconcile(node.env, node.io, MIG_DRA, node=node.node).ok  # VFs back
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    assert drv.prepare([ref])[ref.uid].error is None
    (gi,) = discover(node.env, node.io).gpu(H100).mig.instances
    assert (gi.profile_id, gi.placement.start, gi.vgpu is not None) == (15, 6, True)


def test_the_dra_layout_leaves_mig_mode_alone_while_a_claim_holds_a_vgpu(node, paths):
    claims = DictClaims()
    drv = make_driver(node, paths, claims, lambda: pool_of(node))
    ref = claims.add(claim_object("vm", [("gpu", "gpu-2-mig-7g80gb-0-0")], node=node.node), str(uuid.uuid4()))
    assert drv.prepare([ref])[ref.uid].error is None
    vgpu = discover(node.env, node.io).gpu(H100).vgpus[0]
    pid = node.host.spawn_holder([node.env.vfio_group(vgpu.iommu_group)])
    out = reconcile(node.env, node.io, [GpuLayout(all=True, mode="dra", migMode=False)], node=node.node)
    assert not out.matches
    assert discover(node.env, node.io).gpu(H100).mig.enabled
    node.host.kill(pid)


def test_an_8_gpu_h100_node_publishes_nvidia_counts(tmp_path):
    sim = sim_node(tmp_path / "h", "h100-node")
    assert reconcile(sim.env, sim.io, MIG_DRA).matches
    pool = build_pool(discover(sim.env, sim.io), PoolPolicy.default(), server_version=(1, 35))
    assert len(pool.devices) == 8 * (1 + 25)  # the whole GPU and NVIDIA's 25 placements (7+1... of 7 profiles)
    assert len(pool.counter_sets) == 8 and all(len(c.counters) == 15 for c in pool.counter_sets)


def test_a_placement_name_tells_its_gpu_and_type_without_the_pool(node):
    """What the checkpoint rebuild reads back from a device name at the daemon's start."""
    from dra_bridge.kubeletplugin import recovery

    obs = recovery.Observed(inventory=discover(node.env, node.io))
    for d in pool_of(node).devices:
        if d.placement is not None:
            assert recovery._published(d.name, None, obs) == ("vgpu", d.gpu, d.type_id), d.name


def test_capacity_is_placement_aware(node):
    """`vgpuctl capacity`: how many more A100-3-20C fit on the A100 given what is allocated where:
    a 1g.5gb at slice 0 leaves one 3g.20gb (at 4), a 1g.5gb at slice 5 leaves one (at 0), both
    leave none, though memory alone would take one more."""
    from dra_bridge.scheduling import capacity

    slices = build_slices(pool_of(node, (1, 37)), driver="vgpu.kubevirt.io", node_name=node.node,
                          pool_name=node.node, generation=1, server_version=(1, 37))

    def allocated(*devices):
        return [{**claim_object(f"c{k}", [("gpu", d)], node=node.node), "metadata": {"name": f"c{k}",
                 "namespace": "default", "uid": str(uuid.uuid4())}} for k, d in enumerate(devices)]

    def fits(*devices):
        r = capacity.compute(slices, allocated(*devices))
        return r.fits(node.node, 1, "A100-3-20C"), r.fits(node.node, 1, "A100-1-5C")

    assert fits() == (2, 7)
    assert fits("gpu-1-mig-1g5gb-19-0") == (1, 6)
    assert fits("gpu-1-mig-1g5gb-19-0", "gpu-1-mig-1g5gb-19-5") == (0, 5)
    assert fits("gpu-1-passthrough") == (0, 0)


def test_attributes_as_nvidia_names_them(node):
    """``architecture`` on every GPU's devices (from the chip name, as NVML spells it), the GPU's
    NVML UUID as ``uuid`` on the whole GPU and ``parentUUID`` on its MIG placements."""
    pool = pool_of(node)
    arch = {d.gpu: d.attributes["architecture"]["string"] for d in pool.devices}
    assert arch == {A100_MDEV: "Ampere", A100_VFIO: "Ampere", H100: "Hopper", L40S: "Ada Lovelace"}
    uuids = {}
    for gi, addr in enumerate((A100_MDEV, A100_VFIO, H100)):
        whole = pool.device(f"gpu-{gi}-passthrough").attributes["uuid"]["string"]
        assert whole.startswith("GPU-") and uuid.UUID(whole[4:])
        parents = {d.attributes["parentUUID"]["string"] for d in pool.devices if d.gpu == addr and d.placement}
        assert parents == {whole}
        uuids[addr] = whole
    assert len(set(uuids.values())) == 3  # one per GPU
    assert not any("parentUUID" in d.attributes or "uuid" in d.attributes for d in pool.devices if d.gpu == L40S)
