"""KubeVirt's own objects on the real control plane (issue #40.2).

KubeVirt's CRDs (VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration, KubeVirt),
made by KubeVirt's own virt-operator code at a pinned release (tests/kubevirt/crds/), are installed on
the real kube-apiserver (tests/controlplane/), so a real server validates by KubeVirt's published
schemas, with strict field validation:

- every VirtualMachine and KubeVirt CR that ``vgpuctl render`` makes (vGPUs and whole GPUs, by
  device-plugin resource or by claim; the KubeVirt CR with its ``--set`` options, created and applied
  as the documented merge patch), rendered with ``--kubeconfig`` (vgpuctl checks them against the
  server's own OpenAPI first);
- ``vgpuctl drain --migrate`` end to end: the real scheduler places the VMs' virt-launcher pods on a
  GPU the agent publishes, a thread plays virt-controller (the migrations' phases, the VMIs'
  migration state; one VM's migration fails) and drain reports per VM as on the simulated cluster
  (tests/system/test_cordon.py).

Skipped where Go is absent (failed under ``CI=true``): tests/support/kubevirt.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from dra_bridge.apiclient.client import compact_json
from dra_bridge.apiclient.maintenance import migration_object
from dra_bridge.sim.kubelet import KubeletClient
from tests.support import kubevirt
from tests.support.controlplane import RealControlPlane, plural, poll, prepare_claims
from tests.support.dra import make_node, short_tmp
from tests.system.test_real_controlplane import Serving, make_daemon, node_for

pytestmark = [pytest.mark.go]

VGPUCTL = [sys.executable, "-m", "vgpuctl.main"]
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
STRICT = "?fieldValidation=Strict"


@pytest.fixture(scope="module")
def cp():
    """The real control plane with KubeVirt's CRDs installed (and the namespaces the samples use)."""
    kubevirt.binary()  # skip (fail under CI=true) before starting anything
    with RealControlPlane() as c:
        # as kubectl does: an opaque config's parameters sent with spaces make its claims' allocations
        # unwritable over JSON (dra_bridge/apiclient/client.py, compact_json)
        compact_json(c.client)
        c.crds = kubevirt.install(c)
        for ns in ("kubevirt", "vms"):
            c.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        yield c


def wait_for(pred, what: str, timeout: float = 60.0):
    return poll(pred, what, timeout)


def vgpuctl(cp, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*VGPUCTL, *args, "--kubeconfig", str(cp.kubeconfig_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def render(cp, tmp_path, *args: str) -> list[dict]:
    """``vgpuctl render ARGS --kubeconfig`` the real server's: vgpuctl validates the KubeVirt objects
    against the server's OpenAPI (the CRDs' schemas) before it prints them."""
    sim = tmp_path / "sim"
    sim.mkdir(exist_ok=True)
    out = vgpuctl(cp, "render", *args, env={"VGPUCTL_SIM_DIR": str(sim)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOT validated" not in out.stderr, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def create(cp, obj: dict) -> dict:
    """POST with strict field validation: an unknown or duplicate field is refused, not dropped."""
    path = cp.path(plural(obj["kind"]), namespace=obj["metadata"].get("namespace"))
    return cp.rest("POST", path + STRICT, obj)


def create_once(cp, obj: dict) -> None:
    """Create, or leave the same object made earlier (shared claim templates, DeviceClasses)."""
    from kubernetes.client.exceptions import ApiException

    try:
        create(cp, obj)
    except ApiException as exc:
        if exc.status != 409:
            raise


def kept(sent, stored, path: str = "") -> list[str]:
    """Where the server did not keep what was sent (fields it added, its defaults, are fine)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [f"{path}: sent a mapping, stored {json.dumps(stored)[:120]}"]
        return [d for k, v in sent.items() if not (path == ".metadata" and k in SERVER_FIELDS)
                for d in kept(v, stored.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(sent) != len(stored):
            return [f"{path}: sent {json.dumps(sent)[:120]}, stored {json.dumps(stored)[:120]}"]
        return [d for i, (a, b) in enumerate(zip(sent, stored, strict=True)) for d in kept(a, b, f"{path}[{i}]")]
    return [] if sent == stored else [f"{path}: sent {json.dumps(sent)}, stored {json.dumps(stored)}"]


# --------------------------------------------------------------------------- the CRDs themselves


def test_kubevirts_crds_are_served_with_kubevirts_schemas(cp):
    by_kind = {c["spec"]["names"]["kind"]: c for c in cp.crds}
    assert set(by_kind) == set(kubevirt.KINDS)
    for kind, crd in by_kind.items():
        served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
        assert "v1" in served, (kind, served)
        v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        spec = v1["schema"]["openAPIV3Schema"]["properties"]["spec"]
        # a real schema: fields named, not a free-form object that keeps anything
        assert spec.get("properties") and not spec.get("x-kubernetes-preserve-unknown-fields"), kind
    groups = cp.rest("GET", "/apis/kubevirt.io/v1")["resources"]
    assert {"virtualmachines", "virtualmachineinstances", "virtualmachineinstancemigrations",
            "kubevirts"} <= {r["name"] for r in groups}
    print(f"KubeVirt CRDs of {kubevirt.release()} established on the real control plane")


@pytest.mark.parametrize(("field", "value", "words"), [
    ("bogus", 1, 'unknown field "spec.template.spec.domain.devices.gpus[0].bogus"'),
    ("name", None, "spec.template.spec.domain.devices.gpus[0].name: Required value"),
])
def test_the_server_refuses_what_kubevirts_schema_refuses(cp, tmp_path, field, value, words):
    """The check can fail: an unknown field and a missing required one are refused by the server, and
    by vgpuctl's own check against the schema the server publishes (``render --kubeconfig``)."""
    from kubernetes.client.exceptions import ApiException

    from dra_bridge.apiclient.openapi import fetch_kubevirt_openapi
    from kubevirt_templates.validate import KubeVirtSchema

    (vm,) = render(cp, tmp_path, "vm", "--set", f"name=bad-{field}", "--set", "gpus.T4-1Q=1")
    gpu = vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]
    if value is None:
        del gpu[field]
    else:
        gpu[field] = value
    with pytest.raises(ApiException) as exc:
        create(cp, vm)
    message = json.loads(exc.value.body)["message"]
    assert exc.value.status in (400, 422) and words in message, message
    problems = KubeVirtSchema(fetch_kubevirt_openapi(cp.client)).problems(vm)
    assert any(field in p for p in problems), problems


# --------------------------------------------------------------------------- what vgpuctl renders

VMS = {
    "classic-vgpus": ["--set", "gpus.T4-1Q=2", "--set", "display=true", "--set", "ramfb=true"],
    "classic-displays": ["--set", "gpus.T4-1Q=2", "--set", "gpus.T4-2Q=1", "--set", "display=true"],
    "classic-no-display": ["--set", "gpus.NVIDIA A100-4C=1", "--set", "display=false"],
    "classic-passthrough": ["--set", "passthrough=TU104GL [Tesla T4]", "--set", "passthrough_count=2"],
    "classic-resource": ["--set", "passthrough=nvidia.com/TU104GL_TESLA_T4", "--set", "run_strategy=Halted"],
    "dra-vgpus": ["--set", "mode=dra", "--set", "gpus.A100-4C=1", "--set", "gpus.L40S-8Q=2", "--set", "display=true",
                  "--set", "ramfb=false", "--set", "ssh_authorized_keys=[ssh-ed25519 AAAA demo]"],
    "dra-passthrough": ["--set", "mode=dra", "--set", "passthrough=TU104GL [Tesla T4]", "--set", "namespace=vms",
                        "--set", "memory=8Gi", "--set", "cpus=4", "--set", "password=s3cret",
                        "--set", "run_strategy=RerunOnFailure"],
    "dra-mixed": ["--set", "mode=dra", "--set", "gpus.T4-8Q=1", "--set", "passthrough=AD102GL [L40S]",
                  "--set", 'user_data="#cloud-config\\nruncmd: [nvidia-smi]\\n"'],
}


@pytest.mark.parametrize("case", sorted(VMS))
def test_every_rendered_vm_is_accepted_by_the_real_server_as_rendered(cp, tmp_path, case):
    objs = render(cp, tmp_path, "vm", "--set", f"name=vm-{case}", *VMS[case])
    vm = objs[-1]
    assert vm["kind"] == "VirtualMachine"
    for o in objs[:-1]:  # the claim templates of a dra VM
        create_once(cp, o)
    stored = create(cp, vm)
    assert kept(vm, stored) == []


CRS = {
    "classic": ["--simulate"],
    "classic-and-dra": ["--simulate", "--set", "dra=true", "--set", "extra_feature_gates=[LiveMigration, Snapshot]"],
    "dra-only": ["--set", "classic=false", "--set", "dra=true"],
    "vgpus-only": ["--simulate", "--set", "passthrough=false"],
    "passthrough-only": ["--simulate", "--set", "vgpus=false", "--set", "resource_domain=example.com"],
    "some-types": ["--simulate", "--set", "types=[T4-1Q, T4-8Q]", "--set", "include_mig_backed=true"],
    "live-migration": ["--simulate", "--set", "vgpu_live_migration=true"],
    "live-migration-no-inventory": ["--set", "vgpu_live_migration=true"],
}


@pytest.mark.parametrize("case", sorted(CRS))
def test_every_rendered_kubevirt_cr_is_accepted_created_and_as_the_documented_merge_patch(cp, tmp_path, case):
    """Created afresh, and applied as the template says (``kubectl patch kubevirt kubevirt -n kubevirt
    --type merge``) to a KubeVirt CR as virt-operator's install leaves it: both kept as rendered."""
    (cr,) = render(cp, tmp_path, "kubevirt-cr", *CRS[case])
    assert cr["kind"] == "KubeVirt" and cr["spec"]["configuration"]
    fresh = {**cr, "metadata": {**cr["metadata"], "name": f"kv-{case}"}}
    assert kept(fresh, create(cp, fresh)) == []

    base = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts"
    if cp.get_object("kubevirts", "kubevirt", "kubevirt") is None:
        create(cp, {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                    "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                    "spec": {"certificateRotateStrategy": {}, "configuration": {"developerConfiguration": {}},
                             "customizeComponents": {}, "imagePullPolicy": "IfNotPresent",
                             "workloadUpdateStrategy": {}}})
    patched = kubevirt._patch(cp, f"{base}/kubevirt", {k: v for k, v in cr.items() if k == "spec"})
    conf = patched["spec"]["configuration"]
    assert kept(cr["spec"]["configuration"], conf) == []
    assert patched["spec"]["imagePullPolicy"] == "IfNotPresent"  # the rest of the CR is left as it was


# --------------------------------------------------------------------------- drain --migrate end to end

GPU_INDEX = 3  # the default preset's L40S
PROFILE = "L40S-8Q"


def launcher_pod(vmi: dict) -> dict:
    """The virt-launcher pod KubeVirt makes for a VMI: its labels, its claims (the VMI's)."""
    name = vmi["metadata"]["name"]
    claims = vmi["spec"].get("resourceClaims") or []
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"virt-launcher-{name}", "namespace": vmi["metadata"]["namespace"],
                         "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name}},
            "spec": {"restartPolicy": "Never", "resourceClaims": claims,
                     "containers": [{"name": "compute", "image": "registry.invalid/virt-launcher",
                                     "resources": {"claims": [{"name": c["name"]} for c in claims]}}]}}


def vmi_for(vm: dict, node: str, migratable: bool) -> dict:
    """The VirtualMachineInstance virt-controller makes from the VM, running on ``node``."""
    cond = {"type": "LiveMigratable", "status": str(migratable)}
    if not migratable:
        cond.update(reason="HostDeviceNotLiveMigratable", message="VMI uses a host device that cannot migrate")
    meta = vm["metadata"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": vm["spec"]["template"]["metadata"]["labels"],
                         "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                              "name": meta["name"], "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": vm["spec"]["template"]["spec"],
            "status": {"phase": "Running", "nodeName": node, "conditions": [cond]}}


def run_as_kubelet(cp, kubelet: KubeletClient, pod: dict) -> None:
    """What the kubelet does for a pod bound to its node: prepare its claims, report it running."""
    prepare_claims(cp, kubelet, pod)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {**pod["status"], "phase": "Running", "startTime": now,
              "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                             for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
    cp.rest("PUT", cp.path("pods", pod["metadata"]["name"], pod["metadata"]["namespace"]) + "/status", {**pod, "status": status})


def test_drain_migrate_runs_end_to_end_with_kubevirts_objects(cp, tmp_path):
    """Three VMs hold vGPUs of one GPU (placed by the real scheduler): one migrates, one's migration
    fails, one cannot migrate. ``drain --migrate`` creates a VirtualMachineInstanceMigration for the
    two migratable ones (validated by KubeVirt's schema), follows the phases virt-controller writes and
    says per VM what became of it, as on the simulated cluster; the VM that moved left the GPU."""
    plans = {"default/vm-fails": "fail:target has no L40S-8Q free"}
    vms = {"vm-moves": True, "vm-fails": True, "vm-pinned": False}
    with short_tmp("kvd") as base:
        node = make_node(base / "n", "default", version=(1, 37))
        if cp.get_object("nodes", node.node) is None:
            cp.add(node_for(node.node))
        for o in render(cp, tmp_path, "deviceclasses"):
            create_once(cp, o)
        gpu = f"{node.node}/{GPU_INDEX}"
        with Serving(make_daemon(node, cp, base)):
            kubelet = KubeletClient(base / "kl").register()
            controller = kubevirt.VirtController(cp, plans)
            controller.start()
            try:
                for name, migratable in vms.items():
                    objs = render(cp, tmp_path, "vm", "--set", f"name={name}", "--set", "mode=dra",
                                  "--set", f"gpus.{PROFILE}=1")
                    for o in objs[:-1]:
                        create_once(cp, o)
                    vm = create(cp, objs[-1])
                    vmi = create(cp, vmi_for(vm, node.node, migratable))
                    cp.rest("POST", cp.path("pods", namespace="default") + STRICT, launcher_pod(vmi))
                for name in vms:
                    pod = wait_for(lambda n=name: (p := cp.get_object("pods", f"virt-launcher-{n}", "default"))
                                   ["spec"].get("nodeName") and p.get("status", {}).get("resourceClaimStatuses") and p,
                                   f"{name}'s pod scheduled", 90)
                    run_as_kubelet(cp, kubelet, pod)
                on_gpu = {c["metadata"]["name"]: r["device"] for c in cp.objects("resourceclaims", "default")
                          for r in c["status"]["allocation"]["devices"]["results"]}
                assert len(on_gpu) == 3, on_gpu

                out = vgpuctl(cp, "drain", gpu, "--migrate", "--timeout", "20", "--wait", "30")
                print(out.stdout)
                text = " ".join(out.stdout.split())
                assert out.returncode == 3, out.stdout + out.stderr  # the VMs that did not move still hold it
                for line in ("VM default/vm-moves: migrated to node node-b",
                             "VM default/vm-fails: migration failed (target has no L40S-8Q free)",
                             "VM default/vm-pinned: not migratable (HostDeviceNotLiveMigratable)",
                             "not drained: 2 holder(s)"):
                    assert line in text, out.stdout + out.stderr
            finally:
                controller.stop()
                kubelet.close()
            assert controller.errors == []
            migs = {m["spec"]["vmiName"]: m for m in cp.objects("virtualmachineinstancemigrations", "default")}
            assert set(migs) == {"vm-moves", "vm-fails"}  # none for the VM that cannot migrate
            assert {n: m["status"]["phase"] for n, m in migs.items()} == {"vm-moves": "Succeeded",
                                                                          "vm-fails": "Failed"}
            for n, m in migs.items():  # kept as drain wrote them: nothing pruned by KubeVirt's schema
                assert kept(migration_object("default", n), m) == [], m
            assert controller.seen_phases["default/vm-moves"] == list(kubevirt.VirtController.PHASES)
            moved = cp.get_object("virtualmachineinstances", "vm-moves", "default")["status"]
            assert moved["nodeName"] == "node-b" and moved["migrationState"]["completed"] is True
            failed = cp.get_object("virtualmachineinstances", "vm-fails", "default")["status"]
            assert failed["nodeName"] == node.node and failed["migrationState"]["failed"] is True
            assert cp.get_object("pods", "virt-launcher-vm-moves", "default") is None
            assert cp.get_object("pods", "virt-launcher-vm-fails", "default")["status"]["phase"] == "Running"
