"""``vgpuctl demo`` and the simulated cluster under it (dra_bridge.sim.cluster, dra_bridge.sim.apiserver),
with the selectors it evaluates through the CEL engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.scheduling.pools import Device
from dra_bridge.scheduling.selectors import CelSelectors, SelectorError, default_selectors
from dra_bridge.sim import demo
from dra_bridge.sim.kubelet import resolve_cdi
from dra_bridge.sim.workloads import pod_node
from kubevirt_templates.render import render
from vgpuctl.commands import demo as demo_cli
from vgpuctl.main import main

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def report():
    return demo.run_demo(render=render)


def by_name(rep, name):
    return next(w for w in rep.workloads if w["name"] == name)


def test_demo_runs_the_whole_system(report):
    assert report.ok, report.problems
    # a real version's defaults: 1.36 keeps counters and binding conditions, not compatibility groups
    assert report.node == "sim-node-1" and report.kubernetes == "v1.36.0"
    assert report.feature_gates["DRAPartitionableDevices"] and report.feature_gates["DRADeviceBindingConditions"]
    assert "DRADeviceCompatibilityGroups" not in report.feature_gates
    phases = {w["name"]: w["phase"] for w in report.workloads}
    assert phases == {"vm-t4-a": "Running", "pod-t4": "Running", "vm-a100": "Running", "pod-a100": "Running",
                      "vm-passthrough": "Running", "vfio-pod": "Running", "vm-l40s": "Running",
                      "vm-classic": "Running", "vm-t4-c": "Pending"}
    # the node manager applied the layout: VFs on the SR-IOV boards
    vfs = {g["model"]: g["vfs"] for g in report.layout["gpus"]}
    assert vfs["GA100 [A100 PCIe 40GB]"] == 16 and vfs["AD102GL [L40S]"] == 32
    # the bridge published one counter set per GPU (1.35+: counters in slices of their own)
    # devices on 1.36 (a time-sliced GPU holding vGPUs offers their size): 2 x (T4 8 GB slots 2 + whole GPU), the A100's
    # 3g.20gb and 1g.5gb placements (2 + 7) and the whole GPU, the L40S in mixed-size mode: its 12 GB and 8 GB
    # placements (4 + 4) and the whole GPU
    assert report.slices["counter_sets"] == 4 and report.slices["devices"] == 2 * 3 + 10 + 9
    assert report.slices["plugin_socket"].endswith("/plugins/vgpu.kubevirt.io/dra.sock")


def test_demo_workloads_are_real_claims_prepared_by_the_plugin(report):
    devices = [d for w in report.workloads for d in w["devices"]]
    assert len(devices) == 8
    # every claim was made from a template by the claim controller's naming rule (the classic VM's
    # by the scheduler's, KEP-5004: <pod>-extended-resources-<random>)
    for w in report.workloads:
        for claim in w["claims"]:
            assert claim.startswith(w["pod"] + "-")
    # KEP-5304 metadata gave each workload its device: an mdev UUID, a VF, or the GPU's address
    a = by_name(report, "vm-t4-a")["devices"][0]
    assert a["kind"] == "vgpu" and a["profile"] == "T4-8Q" and len(a["host_id"]) == 36
    pod = by_name(report, "vfio-pod")["devices"][0]
    assert pod["profile"] == "L40S-12Q" and pod["host_id"].startswith("0000:19:00.")  # a VF of the L40S
    pt = by_name(report, "vm-passthrough")["devices"][0]
    assert pt["kind"] == "passthrough" and pt["host_id"] == "0000:13:00.0"
    # isolated: every device in its own IOMMU group, a vfio device node per group
    groups = [d["iommu_group"] for d in devices]
    assert None not in groups and len(set(groups)) == 8
    for d in devices:
        paths = [n["path"] for n in d["device_nodes"]]
        assert paths == ["/dev/vfio/vfio", f"/dev/vfio/{d['iommu_group']}"]
    # the workloads ran the health check on their device nodes
    for w in report.workloads:
        if w["phase"] == "Running":
            assert w["health"]["result"] == "Pass", w["health"]
    assert report.host_problems == []


def test_demo_a_vm_and_a_pod_share_one_gpus_counters(report):
    """One accounting: a VM's vGPU and a pod's vGPU (a vfio device) on the same T4, drawing on its
    one counter set, and the next T4 vGPU refused because that set is spent."""
    vm, pod = by_name(report, "vm-t4-a"), by_name(report, "pod-t4")
    assert (vm["kind"], pod["kind"]) == ("VirtualMachine", "Pod")
    (dv,), (dp,) = vm["devices"], pod["devices"]
    assert dv["gpu"] == dp["gpu"] == "0000:10:00.0" and dv["counter_set"] == dp["counter_set"]
    assert dv["kind"] == dp["kind"] == "vgpu" and dv["host_id"] != dp["host_id"]  # two mdevs on one GPU
    assert [n["path"] for n in dp["device_nodes"]][-1] == f"/dev/vfio/{dp['iommu_group']}"
    g0 = next(g for g in report.gpus if g.index == 0)
    assert [(h.owner, h.workload) for h in g0.holders] == [("VM", "vm-t4-a"), ("pod", "pod-t4")]
    assert report.shared[0] == {"gpu": 0, "address": "0000:10:00.0", "counter_set": dv["counter_set"],
                                "vms": ["vm-t4-a"], "classic_vms": [], "pods": ["pod-t4"], "memory_used": 16 * GiB,
                                "memory_total": 16 * GiB}


def test_demo_mig_backed_vgpus_of_a_vm_and_a_pod_share_the_a100s_counters(report):
    """MIG-backed vGPUs at two GPU-instance placements of one A100, a VM's and a pod's, on the GPU's
    one counter set in NVIDIA's vocabulary; what is left is what still has a free placement."""
    vm, pod = by_name(report, "vm-a100"), by_name(report, "pod-a100")
    (dv,), (dp,) = vm["devices"], pod["devices"]
    assert dv["device"].startswith("gpu-2-mig-3g20gb-9-") and dp["device"].startswith("gpu-2-mig-1g5gb-19-")
    assert dv["counter_set"] == dp["counter_set"] == "gpu-2-counter-set"
    assert report.shared[1]["vms"] == ["vm-a100"] and report.shared[1]["pods"] == ["pod-a100"]
    g2 = next(g for g in report.gpus if g.index == 2)
    assert (g2.slices_used, g2.slices_total) == (5, 8)  # 4 slices of the 3g.20gb, 1 of the 1g.5gb


def test_demo_a_classic_device_name_vm_and_a_dra_vm_share_the_l40s_counters(report):
    """An unchanged VM of the device-plugin era (gpus[].deviceName: nvidia.com/NVIDIA_L40S-12Q) runs
    on the DRA accounting: the scheduler's claim for its classic resource, our device in the L40S's
    counter set beside a DRA VM's and a pod's, found by virt-launcher in PCI_RESOURCE_<R>."""
    classic, dra = by_name(report, "vm-classic"), by_name(report, "vm-l40s")
    (dc,), (dd,) = classic["devices"], dra["devices"]
    assert dc["counter_set"] == dd["counter_set"] == "gpu-3-slots-a" and dc["device"] != dd["device"]
    assert dc["env"] == [f"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-12Q={dc['host_id']}"] and dd["env"] == []
    assert dc["host_id"].startswith("0000:19:00.")  # a VF of the L40S carrying the type
    assert classic["claims"][0].startswith(classic["pod"] + "-extended-resources-")
    g3 = next(g for g in report.shared if g["gpu"] == 3)
    assert g3["classic_vms"] == ["vm-classic"] and set(g3["vms"]) == {"vm-l40s", "vm-classic"}


def test_demo_a_vm_and_a_pod_of_different_sizes_share_the_l40s_in_mixed_size_mode(report):
    """The L40S runs in mixed-size mode: the pod's 12 GiB vGPU and the VM's 8 GiB one (and the classic
    VM's 12 GiB one) at their own placements, each made there on the host; the slot map says where."""
    pod, vm = by_name(report, "vfio-pod")["devices"][0], by_name(report, "vm-l40s")["devices"][0]
    classic = by_name(report, "vm-classic")["devices"][0]
    assert (pod["profile"], pod["device"], pod["slots"]) == ("L40S-12Q", "gpu-3-vgpu-12gb-at-0", (0, 12))
    assert (vm["profile"], vm["device"], vm["slots"]) == ("L40S-8Q", "gpu-3-vgpu-8gb-at-16", (16, 8))
    assert (classic["device"], classic["slots"]) == ("gpu-3-vgpu-12gb-at-24", (24, 12))
    g3 = next(g for g in report.gpus if g.index == 3)
    assert g3.slots_total == 48 and {h.workload: h.slots for h in g3.holders} == {
        "vfio-pod": (0, 12), "vm-l40s": (16, 8), "vm-classic": (24, 12)}
    shared = next(g for g in report.shared if g["gpu"] == 3)
    assert shared["pods"] == ["vfio-pod"] and "vm-l40s" in shared["vms"]
    out = demo_cli.text(report)
    assert "3 vGPUs on 48 slots of 1 GiB (mixed-size)" in out and "VF 0000:19:00.5, slots 16-23" in out
    # the picture: the L40S as its 48 slots, each vGPU drawn over the slots it holds
    root = ET.fromstring(demo_cli.svg(report))
    (smap,) = [g for g in root.iter(SVG + "g") if g.get("class") == "slot-map"]
    assert len(list(smap.iter(SVG + "line"))) == 47
    marks = ["".join(t.itertext()) for t in smap.iter(SVG + "text")]
    assert marks[0] == "mixed-size mode: 48 slots of 1 GiB" and marks[1:] == ["0", "12", "16", "24", "36", "48",
                                                                              "free slots 36-47"]
    bar = [r for r in root.iter(SVG + "rect") if r.get("class") == "gpu"][3]
    x0, width = float(bar.get("x")), float(bar.get("width"))
    held = {r.find(SVG + "title").text.split(" · ")[0]: r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None}
    for who, (start, size) in (("pod vfio-pod", (0, 12)), ("VM vm-l40s", (16, 8)), ("VM vm-classic", (24, 12))):
        r = held[who]
        assert float(r.get("x")) == pytest.approx(x0 + width * start / 48, abs=0.1)
        assert float(r.get("width")) == pytest.approx(width * size / 48, abs=0.1)
        assert r.find(SVG + "title").text.endswith(f"slots {start}-{start + size - 1}")


def test_demo_accounts_per_gpu(report):
    gpus = {g.index: g for g in report.gpus}
    assert [h.workload for h in gpus[0].holders] == ["vm-t4-a", "pod-t4"]
    assert gpus[0].memory_used == gpus[0].memory_total == 16 * GiB and gpus[0].vgpus_used == 2
    assert [(h.workload, h.kind) for h in gpus[1].holders] == [("vm-passthrough", "passthrough")]
    assert gpus[1].memory_used == 16 * GiB  # the whole GPU consumes the whole counter set
    assert gpus[2].memory_used == (19968 + 4864) * 2**20 and gpus[3].memory_used == (12 + 8 + 12) * GiB
    left = {i: {x["profile"]: x["fits"] for x in g.left} for i, g in gpus.items()}
    assert left[0] == {"T4-8Q": 0, "whole GPU": 0} and left[1] == {"T4-8Q": 0, "whole GPU": 0}
    # the 3g.20gb at 0 and the 1g.5gb at 4 leave two 1g.5gb placements (5, 6) and no 3g.20gb
    assert left[2] == {"A100-1-5C": 2, "A100-3-20C": 0, "whole GPU": 0}
    assert left[3]["L40S-12Q"] == 1 and left[3]["whole GPU"] == 0
    assert gpus[2].framework == "mdev-sriov" and gpus[3].framework == "vendor-vfio" and gpus[1].framework == "mdev"


def test_demo_explains_the_refusal(report):
    (r,) = report.refused
    assert r["workload"] == "vm-t4-c" and r["owner"] == "VM" and r["asked"] == "T4-8Q"
    # the allocator's own reason: the shared counter set has no framebuffer left
    assert "gpu-0 has 0 B of 16 GiB framebuffer left; needs 8 GiB" in r["reason"]
    text = "\n".join(r["per_gpu"])
    assert "in use by VM vm-t4-a (T4-8Q, 8 GiB), pod pod-t4 (T4-8Q, 8 GiB)" in text
    assert "passed through to vm-passthrough" in text
    assert "no T4-8Q devices published" in text


def test_refusal_names_the_gpus_that_publish_nothing_of_the_profile_not_their_model():
    """newcomer finding 8: on rtxpro-node, GPU 3 publishes the one whole GPU (held) while GPUs 0-2 of
    the same model publish none; the refusal says so per GPU, not "MODEL: no whole GPU devices published"."""
    model = "GB202GL [RTX PRO 6000 Blackwell Server Edition]"

    def view(i: int, left: list[dict], holders=()) -> demo.GpuView:
        return demo.GpuView(index=i, address=f"0000:{0x10 + 3 * i:02x}:00.0", model=model, framework="mdev-sriov",
                            counter_set=None, memory_total=None, memory_used=0, vgpus_total=None, vgpus_used=0,
                            holders=list(holders), left=left)

    whole = demo.Holder(workload="vm-whole", owner="VM", kind="passthrough", profile="whole GPU", memory=None,
                        device="gpu-3-passthrough", host_id="0000:19:00.0", iommu_group=None)
    gpus = [view(i, [{"profile": "DC-1-6Q", "fits": 1, "of": 4}]) for i in range(3)]
    gpus.append(view(3, [{"profile": "whole GPU", "fits": 0, "of": 1}], [whole]))
    lines = demo._refusal_detail(None, gpus, "whole GPU")  # type: ignore[arg-type]
    assert lines == ["GPU 3 (0000:19:00.0): the whole GPU is passed through to vm-whole",
                     f"GPU 0, 1, 2 ({model}): no whole GPU devices published"], lines


def test_demo_tears_everything_down(report):
    t = report.teardown
    assert t["vgpus_removed"] == 7 and t["gpus_returned"] == ["0000:13:00.0"]
    assert (t["claims_left"], t["prepared_left"], t["cdi_files_left"], t["vgpus_left"], t["still_on_vfio"]) == \
           (0, 0, 0, [], [])


def test_demo_text(report):
    text = demo_cli.text(report)
    long = [line for line in text.splitlines() if len(line) > 80]
    assert all(" " not in line.strip() and line.strip().startswith("/") for line in long), long  # a path, whole
    out = " ".join(text.split())  # long lines go on below, in 80 columns
    for needle in ("[1] node manager", "[2] DRA bridge", "vm-t4-a", "[4] per physical GPU", "left: 2 x A100-1-5C",
                   "VM  vm-t4-a", "pod pod-t4", "VM vm-t4-a and pod pod-t4 draw on the same 16 GiB",
                   "[5] refused", "VM vm-t4-c asked for a T4-8Q vGPU and stays Pending", "host clean", "done in",
                   "0000:13:00.0 T4 (mdev) [####################] 16 GiB of 16 GiB, passed through whole"):
        assert " ".join(needle.split()) in out, needle
    assert "16 of 16 vGPUs" not in out  # the passed-through T4 holds no vGPU


def test_demo_svg_is_well_formed(report):
    root = ET.fromstring(demo_cli.svg(report))
    assert root.tag == SVG + "svg"
    segments = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
    assert len(segments) == 8  # one per device held
    titles = " ".join(r.find(SVG + "title").text for r in segments)
    assert "vm-passthrough" in titles and "vfio-pod" in titles
    texts = " ".join("".join(t.itertext()) for t in root.iter(SVG + "text"))
    assert "refused: VM vm-t4-c" in texts and "GPU 3" in texts
    # the passed-through T4 is drawn full, the A100 bar is longer than a T4's (scaled to memory)
    bars = [r for r in root.iter(SVG + "rect") if r.get("class") == "gpu"]
    assert len(bars) == 4 and float(bars[2].get("width")) > float(bars[0].get("width"))


def test_demo_svg_has_a_legend_and_tells_vms_from_pods(report):
    root = ET.fromstring(demo_cli.svg(report))
    legend = next(g for g in root.iter(SVG + "g") if g.get("class") == "legend")
    entries = ["".join(t.itertext()) for t in legend.iter(SVG + "text")]
    assert entries == ["Legend", "VM: vGPU or whole GPU (virt-launcher pod's claim)", "pod: vGPU as a vfio device",
                       "free framebuffer", "refused request (stays Pending)"]
    # VMs solid in blues, pods in oranges with the hatch pattern over them, each labelled with its kind
    segments = {r.find(SVG + "title").text.split(" · ")[0]: r for r in root.iter(SVG + "rect")
                if r.find(SVG + "title") is not None}
    assert set(segments) == {"VM vm-t4-a", "pod pod-t4", "VM vm-a100", "pod pod-a100", "VM vm-passthrough",
                             "pod vfio-pod", "VM vm-l40s", "VM vm-classic"}
    for who, r in segments.items():
        owner = who.split()[0]
        assert r.get("class") == f"holder {owner.lower()}"
        assert r.get("fill") in (demo_cli.VM_COLORS if owner == "VM" else demo_cli.POD_COLORS)
    hatched = [r for r in root.iter(SVG + "rect") if r.get("fill") == "url(#pod-hatch)"]
    assert len(hatched) == 1 + 3  # the legend's swatch and the three pods
    assert root.find(f"{SVG}defs/{SVG}pattern[@id='pod-hatch']") is not None
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert "VM vm-t4-a" in texts and "pod pod-t4" in texts  # labels on the shared T4's segments
    assert any("shared by VM vm-t4-a and pod pod-t4: one counter set" in t for t in texts)
    # the refused request drawn as a dashed box past the full T4 it did not fit on
    dashed = [r for r in root.iter(SVG + "rect") if r.get("stroke-dasharray")]
    assert len(dashed) == 2  # the legend's swatch and vm-t4-c on GPU 0
    assert "T4-8Q: refused" in texts


def test_demo_json_is_complete(report):
    d = json.loads(demo_cli.to_json(report))
    assert d["ok"] is True and len(d["workloads"]) == 9 and len(d["gpus"]) == 4 and d["refused"]
    assert "text" not in d["layout"]


def test_cli_demo(tmp_path, capsys):
    svg = tmp_path / "gpus.svg"
    assert main(["demo", "--json", "--svg", str(svg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and [w["phase"] for w in out["workloads"]].count("Running") == 8
    ET.parse(svg)


def test_demo_after_a_plain_install(tmp_path):
    """No test extras: no kubernetes-validate (DRA rules only), no grpcio-tools, no pytest, and
    tests/ not importable; selectors go through the CEL engine, a runtime dependency."""
    code = ("import sys\n"
            "for m in ('kubernetes_validate', 'grpc_tools', 'pytest', 'tests'):\n"
            "    sys.modules[m] = None\n"
            "from dra_bridge.sim.demo import run_demo\n"
            "from kubevirt_templates.render import render\n"
            "rep = run_demo(render=render)\n"
            "print(rep.cel, rep.ok, rep.problems)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))  # this checkout, whatever the environment has installed
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[:2] == ["CelSelectors", "True"], p.stdout


def test_cli_demo_rtxpro_node_shares_a_gpu_instance(tmp_path, capsys):
    """`vgpuctl demo --preset rtxpro-node` (#38.5): a VM and a pod each get a DC-1-6Q vGPU in one GB20x
    GPU instance (MIG time-slicing), at two placements inside it, both made on the simulated host
    where the slices said; the second VM asking for the one whole GPU is refused; all torn down."""
    svg = tmp_path / "gpus.svg"
    assert main(["demo", "--preset", "rtxpro-node", "--json", "--svg", str(svg)]) == 0
    rep = json.loads(capsys.readouterr().out)
    titles = [t.text for t in ET.parse(svg).iter(SVG + "title")]
    assert any(t.startswith("VM vm-mig") for t in titles) and any(t.startswith("pod pod-mig") for t in titles)
    assert rep["ok"], rep["problems"]
    assert rep["preset"] == "rtxpro-node" and rep["host_problems"] == []
    phases = {w["name"]: w["phase"] for w in rep["workloads"]}
    assert phases.pop("vm-whole-b") == "Pending" and set(phases.values()) == {"Running"}
    (gi,) = rep["shared_instances"]
    assert gi["gpu"] == 2 and gi["slices"][1] == 1
    held = {h["workload"]: (h["owner"], h["placement"]) for h in gi["holders"]}
    assert held.keys() == {"vm-mig", "pod-mig"} and held["vm-mig"][0] == "VM" and held["pod-mig"][0] == "pod"
    assert held["vm-mig"][1] != held["pod-mig"][1] and {p for _, p in held.values()} <= {0, 6, 12, 18}
    hosts = {w["name"]: w["devices"][0]["host_id"] for w in rep["workloads"] if w["devices"]}
    assert hosts["vm-mig"] != hosts["pod-mig"]  # two vGPUs (two VFs), one instance
    (r,) = rep["refused"]
    assert r["workload"] == "vm-whole-b" and r["whole"]
    assert any(line.startswith("GPU 0, 1, 2 (") and line.endswith("no whole GPU devices published")
               for line in r["per_gpu"]), r["per_gpu"]  # not the model: GPU 3 of it publishes its whole GPU
    assert rep["teardown"]["vgpus_left"] == [] and rep["teardown"]["still_on_vfio"] == []


def test_demo_presets_and_the_example_layout_agree():
    import yaml

    assert tuple(demo.PRESETS) == demo_cli.DEMO_PRESETS
    example = yaml.safe_load((REPO / "examples" / "rtxpro-layout.yaml").read_text())["layouts"]["dra"]
    assert yaml.safe_load(demo.RTXPRO_LAYOUT)["layouts"]["dra"] == example


def test_demo_text_names_the_shared_gpu_instance():
    rep = demo.DemoReport(node="n", preset="rtxpro-node", kubernetes="v1.36.0", cel="CelSelectors",
                          layout={"name": "dra", "gpus": []}, slices={"count": 0, "devices": 0, "counter_sets": 0,
                                                                      "generation": 1, "plugin_socket": "/s"},
                          workloads=[{"name": "vm-mig", "what": "VM", "phase": "Running", "devices": []}],
                          teardown={"workloads": 0, "vgpus_removed": 0, "gpus_returned": [], "vgpus_left": [],
                                    "still_on_vfio": []})
    h = [demo.Holder("vm-mig", "VM", "vgpu", "1g.24gb", 6 * GiB, "d0", "0000:16:00.4", 1, instance=(1, 1), inside=0),
         demo.Holder("pod-mig", "pod", "vgpu", "1g.24gb", 6 * GiB, "d1", "0000:16:00.5", 2, instance=(1, 1), inside=6)]
    rep.gpus = [demo.GpuView(index=2, address="0000:16:00.0", model="GB202GL [RTX PRO 6000 Blackwell Server Edition]",
                             framework="vendor-vfio", counter_set="gpu-2-counter-set", memory_total=92 * GiB,
                             memory_used=12 * GiB, vgpus_total=None, vgpus_used=0, slices_total=4, slices_used=1,
                             holders=h)]
    rep.shared_instances = demo.shared_instances(rep.gpus)
    out = " ".join(demo_cli.text(rep).split())
    assert "VF 0000:16:00.5, GPU instance at slice 1, placement 6 inside it" in out
    assert "one GPU instance (1g.24gb, memory slices 1-1) shared: VM vm-mig at 0 and pod pod-mig at 6" in out


# --------------------------------------------------------------------------- selectors


def device(attrs: dict, capacity: dict | None = None, driver: str = "vgpu.kubevirt.io") -> Device:
    return Device(driver=driver, pool="p", name="d", node="n", attributes=attrs,
                  capacity={k: {"value": v} for k, v in (capacity or {}).items()}, consumes=[])


def test_selectors_evaluate_the_template_expressions():
    from kubevirt_templates.render import (
        class_expression,
        min_memory_expression,
        product_expression,
        profile_expression,
    )

    d = device({"type": {"string": "vgpu"}, "profile": {"string": "T4-8Q"}, "gpuIndex": {"int": 0},
                "vgpuTypes": {"string": " T4-8Q T4-8C T4-8A "},
                "productName": {"string": "TU104GL [Tesla T4]"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:10:00.0"}}, {"memory": "8Gi"})
    s = default_selectors()
    assert isinstance(s, CelSelectors)
    drv = "vgpu.kubevirt.io"
    assert s.matches(class_expression(drv, "vgpu"), d)
    assert not s.matches(class_expression(drv, "passthrough"), d)
    assert s.matches(profile_expression(drv, "T4-8Q"), d) and not s.matches(profile_expression(drv, "T4-4Q"), d)
    assert s.matches(product_expression(drv, "TU104GL [Tesla T4]"), d)
    assert s.matches(min_memory_expression(drv, "8Gi"), d) and s.matches(min_memory_expression(drv, "8192Mi"), d)
    assert not s.matches(min_memory_expression(drv, "9Gi"), d)
    assert s.matches('device.attributes["vgpu.kubevirt.io"].gpuIndex == 0', d)
    assert s.matches('device.attributes["resource.kubernetes.io"].pciBusID == "0000:10:00.0"', d)
    assert s.matches('device.attributes["vgpu.kubevirt.io"].profile.startsWith("T4-") && '
                     'device.attributes["vgpu.kubevirt.io"].profile in ["T4-8Q", "T4-4Q"]', d)
    assert s.matches("device.capacity['vgpu.kubevirt.io'].memory.isGreaterThan(quantity('4Gi'))", d)
    assert s.matches('!has(device.attributes["vgpu.kubevirt.io"].numaNode)', d)
    assert s.matches('device.attributes["other.io"].x == "y" || true', d)  # the error on the left is absorbed
    assert s.errors == []
    # a missing attribute is a run-time error, a broken expression a compile error: as the scheduler,
    # that is an error (the allocator fails the attempt on it); lenient, the device does not match.
    # Either way the error is kept
    with pytest.raises(SelectorError, match="numaNode"):
        s.matches('device.attributes["vgpu.kubevirt.io"].numaNode == 0', d)
    lenient = CelSelectors(strict=False)
    assert not lenient.matches('device.attributes["vgpu.kubevirt.io"].numaNode == 0', d)
    assert not lenient.matches("device.attributes[", d)
    assert len(lenient.errors) == 2 and "numaNode" in lenient.errors[0] and "does not compile" in lenient.errors[1]


def _value(d: Device, name: str):
    """An attribute of a published device, read without CEL (the test's own reading)."""
    v = d.attributes.get(name) or d.attributes.get(f"{d.driver}/{name}")
    return next(iter(v.values())) if v else None


def test_selectors_select_exactly_the_devices_on_every_published_device(tmp_path):
    """Every selector the templates and DeviceClasses write, on every device of a 1.37 pool with
    every profile: the CEL engine selects exactly the devices a plain reading of their
    attributes and capacity names."""
    from dra_bridge.pool.devices import build_pool
    from dra_bridge.pool.policy import policy_from_layout
    from dra_bridge.pool.slices import build_slices
    from dra_bridge.scheduling.pools import read_pools
    from kubevirt_templates.render import class_expression, min_memory_expression, profile_expression
    from mdev_manager.config import GpuLayout
    from mdev_manager.discovery import discover
    from mdev_manager.reconcile import reconcile
    from mdev_manager.sim.node import sim_node

    sim = sim_node(tmp_path / "h", "default")
    env, io = sim.env, sim.io
    layouts = [GpuLayout(all=True, mode="dra", passthrough=True)]
    reconcile(env, io, layouts, node="n")
    inv = discover(env, io, node="n")
    pool = build_pool(inv, policy_from_layout(inv, layouts), server_version=(1, 37))
    slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name="n", pool_name="n", generation=1,
                          server_version=(1, 37))
    devices = [d for p in read_pools(slices).values() for d in p.devices]
    drv = "vgpu.kubevirt.io"

    def memory(d: Device):
        cap = d.capacity.get("memory") or d.capacity.get(f"{drv}/memory")
        return parse_quantity(cap["value"]) if cap else None

    cases = [
        (class_expression(drv, "vgpu"), lambda d: d.driver == drv and _value(d, "type") == "vgpu"),
        (class_expression(drv, "passthrough"), lambda d: d.driver == drv and _value(d, "type") == "passthrough"),
        (profile_expression(drv, "T4-8Q"), lambda d: _value(d, "profile") == "T4-8Q"),
        (profile_expression(drv, "L40S-12Q"), lambda d: _value(d, "profile") == "L40S-12Q"),
        (min_memory_expression(drv, "10Gi"), lambda d: memory(d) is not None and memory(d) >= 10 * GiB),
        ('device.attributes["vgpu.kubevirt.io"].gpuIndex == 2', lambda d: _value(d, "gpuIndex") == 2),
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:13:00.0"',
         lambda d: _value(d, "resource.kubernetes.io/pciBusID") == "0000:13:00.0"),
        ('device.attributes["vgpu.kubevirt.io"].parentPciBusID == "0000:16:00.0"',
         lambda d: _value(d, "parentPciBusID") == "0000:16:00.0"),
    ]
    real = CelSelectors(strict=False)  # each expression on every device, classes aside: a missing attribute is no match
    for e, reading in cases:
        got = [real.matches(e, d) for d in devices]
        want = [reading(d) for d in devices]
        assert got == want, e
        assert any(want), e


# --------------------------------------------------------------------------- pieces


def test_resolve_cdi_finds_each_id_once(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "v.io/claim", "devices": [
        {"name": "u-dev", "containerEdits": {"deviceNodes": [{"path": "/dev/vfio/7", "hostPath": "/h/7"}]}}]}))
    (tmp_path / "b.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "v.io/metadata", "devices": [
        {"name": "u_req", "containerEdits": {"mounts": [{"hostPath": "/h/m", "containerPath": "/m"}]}}]}))
    e = resolve_cdi(tmp_path, ["v.io/claim=u-dev", "v.io/metadata=u_req"])
    assert e.device_nodes[0]["hostPath"] == "/h/7" and e.mounts[0]["containerPath"] == "/m"
    with pytest.raises(LookupError):
        resolve_cdi(tmp_path, ["v.io/claim=other"])


def test_pod_node():
    assert pod_node({"spec": {"nodeName": "a"}}) == "a"
    assert pod_node({"spec": {"nodeSelector": {"kubernetes.io/hostname": "b"}}}) == "b"
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]}}}
    assert pod_node({"spec": {"affinity": aff}}) == "c"
    assert pod_node({"spec": {}}) is None


def test_fakeapi_serves_pod_logs():
    from kubernetes import client

    from dra_bridge.sim.apiserver import LocalApiServer

    with LocalApiServer("1.35") as srv:
        core = client.CoreV1Api(srv.api_client())
        core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                               "spec": {"containers": [{"name": "c", "image": "i"}]}})
        assert core.read_namespaced_pod_log("p", "default") == ""
        srv.set_pod_log("default", "p", "RESULT: Pass\n")
        assert core.read_namespaced_pod_log("p", "default") == "RESULT: Pass\n"
        with pytest.raises(client.exceptions.ApiException) as exc:
            core.read_namespaced_pod_log("q", "default")
        assert exc.value.status == 404


def test_fakeapi_without_kubernetes_validate_still_enforces_the_dra_rules(tmp_path):
    code = ("import sys\n"
            "sys.modules['kubernetes_validate'] = None\n"
            "from kubernetes import client\n"
            "from dra_bridge.sim.apiserver import LocalApiServer, HAVE_SCHEMAS\n"
            "assert not HAVE_SCHEMAS\n"
            "bad = {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice', 'metadata': {'name': 'x'},\n"
            "       'spec': {'driver': 'd.io', 'pool': {'name': 'p', 'generation': 1, 'resourceSliceCount': 1},\n"
            "                'nodeName': 'n', 'devices': [{'name': 'a'}],\n"
            "                'sharedCounters': [{'name': 'c', 'counters': {'m': {'value': '1'}}}]}}\n"
            "with LocalApiServer('1.35') as srv:\n"
            "    api = client.ResourceV1Api(srv.api_client())\n"
            "    try:\n"
            "        api.create_resource_slice(bad)\n"
            "    except client.exceptions.ApiException as exc:\n"
            "        print(exc.status)\n"
            "    bad['spec'].pop('sharedCounters')\n"
            "    print(api.create_resource_slice(bad).metadata.name)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["422", "x"]
