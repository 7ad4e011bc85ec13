"""The scheduler model checked by the real scheduler (issue #30): ``dra_bridge.scheduling``'s
:class:`Allocator` and Kubernetes' own structured allocator (``k8s.io/dynamic-resource-allocation``
of each supported minor, run by tests/support/upstream_allocator.py) on the same inputs.

Inputs are what the project really produces: the slices the node agent publishes for a preset
(``vgpuctl --simulate PRESET slices`` for a server version and its gates), the DeviceClasses
``vgpuctl render deviceclasses`` makes, claims from ``render claim-template`` (a vGPU type, a whole
GPU, a minimum framebuffer, firstAvailable) and two-device claims with matchAttribute or
distinctAttribute, one or two claims per pod; hypothesis draws streams of allocations and releases
over them (the already-allocated claims carried from step to step), with the slices listed in any
order, some GPUs
cordoned by a taint (tolerated or not) and the scheduler's gates at their defaults or flipped. Both
must agree on fit or no fit, on the devices chosen and on errors for the whole attempt.

The regression cases at the end are published shapes the two disagreed on before the model was
fixed; they check the model against the recorded upstream outcome even where Go is absent.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_bridge.api import compat
from dra_bridge.scheduling.allocator import AllocationError, Allocator, Unsatisfiable
from dra_bridge.scheduling.objects import dev_attr
from dra_bridge.scheduling.pools import Features
from dra_bridge.scheduling.selectors import CelSelectors
from kubevirt_templates.render import render
from tests.support import sandbox
from tests.support.upstream_allocator import MINORS, UpstreamAllocator, chosen, detail, running
from tests.system.test_no_overcommit import B200, LAYOUT, MIXED_SIZE, RTXPRO

D = "vgpu.kubevirt.io"
CLASSES = render("deviceclasses", {})
GROUPS = {"DRADeviceCompatibilityGroups": True}
#: the gates 1.34 and 1.35 have off by default, on: what a cluster that opted in keeps and schedules
OPTED_IN = {"DRAPartitionableDevices": True, "DRADeviceTaints": True, "DRADeviceBindingConditions": True}
#: (preset, layout, minor, the API server's gates): what the agent publishes there
PUBLISHED = [
    ("t4-node", None, "1.34", {}),
    ("mig-node", LAYOUT, "1.34", {}),  # counters, taints and binding conditions dropped by the server
    ("mixed-node", MIXED_SIZE, "1.34", OPTED_IN),  # 1.34's layout: counters beside the devices
    ("default", None, "1.35", {}),
    ("mixed-node", MIXED_SIZE, "1.35", {}),
    ("mig-node", LAYOUT, "1.35", OPTED_IN),
    ("t4-node", None, "1.36", {}),
    ("a16-node", None, "1.37", {}),
    ("default", None, "1.37", {}),  # T4 mdev, A100 SR-IOV, L40S vendor VFIO
    ("mig-node", LAYOUT, "1.36", {}),  # MIG-backed, time-sliced and whole GPUs, migMode auto
    ("mig-node", LAYOUT, "1.37", GROUPS),
    ("mixed-node", MIXED_SIZE, "1.36", {}),
    ("mixed-node", MIXED_SIZE, "1.37", GROUPS),  # mixed-size placements apart by groups
    ("rtxpro-node", RTXPRO, "1.36", {}),  # Blackwell (#38): 96 slots, GB20x instances, whole GPUs
    ("b200-node", B200, "1.37", GROUPS),  # 8 x B200 in MIG mode
]
#: the scheduler's gates flipped from the minor's defaults (None: the defaults); taints off takes the rules
#: off too (kube-apiserver refuses DRADeviceTaintRules on without DRADeviceTaints)
FLIPS = [None, {"DRADeviceTaints": False, "DRADeviceTaintRules": False}, {"DRADeviceBindingConditions": False},
         {"DRAPartitionableDevices": False}, GROUPS, {"DRADeviceCompatibilityGroups": False}, OPTED_IN]
#: Minors whose allocator searches a pool's slices in the order they are listed (the informer's,
#: not fixed) and pools in Go map order: GatherPools sorts neither before 1.36. The model keeps
#: 1.36's order (pools by ID, slices by name), one of the orders these minors may take; the
#: streams list slices by name for them (recorded in test_slice_order_upstream_1_34_1_35_listing).
UNSORTED = ("1.34", "1.35")
TAINT = {"key": "example.com/maintenance", "value": "gpu", "effect": "NoSchedule"}
#: tolerations a claim may carry for it: none, by key, by key and value (right, wrong), by effect only
TOLERATIONS = [None, [{"key": TAINT["key"], "operator": "Exists"}],
               [{"key": TAINT["key"], "operator": "Equal", "value": "gpu"}],
               [{"key": TAINT["key"], "value": "other"}],
               [{"operator": "Exists", "effect": "NoSchedule"}]]


@functools.cache
def published(preset: str, layout: str | None, minor: str, gates: tuple[tuple[str, bool], ...]) -> list[dict]:
    """The slices the node agent publishes for ``preset`` on a server of ``minor`` with ``gates``
    (on this module's own hosts, each built once: ``slices`` changes nothing on them)."""
    cmd = [sys.executable, "-m", "vgpuctl", "--simulate", preset, "slices", "-o", "json", "--server-version", minor]
    if layout:
        path = Path(subprocess.run(["mktemp", "--suffix=.yaml"], capture_output=True, text=True,
                                   check=True).stdout.strip())
        path.write_text(layout)
        cmd += ["-f", str(path), "--layout", "mixed"]
    if gates:
        cmd += ["--feature-gates", ",".join(f"{k}={str(v).lower()}" for k, v in gates)]
    env = {**os.environ, "VGPUCTL_SIM_DIR": _hosts()}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)["items"]


@functools.cache
def _hosts() -> str:
    """This process's simulated hosts for :func:`published` (in the tests' own home, which goes with
    the session: tests/support/sandbox.py)."""
    return tempfile.mkdtemp(prefix="published-", dir=os.environ.get(sandbox.ROOT))


def offered(slices: list[dict]) -> list[dict]:
    """render claim-template values for every kind of device published (and a few users write)."""
    types, products = set(), set()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if dev_attr(d, "type", D) == "passthrough":
                products.add(dev_attr(d, "productName", D))
            types.update((dev_attr(d, "vgpuTypes", D) or "").split())
    out = [{"profile": t} for t in sorted(types)] + [{"passthrough": True, "product": p} for p in sorted(products)]
    out += [{"min_memory": "8Gi"}, {"min_memory": "20Gi"}]
    if len(types) >= 2:
        out.append({"first_available": sorted(types)[-2:]})
    return out


def claim(values: dict, i: int, pair: str | None = None) -> dict:
    """A ResourceClaim made from ``render claim-template``; ``pair``: two such devices under a
    matchAttribute or distinctAttribute constraint on the GPU."""
    tmpl = next(o for o in render("claim-template", {**values, "name": f"t{i}"}) if o["kind"] == "ResourceClaimTemplate")
    spec = copy.deepcopy(tmpl["spec"]["spec"])
    if pair:
        (req,) = spec["devices"]["requests"]
        spec["devices"]["requests"] = [dict(req, name="a"), dict(req, name="b")]
        spec["devices"].pop("config", None)
        spec["devices"]["constraints"] = [{"requests": ["a", "b"], pair: f"{D}/gpuIndex"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"uid-{i}"}, "spec": spec}


def cordon(slices: list[dict], gpus: set[int], effect: str = "NoSchedule") -> list[dict]:
    """``slices`` with every device of the GPUs ``gpus`` tainted (as a DeviceTaintRule would)."""
    out = copy.deepcopy(slices)
    for s in out:
        for d in s["spec"].get("devices") or []:
            if dev_attr(d, "gpuIndex", D) in gpus:
                d["taints"] = [*(d.get("taints") or []), dict(TAINT, effect=effect)]
    return out


def model_outcome(minor: str, gates: dict | None, slices: list[dict], allocated: list[dict], claims: list[dict],
                  node: str, full: bool = False) -> tuple:
    """("allocated", per claim its devices, or with ``full`` its whole :func:`detail`), ("no fit",) or
    ("error",), from the model with ``minor``'s scheduler and ``gates`` flipped."""
    v = compat.version_tuple(minor)
    features = Features.from_gates(compat.resolve(v, gates or {}), v)
    alloc = Allocator(slices, CLASSES, CelSelectors(), features=features)
    for c in allocated:
        alloc.reserve(c)
    try:
        _, allocations = alloc.allocate(claims, node=node)
    except AllocationError:
        return ("error",)
    except Unsatisfiable:
        return ("no fit",)
    return ("allocated", [detail(a) if full else chosen(a) for a in allocations])


def upstream_outcome(answer: dict, full: bool = False) -> tuple:
    if answer["status"] == "allocated":
        return ("allocated", [detail(a) if full else chosen(a) for a in answer["allocations"]])
    if answer["status"] == "unschedulable" or answer.get("perNode"):
        return ("no fit",)  # nil, nil or an error for this node only: the node is not feasible
    return ("error",)


#: one running upstream allocator per minor, shared by the tests (the fixture ``upstream`` of
#: tests/oracle/conftest.py checks they can run and closes them)
_oracle = running


def agree(up: UpstreamAllocator, minor: str, gates: dict | None, slices: list[dict], allocated: list[dict],
          claims: list[dict], node: str) -> dict:
    answer = up.allocate(slices=slices, classes=CLASSES, claims=claims, node=node, allocated=allocated, gates=gates)
    ours = model_outcome(minor, gates, slices, allocated, claims, node, full=True)
    assert ours == upstream_outcome(answer, full=True), (answer.get("error"), answer["features"])
    return answer


@pytest.mark.go
@settings(max_examples=int(os.environ.get("VGPUCTL_ORACLE_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), which=st.integers(0, len(PUBLISHED) - 1), flip=st.sampled_from(FLIPS),
       order=st.randoms(use_true_random=False), cordoned=st.sets(st.integers(0, 4), max_size=2),
       effect=st.sampled_from(["NoSchedule", "NoExecute"]), tolerate=st.sampled_from(TOLERATIONS))
def test_model_and_upstream_agree_on_streams_of_allocations(upstream, data, which, flip, order, cordoned, effect,
                                                            tolerate):
    preset, layout, minor, server = PUBLISHED[which]
    slices = published(preset, layout, minor, tuple(sorted(server.items())))
    node = slices[0]["spec"]["nodeName"]
    slices = cordon(slices, cordoned, effect)
    order.shuffle(slices)  # from 1.36 the scheduler searches in its own order, not the listing's
    if minor in UNSORTED:
        slices.sort(key=lambda s: s["metadata"]["name"])  # the one order the model and they share
    if flip and set(flip) - set(_oracle(minor).gates()):
        flip = None  # a gate this minor does not have
    kinds = offered(slices)
    # distinctAttribute needs DRAConsumableCapacity: with it off (1.34 and 1.35 by default) the API
    # server drops the field and refuses the claim (sim/apiserver/dropfields.py), so the scheduler
    # never sees one; 1.34's allocator does not keep it across requests (recorded below)
    consumable = compat.resolve(compat.version_tuple(minor), flip or {}).get("DRAConsumableCapacity", False)
    pairs = [None, None, "matchAttribute"] + (["distinctAttribute"] if consumable and minor != "1.34" else [])
    allocated: list[dict] = []
    for i in range(data.draw(st.integers(1, 10), label="steps")):
        if allocated and data.draw(st.integers(0, 3), label="release?") == 0:
            allocated.pop(data.draw(st.integers(0, len(allocated) - 1), label="released"))
            continue
        pod = []
        for k in range(data.draw(st.integers(1, 2), label="claims of the pod")):
            values = data.draw(st.sampled_from(kinds), label="claim")
            pair = data.draw(st.sampled_from(pairs), label="pair")
            c = claim(values, 10 * i + k, pair)
            if data.draw(st.integers(0, 5), label="admin access?") == 0:
                for r in c["spec"]["devices"]["requests"]:
                    if r.get("exactly"):  # a firstAvailable sub-request has no adminAccess
                        r["exactly"]["adminAccess"] = True
            if tolerate and cordoned:
                for r in c["spec"]["devices"]["requests"]:
                    for sub in [r.get("exactly")] + (r.get("firstAvailable") or []):
                        if sub:
                            sub["tolerations"] = copy.deepcopy(tolerate)
            pod.append(c)
        answer = agree(_oracle(minor), minor, flip, slices, allocated, pod, node)
        if answer["status"] == "allocated":
            allocated += [dict(c, status={"allocation": a}) for c, a in zip(pod, answer["allocations"], strict=True)]


@pytest.mark.go
def test_a_pod_with_two_claims_and_every_minor_default(upstream):
    """A pod's claims are allocated together: a whole GPU and a vGPU of another GPU, on each minor
    (1.34 and 1.35 keep no counters by default: the agent publishes fixed vGPUs there, no whole
    GPU, so two vGPUs of different types)."""
    for minor in MINORS:
        slices = published("mig-node", LAYOUT, minor, ())
        node = slices[0]["spec"]["nodeName"]
        kinds = offered(slices)
        whole = next((k for k in kinds if k.get("passthrough")), kinds[0])
        vgpu = next(k for k in kinds if k.get("profile") and k != whole)
        answer = agree(_oracle(minor), minor, None, slices, [], [claim(whole, 0), claim(vgpu, 1)], node)
        assert answer["status"] == "allocated"


# --------------------------------------------------------------------------- regression cases
#: Published shapes the model and upstream disagreed on before the model was fixed, with the
#: upstream outcome (kept so the model is checked against it where Go is absent).
REGRESSIONS = {
    # slices listed in reverse: upstream sorts a pool's slices by name and takes GPU 0's
    # passthrough device; the model took the listing's order (GPU 1's)
    "slice-order": ("mig-node", LAYOUT, "1.37", (), None, True,
                    {"passthrough": True, "product": "GA100 [A100 PCIe 40GB]"},
                    ("allocated", [[("gpu", D, "sim-mig", "gpu-0-passthrough")]])),
    # the API server keeps compatibility groups but kube-scheduler 1.37 has the alpha gate off
    # (its default): upstream ignores the slices that name groups, so the pool is incomplete and
    # nothing on the node is allocated; the model allocated
    "groups-gate-off": ("mixed-node", MIXED_SIZE, "1.37", (("DRADeviceCompatibilityGroups", True),), None, False,
                        {"profile": "A40-12Q"}, ("no fit",)),
    # scheduler with DRAPartitionableDevices off: counter slices are ignored, the pool is incomplete
    "partitionable-off": ("mixed-node", MIXED_SIZE, "1.36", (), {"DRAPartitionableDevices": False}, False,
                          {"profile": "A40-12Q"}, ("no fit",)),
    # binding conditions off: the devices that carry them cannot be selected
    "binding-off": ("mixed-node", MIXED_SIZE, "1.36", (), {"DRADeviceBindingConditions": False}, False,
                    {"profile": "A40-12Q"}, ("no fit",)),
}


@pytest.mark.parametrize("case", sorted(REGRESSIONS))
def test_regression_model_matches_recorded_upstream(case):
    preset, layout, minor, server, flip, reverse, values, expected = REGRESSIONS[case]
    slices = published(preset, layout, minor, server)
    if reverse:
        slices = slices[::-1]
    got = model_outcome(minor, flip, slices, [], [claim(values, 0)], slices[0]["spec"]["nodeName"])
    assert got == (expected[0], [list(x) for x in expected[1]]) if len(expected) > 1 else got == expected


@pytest.mark.go
@pytest.mark.parametrize("case", sorted(REGRESSIONS))
def test_regression_upstream_still_says_so(upstream, case):
    preset, layout, minor, server, flip, reverse, values, expected = REGRESSIONS[case]
    slices = published(preset, layout, minor, server)
    if reverse:
        slices = slices[::-1]
    answer = _oracle(minor).allocate(slices=slices, classes=CLASSES, claims=[claim(values, 0)],
                                     node=slices[0]["spec"]["nodeName"], gates=flip)
    got = upstream_outcome(answer)
    assert got == (expected[0], [list(x) for x in expected[1]]) if len(expected) > 1 else got == expected


@pytest.mark.go
def test_distinct_attribute_upstream_1_36_keeps_values_per_request(upstream):
    """Where upstream is wrong: 1.36.x (v0.36.6) checks distinctAttribute per request
    (kubernetes#140438, fixed in 1.37), so a request of two devices and a second request share a
    GPU; 1.37 and the model put the three devices on three GPUs. Recorded, not copied into the model."""
    c = claim({"profile": "T4-1Q"}, 0)
    (req,) = c["spec"]["devices"]["requests"]
    req["exactly"]["count"] = 2
    c["spec"]["devices"]["requests"] = [dict(req, name="a"), {"name": "b", "exactly": dict(req["exactly"], count=1)}]
    c["spec"]["devices"].pop("config", None)
    c["spec"]["devices"]["constraints"] = [{"requests": ["a", "b"], "distinctAttribute": f"{D}/gpuIndex"}]
    for minor in ("1.36", "1.37"):
        slices = published("t4-node", None, minor, ())
        node = slices[0]["spec"]["nodeName"]
        answer = _oracle(minor).allocate(slices=slices, classes=CLASSES, claims=[c], node=node)
        if minor == "1.36":
            assert answer["status"] == "allocated"
            gpus = [r["device"].split("-vgpu")[0] for r in answer["allocations"][0]["devices"]["results"]]
            assert len(set(gpus)) < len(gpus), gpus  # two results on one GPU despite distinctAttribute
        else:
            assert upstream_outcome(answer) == model_outcome(minor, None, slices, [], [c], node)
        ours = model_outcome(minor, None, slices, [], [c], node)
        assert ours[0] == "allocated"
        gpus = [dev.split("-vgpu")[0] for _, _, _, dev in ours[1][0]]
        assert len(set(gpus)) == len(gpus) == 3, gpus  # the model: three GPUs


@pytest.mark.go
@pytest.mark.parametrize("minor", MINORS[1:])
def test_slice_order_upstream_1_34_1_35_listing(upstream, minor):
    """Where upstream differs between minors: 1.34 and 1.35 take a pool's slices as listed, so
    listing them in reverse changes which device a vGPU claim gets; from 1.36, and in the model,
    it does not. Recorded, not copied into the model (a real scheduler's listing order is not fixed).
    1.34 is left out: with its default gates the agent publishes each pool as one slice."""
    slices = sorted(published("default", None, minor, ()), key=lambda s: s["metadata"]["name"])
    c = claim({"profile": "T4-1A"}, 0)
    node = slices[0]["spec"]["nodeName"]
    picks = [chosen(_oracle(minor).allocate(slices=ordered, classes=CLASSES, claims=[c], node=node)
                    ["allocations"][0]) for ordered in (slices, slices[::-1])]
    assert (picks[0] != picks[1]) == (minor in UNSORTED), picks
    assert model_outcome(minor, None, slices[::-1], [], [c], node) == ("allocated", [picks[0]])


@pytest.mark.go
def test_distinct_attribute_upstream_1_34_ignores_it_across_requests(upstream):
    """Where upstream is wrong: 1.34 (v0.34.13), even with DRAConsumableCapacity on, puts two
    single-device requests under one distinctAttribute on one GPU; 1.35 (and the model) use two
    GPUs. With 1.34's default gates the API server drops the field and refuses such a claim.
    Recorded, not copied into the model."""
    c = claim({"profile": "T4-1Q"}, 0, "distinctAttribute")
    on = {"DRAConsumableCapacity": True}
    for minor in ("1.34", "1.35"):
        slices = published("t4-node", None, minor, ())
        answer = _oracle(minor).allocate(slices=slices, classes=CLASSES, claims=[c], node="sim-t4", gates=on)
        gpus = {r["device"].split("-vgpu")[0] for r in answer["allocations"][0]["devices"]["results"]}
        assert len(gpus) == (1 if minor == "1.34" else 2), (minor, gpus)
        ours = model_outcome(minor, on, slices, [], [c], "sim-t4")
        assert len({dev.split("-vgpu")[0] for _, _, _, dev in ours[1][0]}) == 2


def _grouped_pool() -> list[dict]:
    """One counter set, three devices with two compatibility groups each, pairwise compatible
    but with no group common to all three (x,y / y,z / x,z)."""
    groups = {"d-xy": ["x", "y"], "d-yz": ["y", "z"], "d-xz": ["x", "z"]}
    meta = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
    pool = {"name": "n1", "generation": 1, "resourceSliceCount": 2}
    counters = dict(meta, metadata={"name": "n1-counters"}, spec={
        "driver": D, "nodeName": "n1", "pool": pool,
        "sharedCounters": [{"name": "gpu-0", "counters": {"slots": {"value": "8"}}}]})
    devices = dict(meta, metadata={"name": "n1-devices"}, spec={"driver": D, "nodeName": "n1", "pool": pool, "devices": [
        {"name": n, "attributes": {"type": {"string": "vgpu"}},
         "consumesCounters": [{"counterSet": "gpu-0", "counters": {"slots": {"value": "1"}}, "compatibilityGroups": g}]}
        for n, g in groups.items()]})
    return [counters, devices]


def _three() -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "three", "namespace": "default", "uid": "uid-three"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": "vgpu.kubevirt.io", "allocationMode": "ExactCount", "count": 3}}]}}}


def test_regression_compatibility_groups_are_a_running_intersection():
    """The model checked groups pairwise and put all three on the set; upstream keeps the running
    intersection of every device on the set (recorded: does not fit)."""
    assert model_outcome("1.37", GROUPS, _grouped_pool(), [], [_three()], "n1") == ("no fit",)


@pytest.mark.go
def test_compatibility_groups_running_intersection_upstream(upstream):
    slices, c = _grouped_pool(), _three()
    answer = agree(_oracle("1.37"), "1.37", GROUPS, slices, [], [c], "n1")
    assert answer["status"] == "unschedulable"
    two = copy.deepcopy(c)
    two["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    assert agree(_oracle("1.37"), "1.37", GROUPS, slices, [], [two], "n1")["status"] == "allocated"


def _two_drivers_one_pool_name() -> tuple[list[dict], list[dict]]:
    """Two drivers on one node, each naming its pool after the node and its counter set alike, one
    slot each: counters are per driver and pool, so both devices can be allocated together."""
    out = []
    for driver in ("a.example.com", "b.example.com"):
        pool = {"name": "n1", "generation": 1, "resourceSliceCount": 2}
        meta = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
        out.append(dict(meta, metadata={"name": f"{driver}-counters"}, spec={
            "driver": driver, "nodeName": "n1", "pool": pool,
            "sharedCounters": [{"name": "gpu-0", "counters": {"slots": {"value": "1"}}}]}))
        out.append(dict(meta, metadata={"name": f"{driver}-devices"}, spec={
            "driver": driver, "nodeName": "n1", "pool": pool, "devices": [
                {"name": "dev-0", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"slots": {"value": "1"}}}]}]}))
    classes = [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "every"}, "spec": {}}]
    return out, classes


@pytest.mark.go
def test_counters_of_two_drivers_with_one_pool_name_stay_apart(upstream):
    """kubernetes#140434 (1.35.x and 1.36.0-1.36.3 key counters by pool name only) is not in the pinned
    releases: both devices fit on 1.36 and 1.37, as in the model."""
    slices, classes = _two_drivers_one_pool_name()
    c = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "both", "namespace": "default", "uid": "uid-both"},
         "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "every", "count": 2}}]}}}
    for minor in ("1.36", "1.37"):
        answer = _oracle(minor).allocate(slices=slices, classes=classes, claims=[c], node="n1")
        assert answer["status"] == "allocated", answer
        alloc = Allocator(slices, classes, CelSelectors())
        _, got = alloc.allocate([c], node="n1")
        assert chosen(got[0]) == chosen(answer["allocations"][0])

