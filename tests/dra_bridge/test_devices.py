"""dra_bridge.pool.devices: the device model and its counters."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from dra_bridge.api.k8sname import is_dns_label, truncate_utf8
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import (
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    GpuPolicy,
    Pool,
    PoolPolicy,
    build_pool,
    co_allocatable,
    format_mib,
)
from mdev_manager.models import Gpu, Inventory, Vgpu, VgpuType
from mdev_manager.names import framebuffer_mib_from_name, is_mig_backed, short_type_name

V137 = (1, 37)
V136 = (1, 36)


def serving(pool, type_id: str) -> list:
    """The devices a claim for ``type_id`` may get: its size slots (shared with the other series of its size)."""
    return [d for d in pool.devices if d.type_id == type_id or type_id in d.type_choices.values()]

# --------------------------------------------------------------------------- inventory builders
# Type data from the NVIDIA tables in the reference (vgpu-types.md).


def vtype(type_id: str, name: str, max_instances: int | None, framework: str = "mdev", fb: int | None = None) -> VgpuType:
    return VgpuType(
        id=type_id,
        name=name,
        short_name=short_type_name(name),
        framework=framework,
        max_instances=max_instances,
        available_instances=max_instances or 0,
        framebuffer_mib=fb if fb is not None else framebuffer_mib_from_name(name),
        mig_backed=is_mig_backed(name),
    )


def series(prefix: str, board: str, start: int, sizes: list[tuple[int, int]], letter: str, *,
           mdev: bool = True) -> list[VgpuType]:
    fw = "mdev" if mdev else "vendor-vfio"
    return [
        vtype(f"nvidia-{start + i}" if mdev else str(start + i), f"{prefix} {board}-{gb}{letter}", n, fw)
        for i, (gb, n) in enumerate(sizes)
    ]


T4_SIZES = [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
L40S_SIZES = [(1, 32), (2, 24), (3, 16), (4, 12), (6, 8), (8, 6), (12, 4), (16, 3), (24, 2), (48, 1)]


def make_gpu(
    index: int,
    address: str,
    device_id: str,
    product: str,
    framework: str,
    types: list[VgpuType],
    total_vfs: int = 0,
    numa: int | None = 0,
    vendor: str = "0x10de",
) -> Gpu:
    return Gpu(
        address=address,
        vendor_id=vendor,
        device_id=device_id,
        class_code="0x030200",
        product_name=product,
        numa_node=numa,
        index=index,
        framework=framework,
        sriov_total_vfs=total_vfs,
        sriov_num_vfs=total_vfs,
        types=types,
    )


def t4(index: int = 0, address: str = "0000:3b:00.0") -> Gpu:
    types = [vtype("nvidia-222", "GRID T4-1B", 16)]
    types += series("GRID", "T4", 230, T4_SIZES, "Q")
    types += series("GRID", "T4", 319, [(4, 4), (8, 2), (16, 1)], "C")
    return make_gpu(index, address, "0x1eb8", "Tesla T4", "mdev", types)


def a100(index: int = 0, address: str = "0000:65:00.0") -> Gpu:
    types = series("NVIDIA", "A100", 468, [(4, 10), (5, 8), (8, 5), (10, 4), (20, 2), (40, 1)], "C")
    types += [
        vtype("nvidia-474", "NVIDIA A100-1-5C", 7),
        vtype("nvidia-475", "NVIDIA A100-2-10C", 3),
        vtype("nvidia-476", "NVIDIA A100-3-20C", 2),
        vtype("nvidia-477", "NVIDIA A100-4-20C", 1),
        vtype("nvidia-478", "NVIDIA A100-7-40C", 1),
        vtype("nvidia-706", "NVIDIA A100-1-5CME", 1),
    ]
    return make_gpu(index, address, "0x20f1", "GA100 [A100 PCIe 40GB]", "mdev-sriov", types, total_vfs=16)


def l40s(index: int = 0, address: str = "0000:ca:00.0", *, a_series: bool = False) -> Gpu:
    types = [
        vtype("1145", "NVIDIA L40S-1B", 32, "vendor-vfio"),
        vtype("1146", "NVIDIA L40S-2B", 24, "vendor-vfio"),
        vtype("2164", "NVIDIA L40S-3B", 16, "vendor-vfio"),
    ]
    types += series("NVIDIA", "L40S", 1147, L40S_SIZES, "Q", mdev=False)
    if a_series:
        types += series("NVIDIA", "L40S", 1157, L40S_SIZES, "A", mdev=False)
    return make_gpu(index, address, "0x26b9", "AD102GL [L40S]", "vendor-vfio", types, total_vfs=32, numa=1)


def a16_board(first_index: int = 0, bus: int = 0x81) -> list[Gpu]:
    gpus = []
    for i in range(4):
        types = [vtype("nvidia-709", "NVIDIA A16-1B", 16), vtype("nvidia-710", "NVIDIA A16-2B", 8)]
        types += series("NVIDIA", "A16", 711, T4_SIZES, "Q")
        types += series("NVIDIA", "A16", 721, [(4, 4), (8, 2), (16, 1)], "C")
        gpus.append(
            make_gpu(first_index + i, f"0000:{bus + i:02x}:00.0", "0x25b6", "GA107GL [A16]", "mdev-sriov", types, total_vfs=16)
        )
    return gpus


def inventory(*gpus: Gpu) -> Inventory:
    return Inventory(node="node-a", gpus=list(gpus))


# --------------------------------------------------------------------------- the board rule


def by_gpu(pool: Pool, gpu: Gpu) -> dict[str, list[str]]:
    """vGPU device names of one GPU, grouped by type id."""
    out: dict[str, list[str]] = {}
    for d in pool.devices:
        if d.gpu == gpu.address and d.kind == "vgpu":
            out.setdefault(d.type_id, []).append(d.name)
    return out


def board_allows(gpu: Gpu, counts: dict[str, int], *, equal_size: bool) -> bool:
    """The hardware rule: sum of count / max_instances <= 1, at most the VF count of vGPUs, and
    (equal-size mode) a single framebuffer size."""
    types = {t.id: t for t in gpu.types}
    used = {k: v for k, v in counts.items() if v}
    if sum(Fraction(c, types[t].max_instances) for t, c in used.items()) > 1:
        return False
    if gpu.sriov_total_vfs and sum(used.values()) > gpu.sriov_total_vfs:
        return False
    if equal_size and len({types[t].framebuffer_mib for t in used}) > 1:
        return False
    return True


def feasible_by_counters(pool: Pool, gpu: Gpu, *, groups: bool) -> set[tuple[int, ...]]:
    """Every count vector (per offered type) that the scheduler's counter model admits."""
    names = by_gpu(pool, gpu)
    tids = list(names)
    out: set[tuple[int, ...]] = set()

    def dfs(i: int, chosen: list[str], counts: list[int]) -> None:
        if i == len(tids):
            out.add(tuple(counts))
            return
        for c in range(len(names[tids[i]]) + 1):
            pick = chosen + names[tids[i]][:c]
            if c and not co_allocatable(pool, pick, compatibility_groups=groups):
                break  # monotone: more of the same type cannot fit either
            dfs(i + 1, pick, counts + [c])

    dfs(0, [], [])
    return out


def feasible_by_board(pool: Pool, gpu: Gpu, *, equal_size: bool) -> set[tuple[int, ...]]:
    """Every count vector (per offered type) the hardware rule admits (pruned enumeration)."""
    names = by_gpu(pool, gpu)
    tids = list(names)
    out: set[tuple[int, ...]] = set()

    def dfs(i: int, counts: list[int]) -> None:
        if i == len(tids):
            out.add(tuple(counts))
            return
        for c in range(len(names[tids[i]]) + 1):
            trial = dict(zip(tids, counts + [c], strict=False))
            if c and not board_allows(gpu, trial, equal_size=equal_size):
                break
            dfs(i + 1, counts + [c])

    dfs(0, [])
    return out


@pytest.mark.parametrize(
    "gpu_factory, mixed",
    [(t4, False), (t4, True), (a100, False), (a100, True), (lambda: a16_board()[2], False)],
    ids=["t4-equal", "t4-mixed", "a100-equal", "a100-mixed", "a16-equal"],
)
def test_counters_admit_exactly_the_board_rule(gpu_factory, mixed):
    gpu = gpu_factory()
    pool = build_pool(
        inventory(gpu), PoolPolicy(others=GpuPolicy(passthrough=False, mixed_size=mixed)), server_version=V137
    )
    by_counters = feasible_by_counters(pool, gpu, groups=True)
    by_board = feasible_by_board(pool, gpu, equal_size=not mixed)
    assert by_counters == by_board
    assert len(by_counters) > 10


@pytest.mark.parametrize("mixed", [False, True])
def test_l40s_random_allocations_are_creatable(mixed):
    """L40S is too large to enumerate: random greedy allocations, each step checked."""
    gpu = l40s(a_series=True)
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(passthrough=False, mixed_size=mixed)), server_version=V137)
    vgpus = [d for d in pool.devices if d.kind == "vgpu"]
    rng = random.Random(1234)
    types = {t.id: t for t in gpu.types}
    saw_full = 0
    for _ in range(25):
        order = vgpus[:]
        rng.shuffle(order)
        chosen: list[str] = []
        counts: dict[str, int] = {}
        for d in order:
            if co_allocatable(pool, chosen + [d.name]):
                chosen.append(d.name)
                counts[d.type_id] = counts.get(d.type_id, 0) + 1
                assert board_allows(gpu, counts, equal_size=not mixed), counts
        # the greedy pass stopped because nothing else fits: the board must agree
        left = {d.type_id for d in vgpus if d.name not in chosen}
        for tid in left:
            more = {**counts, tid: counts.get(tid, 0) + 1}
            assert not board_allows(gpu, more, equal_size=not mixed), (counts, tid)
        used = sum(Fraction(c, types[t].max_instances) for t, c in counts.items())
        saw_full += used == 1 or len(chosen) == 32
    assert saw_full > 0


def test_l40s_caps_at_32_and_shares_are_exact():
    gpu = l40s()
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V137)
    cs = pool.counter_set("gpu-0-counter-set")
    assert cs.counters == {"memory": "48Gi", "vgpus": 32}
    one_q = serving(pool, "1147")
    assert len(one_q) == 32
    assert one_q[0].consumes[0].counters == {"memory": "1536Mi", "vgpus": "1"}
    assert one_q[0].capacity == {"memory": "1Gi"}
    assert co_allocatable(pool, [d.name for d in one_q])
    # every type: max_instances of it fill the GPU exactly and one more does not exist
    for t in gpu.types:
        devs = [d.name for d in serving(pool, t.id)]
        assert len(devs) == t.max_instances
        assert co_allocatable(pool, devs)
    # 16 x 3Q (3 GiB each, 48 GiB) and one 1Q on top would overflow the board
    three_q = [d.name for d in serving(pool, "1149")]
    assert not co_allocatable(pool, three_q + [one_q[0].name])


def test_t4_counters_names_and_groups():
    gpu = t4()
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V137)
    assert [c.model_dump() for c in pool.counter_sets] == [
        {"name": "gpu-0-counter-set", "counters": {"memory": "16Gi", "vgpus": 16}}
    ]
    pt = pool.device("gpu-0-passthrough")
    assert pt.kind == "passthrough"
    assert pt.consumes[0].counters == {"memory": "16Gi", "vgpus": "16"}
    assert pt.consumes[0].compatibility_groups == []
    names = [d.name for d in serving(pool, "nvidia-230")]
    assert names == [f"gpu-0-vgpu-1gb-{k}" for k in range(16)]  # one slot per instance of the size
    d = pool.device("gpu-0-vgpu-1gb-3")
    assert d.type_id == "nvidia-230" and d.attributes["profile"] == {"string": "T4-1Q"}  # Q by default
    assert d.type_choices == {"T4-1Q": "nvidia-230", "T4-1B": "nvidia-222"}
    assert d.attributes["vgpuTypes"] == {"string": " T4-1Q T4-1B "}
    assert d.consumes[0].counters == {"memory": "1Gi", "vgpus": "1"}
    assert d.consumes[0].compatibility_groups == ["fb-1024"]
    assert pool.device("gpu-0-vgpu-4gb-0").consumes[0].compatibility_groups == ["fb-4096"]
    assert "nvidia-319" in pool.device("gpu-0-vgpu-4gb-0").type_choices.values()  # T4-4C shares the 4 GB slots
    # one size's slots hold any of its series together; different sizes may not share the GPU
    assert co_allocatable(pool, [f"gpu-0-vgpu-1gb-{k}" for k in range(16)])
    assert not co_allocatable(pool, ["gpu-0-vgpu-1gb-0", "gpu-0-vgpu-2gb-0"])
    assert co_allocatable(pool, ["gpu-0-vgpu-1gb-0", "gpu-0-vgpu-2gb-0"], compatibility_groups=False)
    assert len([d for d in pool.devices if d.kind == "vgpu"]) == 31  # 16 + 8 + 4 + 2 + 1 slots
    assert pool.warnings == []


def test_a100_excludes_mig_backed_and_caps_vgpus():
    gpu = a100()
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V137)
    tids = {t for d in pool.devices if d.kind == "vgpu" for t in d.type_choices.values()}
    assert tids == {f"nvidia-{n}" for n in range(468, 474)}
    cs = pool.counter_set("gpu-0-counter-set")
    assert cs.counters == {"memory": "40Gi", "vgpus": 10}
    assert pool.device("gpu-0-vgpu-4gb-3").consumes[0].counters == {"memory": "4Gi", "vgpus": "1"}
    assert len(serving(pool, "nvidia-468")) == 10
    # the 5C type: 8 instances of 5 GiB on 40 GiB
    assert pool.device("gpu-0-vgpu-5gb-7").consumes[0].counters["memory"] == "5Gi"


def test_explicit_mig_backed_and_unknown_types_warn():
    gpu = a100()
    pol = PoolPolicy(gpus={"0000:65:00.0": GpuPolicy(vgpu_types=["A100-1-5C", "nvidia-469", "NVIDIA A100-4C", "bogus"])})
    pool = build_pool(inventory(gpu), pol, server_version=V137)
    assert {d.type_id for d in pool.devices if d.kind == "vgpu"} == {"nvidia-469", "nvidia-468"}
    assert any("MIG-backed" in w for w in pool.warnings)
    assert any("'bogus'" in w for w in pool.warnings)
    # policy order is the device order (the priority used when a 1.34 slice overflows)
    kinds = [d.type_id for d in pool.devices if d.kind == "vgpu"]
    assert kinds.index("nvidia-469") < kinds.index("nvidia-468")


def test_passthrough_excludes_every_vgpu():
    inv = inventory(t4(0, "0000:3b:00.0"), a100(1, "0000:65:00.0"), l40s(2, "0000:ca:00.0"), *a16_board(3))
    for mixed in (False, True):
        pool = build_pool(inv, PoolPolicy(others=GpuPolicy(mixed_size=mixed)), server_version=V137)
        for gpu in inv.gpus:
            pt = f"gpu-{gpu.index}-passthrough"
            assert co_allocatable(pool, [pt])
            for d in pool.devices:
                if d.gpu == gpu.address and d.kind == "vgpu":
                    assert not co_allocatable(pool, [pt, d.name])
                    assert not co_allocatable(pool, [pt, d.name], compatibility_groups=False)
        # ...but a passthrough GPU and a vGPU of another GPU are independent
        assert co_allocatable(pool, ["gpu-0-passthrough", "gpu-1-vgpu-4gb-0"])


def test_a16_board_has_one_counter_set_per_gpu():
    gpus = a16_board()
    pool = build_pool(inventory(*gpus), PoolPolicy.default(), server_version=V137)
    assert [c.name for c in pool.counter_sets] == [f"gpu-{i}-counter-set" for i in range(4)]
    for c in pool.counter_sets:
        assert c.counters == {"memory": "16Gi", "vgpus": 16}
    # a full GPU 0 does not stop GPU 1
    full0 = [d.name for d in serving(pool, "nvidia-711") if d.gpu == gpus[0].address]
    assert co_allocatable(pool, full0 + ["gpu-1-vgpu-16gb-0"])
    assert pool.device("gpu-2-vgpu-1gb-0").attributes["parentPciBusID"] == {"string": gpus[2].address}


# --------------------------------------------------------------------------- servers < 1.37


def sizes_of(pool: Pool, gpu: Gpu) -> set[str]:
    return {d.capacity["memory"] for d in pool.devices if d.gpu == gpu.address and d.kind == "vgpu"}


def test_old_server_empty_gpu_publishes_smallest_size_only():
    gpu = t4()
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V136)
    assert sizes_of(pool, gpu) == {"1Gi"}
    assert {t for d in pool.devices if d.kind == "vgpu" for t in d.type_choices.values()} == {"nvidia-222", "nvidia-230"}
    assert pool.device("gpu-0-passthrough") is not None
    # anything the counters admit is creatable, even with groups ignored
    assert feasible_by_counters(pool, gpu, groups=False) == feasible_by_board(pool, gpu, equal_size=True)


def test_old_server_uses_configured_size():
    gpu = t4()
    pol = PoolPolicy(gpus={"0000:3b:00.0": GpuPolicy(equal_size_fb_mib=4096)})
    pool = build_pool(inventory(gpu), pol, server_version=(1, 34))
    assert sizes_of(pool, gpu) == {"4Gi"}
    assert {t for d in pool.devices if d.kind == "vgpu" for t in d.type_choices.values()} == {"nvidia-232", "nvidia-319"}
    # the counter set still describes the whole GPU; 4 x 4Gi fill it
    assert pool.counter_sets[0].counters == {"memory": "16Gi", "vgpus": 16}


def test_old_server_follows_present_vgpus():
    gpu = t4()
    gpu.vgpus = [
        Vgpu(id="aa618089-8b16-4d01-a136-25a0f3c73123", framework="mdev", type_id="nvidia-231",
             type_name="GRID T4-2Q", parent=gpu.address, gpu=gpu.address)
    ]
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V136)
    assert sizes_of(pool, gpu) == {"2Gi"}
    # the configured size disagrees with what is there: no vGPU, passthrough stays, a warning
    pol = PoolPolicy(others=GpuPolicy(equal_size_fb_mib=1024))
    pool = build_pool(inventory(gpu), pol, server_version=V136)
    assert sizes_of(pool, gpu) == set()
    assert pool.device("gpu-0-passthrough") is not None
    assert any("holds 2048 MiB" in w for w in pool.warnings)


def test_old_server_configured_size_not_offered():
    gpu = a100()
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(equal_size_fb_mib=3072)), server_version=V136)
    assert sizes_of(pool, gpu) == set()
    assert any("3072 MiB" in w for w in pool.warnings)


def test_newer_server_ignores_equal_size_setting_and_groups():
    gpu = t4()
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(equal_size_fb_mib=4096)), server_version=V137)
    assert sizes_of(pool, gpu) == {"1Gi", "2Gi", "4Gi", "8Gi", "16Gi"}


def test_mixed_size_publishes_all_sizes_without_groups_on_any_server():
    gpu = t4()
    for v in [(1, 34), V136, V137]:
        pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(mixed_size=True)), server_version=v)
        assert sizes_of(pool, gpu) == {"1Gi", "2Gi", "4Gi", "8Gi", "16Gi"}
        assert all(not c.compatibility_groups for d in pool.devices for c in d.consumes)


def test_default_server_version_is_the_safe_one():
    pool = build_pool(inventory(t4()), PoolPolicy.default())
    assert sizes_of(pool, t4()) == {"1Gi"}


# --------------------------------------------------------------------------- policy


def test_policy_selects_gpus_and_passthrough():
    inv = inventory(t4(0, "0000:3b:00.0"), a100(1, "0000:65:00.0"))
    pol = PoolPolicy(gpus={"65:00.0": GpuPolicy(passthrough=False, vgpu_types=["A100-20C"])})
    pool = build_pool(inv, pol, server_version=V137)
    assert [c.name for c in pool.counter_sets] == ["gpu-1-counter-set"]
    assert [d.name for d in pool.devices] == ["gpu-1-vgpu-20gb-0", "gpu-1-vgpu-20gb-1"]
    # passthrough only: the counter set is still there (one per physical GPU)
    pol = PoolPolicy(others=GpuPolicy(vgpu_types=[]))
    pool = build_pool(inv, pol, server_version=V137)
    assert [d.name for d in pool.devices] == ["gpu-0-passthrough", "gpu-1-passthrough"]
    assert len(pool.counter_sets) == 2
    # nothing offered: nothing published
    pool = build_pool(inv, PoolPolicy(others=GpuPolicy(passthrough=False, vgpu_types=[])), server_version=V137)
    assert pool.devices == [] and pool.counter_sets == []
    # a policy entry for an absent GPU is reported
    pool = build_pool(inv, PoolPolicy(gpus={"0000:99:00.0": GpuPolicy()}), server_version=V137)
    assert pool.devices == [] and any("0000:99:00.0" in w for w in pool.warnings)


def test_policy_rejects_bad_addresses():
    with pytest.raises(ValueError):
        PoolPolicy(gpus={"../etc": GpuPolicy()})
    with pytest.raises(ValueError):
        PoolPolicy(gpus={"0000:3b:00.0": GpuPolicy(), "3b:00.0": GpuPolicy()})
    with pytest.raises(ValueError):
        build_pool(inventory(t4()), PoolPolicy.default(), driver="Not_A.Driver")


def test_default_policy_can_turn_passthrough_off():
    pool = build_pool(inventory(t4()), PoolPolicy.default(passthrough=False), server_version=V137)
    assert all(d.kind == "vgpu" for d in pool.devices)


# --------------------------------------------------------------------------- attributes and names


def test_attributes_follow_conventions():
    gpu = l40s()
    pool = build_pool(
        inventory(gpu), PoolPolicy.default(), server_version=V137, pcie_roots={"0000:CA:00.0": "pci0000:c0"}
    )
    pt = pool.device("gpu-0-passthrough")
    assert pt.attributes["type"] == {"string": "passthrough"}
    assert pt.attributes["framework"] == {"string": "vfio-pci"}
    assert pt.attributes["profile"] == {"string": "AD102GL [L40S]"}
    assert pt.attributes[ATTR_PCI_BUS_ID] == {"string": "0000:ca:00.0"}
    assert pt.attributes[ATTR_PCIE_ROOT] == {"string": "pci0000:c0"}
    assert pt.attributes["numaNode"] == {"int": 1}
    assert pt.attributes["gpuIndex"] == {"int": 0}
    assert pt.attributes["vendorId"] == {"string": "0x10de"}
    assert pt.attributes["deviceId"] == {"string": "0x26b9"}
    assert pt.capacity == {"memory": "48Gi"}
    assert pt.type_id is None

    v = pool.device("gpu-0-vgpu-2gb-5")
    assert v.kind == "vgpu" and v.type_id == "1148" and v.gpu == "0000:ca:00.0"
    a = v.attributes
    assert a["type"] == {"string": "vgpu"}
    assert a["profile"] == {"string": "L40S-2Q"}
    assert a["typeName"] == {"string": "NVIDIA L40S-2Q"}
    assert a["typeId"] == {"string": "1148"}
    assert a["framework"] == {"string": "vendor-vfio"}
    assert a["productName"] == {"string": "AD102GL [L40S]"}
    assert a["parentPciBusID"] == {"string": "0000:ca:00.0"}
    assert a[ATTR_PCIE_ROOT] == {"string": "pci0000:c0"}
    assert a["series"] == {"string": "Q"}
    assert ATTR_PCI_BUS_ID not in a  # KubeVirt would take it for a PCI device
    assert v.capacity == {"memory": "2Gi"}
    assert a["vgpuTypes"] == {"string": " L40S-2Q L40S-2B "}  # the size's types, the default first
    assert v.type_choices == {"L40S-2Q": "1148", "L40S-2B": "1146"}
    assert pool.device("gpu-0-vgpu-1gb-0").attributes["framework"] == {"string": "vendor-vfio"}
    t4pool = build_pool(inventory(t4()), PoolPolicy.default(), server_version=V137)
    assert t4pool.device("gpu-0-vgpu-1gb-0").attributes["framework"] == {"string": "mdev"}


def test_unknown_numa_is_omitted():
    gpu = t4()
    gpu.numa_node = -1
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V137)
    assert "numaNode" not in pool.device("gpu-0-passthrough").attributes


def test_long_names_are_sanitised_truncated_and_unique():
    long_name = "NVIDIA " + "Very_Long.Board+Name/" * 6 + "-4C"
    types = [
        vtype("nvidia-900", long_name, 4, fb=4096),
        vtype("nvidia-901", long_name + "x", 2, fb=8192),
        vtype("nvidia-902", "NVIDIA Ü-Board-16C", 1),
        # two types whose short names sanitise alike
        vtype("nvidia-903", "NVIDIA X_1-16C", 1),
        vtype("nvidia-904", "NVIDIA X.1-16C", 1),
    ]
    product = "Ω" * 40 + " a very long product name that does not fit in sixty-four bytes"
    gpu = make_gpu(12, "0000:3b:00.0", "0x1eb8", product, "mdev", types)
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(mixed_size=True)), server_version=V137)
    names = [d.name for d in pool.devices]
    # the three 16 GB types share one slot (one size, one instance limit)
    assert len(names) == len(set(names)) == 1 + 4 + 2 + 1
    assert len(pool.device("gpu-12-vgpu-16gb-0").type_choices) == 3
    for n in names:
        assert is_dns_label(n), n
    for d in pool.devices:
        assert len(d.attributes) + len(d.capacity) <= 32
        for v in d.attributes.values():
            assert len(v) == 1
            if "string" in v:
                assert len(v["string"].encode()) <= 64
    # the cut never splits a character
    assert truncate_utf8("Ω" * 40).encode().decode() == "Ω" * 32


def test_pool_device_names_unique_across_node():
    inv = inventory(t4(0, "0000:3b:00.0"), a100(1, "0000:65:00.0"), l40s(2, "0000:ca:00.0"), *a16_board(3))
    pool = build_pool(inv, PoolPolicy(others=GpuPolicy(mixed_size=True)), server_version=V137)
    names = [d.name for d in pool.devices]
    assert len(names) == len(set(names))
    assert all(is_dns_label(n) for n in names)
    assert all(is_dns_label(c.name) for c in pool.counter_sets)
    assert all(is_dns_label(k) for c in pool.counter_sets for k in c.counters)


def test_duplicate_gpu_index_is_refused():
    with pytest.raises(ValueError, match="share index"):
        build_pool(inventory(t4(0, "0000:3b:00.0"), t4(0, "0000:3c:00.0")), PoolPolicy.default())


# --------------------------------------------------------------------------- odd boards


def test_non_nvidia_without_framebuffer_uses_a_share_counter():
    types = [vtype(tid, name, n, fb=None).model_copy(update={"framebuffer_mib": None})
             for tid, name, n in (("i915-GVTg_V5_4", "GVTg_V5_4", 5), ("i915-GVTg_V5_8", "GVTg_V5_8", 7))]
    gpu = make_gpu(0, "0000:00:02.0", "0x3e92", "UHD Graphics 630", "mdev", types, vendor="0x8086")
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=(1, 34))
    cs = pool.counter_sets[0]
    assert cs.counters == {"share": 35, "vgpus": 7}
    assert pool.device("gpu-0-passthrough").consumes[0].counters == {"share": "35", "vgpus": "7"}
    assert pool.device("gpu-0-vgpu-gvtg-v5-4-0").consumes[0].counters == {"share": "7", "vgpus": "1"}
    assert all(not c.compatibility_groups for d in pool.devices for c in d.consumes)
    assert feasible_by_counters(pool, gpu, groups=False) == feasible_by_board(pool, gpu, equal_size=False)


def test_gpu_without_vgpu_types_offers_passthrough_only():
    gpu = make_gpu(0, "0000:17:00.0", "0x2330", "H100", "none", [])
    pool = build_pool(inventory(gpu), PoolPolicy.default(), server_version=V137)
    assert [d.name for d in pool.devices] == ["gpu-0-passthrough"]
    assert pool.counter_sets[0].counters == {"share": 1, "vgpus": 1}
    assert pool.device("gpu-0-passthrough").capacity == {}


def test_inexact_shares_round_the_counter_down():
    # made-up board: 10 GiB, a type with max 3 -> shares of a 10 GiB counter are not exact
    types = [vtype("nvidia-990", "NVIDIA Z-3Q", 3), vtype("nvidia-991", "NVIDIA Z-10Q", 1)]
    gpu = make_gpu(0, "0000:3b:00.0", "0x0001", "Z", "mdev", types)
    pool = build_pool(inventory(gpu), PoolPolicy(others=GpuPolicy(mixed_size=True)), server_version=V137)
    total = parse_quantity(pool.counter_sets[0].counters["memory"])
    share = parse_quantity(pool.device("gpu-0-vgpu-3gb-0").consumes[0].counters["memory"])
    assert total == 3 * share and total <= 10 * 2**30
    assert any("rounded down" in w for w in pool.warnings)
    assert feasible_by_counters(pool, gpu, groups=True) == feasible_by_board(pool, gpu, equal_size=False)


def test_quantity_helpers():
    assert format_mib(1536) == "1536Mi"
    assert format_mib(49152) == "48Gi"
    assert parse_quantity("1536Mi") == 1536 * 2**20
    assert parse_quantity("1.5Gi") == parse_quantity("1536Mi")
    assert parse_quantity("16") == 16
    assert parse_quantity("2k") == 2000
    assert parse_quantity("1e3") == 1000
    with pytest.raises(ValueError):
        parse_quantity("12 apples")


@pytest.mark.parametrize("shown, declared, mixed", [
    (None, False, False), (None, True, True),   # an empty GPU is taken at the layout's word
    (True, False, True), (False, True, False),  # what the GPU shows wins
])
def test_policy_mixed_size_from_the_gpu_and_the_layout(shown, declared, mixed):
    from dra_bridge.pool.policy import policy_from_layout
    from mdev_manager.config import GpuLayout

    gpu = t4().model_copy(update={"mixed_size": shown})
    layouts = [GpuLayout(all=True, mode="dra", mixed_size=declared)]
    pol = policy_from_layout(inventory(gpu), layouts)
    assert pol.gpus[gpu.address].mixed_size is mixed
    pool = build_pool(inventory(gpu), pol, server_version=V136)
    assert sizes_of(pool, gpu) == ({"1Gi", "2Gi", "4Gi", "8Gi", "16Gi"} if mixed else {"1Gi"})


@pytest.mark.parametrize("version", [V136, V137])
def test_vgpus_no_claim_holds_take_their_room_from_the_gpus_counters(version):
    """#36.2: vGPUs on a GPU that no prepared claim holds (made by hand, or in use where the layout wanted
    them gone) are invisible to the scheduler, which would allocate their room to claims whose prepare
    must then fail. Their share leaves the counters; what could never fit (the whole GPU, sizes larger
    than the room left, other sizes of an equal-size GPU) is not published."""
    from dra_bridge.pool.policy import with_outside

    gpu = t4()
    held = [Vgpu(id=f"00000000-0000-0000-0000-00000000000{k}", framework="mdev", type_id="nvidia-231",
                 type_name="GRID T4-2Q", parent=gpu.address, gpu=gpu.address) for k in range(8)]
    claimed = {held[6].id, held[7].id}  # two are a claim's
    inv = inventory(gpu.model_copy(update={"vgpus": held}))
    policy = with_outside(PoolPolicy.default(), inv, claimed)
    assert policy.for_gpu(gpu.address).outside_vgpus == [v.id for v in held[:6]]
    pool = build_pool(inv, policy, server_version=version)
    assert [c.model_dump() for c in pool.counter_sets] == [
        {"name": "gpu-0-counter-set", "counters": {"memory": "4Gi", "vgpus": 10}}]  # 16 GiB less 6 x 2 GiB
    assert pool.device("gpu-0-passthrough") is None
    assert {d.capacity["memory"] for d in pool.devices} == {"2Gi"}
    slots = [d.name for d in pool.devices]
    assert co_allocatable(pool, slots[:2]) and not co_allocatable(pool, slots[:3])
    # the claims' own two are allocated devices the scheduler counts itself: not taken again
    full = build_pool(inv, with_outside(PoolPolicy.default(), inv, set()), server_version=version)
    assert full.devices == [] and full.counter_sets[0].counters == {"memory": "0Gi", "vgpus": 8}
    assert build_pool(inv, with_outside(PoolPolicy.default(), inv, {v.id for v in held}),
                      server_version=version).counter_sets[0].counters == {"memory": "16Gi", "vgpus": 16}
