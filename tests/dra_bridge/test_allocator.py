"""The scheduler model (``dra_bridge.scheduling.allocator``), one test per point of issue #5.

Realistic nodes come from our own pipeline: a simulated host (``default`` preset: two T4 on
mdev, an A100-40GB with mdev on SR-IOV VFs, an L40S with vendor-specific VFIO) reconciled for
DRA, discovered, turned into a pool by ``build_pool`` and into ResourceSlices by
``build_slices``. Features our builder never produces (allocationMode All targets, shared
devices with request policies, older generations, incomplete pools, counter sets split over
several slices, taints) use small hand-written slices. Selectors are evaluated with the real
CEL implementation plus the Kubernetes quantity library (``CelSelectors``).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import PoolPolicy, build_pool
from dra_bridge.pool.slices import build_slices
from dra_bridge.scheduling.allocator import AllocationError, Allocator, Unsatisfiable
from dra_bridge.scheduling.pools import read_pools
from dra_bridge.scheduling.selectors import CelSelectors
from mdev_manager.catalog import known_type
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.sim.node import sim_node

D = "vgpu.kubevirt.io"
DRA_ALL = {"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}}

# The DeviceClasses `vgpuctl render deviceclasses` produces, plus one for hand-written slices.
VGPU = "vgpu.kubevirt.io"
WHOLE = "passthrough.vgpu.kubevirt.io"
ANY = "any"
CLASSES = [
    {"metadata": {"name": VGPU}, "spec": {"selectors": [{"cel": {"expression":
        f'device.driver == "{D}" && device.attributes["{D}"].type == "vgpu"'}}]}},
    {"metadata": {"name": WHOLE}, "spec": {"selectors": [{"cel": {"expression":
        f'device.driver == "{D}" && device.attributes["{D}"].type == "passthrough"'}}]}},
    {"metadata": {"name": ANY}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}},
]


# --------------------------------------------------------------------------- realistic nodes
@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    """The ``default`` simulated node after the agent prepared every GPU for DRA."""
    sim = sim_node(Path(tmp_path_factory.mktemp("alloc-host")), "default")
    assert reconcile(sim.env, sim.io, parse_config(DRA_ALL)).ok
    return discover(sim.env, sim.io, node=sim.node)


def node_slices(inventory, node: str, version=(1, 37), generation: int = 1) -> list[dict]:
    pool = build_pool(inventory, PoolPolicy.default(), D, server_version=version)
    return build_slices(pool, driver=D, node_name=node, pool_name=node, generation=generation,
                        server_version=version)


def gpu_index(inventory, board_model_part: str) -> int:
    return next(g.index for g in inventory.gpus if board_model_part in g.model)


def sel(expr: str) -> list[dict]:
    return [{"cel": {"expression": expr}}]


def profile_is(profile: str) -> str:
    """A device that can become a vGPU of ``profile`` (a size slot of its size, or a MIG placement)."""
    return f'device.attributes["{D}"].vgpuTypes.contains(" {profile} ")'


def claim(name: str, *requests: dict, constraints: list | None = None, status: dict | None = None) -> dict:
    out = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "vms"},
           "spec": {"devices": {"requests": list(requests), "constraints": constraints or []}}}
    if status:
        out["status"] = status
    return out


def exactly(name: str, cls: str = VGPU, expr: str | None = None, **fields) -> dict:
    body = {"deviceClassName": cls, **fields}
    if expr:
        body["selectors"] = sel(expr)
    return {"name": name, "exactly": body}


def vgpu(name: str, profile: str, **fields) -> dict:
    return exactly(name, VGPU, profile_is(profile), **fields)


def devices_of(slices: list[dict]) -> dict[tuple[str, str], dict]:
    """(pool, device name) -> the published device entry."""
    return {(s["spec"]["pool"]["name"], d["name"]): d for s in slices for d in s["spec"].get("devices") or []}


def results(alloc: dict) -> list[dict]:
    return alloc["devices"]["results"]


def attr(dev: dict, name: str):
    return next(iter(dev["attributes"][name].values()))


# --------------------------------------------------------------------------- hand-written slices
def hslice(node: str | None, pool: str, *, devices=None, counters=None, generation=1, count=1, k=0) -> dict:
    spec = {"driver": D, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count}}
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    if devices is not None:
        spec["devices"] = devices
    if counters is not None:
        spec["sharedCounters"] = counters
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{pool}-{generation}-{k}"}, "spec": spec}


def hdev(name: str, kind: str = "nic", *, consumes=None, capacity=None, multi=False, taints=None, **attrs) -> dict:
    d = {"name": name, "attributes": {"type": {"string": kind},
                                      **{k: ({"int": v} if isinstance(v, int) else {"string": v})
                                         for k, v in attrs.items()}}}
    if capacity:
        d["capacity"] = capacity
    if consumes:
        d["consumesCounters"] = consumes
    if multi:
        d["allowMultipleAllocations"] = True
    if taints:
        d["taints"] = taints
    return d


def counter_set(name: str, **counters) -> dict:
    return {"name": name, "counters": {k: {"value": str(v)} for k, v in counters.items()}}


def consume(cs: str, **counters) -> list[dict]:
    return [{"counterSet": cs, "counters": {k: {"value": str(v)} for k, v in counters.items()}}]


def allocator(slices, nodes=None) -> Allocator:
    return Allocator(slices, CLASSES, CelSelectors(), nodes=nodes)


# =========================================================================== 1. CEL selectors
def test_class_and_request_selectors_use_real_cel_with_quantity_functions(inventory):
    slices = node_slices(inventory, "node-1")
    devs = devices_of(slices)
    a = allocator(slices)
    # request selector on a Quantity: at least 10 GiB of framebuffer, strictly less than 16 GiB
    expr = (f'device.capacity["{D}"].memory.compareTo(quantity("10Gi")) >= 0 && '
            f'device.capacity["{D}"].memory.isLessThan(quantity("16Gi"))')
    got = []
    for i in range(3):
        _, [alloc] = a.allocate([claim(f"c{i}", exactly("gpu", VGPU, expr))])
        [r] = results(alloc)
        got.append(devs[("node-1", r["device"])])
    for dev in got:
        mem = parse_quantity(dev["capacity"]["memory"]["value"])
        assert 10 * 2**30 <= mem < 16 * 2**30
        assert attr(dev, "type") == "vgpu"  # the class selector applies too
    # the class alone decides between whole GPUs and vGPUs
    _, [alloc] = a.allocate([claim("whole", exactly("gpu", WHOLE))])
    [r] = results(alloc)
    assert attr(devs[("node-1", r["device"])], "type") == "passthrough"
    # quantity arithmetic in a selector (add/sub): a 4 GiB vGPU is 8Gi - 4Gi
    _, [alloc] = a.allocate([claim("arith", exactly("gpu", VGPU,
        f'device.capacity["{D}"].memory == quantity("8Gi").sub(quantity("4Gi")) && '
        f'device.attributes["{D}"].profile.startsWith("L40S")'))])
    assert devs[("node-1", results(alloc)[0]["device"])]["capacity"]["memory"]["value"] == "4Gi"


def test_selector_runtime_error_fails_the_attempt(inventory):
    """As the scheduler (checked against it in tests/oracle): a selector that fails on a device the
    search reaches fails the whole attempt (AllocationError: no other node is tried); with
    ``CelSelectors(strict=False)`` the device just does not match."""
    slices = node_slices(inventory, "node-1")
    cel = CelSelectors()
    a = Allocator(slices, CLASSES, cel)
    with pytest.raises(AllocationError, match="a selector failed on device .*noSuchAttribute"):
        a.allocate([claim("c", exactly("gpu", VGPU, f'device.attributes["{D}"].noSuchAttribute == "x"'))])
    assert cel.errors and "noSuchAttribute" in cel.errors[0]
    # an expression that does not compile fails the same way (the API server refuses it on write)
    with pytest.raises(AllocationError, match="does not compile"):
        a.allocate([claim("c", exactly("gpu", VGPU, "device.attributes["))])
    lenient = Allocator(slices, CLASSES, CelSelectors(strict=False))
    with pytest.raises(Unsatisfiable, match="no device matches request 'gpu'"):
        lenient.allocate([claim("c", exactly("gpu", VGPU, f'device.attributes["{D}"].noSuchAttribute == "x"'))])


def test_unknown_device_class_is_reported():
    a = allocator([hslice("n", "n", devices=[hdev("d0")])])
    with pytest.raises(Unsatisfiable, match="device class 'nope' does not exist"):
        a.allocate([claim("c", exactly("r", "nope"))])


# =========================================================================== 2. ExactCount and All
def test_exact_count_allocates_that_many_distinct_devices(inventory):
    slices = node_slices(inventory, "node-1")
    a = allocator(slices)
    _, [alloc] = a.allocate([claim("c", vgpu("gpu", "A100-10C", count=3))])
    names = [r["device"] for r in results(alloc)]
    assert len(names) == 3 == len(set(names))
    assert all(r["request"] == "gpu" for r in results(alloc))
    # the A100 holds four 10C: one more fits, then the GPU is full
    a.allocate([claim("d", vgpu("gpu", "A100-10C"))])
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("e", vgpu("gpu", "A100-10C"))])


def test_allocation_mode_all_takes_every_matching_device():
    slices = [hslice("n1", "n1", devices=[hdev(f"nic-{i}", "nic") for i in range(4)] + [hdev("gpu-0", "gpu")])]
    a = allocator(slices)
    nic = f'device.attributes["{D}"].type == "nic"'
    _, [alloc] = a.allocate([claim("all", exactly("nics", ANY, nic, allocationMode="All"))])
    assert sorted(r["device"] for r in results(alloc)) == [f"nic-{i}" for i in range(4)]
    # "all" needs every matching device free: once one is taken, nothing is allocated
    b = allocator(slices)
    b.allocate([claim("one", exactly("nic", ANY, nic))])
    with pytest.raises(Unsatisfiable, match=r"asks for all 4 matching devices, but nic-0 is not available"):
        b.allocate([claim("all", exactly("nics", ANY, nic, allocationMode="All"))])
    # at least one device is required
    with pytest.raises(Unsatisfiable, match="no device matches"):
        a.allocate([claim("none", exactly("x", ANY, f'device.attributes["{D}"].type == "fpga"',
                                          allocationMode="All"))])


def test_allocation_mode_all_waits_for_an_incomplete_pool():
    """Like the scheduler: "all" is refused while a pool visible to the node is being updated."""
    complete = hslice("n1", "n1", devices=[hdev("nic-0")])
    updating = hslice("n1", "n1-extra", devices=[hdev("nic-1")], count=2)
    a = allocator([complete, updating])
    with pytest.raises(Unsatisfiable, match=r"asks for all devices, but pool vgpu.kubevirt.io/n1-extra is being"):
        a.allocate([claim("all", exactly("nics", ANY, allocationMode="All"))])
    # an exact count still uses the complete pool
    _, [alloc] = a.allocate([claim("one", exactly("nic", ANY))])
    assert results(alloc)[0]["device"] == "nic-0"


# =========================================================================== 3. firstAvailable
def test_first_available_tries_sub_requests_in_order(inventory):
    slices = node_slices(inventory, "node-1")
    a = allocator(slices)
    req = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": VGPU, "selectors": sel(profile_is("A100-20C"))},
        {"name": "small", "deviceClassName": VGPU, "selectors": sel(profile_is("T4-16Q"))},
    ]}
    got = [results(a.allocate([claim(f"c{i}", req)])[1][0])[0]["request"] for i in range(4)]
    # two 20C fill the A100; then the two T4 (one 16Q each); then nothing
    assert got == ["gpu/big", "gpu/big", "gpu/small", "gpu/small"]
    with pytest.raises(Unsatisfiable) as exc:
        a.allocate([claim("c9", req)])
    # the reason covers every sub-request, with the GPUs and numbers
    a100 = gpu_index(inventory, "A100")
    assert f"'gpu/big': gpu-{a100} has 0 B of 40 GiB framebuffer left; needs 20 GiB" in str(exc.value)
    assert "'gpu/small': gpu-0 has 0 B of 16 GiB framebuffer left; needs 16 GiB" in str(exc.value)


def test_first_available_backtracks_when_a_later_request_fails(inventory):
    """The first sub-request fits alone, but only the second leaves room for the next request."""
    slices = node_slices(inventory, "node-1")
    a100 = gpu_index(inventory, "A100")
    a = allocator(slices)
    on_a100 = f'device.attributes["{D}"].gpuIndex == {a100}'
    c = claim("c", {"name": "first", "firstAvailable": [
        {"name": "whole", "deviceClassName": WHOLE, "selectors": sel(on_a100)},
        {"name": "part", "deviceClassName": VGPU, "selectors": sel(profile_is("A100-20C"))},
    ]}, vgpu("second", "A100-20C"))
    _, [alloc] = a.allocate([c])
    assert sorted(r["request"] for r in results(alloc)) == ["first/part", "second"]


# =========================================================================== 4. constraints
def test_match_attribute_keeps_requests_on_one_gpu(inventory):
    slices = node_slices(inventory, "node-1")
    devs = devices_of(slices)
    t4 = [g.index for g in inventory.gpus if "T4" in g.model]
    a = allocator(slices)
    # fill gpu-0 up to one free T4-2Q slot (8 fit)
    first_t4 = f'{profile_is("T4-2Q")} && device.attributes["{D}"].gpuIndex == {t4[0]}'
    a.allocate([claim("fill", exactly("r", VGPU, first_t4, count=7))])
    pair = [vgpu("a", "T4-2Q"), vgpu("b", "T4-2Q")]
    # without the constraint the pair is split across the two T4
    free = a.state.copy()
    _, [split] = a.allocate([claim("split", *pair)])
    gpus = {attr(devs[("node-1", r["device"])], "gpuIndex") for r in results(split)}
    assert gpus == set(t4)
    a.state = free  # forget that allocation
    a._full.clear(), a._cursor.clear()
    _, [alloc] = a.allocate([claim("pair", *pair, constraints=[{"matchAttribute": f"{D}/parentPciBusID"}])])
    gpus = {attr(devs[("node-1", r["device"])], "gpuIndex") for r in results(alloc)}
    assert gpus == {t4[1]}
    # a vGPU has no pciBusID: a constraint on it cannot be met (the scheduler: attribute not set)
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("nobus", *pair, constraints=[{"matchAttribute": "resource.kubernetes.io/pciBusID"}])])


def test_distinct_attribute_spreads_devices_over_gpus(inventory):
    slices = node_slices(inventory, "node-1")
    devs = devices_of(slices)
    a = allocator(slices)
    _, [same] = a.allocate([claim("same", vgpu("r", "T4-4Q", count=2))])
    assert len({attr(devs[("node-1", r["device"])], "gpuIndex") for r in results(same)}) == 1
    _, [spread] = a.allocate([claim("spread", vgpu("r", "T4-4Q", count=2),
                                    constraints=[{"distinctAttribute": f"{D}/gpuIndex"}])])
    assert len({attr(devs[("node-1", r["device"])], "gpuIndex") for r in results(spread)}) == 2
    # only two T4: three distinct T4 GPUs do not exist
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("three", vgpu("r", "T4-1Q", count=3),
                          constraints=[{"distinctAttribute": f"{D}/gpuIndex"}])])
    # a device without the attribute never satisfies distinctAttribute
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("nobus", vgpu("r", "T4-1Q"), constraints=[{"distinctAttribute": "resource.kubernetes.io/pciBusID"}])])


# =========================================================================== 5. shared counters, generations
@pytest.mark.parametrize("version", [(1, 34), (1, 35), (1, 37)])
def test_shared_counters_hold_across_the_slices_of_a_pool(inventory, version):
    """1.35+ publishes counter sets in their own slice; devices in other slices consume them."""
    slices = node_slices(inventory, "node-1", version=version)
    if version >= (1, 35):
        assert any(s["spec"].get("sharedCounters") and not s["spec"].get("devices") for s in slices)
    a100 = gpu_index(inventory, "A100")
    a = allocator(slices)
    profile = "A100-10C" if version >= (1, 37) else next(
        attr(d, "profile") for d in devices_of(slices).values()
        if attr(d, "type") == "vgpu" and attr(d, "gpuIndex") == a100)
    n = known_type(profile).max_instances
    for i in range(n):
        a.allocate([claim(f"c{i}", vgpu("gpu", profile))])
    with pytest.raises(Unsatisfiable, match=rf"gpu-{a100} has 0 B of 40 GiB framebuffer left"):
        a.allocate([claim("over", vgpu("gpu", profile))])
    # the whole GPU consumes the same set: not allocatable next to its vGPUs
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("whole", exactly("gpu", WHOLE, f'device.attributes["{D}"].gpuIndex == {a100}'))])


def test_counter_sets_split_over_several_counter_slices():
    """Two counter sets in two counters-only slices, devices in a third: all of one pool."""
    slices = [
        hslice("n1", "n1", counters=[counter_set("gpu-0-counter-set", memory="16Gi")], count=3, k=0),
        hslice("n1", "n1", counters=[counter_set("gpu-1-counter-set", memory="16Gi")], count=3, k=1),
        hslice("n1", "n1", count=3, k=2, devices=[
            *(hdev(f"gpu-{g}-vgpu-{i}", "vgpu", gpuIndex=g, consumes=consume(f"gpu-{g}-counter-set", memory="8Gi"))
              for g in (0, 1) for i in range(3)),
        ]),
    ]
    a = allocator(slices)
    taken = [results(a.allocate([claim(f"c{i}", exactly("r", ANY))])[1][0])[0]["device"] for i in range(4)]
    assert sorted(taken) == ["gpu-0-vgpu-0", "gpu-0-vgpu-1", "gpu-1-vgpu-0", "gpu-1-vgpu-1"]
    with pytest.raises(Unsatisfiable, match="gpu-0 has 0 B of 16 GiB framebuffer left; needs 8 GiB"):
        a.allocate([claim("over", exactly("r", ANY))])
    # without the slice that holds gpu-1's counters the pool is incomplete: nothing is allocated
    b = allocator([slices[0], slices[2]])
    with pytest.raises(Unsatisfiable, match=r"incomplete pools ignored: vgpu.kubevirt.io/n1"):
        b.allocate([claim("c", exactly("r", ANY))])


def test_only_the_newest_complete_generation_counts():
    old = [hslice("n1", "n1", generation=1, counters=[counter_set("cs", memory="40Gi")], devices=[
        hdev("old-0", consumes=consume("cs", memory="10Gi")), hdev("old-1", consumes=consume("cs", memory="10Gi"))])]
    new = [hslice("n1", "n1", generation=2, count=2, k=0, counters=[counter_set("cs", memory="10Gi")]),
           hslice("n1", "n1", generation=2, count=2, k=1, devices=[
               hdev(f"new-{i}", consumes=consume("cs", memory="10Gi")) for i in range(3)])]
    # the newest generation replaces the old one, devices and counters alike
    a = allocator(old + new)
    _, [alloc] = a.allocate([claim("c", exactly("r", ANY))])
    assert results(alloc)[0]["device"] == "new-0"
    with pytest.raises(Unsatisfiable, match="cs has 0 B of 10 GiB framebuffer left; needs 10 GiB"):
        a.allocate([claim("d", exactly("r", ANY))])  # the new set is 10Gi, not the old 40Gi
    # while generation 2 is incomplete, the pool offers nothing (not even generation 1)
    b = allocator(old + new[1:])
    assert not read_pools(old + new[1:])[(D, "n1")].complete
    with pytest.raises(Unsatisfiable, match="incomplete pools ignored: vgpu.kubevirt.io/n1"):
        b.allocate([claim("c", exactly("r", ANY))])


def test_realistic_pool_of_a_new_generation_replaces_the_old(inventory):
    gen1 = node_slices(inventory, "node-1", generation=1)
    gen2 = node_slices(inventory, "node-1", generation=2)
    a = allocator(gen1 + gen2)
    assert {p.generation for p in a.pools.values()} == {2}
    assert len(a.by_node["node-1"]) == len(devices_of(gen2))
    # an incomplete generation 2 (one slice missing) hides the whole pool
    b = allocator(gen1 + gen2[:-1])
    with pytest.raises(Unsatisfiable, match="incomplete pools ignored"):
        b.allocate([claim("c", vgpu("gpu", "T4-1Q"))])


# =========================================================================== 6. compatibilityGroups
def test_compatibility_groups_keep_one_framebuffer_size_per_gpu(inventory):
    slices = node_slices(inventory, "node-1", version=(1, 37))
    t4 = [g.index for g in inventory.gpus if "T4" in g.model]
    a = allocator(slices)
    on_first = f'device.attributes["{D}"].gpuIndex == {t4[0]}'
    a.allocate([claim("c4q", exactly("r", VGPU, f'{profile_is("T4-4Q")} && {on_first}'))])
    # same size, another series: shares the GPU (groups fb-4096 intersect)
    a.allocate([claim("c4c", exactly("r", VGPU, f'{profile_is("T4-4C")} && {on_first}'))])
    # another size on that GPU: refused, and the reason names the GPU and both groups
    with pytest.raises(Unsatisfiable) as exc:
        a.allocate([claim("c2q", exactly("r", VGPU, f'{profile_is("T4-2Q")} && {on_first}'))])
    assert f"gpu-{t4[0]} holds vGPUs of another framebuffer size (fb-4096)" in str(exc.value)
    assert "needs fb-2048" in str(exc.value)
    # without the GPU restriction the 2Q goes to the other T4
    _, [alloc] = a.allocate([claim("c2q", vgpu("r", "T4-2Q"))])
    assert results(alloc)[0]["device"].startswith(f"gpu-{t4[1]}-")


# =========================================================================== 7. shared devices, request policies
def shared_slices(capacity: dict, n: int = 1, consumes=None, counters=None) -> list[dict]:
    return [hslice("n1", "n1", counters=counters, devices=[
        hdev(f"link-{i}", "link", multi=True, capacity=capacity, consumes=consumes) for i in range(n)])]


def test_allow_multiple_allocations_with_valid_values():
    cap = {"bandwidth": {"value": "10G", "requestPolicy": {"default": "1G", "validValues": ["1G", "2G", "5G"]}}}
    a = allocator(shared_slices(cap))

    def take(name, amount=None):
        body = {"deviceClassName": ANY}
        if amount:
            body["capacity"] = {"requests": {"bandwidth": amount}}
        return results(a.allocate([claim(name, {"name": "r", "exactly": body})])[1][0])[0]

    r = take("c1", "3G")  # rounded up to the next valid value
    assert r["device"] == "link-0" and r["consumedCapacity"] == {"bandwidth": "5G"} or \
        parse_quantity(r["consumedCapacity"]["bandwidth"]) == parse_quantity("5G")
    assert re.fullmatch(r"[0-9a-f-]{36}", r["shareID"])
    assert parse_quantity(take("c2")["consumedCapacity"]["bandwidth"]) == parse_quantity("1G")  # the default
    assert parse_quantity(take("c3", "2G")["consumedCapacity"]["bandwidth"]) == parse_quantity("2G")
    # 8G used: 2G more fit, 5G do not; 6G is above every valid value
    with pytest.raises(Unsatisfiable):
        take("c4", "6G")
    with pytest.raises(Unsatisfiable):
        take("c5", "5G")
    take("c6", "2G")
    with pytest.raises(Unsatisfiable):
        take("c7", "1G")


def test_allow_multiple_allocations_with_valid_range():
    cap = {"memory": {"value": "8Gi", "requestPolicy": {"default": "1Gi",
                                                         "validRange": {"min": "1Gi", "max": "4Gi", "step": "1Gi"}}}}
    a = allocator(shared_slices(cap))

    def take(name, amount):
        body = {"deviceClassName": ANY, "capacity": {"requests": {"memory": amount}}}
        return results(a.allocate([claim(name, {"name": "r", "exactly": body})])[1][0])[0]

    assert take("c1", "1500Mi")["consumedCapacity"] == {"memory": "2Gi"}  # rounded up to the step
    assert take("c2", "100Mi")["consumedCapacity"] == {"memory": "1Gi"}  # raised to the minimum
    with pytest.raises(Unsatisfiable):
        take("c3", "5Gi")  # above the range's maximum
    assert take("c4", "4Gi")["consumedCapacity"] == {"memory": "4Gi"}
    with pytest.raises(Unsatisfiable):
        take("c5", "2Gi")  # 7Gi used of 8Gi
    take("c6", "1Gi")


def test_shared_device_without_policy_is_consumed_whole_when_nothing_is_requested():
    """The scheduler's fillEmptyRequest: an unrequested capacity without a default takes it all."""
    a = allocator(shared_slices({"bandwidth": {"value": "10G"}}))
    r = results(a.allocate([claim("c1", exactly("r", ANY))])[1][0])[0]
    assert parse_quantity(r["consumedCapacity"]["bandwidth"]) == parse_quantity("10G")
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("c2", exactly("r", ANY))])
    # a request for a capacity the device does not have never matches
    b = allocator(shared_slices({"bandwidth": {"value": "10G"}}))
    with pytest.raises(Unsatisfiable):
        b.allocate([claim("c", {"name": "r", "exactly": {"deviceClassName": ANY,
                                                        "capacity": {"requests": {"memory": "1Gi"}}}})])


def test_shared_device_consumes_its_counters_once():
    """Shares after the first skip the counter check (the scheduler's skipCounterCheck)."""
    slices = [hslice("n1", "n1", counters=[counter_set("cs", memory="8Gi")], devices=[
        hdev("shared", "link", multi=True, capacity={"bw": {"value": "4", "requestPolicy": {"default": "1"}}},
             consumes=consume("cs", memory="8Gi")),
        hdev("exclusive", "nic", consumes=consume("cs", memory="1Gi")),
    ])]
    a = allocator(slices)
    link = f'device.attributes["{D}"].type == "link"'
    for i in range(4):  # four shares of 1, all on one device, counters consumed once
        assert results(a.allocate([claim(f"s{i}", exactly("r", ANY, link))])[1][0])[0]["device"] == "shared"
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("s5", exactly("r", ANY, link))])  # bw used up
    with pytest.raises(Unsatisfiable, match="cs has 0 B of 8 GiB framebuffer left; needs 1 GiB"):
        a.allocate([claim("x", exactly("r", ANY, f'device.attributes["{D}"].type == "nic"'))])


def test_capacity_request_filters_exclusive_devices(inventory):
    """With a capacity request, the scheduler also skips (non-shared) devices whose capacity is
    smaller: a vGPU request for 16 GiB gets a device with at least that much."""
    slices = node_slices(inventory, "node-1")
    devs = devices_of(slices)
    a = allocator(slices)
    r = results(a.allocate([claim("c", {"name": "r", "exactly": {
        "deviceClassName": VGPU, "capacity": {"requests": {"memory": "16Gi"}}}})])[1][0])[0]
    assert parse_quantity(devs[("node-1", r["device"])]["capacity"]["memory"]["value"]) >= 16 * 2**30
    assert "consumedCapacity" not in r and "shareID" not in r


# =========================================================================== 8. existing allocations
def test_already_allocated_claims_consume_what_they_hold(inventory):
    slices = node_slices(inventory, "node-1")
    a100 = gpu_index(inventory, "A100")
    first = allocator(slices)
    _, [held] = first.allocate([claim("held", vgpu("gpu", "A100-10C", count=3))])
    # a fresh allocator (another scheduling cycle) learns about it from the claim's status
    a = allocator(slices)
    a.reserve(claim("held", vgpu("gpu", "A100-10C", count=3), status={"allocation": held}))
    a.reserve(claim("held", vgpu("gpu", "A100-10C", count=3), status={"allocation": held}))  # seen twice: once
    a.allocate([claim("one-more", vgpu("gpu", "A100-10C"))])
    with pytest.raises(Unsatisfiable, match=rf"gpu-{a100} has 0 B of 40 GiB framebuffer left; needs 10 GiB"):
        a.allocate([claim("too-many", vgpu("gpu", "A100-10C"))])
    # a held whole GPU blocks its vGPUs
    b = allocator(slices)
    _, [whole] = b.allocate([claim("w", exactly("gpu", WHOLE, f'device.attributes["{D}"].gpuIndex == {a100}'))])
    c = allocator(slices)
    c.reserve(claim("w", exactly("gpu", WHOLE), status={"allocation": whole}))
    with pytest.raises(Unsatisfiable):
        c.allocate([claim("v", vgpu("gpu", "A100-4C"))])
    # results naming devices the slices no longer have are ignored
    c.reserve(claim("gone", status={"allocation": {"devices": {"results": [
        {"request": "r", "driver": D, "pool": "node-1", "device": "gpu-9-passthrough"}]}}}))


def test_reserve_accounts_shared_device_capacity():
    cap = {"bw": {"value": "10", "requestPolicy": {"default": "1"}}}
    a = allocator(shared_slices(cap))
    a.reserve(claim("held", status={"allocation": {"devices": {"results": [
        {"request": "r", "driver": D, "pool": "n1", "device": "link-0", "shareID": "x",
         "consumedCapacity": {"bw": "9"}}]}}}))
    a.allocate([claim("c1", exactly("r", ANY))])
    with pytest.raises(Unsatisfiable):
        a.allocate([claim("c2", exactly("r", ANY))])


# =========================================================================== 9. a pod's claims on one node
def test_a_pods_claims_land_on_one_node(inventory):
    slices = node_slices(inventory, "node-a") + node_slices(inventory, "node-b")
    a100 = gpu_index(inventory, "A100")
    a = allocator(slices)
    # node-a's A100 is taken whole by someone else
    a.allocate([claim("other", exactly("gpu", WHOLE, f'device.attributes["{D}"].gpuIndex == {a100}'))], node="node-a")
    # alone, a T4 claim would go to node-a (first in order) ...
    t4_alone = allocator(slices)
    t4_alone.allocate([claim("other", exactly("gpu", WHOLE, f'device.attributes["{D}"].gpuIndex == {a100}'))],
                      node="node-a")
    assert t4_alone.allocate([claim("t4", vgpu("gpu", "T4-1Q"))])[0] == "node-a"
    # ... but with an A100 claim in the same pod both go to node-b
    node, allocs = a.allocate([claim("a100", vgpu("gpu", "A100-4C")), claim("t4", vgpu("gpu", "T4-1Q"))])
    assert node == "node-b"
    for alloc in allocs:
        assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-b"]
        assert all(r["pool"] == "node-b" for r in results(alloc))
    # two claims competing for one GPU: each fits alone, not together
    b = allocator(node_slices(inventory, "node-a"))
    with pytest.raises(Unsatisfiable, match="not all of them together"):
        b.allocate([claim("x", exactly("gpu", WHOLE, f'device.attributes["{D}"].gpuIndex == {a100}')),
                    claim("y", vgpu("gpu", "A100-40C"))])


# =========================================================================== 10. taints
def test_taints_need_tolerations():
    taint = {"key": "maintenance", "value": "planned", "effect": "NoSchedule"}
    slices = [hslice("n1", "n1", devices=[hdev("d0", taints=[taint]),
                                          hdev("d1", taints=[{"key": "info", "effect": "None"}])])]
    a = allocator(slices)
    _, [alloc] = a.allocate([claim("c", exactly("r", ANY))])
    assert results(alloc)[0]["device"] == "d1"  # effect None does not keep anything away
    with pytest.raises(Unsatisfiable, match="d0 has taint maintenance=planned:NoSchedule, not tolerated"):
        a.allocate([claim("c2", exactly("r", ANY))])
    for tol in ([{"key": "maintenance", "operator": "Exists"}],
                [{"key": "maintenance", "operator": "Equal", "value": "planned", "effect": "NoSchedule"}],
                [{"operator": "Exists"}]):
        b = allocator(slices)
        b.allocate([claim("c", exactly("r", ANY))])
        assert results(b.allocate([claim("c2", exactly("r", ANY, tolerations=tol))])[1][0])[0]["device"] == "d0"
    for tol in ([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}],
                [{"key": "maintenance", "value": "unplanned"}]):
        b = allocator(slices)
        b.allocate([claim("c", exactly("r", ANY))])
        with pytest.raises(Unsatisfiable):
            b.allocate([claim("c2", exactly("r", ANY, tolerations=tol))])


# =========================================================================== 11. reasons
def test_unsatisfiable_reason_names_the_gpu_and_the_numbers(inventory):
    slices = node_slices(inventory, "node-1")
    a100 = gpu_index(inventory, "A100")
    a = allocator(slices)
    for i in range(9):  # 9 x 4 GiB of the A100's 40 GiB
        a.allocate([claim(f"c{i}", vgpu("gpu", "A100-4C"))])
    with pytest.raises(Unsatisfiable) as exc:
        a.allocate([claim("big", vgpu("gpu", "A100-10C"))])
    assert str(exc.value) == f"node-1: gpu-{a100} has 4 GiB of 40 GiB framebuffer left; needs 10 GiB"
    # the vgpus counter is named when the framebuffer is not the limit
    slices = [hslice("n1", "n1", counters=[counter_set("gpu-5-counter-set", memory="16Gi", vgpus=2)], devices=[
        hdev(f"v{i}", "vgpu", consumes=consume("gpu-5-counter-set", memory="1Gi", vgpus=1)) for i in range(4)])]
    b = allocator(slices)
    b.allocate([claim("c", exactly("r", ANY, count=2))])
    with pytest.raises(Unsatisfiable, match=r"^n1: gpu-5 has 0 of 2 vgpus left; needs 1$"):
        b.allocate([claim("d", exactly("r", ANY))])


def test_reason_lists_a_few_nodes_and_counts_the_rest(inventory):
    slices = [s for n in range(5) for s in node_slices(inventory, f"node-{n}")]
    a = allocator(slices)
    with pytest.raises(Unsatisfiable) as exc:
        a.allocate([claim("c", vgpu("gpu", "H100-80C"))])
    msg = str(exc.value)
    assert msg.count("no device matches request 'gpu'") == 3 and msg.endswith("(and 2 more nodes)")


# =========================================================================== 12. no over-allocation
def _board_rule_holds(slices: list[dict], allocations: list[dict]) -> None:
    """Check the allocations against the catalog: per physical GPU, sum over types of
    count / max_instances <= 1, one framebuffer size (equal-size mode), passthrough alone."""
    devs = devices_of(slices)
    seen = set()
    per_gpu: dict[tuple, list[dict]] = defaultdict(list)
    for alloc in allocations:
        for r in results(alloc):
            key = (r["pool"], r["device"])
            assert key not in seen, f"{key} allocated twice"
            seen.add(key)
            dev = devs[key]
            per_gpu[(r["pool"], attr(dev, "gpuIndex"))].append(dev)
    for gpu, held in per_gpu.items():
        kinds = [attr(d, "type") for d in held]
        if "passthrough" in kinds:
            assert held == [d for d in held if attr(d, "type") == "passthrough"] and len(held) == 1, gpu
            continue
        counts: dict[str, int] = defaultdict(int)
        for d in held:
            counts[attr(d, "typeName")] += 1
        load = sum(Fraction(n, known_type(name).max_instances) for name, n in counts.items())
        assert load <= 1, (gpu, dict(counts))
        sizes = {known_type(name).fb_mib for name in counts}
        assert len(sizes) == 1, (gpu, dict(counts))


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_never_exceed_a_gpus_board_rule(inventory, seed):
    version = (1, 37) if seed % 2 == 0 else (1, 35)
    slices = node_slices(inventory, "node-1", version=version)
    profiles = sorted({attr(d, "profile") for d in devices_of(slices).values() if attr(d, "type") == "vgpu"})
    rng = random.Random(seed)
    a = allocator(slices)
    allocations, failures = [], 0
    for i in range(250):
        pod = []
        for j in range(rng.choice([1, 1, 1, 2])):
            if rng.random() < 0.1:
                req = exactly("gpu", WHOLE, count=1)
            elif rng.random() < 0.25:
                req = {"name": "gpu", "firstAvailable": [
                    {"name": f"s{k}", "deviceClassName": VGPU, "count": rng.choice([1, 2]),
                     "selectors": sel(profile_is(rng.choice(profiles)))} for k in range(rng.choice([2, 3]))]}
            elif rng.random() < 0.2:
                gib = rng.choice([1, 2, 4, 8, 12, 16])
                req = exactly("gpu", VGPU, f'device.capacity["{D}"].memory.compareTo(quantity("{gib}Gi")) >= 0',
                              count=rng.choice([1, 2]))
            else:
                req = vgpu("gpu", rng.choice(profiles), count=rng.choice([1, 1, 2, 3]))
            pod.append(claim(f"p{i}-{j}", req))
        try:
            _, allocs = a.allocate(pod)
            allocations += allocs
        except Unsatisfiable as exc:
            failures += 1
            assert str(exc)
    assert allocations and failures  # the node filled up
    _board_rule_holds(slices, allocations)
    # and what the allocator believes it holds is exactly what the allocations say
    held = {(r["driver"], r["pool"], r["device"]) for al in allocations for r in results(al)}
    assert held == a.state.taken


def test_fresh_allocator_agrees_after_reserving_everything(inventory):
    """Replaying the allocations as existing claims leaves no room the first allocator did not see."""
    slices = node_slices(inventory, "node-1")
    a = allocator(slices)
    done = []
    for i in range(40):
        try:
            done.append(a.allocate([claim(f"c{i}", vgpu("gpu", ["T4-4Q", "A100-8C", "L40S-6Q"][i % 3]))])[1][0])
        except Unsatisfiable:
            pass
    b = allocator(slices)
    for i, alloc in enumerate(done):
        b.reserve(claim(f"c{i}", status={"allocation": alloc}))
    assert b.state.taken == a.state.taken
    assert {k: dict(v) for k, v in b.state.used.items()} == {k: dict(v) for k, v in a.state.used.items()}


@pytest.mark.parametrize("seed", range(3))
def test_filter_answers_what_solving_every_node_answers(inventory, seed):
    """The scheduler-like Filter phase (its per-shape index of nodes that fit, kept up to date from the
    nodes each allocation changed) names exactly the nodes a fresh search of each node, in the same
    ring order from ``start``, finds room on: after every allocation of a random stream."""
    nodes = [f"node-{i}" for i in range(5)]
    slices = [s for n in nodes for s in node_slices(inventory, n)]
    rng = random.Random(seed)
    a = allocator(slices)
    profiles = ["T4-4Q", "T4-8Q", "A100-8C", "L40S-6Q", "L40S-12Q"]
    narrowed = 0
    for i in range(200):
        c = claim(f"c{i}", vgpu("gpu", rng.choice(profiles), count=rng.choice([1, 2, 4])))
        start, limit = rng.randrange(len(nodes)), rng.choice([1, 2, None])
        got, seen = a.filter([c], start, limit)
        ring = [nodes[(start + k) % len(nodes)] for k in range(len(nodes))]
        fit = [n for n in ring if a._solve(n, [c], a.state) is not None]
        assert got == (fit[:limit] if limit else fit), (i, start, limit)
        assert 1 <= seen <= len(nodes)
        narrowed += len(fit) < len(nodes)
        if got:
            a.allocate([c], node=got[0])
    assert narrowed > 20  # nodes filled up: the index had nodes to drop
