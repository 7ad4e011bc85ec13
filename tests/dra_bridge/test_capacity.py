"""``vgpuctl capacity``: how many more of each profile fit, per node and GPU, through the scheduler model."""

from __future__ import annotations

import json

import yaml

from dra_bridge.scheduling import capacity
from dra_bridge.scheduling.selectors import CelSelectors
from dra_bridge.sim.cluster import SimCluster
from dra_bridge.sim.demo import WORKLOADS, render_workload
from dra_bridge.sim.scenarios import simulated_capacity
from kubevirt_templates.render import render
from vgpuctl.commands.capacity import usage_text
from vgpuctl.main import main

DRV = "vgpu.kubevirt.io"


def fits(report, index, node=None) -> dict[str, int]:
    g = report.gpu(node, index)
    return {p.profile: p.fits for p in g.profiles}


# --------------------------------------------------------------------------- hand-written slices


def dev(name, kind, profile, mem, consumes, groups=None, index=0, gpu="0000:10:00.0"):
    attrs = {"type": {"string": kind}, "gpuIndex": {"int": index}, "productName": {"string": "TU104GL [Tesla T4]"}}
    if kind == "vgpu":
        attrs |= {"profile": {"string": profile}, "parentPciBusID": {"string": gpu}}
    else:
        attrs["resource.kubernetes.io/pciBusID"] = {"string": gpu}
    c = {"counterSet": f"gpu-{index}-counter-set", "counters": {k: {"value": v} for k, v in consumes.items()}}
    if groups:
        c["compatibilityGroups"] = groups
    return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": mem}}, "consumesCounters": [c]}


def t4_slices(*, groups: bool, generation: int = 1, count: int | None = None, node: str = "n1") -> list[dict]:
    devices = [dev("gpu-0-passthrough", "passthrough", None, "16Gi", {"memory": "16Gi", "vgpus": "4"})]
    devices += [dev(f"gpu-0-vgpu-t4-8q-{k}", "vgpu", "T4-8Q", "8Gi", {"memory": "8Gi", "vgpus": "1"},
                    ["fb-8192"] if groups else None) for k in range(2)]
    devices += [dev(f"gpu-0-vgpu-t4-4q-{k}", "vgpu", "T4-4Q", "4Gi", {"memory": "4Gi", "vgpus": "1"},
                    ["fb-4096"] if groups else None) for k in range(4)]
    pool = {"name": node, "generation": generation, "resourceSliceCount": count or 2}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-0"},
         "spec": {"driver": DRV, "pool": pool, "nodeName": node, "sharedCounters": [
             {"name": "gpu-0-counter-set", "counters": {"memory": {"value": "16Gi"}, "vgpus": {"value": "4"}}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-1"},
         "spec": {"driver": DRV, "pool": pool, "nodeName": node, "devices": devices}},
    ]


def claim(name, *devices, node="n1"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": DRV, "pool": node, "device": d} for d in devices]}}}}


def test_empty_gpu_fits_each_profile_alone():
    r = capacity.compute(t4_slices(groups=True), [], selectors=CelSelectors())
    assert fits(r, 0) == {"T4-4Q": 4, "T4-8Q": 2, "whole GPU": 1}
    g = r.gpu("n1", 0)
    assert (g.gpu, g.counter_set, g.totals, g.used) == ("0000:10:00.0", "gpu-0-counter-set",
                                                        {"memory": "16Gi", "vgpus": "4"}, {"memory": "0", "vgpus": "0"})


def test_allocations_and_equal_size_mode_count():
    """One 8 GiB vGPU held: one more 8Q fits, no 4Q (equal size, through the compatibility groups,
    although 8 GiB are free), no whole GPU (the counters)."""
    r = capacity.compute(t4_slices(groups=True), [claim("a", "gpu-0-vgpu-t4-8q-0")], selectors=CelSelectors())
    assert fits(r, 0) == {"T4-4Q": 0, "T4-8Q": 1, "whole GPU": 0}
    g = r.gpu("n1", 0)
    assert g.used == {"memory": "8Gi", "vgpus": "1"}
    assert g.holders == [{"claim": "default/a", "device": "gpu-0-vgpu-t4-8q-0", "profile": "T4-8Q"}]
    # without groups (a GPU in mixed-size mode) the 8 GiB left take two 4Q
    r = capacity.compute(t4_slices(groups=False), [claim("a", "gpu-0-vgpu-t4-8q-0")], selectors=CelSelectors())
    assert fits(r, 0) == {"T4-4Q": 2, "T4-8Q": 1, "whole GPU": 0}


def test_whole_gpu_held_leaves_nothing():
    r = capacity.compute(t4_slices(groups=True), [claim("pt", "gpu-0-passthrough")], selectors=CelSelectors())
    assert fits(r, 0) == {"T4-4Q": 0, "T4-8Q": 0, "whole GPU": 0}
    assert r.gpu("n1", 0).holders[0]["profile"] == "whole GPU"
    # its counters are all taken, by no vGPU: the table says what holds it ("4 of 4 vGPUs" before)
    assert usage_text(r.gpu("n1", 0)) == "16 GiB of 16 GiB, passed through whole"


def test_incomplete_pools_and_old_generations_do_not_count():
    slices = t4_slices(groups=True, count=3)  # one slice of the pool is missing
    r = capacity.compute(slices, [], selectors=CelSelectors())
    assert r.gpus == [] and r.incomplete_pools == [f"{DRV}/n1"]
    old = t4_slices(groups=True, generation=1, node="n1")
    new = t4_slices(groups=True, generation=2, node="n1")
    for s in new:
        s["metadata"]["name"] += "-g2"
    r = capacity.compute(old + new, [], selectors=CelSelectors())
    assert len(r.gpus) == 1 and fits(r, 0)["T4-8Q"] == 2


def test_nodes_filter_and_other_drivers():
    slices = t4_slices(groups=True, node="n1") + t4_slices(groups=True, node="n2")
    r = capacity.compute(slices, [claim("a", "gpu-0-passthrough", node="n2")], selectors=CelSelectors())
    assert fits(r, 0, "n1")["whole GPU"] == 1 and fits(r, 0, "n2")["whole GPU"] == 0
    assert [g.node for g in capacity.compute(slices, [], selectors=CelSelectors(), nodes=["n2"]).gpus] == ["n2"]
    assert capacity.compute(slices, [], driver="other.example.com", selectors=CelSelectors()).gpus == []


def test_capacity_json_spells_its_keys_as_kubectl_vgpu_does(tmp_path, capsys):
    """Issue #36: ``capacity -o json`` and ``kubectl vgpu -o json`` both camelCase (was ``free_devices``)."""
    f = tmp_path / "objs.json"
    f.write_text(json.dumps({"kind": "List", "items": t4_slices(groups=True) + [claim("a", "gpu-0-vgpu-t4-8q-1")]}))
    assert main(["capacity", "--from", str(f), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)

    def keys(value) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys(v)}
        return {k for v in value for k in keys(v)} if isinstance(value, list) else set()

    found = keys(doc)
    assert {"incompletePools", "counterSet", "freeDevices"} <= found and not [k for k in found if "_" in k], found


def test_from_objects_reads_kubectl_lists(tmp_path):
    doc = {"apiVersion": "v1", "kind": "List", "items": t4_slices(groups=True) + [claim("a", "gpu-0-vgpu-t4-4q-0")]}
    f = tmp_path / "objs.yaml"
    f.write_text(yaml.safe_dump(doc))
    slices, claims = capacity.from_file(f)
    assert len(slices) == 2 and len(claims) == 1
    assert fits(capacity.compute(slices, claims, selectors=CelSelectors()), 0)["T4-4Q"] == 3


def test_cli_capacity_from_file(tmp_path, capsys):
    f = tmp_path / "objs.json"
    f.write_text(json.dumps({"kind": "List", "items": t4_slices(groups=True) + [claim("a", "gpu-0-vgpu-t4-8q-1")]}))
    assert main(["capacity", "--from", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {p["profile"]: p["fits"] for p in out["gpus"][0]["profiles"]} == {"T4-4Q": 0, "T4-8Q": 1, "whole GPU": 0}
    assert main(["capacity", "--from", str(f)]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0] == "Node n1:" and all(len(line) <= 80 for line in lines)
    assert lines[1].split() == ["GPU", "ADDRESS", "MODEL", "IN", "USE", "PROFILE", "SIZE", "FITS", "OF"]
    assert lines[2].split()[:3] == ["0", "0000:10:00.0", "T4"]
    assert next(ln for ln in lines if "T4-8Q" in ln).split()[-5:] == ["T4-8Q", "8", "GiB", "1", "2"]
    assert next(ln for ln in lines if "whole GPU" in ln).split() == ["whole", "GPU", "16", "GiB", "0", "1"]
    assert main(["capacity", "--from", str(f), "-o", "wide"]) == 0
    wide = capsys.readouterr().out
    assert "8 GiB of 16 GiB, 1 of 4 vGPUs" in wide and "TU104GL [Tesla T4]" in wide
    assert main(["capacity", "--from", str(f), "--fitting"]) == 0
    assert "T4-4Q" not in capsys.readouterr().out


# --------------------------------------------------------------------------- the simulated cluster


def test_simulated_cluster_with_the_demo_workloads():
    r = simulated_capacity("1.35", render=render)
    assert fits(r, 0) == {"T4-8Q": 0, "whole GPU": 0}
    assert fits(r, 1) == {"T4-8Q": 0, "whole GPU": 0}
    # the A100 in MIG mode holds a 3g.20gb at slices 0-3 (the VM) and a 1g.5gb at slice 4 (the pod):
    # two more 1g.5gb fit (slices 5 and 6; slice 7 is no 1g placement), no 3g.20gb (its other
    # placement, 4-7, is broken by the pod's)
    assert fits(r, 2) == {"A100-1-5C": 2, "A100-3-20C": 0, "whole GPU": 0}
    # the L40S in mixed-size mode: a pod's 12Q at slots 0-11, a DRA VM's 8Q at 16-23 and a classic VM's 12Q
    # at 24-35 leave one 12Q (at 36) or one 8Q (at 40), not both: their placements overlap
    assert fits(r, 3) == {"L40S-8Q": 1, "L40S-12Q": 1, "whole GPU": 0}
    assert r.gpu(None, 0).used["memory"] == "16Gi"
    used = r.gpu(None, 2).used
    assert [used[f"memory-slice-{k}"] for k in range(8)] == ["1"] * 5 + ["0"] * 3 and used["multiprocessors"] == "56"
    assert "with the demo's workloads running" in r.notes[0]


def test_simulated_1_37_publishes_every_profile_and_honours_equal_size():
    """Server 1.37, every profile published with compatibility groups: a T4 holding one 8Q fits one
    more 8Q (and its 8A/8C siblings of the same size) and nothing smaller; the untouched T4 fits 16 x 1Q."""
    with SimCluster(render=render, version="1.37", layout_name="all", health=False) as c:
        c.launch(render_workload(WORKLOADS[0], render), name="vm-t4-a")  # T4-8Q on GPU 0
        r = capacity.compute(c.slices(), c.claims(), selectors=c.selectors)
    g0, g1 = fits(r, 0), fits(r, 1)
    assert g0["T4-8Q"] == 1 and g0["T4-8A"] == 1 and g0["T4-4Q"] == 0 and g0["T4-1Q"] == 0 and g0["whole GPU"] == 0
    assert g1["T4-1Q"] == 16 and g1["T4-16Q"] == 1 and g1["whole GPU"] == 1
    assert fits(r, 3)["L40S-1Q"] == 32
    # the A100 in MIG mode: NVIDIA's instance counts of each GPU-instance profile
    assert fits(r, 2) == {"A100-1-5C": 7, "A100-1-5CME": 1, "A100-2-10C": 3, "A100-3-20C": 2, "A100-4-20C": 1,
                          "A100-7-40C": 1, "whole GPU": 1}


def test_cli_capacity_against_an_api_server(tmp_path, capsys):
    """--kubeconfig: slices and claims through the official client (here the simulated cluster's API)."""
    with SimCluster(render=render, health=False) as c:
        c.launch(render_workload(WORKLOADS[2], render), name="vm-a100")
        kubeconfig = c.srv.kubeconfig(tmp_path / "kubeconfig")
        assert main(["capacity", "--kubeconfig", str(kubeconfig), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    a100 = next(g for g in out["gpus"] if g["index"] == 2)
    assert {p["profile"]: p["fits"] for p in a100["profiles"]} == {"A100-1-5C": 3, "A100-3-20C": 1, "whole GPU": 0}
    assert a100["holders"][0]["profile"] == "3g.20gb"  # a MIG placement's profile, as NVIDIA names it
