"""``vgpuctl conformance``: the five checks pass on the simulated cluster, and each fails when its
property is broken; the health-check script on hand-made sysfs trees; JUnit XML; the real-cluster
path (KubeBackend, only the API) against the simulated cluster's API server with its control plane."""

from __future__ import annotations

import copy
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dra_bridge.conformance import healthcheck
from dra_bridge.conformance.backend import KubeBackend, Run
from dra_bridge.conformance.checks import Conformance, run_conformance
from dra_bridge.conformance.report import CheckFailed, CheckResult, ConformanceReport
from dra_bridge.kubeletplugin import cdi
from dra_bridge.sim.cluster import SimCluster
from dra_bridge.sim.controlplane import ControlPlane
from dra_bridge.sim.scenarios import run_conformance_simulated
from kubevirt_templates.render import render
from tests.support.upstream_allocator import real_or_model, use_upstream
from vgpuctl.commands import conformance as conformance_cli
from vgpuctl.main import build_parser, main


def statuses(rep: ConformanceReport) -> dict[int, str]:
    return {c.number: c.status for c in rep.checks}


def detail(rep: ConformanceReport, n: int) -> str:
    return next(c.detail for c in rep.checks if c.number == n)


#: the allocations of ``passing`` that the model, compared with Kubernetes' own allocator, made otherwise
DIFFERENCES: list[str] = []
UPSTREAM: dict[str, bool] = {}  # "ran": whether Kubernetes' own allocator scheduled ``passing``


@pytest.fixture(scope="module")
def passing():
    """The checks on the simulated cluster (1.37, every gate on), Kubernetes' own allocator of 1.37
    scheduling where its program is built (the model stands in where Go is absent, saying so), the
    model compared with it on every allocation (issue #39.1)."""
    up = real_or_model("1.37")
    UPSTREAM["ran"] = up is not None
    return run_conformance_simulated(render=render, prepare=lambda c: use_upstream(c, up, DIFFERENCES))


# --------------------------------------------------------------------------- all pass


def test_all_checks_pass_on_the_simulated_cluster(passing):
    assert statuses(passing) == {n: "passed" for n in range(1, 6)}, passing.to_dict()
    assert DIFFERENCES == []
    assert passing.ok and passing.cleanup == []
    assert "publishes 2 T4-8" in detail(passing, 1) and "allocates 2 of them at once" in detail(passing, 1)
    # check 1's evidence is what the cluster's scheduler did with workloads, not what a model says
    assert "the cluster's scheduler allocates 2 of them at once (pods logical-0-" in detail(passing, 1)
    bound = [e for e in next(c.evidence for c in passing.checks if c.number == 1) if ": bound to sim-node-1" in e]
    assert len(bound) == 2 and all("claim logical-" in e and " on 0000:10:00.0" in e for e in bound), bound
    assert "Allocatable lists none: its logical GPUs are DRA devices (KAR-0003's Allocatable step)" in detail(passing, 1)
    assert "all on GPU 0000:10:00.0 (by the slices, inside the workloads, and on the host)" in detail(passing, 2)
    d3 = detail(passing, 3)
    assert "stays Pending: 0/1 nodes are available" in d3 and "kept their devices" in d3
    # the scheduler's words: upstream's Allocate says no more than that the claims do not fit
    assert ("the claims do not fit (upstream allocator)" if UPSTREAM["ran"] else "framebuffer") in d3
    d4 = detail(passing, 4)
    assert "counter set gpu-0-counter-set" in d4 and "IOMMU group" in d4 and "releasing one lets the other run" in d4
    # MIG-backed beside time-sliced: the A100 (0000:16:00.0, MIG mode) runs a GPU-instance placement
    assert "side by side: time-sliced" in d4 and "MIG-backed ['gpu-2-mig-1g5gb-19-0'] on 0000:16:00.0" in d4
    assert "(memory-slice-0) holds its memory slices and the whole GPU 0000:16:00.0 waits" in d4
    # KAR-0004: a pod asking for nvidia.com/GRID_T4-1Q: 1 (a DeviceClass maps the name), no claim of its own
    assert "by resource name (KAR-0004): a pod asking for nvidia.com/GRID_T4-1Q: 1 got ['gpu-" in d4
    assert "-extended-resources-" in d4
    assert "a pod without a claim sees none (RESULT: ACCELERATOR_MISSING, KAR-0049)" in d4
    assert "0 Fail" in detail(passing, 5)


def test_junit_and_table(passing):
    root = ET.fromstring(conformance_cli.junit(passing))
    suite = root.find("testsuite")
    assert suite.get("tests") == "5" and suite.get("failures") == "0" and suite.get("errors") == "0"
    cases = suite.findall("testcase")
    assert [c.get("name").split(".")[0] for c in cases] == ["1", "2", "3", "4", "5"]
    assert all(c.find("failure") is None and c.find("system-out") is not None for c in cases)
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["cluster"].startswith("simulated") and props["namespace"].startswith("vgpuctl-conformance-")
    text = conformance_cli.table(passing)
    assert "5 of 5 checks passed" in text and "NOT CONFORMANT" not in text
    assert all(len(line) <= 80 for line in text.splitlines())  # 80 columns (issue #26)


def test_the_junit_report_is_written_only_where_asked(tmp_path, capsys):
    """``vgpuctl conformance`` wrote vgpuctl-conformance.xml into the working directory unasked; now
    only ``--junit FILE`` writes XML, to FILE (the run itself is given: what is written matters)."""
    rep = ConformanceReport(cluster="simulated", namespace="ns",
                            checks=[CheckResult(n, f"check {n}", "passed", "ok") for n in range(1, 6)])
    parser = build_parser("conformance")
    here = sorted(os.listdir())
    assert conformance_cli.report(parser.parse_args(["conformance"]), rep) == 0
    assert sorted(os.listdir()) == here and "JUnit XML" not in capsys.readouterr().out
    report = tmp_path / "out" / "r.xml"
    report.parent.mkdir()
    assert conformance_cli.report(parser.parse_args(["conformance", "--junit", str(report)]), rep) == 0
    assert ET.parse(report).getroot().find("testsuite").get("tests") == "5"
    assert f"JUnit XML: {report}" in capsys.readouterr().out and os.listdir(tmp_path) == ["out"]
    assert sorted(os.listdir()) == here


def test_junit_reports_failures_errors_and_skips():
    rep = ConformanceReport(cluster="c", namespace="ns", checks=[
        CheckResult(1, "one", "passed", "ok"), CheckResult(2, "two", "failed", "bad <thing> & more", ["e1"]),
        CheckResult(3, "three", "skipped", "needs 2"), CheckResult(4, "four", "error", "boom")])
    suite = ET.fromstring(conformance_cli.junit(rep)).find("testsuite")
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "1", "1")
    c2 = suite.findall("testcase")[1]
    assert c2.find("failure").get("message") == "bad <thing> & more" and c2.find("system-out").text == "e1"
    assert suite.findall("testcase")[2].find("skipped") is not None
    assert "NOT CONFORMANT" in conformance_cli.table(rep)


# --------------------------------------------------------------------------- each check fails when broken


def republish(c: SimCluster, edit) -> None:
    """Replace the published slices by ``edit(slices)`` (a new generation), as a broken driver would publish."""
    old = c.slices()
    new = edit(copy.deepcopy(old))
    gen = max(s["spec"]["pool"]["generation"] for s in old) + 1
    for s in old:
        c.resource.delete_resource_slice(s["metadata"]["name"])
    for s in new:
        s["metadata"] = {"name": s["metadata"]["name"], "labels": s["metadata"].get("labels") or {}}
        s["spec"]["pool"]["generation"] = gen
        s["spec"]["pool"]["resourceSliceCount"] = len(new)
        c.resource.create_resource_slice(s)


def without_counters(slices, *, kinds=("vgpu", "passthrough")):
    out = []
    for s in slices:
        if kinds == ("vgpu", "passthrough"):
            s["spec"].pop("sharedCounters", None)
            if not s["spec"].get("devices"):
                continue
        for d in s["spec"].get("devices") or []:
            if d["attributes"]["type"]["string"] in kinds:
                d.pop("consumesCounters", None)
        out.append(s)
    return out


def test_check_1_fails_when_no_gpu_has_several_logical_gpus():
    layout = """version: vgpuctl/v1
layouts:
  whole:
    - index: 0
      mode: dra
      vgpus: {T4-16Q: 1}
    - index: 1
      mode: dra
      vgpus: {T4-16Q: 1}
    - model: A100
      mode: dra
      vgpus: {A100-40C: 1}
    - model: L40S
      mode: dra
      vgpus: {L40S-48Q: 1}
"""
    rep = run_conformance_simulated(render=render, layout="whole", layout_text=layout)
    assert statuses(rep) == {1: "failed", 2: "skipped", 3: "skipped", 4: "skipped", 5: "skipped"}
    assert "no physical GPU exposes two or more allocatable logical GPUs" in detail(rep, 1)
    assert not rep.ok and rep.cleanup == []


def test_check_2_fails_when_the_logical_gpus_are_not_on_the_gpu_the_slices_name():
    def swap(slices):
        a, b = "0000:10:00.0", "0000:13:00.0"
        for s in slices:
            for d in s["spec"].get("devices") or []:
                attr = d["attributes"].get("parentPciBusID")
                if attr and attr["string"] in (a, b):
                    attr["string"] = b if attr["string"] == a else a
        return slices

    rep = run_conformance_simulated(render=render, prepare=lambda c: republish(c, swap))
    st = statuses(rep)
    assert st[1] == "passed" and st[2] == "failed", rep.to_dict()
    d2 = detail(rep, 2)
    # the GPU's counter set and whole-GPU device say 0000:10:00.0, its vGPU devices 0000:13:00.0
    assert "is published on GPU 0000:13:00.0, not 0000:10:00.0" in d2
    assert "lives on GPU 0000:10:00.0, the slice said 0000:13:00.0" in d2  # the host agrees with the workload


def test_check_3_fails_when_counters_are_removed_from_the_slices():
    rep = run_conformance_simulated(render=render, prepare=lambda c: republish(c, without_counters))
    st = statuses(rep)
    assert st[1] == "passed" and st[2] == "passed" and st[3] == "failed", rep.to_dict()
    assert "one more logical GPU of any profile was allocated although the GPU was full" in detail(rep, 3)
    assert st[4] == "failed"  # nothing accounts the whole GPU against its vGPUs either
    assert rep.cleanup == []


def test_check_4_fails_when_the_whole_gpu_is_not_accounted_with_its_vgpus():
    rep = run_conformance_simulated(render=render,
                                    prepare=lambda c: republish(c, lambda s: without_counters(s, kinds=("passthrough",))))
    st = statuses(rep)
    assert (st[1], st[2], st[3], st[4]) == ("passed", "passed", "passed", "failed"), rep.to_dict()
    assert "not accounted against the same counters" in detail(rep, 4)


def test_check_4_fails_when_mig_placements_do_not_consume_their_memory_slices():
    def strip(slices):
        for s in slices:
            for d in s["spec"].get("devices") or []:
                if "migBacked" in d["attributes"]:
                    for c in d.get("consumesCounters") or []:
                        c["counters"] = {k: v for k, v in c["counters"].items() if not k.startswith("memory-slice-")}
        return slices

    rep = run_conformance_simulated(render=render, prepare=lambda c: republish(c, strip))
    st = statuses(rep)
    assert (st[1], st[2], st[3], st[4]) == ("passed", "passed", "passed", "failed"), rep.to_dict()
    assert "the MIG-backed device consumes no memory-slice counter" in detail(rep, 4)


def test_check_4_runs_three_sizes_on_a_mixed_size_gpu(passing):
    """The simulated cluster's L40S runs in mixed-size mode: three workloads of three sizes run on it
    at once, each at its own placement (on the host too: the cluster's host check compares)."""
    d4 = detail(passing, 4)
    assert "mixed-size: 3 sizes on GPU 0000:19:00.0 at once, each at its own placement: gpu-3-vgpu-4gb-at-0 " \
           "(slots 0-3), gpu-3-vgpu-3gb-at-6 (slots 6-8), gpu-3-vgpu-2gb-at-4 (slots 4-5)" in d4


def test_check_4_fails_when_mixed_size_placements_consume_no_slots():
    """Devices of a mixed-size GPU that consume nothing: the scheduler puts a 3 GiB vGPU over the 4 GiB
    one's slots, and the node refuses it at prepare."""
    def strip(slices):
        for s in slices:
            for d in s["spec"].get("devices") or []:
                if "placementStart" in d["attributes"] and "migBacked" not in d["attributes"]:
                    d.pop("consumesCounters", None)
        return slices

    rep = run_conformance_simulated(render=render, prepare=lambda c: republish(c, strip))
    st = statuses(rep)
    assert (st[1], st[2], st[3], st[4]) == ("passed", "passed", "passed", "failed"), rep.to_dict()
    d4 = detail(rep, 4)
    assert "L40S-3Q (3 slots) on the mixed-size GPU 0000:19:00.0 did not run beside 1 vGPU(s) of other sizes" in d4
    # the node refused it: nothing over-committed
    assert "gpu-3-vgpu-3gb-at-0 takes slots 0-2 of GPU" in d4 and "which overlap" in d4
    assert rep.cleanup == []


def test_check_1_reads_statically_configured_gpus_from_node_allocatable():
    """KAR-0003's Allocatable step: a node whose device plugin advertises shared GPUs lists them."""
    def advertise(c):
        c.rest("PATCH", f"/api/v1/nodes/{c.node}/status",
               {"status": {"allocatable": {"cpu": "8", "nvidia.com/GRID_T4-1Q": "16"}}}, patch=True)

    rep = run_conformance_simulated(render=render, prepare=advertise)
    assert statuses(rep)[1] == "passed", rep.to_dict()
    assert "Allocatable lists 16 statically configured logical GPUs (nvidia.com/GRID_T4-1Q)" in detail(rep, 1)


def test_check_5_fails_when_a_workload_health_check_fails(monkeypatch):
    """The device node a workload is given is not there: its health check reports Fail."""
    real = cdi.vfio_nodes

    def lost_group_node(env, group, *a, **kw):
        nodes = real(env, group, *a, **kw)
        for n in nodes:
            if n["path"] != "/dev/vfio/vfio":
                n["hostPath"] = str(Path(n["hostPath"]).parent / "lost" / Path(n["hostPath"]).name)
        return nodes

    monkeypatch.setattr(cdi, "vfio_nodes", lost_group_node)
    rep = run_conformance_simulated(render=render)
    assert statuses(rep)[5] == "failed", rep.to_dict()
    assert "device node missing" in detail(rep, 5)


def test_check_5_counts_unknown_as_not_a_failure():
    c = Conformance(backend=None)
    unknown = "CHECK /dev/vfio/9 Unknown group=9 function=0000:41:00.0 gpu=0000:41:00.0 id=1234:5678 -- x\nRESULT: Unknown\n"
    ok = "CHECK /dev/vfio/8 Pass group=8 function=0000:40:00.0 gpu=0000:40:00.0 -- bound\nRESULT: Pass\n"
    c.ran = [Run("a", "t", health=healthcheck.parse(unknown)), Run("b", "t", health=healthcheck.parse(ok))]
    res = CheckResult(5, "five")
    assert "1 Pass, 1 Unknown" in c.check5(res)
    c.ran.append(Run("c", "t", health=None))
    with pytest.raises(CheckFailed, match="c: no health check result"):
        c.check5(res)


# --------------------------------------------------------------------------- the real-cluster path


def test_cli_against_an_api_server_only(tmp_path, capsys):
    """``--kubeconfig``: everything through the API (a namespace of its own, a ConfigMap with the
    script, templates, pods, logs), here served by the simulated cluster and its control plane;
    afterwards nothing of it is left."""
    junit = tmp_path / "junit.xml"
    with SimCluster(render=render, version="1.37", layout_name="all") as c, ControlPlane(c) as cp:
        kubeconfig = c.srv.kubeconfig(tmp_path / "kubeconfig")
        rc = main(["conformance", "--kubeconfig", str(kubeconfig), "--junit", str(junit), "--timeout", "60",
                   "--settle", "1", "--namespace", "conf-test"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert cp.errors == []
        for plural in ("pods", "resourceclaims", "resourceclaimtemplates", "configmaps"):
            assert c.srv.objects(plural, "conf-test") == [], plural
        assert "conf-test" not in {n["metadata"]["name"] for n in c.srv.objects("namespaces")}
        assert c.claims() == [] and c.daemon.driver.cp.claims == {}
        assert c.inventory().all_vgpus() == []
    assert "5 of 5 checks passed" in out and f"JUnit XML: {junit}" in out
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "0"


def test_cli_print_healthcheck(capsys):
    assert main(["conformance", "--print-healthcheck"]) == 0
    assert capsys.readouterr().out == healthcheck.SCRIPT


def test_missing_device_classes_is_an_error_not_a_pass(tmp_path):
    with SimCluster(render=render, health=False) as c:
        backend = KubeBackend(c.api, vgpu_class="nope.example.com", timeout=5, poll=0.05)
        rep = run_conformance(backend)
    assert statuses(rep)[1] == "error" and "DeviceClass nope.example.com not found" in detail(rep, 1)
    assert not rep.ok


class _RunningWithoutLogs:
    """The API a cluster answers where pods run but no kubelet serves their logs (issue #36)."""

    def __init__(self, log):
        self.log = log

    def read_pod(self, name, namespace):
        return {"spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running"}}

    def pod_log(self, name, namespace):
        if isinstance(self.log, Exception):
            raise self.log
        return self.log


@pytest.mark.parametrize("log, why", [(RuntimeError("no kubelet\nanswers"), "reading it failed: no kubelet answers"),
                                      ("", "the log is empty")])
def test_a_running_pod_whose_log_is_not_served_is_said_to_run(log, why):
    backend = KubeBackend(None, timeout=0, poll=0)
    backend.api = _RunningWithoutLogs(log)
    r = backend.wait(Run(name="w", template="t"))
    assert r.phase == "Timeout" and r.reason.startswith("Running on node gpu-1, but no health check result"), r.reason
    assert why in r.reason and "kubectl -n" in r.reason and "logs w" in r.reason, r.reason
    assert "not Running" not in r.reason and "\n" not in r.reason


# --------------------------------------------------------------------------- the health-check script


def pci(root: Path, addr: str, vendor="0x10de", device="0x1eb8", klass="0x030200", driver=None, group=None,
        physfn=None, vgpu_type=None) -> Path:
    d = root / "sys/devices/pci0000:00" / addr
    d.mkdir(parents=True)
    for k, v in (("vendor", vendor), ("device", device), ("class", klass)):
        (d / k).write_text(v + "\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "sys/bus/pci/devices" / addr).symlink_to(d)
    if driver:
        (root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        (d / "driver").symlink_to(root / "sys/bus/pci/drivers" / driver)
    if physfn:
        (d / "physfn").symlink_to(root / "sys/devices/pci0000:00" / physfn)
    if vgpu_type is not None:
        (d / "nvidia").mkdir()
        (d / "nvidia/current_vgpu_type").write_text(f"{vgpu_type}\n")
    if group is not None:
        g = root / f"sys/kernel/iommu_groups/{group}/devices"
        g.mkdir(parents=True, exist_ok=True)
        (g / addr).symlink_to(d)
        node = root / f"dev/vfio/{group}"
        node.parent.mkdir(parents=True, exist_ok=True)
        node.write_text("")
    return d


def mdev(root: Path, parent: Path, uuid: str, group: int, type_name="GRID T4-8Q") -> None:
    m = parent / uuid
    m.mkdir()
    t = parent / "mdev_supported_types/nvidia-233"
    t.mkdir(parents=True)
    (t / "name").write_text(type_name + "\n")
    (m / "mdev_type").symlink_to(t)
    (root / "sys/bus/mdev/drivers/vfio_mdev").mkdir(parents=True, exist_ok=True)
    (m / "driver").symlink_to(root / "sys/bus/mdev/drivers/vfio_mdev")
    g = root / f"sys/kernel/iommu_groups/{group}/devices"
    g.mkdir(parents=True)
    (g / uuid).symlink_to(m)
    (root / f"dev/vfio/{group}").parent.mkdir(parents=True, exist_ok=True)
    (root / f"dev/vfio/{group}").write_text("")


def hc(root: Path, *groups, env=None) -> healthcheck.HealthResult:
    (root / "dev/vfio").mkdir(parents=True, exist_ok=True)
    (root / "dev/vfio/vfio").write_text("")
    nodes = [str(root / "dev/vfio/vfio")] + [str(root / f"dev/vfio/{g}") for g in groups]
    return healthcheck.run(nodes, sys_root=root / "sys", env=env)


def test_healthcheck_passes_vfio_devices_and_names_their_gpu(tmp_path):
    pci(tmp_path, "0000:10:00.0", driver="vfio-pci", group=1)
    pci(tmp_path, "0000:10:00.1", klass="0x040300", driver="vfio-pci", group=1)  # HDA audio: not judged
    pf = pci(tmp_path, "0000:19:00.0", device="0x26b9", driver="nvidia", group=2)
    pci(tmp_path, "0000:19:00.4", device="0x26b9", driver="nvidia", group=3, physfn="0000:19:00.0", vgpu_type=1153)
    mdev(tmp_path, pf, "0f4bc44c-5b6a-4e4f-9b4f-4ed0b2b4d7a1", 4)
    r = hc(tmp_path, 1, 3, 4)
    assert r.result == "Pass" and r.exit_code == 0, r.output
    assert r.groups == {1, 3, 4}
    assert r.gpus == {"0000:10:00.0", "0000:19:00.0"}  # the VF and the mdev name their physical GPU
    by_group = {f.fields.get("group"): f for f in r.findings}
    assert by_group["3"].fields["vgpu_type"] == "1153" and by_group["4"].fields["type"] == "GRID_T4-8Q"
    assert "INFO nvidia-smi" in r.output
    # ai-conformance's probe marker first, then the verdict (the last RESULT line)
    results = [line for line in r.output.splitlines() if line.startswith("RESULT: ")]
    assert results == ["RESULT: ACCELERATOR_FOUND", "RESULT: Pass"] and r.accelerator is True


def test_healthcheck_fails_what_a_workload_cannot_use(tmp_path):
    pci(tmp_path, "0000:10:00.0", driver="nvidia", group=1)  # a PF on nvidia, no vGPU type: not for vfio
    pci(tmp_path, "0000:13:00.0", driver="vfio-pci", group=2)
    (tmp_path / "dev/vfio/2").unlink()  # its device node is gone
    r = hc(tmp_path, 1, 2, 7)  # and group 7 does not exist at all
    assert r.result == "Fail" and r.exit_code == 1
    texts = [f.text for f in r.findings if f.result == "Fail"]
    assert "bound to nvidia without a vGPU type: not usable through vfio" in texts
    assert texts.count("device node missing") == 2


def test_healthcheck_unknown_accelerator_is_not_a_failure(tmp_path):
    pci(tmp_path, "0000:41:00.0", vendor="0x1234", device="0x5678", klass="0x120000", driver="vfio-pci", group=5)
    r = hc(tmp_path, 5)
    assert r.result == "Unknown" and r.exit_code == 0, r.output
    (f,) = [f for f in r.findings if f.result == "Unknown"]
    assert f.fields["id"] == "1234:5678" and f.text == "accelerator not recognised by this check"


def test_healthcheck_in_a_vm_guest_uses_nvidia_smi(tmp_path):
    """No vfio devices (inside a VM the vGPU is a PCI device on the nvidia driver): nvidia-smi must
    list it; without nvidia-smi the bound driver passes."""
    pci(tmp_path, "0000:07:00.0", driver="nvidia")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    dev = tmp_path / "guest-dev"
    dev.mkdir()
    env = {"VGPUCTL_HC_SYS": str(tmp_path / "sys"), "VGPUCTL_HC_VFIO": str(tmp_path / "no-vfio"),
           "VGPUCTL_HC_DEV": str(dev), "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run():
        p = subprocess.run(["sh", "-c", healthcheck.SCRIPT, "healthcheck"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
        return healthcheck.parse(p.stdout, p.returncode)

    smi.write_text("#!/bin/sh\necho 00000000:07:00.0\n")
    smi.chmod(0o755)
    r = run()
    assert r.result == "Pass" and r.findings[0].fields["nvidia_smi"] == "listed", r.output
    # sysfs lists the GPU, but without a device node to open it is no accelerator of this container
    assert r.accelerator is False
    (dev / "nvidia0").touch()
    assert run().accelerator is True
    smi.write_text("#!/bin/sh\necho 00000000:08:00.0\n")
    assert run().result == "Fail"
    smi.unlink()
    env["PATH"] = "/usr/bin:/bin"
    r = run()
    assert r.result == "Pass" and r.findings[0].fields["nvidia_smi"] == "absent"


def test_healthcheck_without_any_device_fails(tmp_path):
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    p = subprocess.run(["sh", "-c", healthcheck.SCRIPT, "healthcheck"], capture_output=True, text=True,
                       env={"VGPUCTL_HC_SYS": str(tmp_path / "sys"), "VGPUCTL_HC_VFIO": str(tmp_path / "none"),
                            "PATH": "/usr/bin:/bin"})
    r = healthcheck.parse(p.stdout, p.returncode)
    assert r.result == "Fail" and "no accelerator device given or found" in r.output
    assert "RESULT: ACCELERATOR_MISSING" in r.output and r.accelerator is False


def test_healthcheck_parse_without_result_is_a_failure():
    r = healthcheck.parse("CHECK /dev/vfio/1 Pass group=1 -- ok\n")
    assert r.result == "Fail" and r.findings[-1].text == "the health check did not report a result"


def test_json_events_are_go_test2json():
    """``--json-events``: Go's test2json stream (what ai-conformance's ``go test -json`` gives), one
    subtest per check; a failed check fails the parent test and the package."""
    import json as _json

    rep = ConformanceReport("c", "ns", [CheckResult(1, "One GPU, several", "passed", "ok", ["evidence"], 1.25),
                                        CheckResult(2, "Same GPU", "failed", "wrong GPU", [], 0.5),
                                        CheckResult(3, "Blocked", "skipped", "needs 2", [], 0.0)], seconds=2.0)
    events = [_json.loads(line) for line in conformance_cli.test2json(rep).splitlines()]
    assert all(set(e) <= {"Time", "Action", "Package", "Test", "Elapsed", "Output"} for e in events)
    verdicts = [(e["Action"], e.get("Test")) for e in events if e["Action"] in ("pass", "fail", "skip")]
    assert verdicts == [("pass", "TestVgpuctlConformance/1_One_GPU__several"),
                        ("fail", "TestVgpuctlConformance/2_Same_GPU"), ("skip", "TestVgpuctlConformance/3_Blocked"),
                        ("fail", "TestVgpuctlConformance"), ("fail", None)]
    out = "".join(e.get("Output", "") for e in events if e.get("Test") == "TestVgpuctlConformance/1_One_GPU__several")
    assert "=== RUN" in out and "    evidence\n" in out and "--- PASS" in out


class _FakeApi:
    """The calls KubeBackend makes to delete a pod, recorded."""

    def __init__(self) -> None:
        self.deleted: list[tuple] = []

    def delete_pod(self, name: str, namespace: str, **kw) -> bool:
        self.deleted.append((name, namespace, kw))
        return True


def test_a_pod_without_a_claim_names_no_claim_and_pods_are_deleted_gracefully():
    """kube-apiserver refuses a container naming a claim its pod does not have (422: check 4's pod
    without a claim never ran on 1.37.2); and a pod deleted with grace period 0 lets the scheduler
    give its device to the next claim before the kubelet unprepared it (the whole GPU's prepare
    was refused on the real control plane): pods go with their own grace period."""
    from dra_bridge.conformance.backend import KubeBackend, Run

    b = KubeBackend.__new__(KubeBackend)
    b.namespace, b.image, b.runs = "ns", "img", []
    bare = b.pod_body("no-claim", None, "n1")
    assert bare["spec"]["resourceClaims"] == [] and bare["spec"]["containers"][0]["resources"] == {}
    with_claim = b.pod_body("p", "tmpl", "n1")["spec"]["containers"][0]["resources"]
    assert with_claim == {"claims": [{"name": "gpu"}]}
    b.api = _FakeApi()
    b.stop(Run(name="p", template="tmpl"), wait=False)
    assert b.api.deleted == [("p", "ns", {})]


@pytest.mark.parametrize("flag", ["--junit", "--json-events"])
def test_a_report_file_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, capsys, flag):
    """A typo in the report's directory ended a whole run (minutes, namespaces made) with a traceback-free
    exit 1 only when it came to write: now one line and exit 2 before the first check."""
    missing = tmp_path / "no-such-dir" / "r.xml"
    assert main(["conformance", flag, str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "does not exist" in err[0], err
    assert main(["conformance", flag, str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_on_1_34_defaults_check_1_names_the_max_workloads_that_would_do_and_check_4_the_missing_counters():
    """Without shared counters (1.34's default gates) each GPU offers one size only, its smallest: a T4
    holds 16, more than the default 8 workloads, and check 1 said only that no GPU had several logical
    GPUs (found on the real 1.34 control plane, tests/system/test_e2e_serve.py). It names what would do;
    given that, checks 1-3 and 5 pass, and check 4 fails saying why: no GPU offers itself whole beside
    its vGPUs without counters."""
    rep = run_conformance_simulated(render=render, version="1.34", feature_gates={})
    assert statuses(rep)[1] == "failed"
    assert "the fewest on one GPU: 16 " in detail(rep, 1) and "--max-workloads 16" in detail(rep, 1), detail(rep, 1)
    rep = run_conformance_simulated(render=render, version="1.34", feature_gates={}, max_workloads=16)
    assert statuses(rep) == {1: "passed", 2: "passed", 3: "passed", 4: "failed", 5: "passed"}, rep.to_dict()
    assert "nor shared counters" in detail(rep, 4) and "DRAPartitionableDevices" in detail(rep, 4)
