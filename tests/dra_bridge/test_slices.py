"""dra_bridge.pool.slices: ResourceSlice layout per Kubernetes version."""

from __future__ import annotations

import copy
import logging

import kubernetes_validate
import pytest

from dra_bridge.api.k8sname import is_dns_label, is_dns_subdomain
from dra_bridge.api.names import DEFAULT_DRIVER, LABEL_DRIVER, LABEL_NODE
from dra_bridge.pool.devices import GpuPolicy, Pool, PoolPolicy, build_pool
from dra_bridge.pool.slicecheck import check_pool_slices, check_slice
from dra_bridge.pool.slices import (
    build_slices,
    device_to_dict,
    label_value,
    limits_for,
    plan_slices,
    slice_name,
)
from tests.dra_bridge.test_devices import a16_board, a100, inventory, l40s, make_gpu, t4, vtype

VERSIONS = [(1, 34), (1, 35), (1, 36), (1, 37)]
DRIVER = DEFAULT_DRIVER
NODE = "node-a"


def vstr(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def slices_for(pool: Pool, v: tuple[int, int], *, generation: int = 3, node: str = NODE, driver: str = DRIVER):
    return build_slices(pool, driver=driver, node_name=node, pool_name=node, generation=generation, server_version=v)


def mixed_node():
    return inventory(t4(0, "0000:3b:00.0"), a100(1, "0000:65:00.0"), l40s(2, "0000:ca:00.0"), *a16_board(3))


def sixteen_l40s():
    return inventory(*[l40s(i, f"0000:{0x10 + i:02x}:00.0", a_series=True) for i in range(16)])


NODES = {
    "t4": lambda: inventory(t4()),
    "a100": lambda: inventory(a100()),
    "l40s": lambda: inventory(l40s()),
    "a16": lambda: inventory(*a16_board()),
    "mixed": mixed_node,
}


def published_devices(slices: list[dict]) -> list[dict]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def assert_well_formed(slices: list[dict], v: tuple[int, int], pool: Pool, dropped: set[str] = frozenset()):
    assert slices, "expected slices"
    for s in slices:
        assert kubernetes_validate.validate(s, desired_version=vstr(v), strict=True) == vstr(v)
    assert check_pool_slices(slices, v) == []
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    assert len(gens) == 1 and counts == {len(slices)}
    for s in slices:
        assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
        assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
        assert s["spec"]["pool"]["name"] == NODE
        assert is_dns_subdomain(s["metadata"]["name"])
        assert s["metadata"]["labels"][LABEL_DRIVER] == DRIVER
        assert s["metadata"]["labels"][LABEL_NODE] == NODE
    names = [d["name"] for d in published_devices(slices)]
    assert len(names) == len(set(names))
    assert all(is_dns_label(n) for n in names)
    assert set(names) == {d.name for d in pool.devices} - set(dropped)
    published_sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or []]
    assert sorted(published_sets) == sorted(c.name for c in pool.counter_sets)
    has_groups = any("compatibilityGroups" in c for d in published_devices(slices) for c in d.get("consumesCounters", []))
    lim = limits_for(v)
    for s in slices:
        devs = s["spec"].get("devices") or []
        sets = s["spec"].get("sharedCounters") or []
        if v >= (1, 35):
            assert not (devs and sets), "1.35+ never mixes devices and sharedCounters"
            assert len(devs) <= 64 and len(sets) <= 8
        else:
            assert len(devs) <= 128
            assert sum(len(c["counters"]) for c in sets) <= 32
            assert sum(len(c["counters"]) for d in devs for c in d.get("consumesCounters", [])) <= 1024
            local = {c["name"] for c in sets}
            assert all(c["counterSet"] in local for d in devs for c in d.get("consumesCounters", []))
        for d in devs:
            assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= lim.attributes_and_capacity
    return has_groups


@pytest.mark.parametrize("v", VERSIONS, ids=vstr)
@pytest.mark.parametrize("node", list(NODES))
@pytest.mark.parametrize("mixed", [False, True], ids=["equal", "mixed"])
def test_every_slice_validates(node, v, mixed):
    pool = build_pool(NODES[node](), PoolPolicy(others=GpuPolicy(mixed_size=mixed)), DRIVER, server_version=v)
    plan = plan_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=3, server_version=v)
    has_groups = assert_well_formed(plan.slices, v, pool, set(plan.dropped))
    assert has_groups == (v >= (1, 37) and not mixed)


def test_split_layout_counters_first():
    pool = build_pool(mixed_node(), PoolPolicy.default(), server_version=(1, 35))
    slices = slices_for(pool, (1, 35))
    # 7 GPUs: one counters-only slice, then one devices-only slice per GPU (64 devices max)
    assert [s["metadata"]["labels"]["vgpu.kubevirt.io/slice-role"] for s in slices][:2] == ["counters", "devices"]
    assert list(slices[0]["spec"]) == ["driver", "nodeName", "pool", "sharedCounters"]
    assert len(slices[0]["spec"]["sharedCounters"]) == 7
    assert [s["metadata"]["name"] for s in slices] == [f"node-a-vgpu-kubevirt-io-{k}" for k in range(len(slices))]
    # devices of one GPU never share a slice with another GPU's
    for s in slices[1:]:
        sets = {c["counterSet"] for d in s["spec"]["devices"] for c in d["consumesCounters"]}
        assert len(sets) == 1


def test_combined_layout_packs_gpus():
    pool = build_pool(mixed_node(), PoolPolicy.default(), server_version=(1, 34))
    slices = slices_for(pool, (1, 34))
    assert all(s["metadata"]["labels"]["vgpu.kubevirt.io/slice-role"] == "combined" for s in slices)
    # t4 (1 + 32 devices) and a100 (1 + 10) share the first slice
    first = {c["name"] for c in slices[0]["spec"]["sharedCounters"]}
    assert {"gpu-0-counter-set", "gpu-1-counter-set"} <= first


def test_combined_layout_respects_summed_counters():
    gpus = [make_gpu(i, f"0000:{0x10 + i:02x}:00.0", "0x2330", "H100", "none", []) for i in range(20)]
    pool = build_pool(inventory(*gpus), PoolPolicy.default(), server_version=(1, 34))
    slices = slices_for(pool, (1, 34))
    # two counters per GPU, 32 per slice: 16 GPUs in the first slice, 4 in the second
    assert [len(s["spec"]["sharedCounters"]) for s in slices] == [16, 4]
    assert_well_formed(slices, (1, 34), pool)


def test_sixteen_gpus_at_scale():
    inv = sixteen_l40s()
    expected = {
        # <1.37: one size (1 GiB: 32 slots the 1B, 1Q and 1A share) + passthrough = 33 devices per GPU
        (1, 34): 6,  # three GPUs per combined slice (4 x 33 > 128)
        (1, 35): 2 + 16,  # 16 sets in 2 counter slices; 33 devices -> one slice per GPU
        (1, 36): 2 + 16,
        # 1.37: every size's slots: 32 + 24 + 16 + 12 + 8 + 6 + 4 + 3 + 2 + 1 + passthrough = 109
        # devices -> 2 slices of <= 64 per GPU
        (1, 37): 2 + 16 * 2,
    }
    for v, n in expected.items():
        pool = build_pool(inv, PoolPolicy.default(), DRIVER, server_version=v)
        per_gpu = 109 if v >= (1, 37) else 33
        assert len(pool.devices) == 16 * per_gpu
        plan = plan_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=7, server_version=v)
        assert plan.dropped == [] and plan.warnings == []
        assert len(plan.slices) == n, v
        assert {s["spec"]["pool"]["generation"] for s in plan.slices} == {7}
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in plan.slices} == {n}
        assert_well_formed(plan.slices, v, pool)


def test_134_overflow_drops_lowest_priority_types(caplog):
    # no real board's slots pass a 1.34 slice (an L40S: 109 devices): a made-up board whose types of
    # one size differ in their limits (so they do not share slots) does: 1 + 64 + 48 + 40 = 153 > 128
    types = [vtype("nvidia-950", "NVIDIA X-1Q", 64, fb=1024), vtype("nvidia-951", "NVIDIA X-1B", 48, fb=1024),
             vtype("nvidia-952", "NVIDIA X-2Q", 40, fb=2048)]
    gpu = make_gpu(0, "0000:ca:00.0", "0x0001", "X", "mdev", types)
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(mixed_size=True)), server_version=(1, 34))
    assert len(pool.devices) == 153
    with caplog.at_level(logging.WARNING, logger="dra_bridge.pool.slices"):
        plan = plan_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=1, server_version=(1, 34))
        build_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=1, server_version=(1, 34))
    assert len(plan.slices) == 1
    kept = [d["name"] for d in plan.slices[0]["spec"]["devices"]]
    assert kept[0] == "gpu-0-passthrough" and len(kept) <= 128
    # whole slot groups only: a group is published with all its slots or not at all
    by_type: dict[str, int] = {}
    for d in pool.devices:
        if d.name in kept and d.type_id:
            by_type[d.type_id] = by_type.get(d.type_id, 0) + 1
    maxes = {t.id: t.max_instances for t in gpu.types}
    assert all(n == maxes[t] for t, n in by_type.items())
    # kept in the pool's (priority) order, skipping those that did not fit
    assert "nvidia-950" in by_type and "nvidia-951" in by_type and "nvidia-952" not in by_type
    assert plan.dropped and set(plan.dropped) | set(kept) == {d.name for d in pool.devices}
    assert any("GPU 0000:ca:00.0" in w and "1.34" in w for w in plan.warnings)
    assert any("not published" in r.getMessage() for r in caplog.records)
    assert_well_formed(plan.slices, (1, 34), pool, set(plan.dropped))
    # 1.35+ has no such limit
    plan = plan_slices(pool, driver=DRIVER, node_name=NODE, pool_name=NODE, generation=1, server_version=(1, 35))
    assert plan.dropped == []


def test_groups_only_on_137():
    pool = build_pool(inventory(t4()), PoolPolicy.default(), server_version=(1, 37))
    on137 = slices_for(pool, (1, 37))
    consumptions = [c for d in published_devices(on137) for c in d["consumesCounters"]]
    assert {tuple(c.get("compatibilityGroups", ())) for c in consumptions} == {
        (), ("fb-1024",), ("fb-2048",), ("fb-4096",), ("fb-8192",), ("fb-16384",)
    }
    pt = next(d for d in published_devices(on137) if d["name"] == "gpu-0-passthrough")
    assert "compatibilityGroups" not in pt["consumesCounters"][0]
    # the pool built for 1.37 relies on groups: publishing it to 1.36 is refused
    with pytest.raises(ValueError, match="compatibility groups"):
        slices_for(pool, (1, 36))
    # a pool built for 1.36 (one size) loses its groups without harm
    pool36 = build_pool(inventory(t4()), PoolPolicy.default(), server_version=(1, 36))
    for v in [(1, 34), (1, 35), (1, 36)]:
        s = slices_for(pool36, v)
        assert not any("compatibilityGroups" in c for d in published_devices(s) for c in d["consumesCounters"])
    # ...and still carries them on 1.37 (one group, harmless)
    assert any("compatibilityGroups" in c for d in published_devices(slices_for(pool36, (1, 37))) for c in d["consumesCounters"])


def test_wire_form_of_a_device():
    pool = build_pool(inventory(l40s()), PoolPolicy.default(), server_version=(1, 37))
    d = device_to_dict(pool.device("gpu-0-vgpu-1gb-0"), compatibility_groups=True)
    assert d["capacity"] == {"memory": {"value": "1Gi"}}
    assert d["consumesCounters"] == [
        {
            "counterSet": "gpu-0-counter-set",
            "counters": {"memory": {"value": "1536Mi"}, "vgpus": {"value": "1"}},
            "compatibilityGroups": ["fb-1024"],
        }
    ]
    assert d["attributes"]["type"] == {"string": "vgpu"}
    assert "compatibilityGroups" not in device_to_dict(pool.device("gpu-0-vgpu-1gb-0"))["consumesCounters"][0]
    s = slices_for(pool, (1, 37))
    sets = s[0]["spec"]["sharedCounters"]
    assert sets == [{"name": "gpu-0-counter-set", "counters": {"memory": {"value": "48Gi"}, "vgpus": {"value": "32"}}}]


def test_names_are_deterministic_and_bounded():
    pool = build_pool(mixed_node(), PoolPolicy.default(), server_version=(1, 36))
    a = slices_for(pool, (1, 36))
    b = slices_for(pool, (1, 36))
    assert a == b
    assert slice_name(NODE, DRIVER, 0) == "node-a-vgpu-kubevirt-io-0"
    assert slice_name(NODE, DRIVER, 0, pool_name="other") == "node-a-vgpu-kubevirt-io-other-0"
    long_node = ".".join(["n" * 60] * 4)  # 243 characters, a valid node name
    s = build_slices(pool, driver="gpu.example.com", node_name=long_node, pool_name=long_node, generation=1,
                     server_version=(1, 36))
    for x in s:
        assert is_dns_subdomain(x["metadata"]["name"]) and len(x["metadata"]["name"]) <= 253
        assert len(x["metadata"]["labels"][LABEL_NODE]) <= 63
        kubernetes_validate.validate(x, desired_version="1.36", strict=True)
    assert len({x["metadata"]["name"] for x in s}) == len(s)
    assert label_value("node-a") == "node-a"
    assert label_value(long_node) != label_value(long_node[:-1] + "m")


def test_empty_pool_and_bad_input():
    assert slices_for(Pool(), (1, 35)) == []
    pool = build_pool(inventory(t4()), PoolPolicy.default(), server_version=(1, 34))
    with pytest.raises(ValueError, match="1.34"):
        slices_for(pool, (1, 33))
    with pytest.raises(ValueError):
        slices_for(pool, (1, 34), driver="UPPER")
    with pytest.raises(ValueError):
        slices_for(pool, (1, 34), generation=-1)


def test_checker_catches_violations():
    pool = build_pool(inventory(l40s()), PoolPolicy.default(), server_version=(1, 37))
    s137 = slices_for(pool, (1, 37))
    # a 1.37 device slice shown to a 1.36 server: groups are unknown there
    assert any("compatibilityGroups" in e for e in check_slice(s137[1], (1, 36)))
    combined = build_pool(inventory(t4()), PoolPolicy.default(), server_version=(1, 34))
    c = slices_for(combined, (1, 34))[0]
    assert check_slice(c, (1, 34)) == []
    assert any("only one of sharedCounters or devices" in e for e in check_slice(c, (1, 35)))
    too_many = copy.deepcopy(s137[1])
    extra = copy.deepcopy(too_many["spec"]["devices"][0])
    too_many["spec"]["devices"] = [dict(extra, name=f"d-{i}") for i in range(65)]
    assert any("65 devices" in e for e in check_slice(too_many, (1, 37)))
    bad = copy.deepcopy(s137[1])
    bad["spec"]["devices"][0]["attributes"]["typeName"] = {"string": "x" * 65}
    bad["spec"]["devices"][0]["name"] = "Not_A_Label"
    errs = check_slice(bad, (1, 37))
    assert any("longer than 64" in e for e in errs) and any("DNS label" in e for e in errs)
    # pool-wide: a device whose counter set is missing, mismatched counts
    broken = copy.deepcopy(s137[1:])
    errs = check_pool_slices(broken, (1, 37))
    assert any("unknown counter set" in e for e in errs) and any("resourceSliceCount" in e for e in errs)
