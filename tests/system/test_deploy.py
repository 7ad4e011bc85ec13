"""deploy/: every overlay renders with kustomize, validates against the Kubernetes schemas, and fits
the agent's command line, paths, privileges and footprint (RBAC: test_rbac.py)."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest
import yaml

from dra_bridge.api.names import (
    ANNOTATION_CONFIG_REASON,
    ANNOTATION_CORDON,
    ANNOTATION_CORDON_APPLIED,
    LABEL_CONFIG,
    LABEL_CONFIG_STATE,
    LABEL_VGPU_HOST_DRIVER,
    NVIDIA_LABEL_CONFIG,
    NVIDIA_LABEL_CONFIG_STATE,
)
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.kept import ANNOTATION_DRA_FIELDS
from kubevirt_templates import render
from mdev_manager.config import parse_config
from mdev_manager.plan import select_gpus
from tests.support.cel import catalog_inventory
from tests.support.deploy import DEPLOY, NAMESPACE, OVERLAYS, ROOT, SERVICE_ACCOUNT, agent, build, needs_kubectl, one
from tests.support.k8sschema import kubernetes_problems

DRIVER = "vgpu.kubevirt.io"
K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

# Flags the manifests pass that `vgpuctl serve` does not have yet; each is tolerated only while
# the parser lacks it (once added, the parser checks it like any other flag).
PENDING_FLAGS: dict[str, str] = {}
_WAS_PENDING_FLAGS = {
    "--device-plugin": "serve the classic device plugin (resources nvidia.com/<TYPE_NAME>)",
    "--layout-label": "read the layout name from this label of the agent's own Node",
    "--state-label": "report pending/success/failed in this label of the agent's own Node",
}


# --------------------------------------------------------------------------- rendering and schema


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay):
    objs = build(overlay)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
        "DeviceClass", "DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding"])
    for o in objs:
        assert kubernetes_problems(o, K8S_VERSIONS) == [], o["kind"]
        ns = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            assert ns is None, f"cluster-scoped {o['kind']} {o['metadata']['name']} has a namespace"
        else:
            assert ns == NAMESPACE, f"{o['kind']} {o['metadata']['name']} in {ns}"


@needs_kubectl
def test_overlays_differ_only_where_intended():
    dra, dp, dev = (build(o) for o in OVERLAYS)
    assert "--device-plugin" in agent(dp)["args"] and "--device-plugin" not in agent(dra)["args"]
    assert agent(dev)["args"][0].startswith("--simulate")
    for objs in (dra, dp, dev):
        strip = [o for o in objs if o["kind"] != "DaemonSet"]
        assert strip == [o for o in dra if o["kind"] != "DaemonSet"]


@needs_kubectl
def test_device_classes_are_the_rendered_ones():
    objs = build("dra")
    shipped = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "DeviceClass"}
    rendered = {o["metadata"]["name"]: o["spec"] for o in render("deviceclasses")}
    assert shipped == rendered


# --------------------------------------------------------------------------- admission policies


def _policy_user(policy: dict) -> str:
    (cond,) = policy["spec"]["matchConditions"]
    m = re.fullmatch(r'request\.userInfo\.username == "([^"]+)"', cond["expression"].strip())
    assert m, cond
    return m.group(1)


def _admit(policy: dict, *, user: str, node: str | None, op: str, obj: dict | None, old: dict | None) -> list[str]:
    """Run a ValidatingAdmissionPolicy's CEL the way the API server does; returns the denials."""
    import cel

    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    ctx = cel.Context()
    ctx.add_variable("request", {"operation": op, "userInfo": {"username": user, "extra": extra}})
    ctx.add_variable("object", obj)
    ctx.add_variable("oldObject", old)
    ctx.add_variable("variables", {})
    if not all(cel.evaluate(c["expression"], ctx) for c in policy["spec"].get("matchConditions", [])):
        return []
    variables: dict = {}
    for var in policy["spec"].get("variables", []):
        variables[var["name"]] = cel.evaluate(var["expression"], ctx)
        ctx.add_variable("variables", variables)
    denied = []
    for v in policy["spec"]["validations"]:
        try:
            ok = cel.evaluate(v["expression"], ctx)
        except Exception as exc:  # an error denies (failurePolicy: Fail)
            ok = f"error: {exc}"
        if ok is not True:
            denied.append(v.get("message") or cel.evaluate(v["messageExpression"], ctx))
    return denied


def _slice(node: str, driver: str = DRIVER) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-x"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def _node(name: str, labels: dict, spec: dict | None = None, annotations: dict | None = None) -> dict:
    meta = {"name": name, "labels": labels}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec or {"podCIDR": "10.0.0.0/24"}}


@needs_kubectl
def test_admission_policies_confine_the_agent_to_its_node():
    objs = build("dra")
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    for o in objs:
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            assert o["spec"]["policyName"] in policies and o["spec"]["validationActions"] == ["Deny"]
    for p in policies.values():
        assert _policy_user(p) == user  # the ServiceAccount the DaemonSet runs as
        assert p["spec"]["failurePolicy"] == "Fail"
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == SERVICE_ACCOUNT

    sp = policies["vgpuctl-resourceslices"]
    rules = sp["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["resourceslices"] and set(rules[0]["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    mine, other = _slice("node-a"), _slice("node-b")
    assert _admit(sp, user=user, node="node-a", op="CREATE", obj=mine, old=None) == []
    assert _admit(sp, user=user, node="node-a", op="UPDATE", obj=mine, old=mine) == []
    assert _admit(sp, user=user, node="node-a", op="DELETE", obj=None, old=mine) == []
    assert _admit(sp, user=user, node="node-a", op="CREATE", obj=other, old=None)
    assert _admit(sp, user=user, node="node-a", op="DELETE", obj=None, old=other)
    assert _admit(sp, user=user, node="node-a", op="UPDATE", obj=mine, old=other)  # take-over
    assert _admit(sp, user=user, node="node-a", op="CREATE", obj=_slice("node-a", "gpu.nvidia.com"), old=None)
    assert _admit(sp, user=user, node=None, op="CREATE", obj=mine, old=None)  # no node in the token
    assert _admit(sp, user="system:serviceaccount:other:x", node="node-b", op="CREATE", obj=mine, old=None) == []

    npol = policies["vgpuctl-node-labels"]
    assert npol["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    base = {"kubernetes.io/hostname": "node-a", LABEL_CONFIG: "default"}
    old = _node("node-a", base)
    ok = _node("node-a", {**base, LABEL_CONFIG_STATE: "success"})
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=ok, old=old) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=old, old=ok) == []  # removing the state
    # the host driver's version (#39.6: kube-apiserver refused it before, found by tests/system/test_real_rbac.py)
    driver = _node("node-a", {**base, LABEL_VGPU_HOST_DRIVER: "580.95.02"})
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=driver, old=old) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", {**base, LABEL_VGPU_HOST_DRIVER: "580.105.06"}), old=driver) == []
    assert _admit(npol, user=user, node="node-b", op="UPDATE", obj=ok, old=old)  # another node
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=_node("node-a", {**base, LABEL_CONFIG: "x"}), old=old)
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", {"kubernetes.io/hostname": "node-a"}), old=old)  # dropping a label
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", base, spec={"unschedulable": True}), old=old)
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=_node("node-a", base, annotations={"a": "b"}), old=old)
    # the reason of a pending layout: the one annotation the agent may set, change and remove
    why = _node("node-a", base, annotations={"a": "b", ANNOTATION_CONFIG_REASON: "vGPU x in use"})
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=why, old=_node("node-a", base, annotations={"a": "b"})) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", base, annotations={ANNOTATION_CONFIG_REASON: "x"}), old=old) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=why, old=old)  # "a" would be added too
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=old, old=why)  # "a" would go too
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", base, annotations={"a": "b"}), old=why) == []  # the reason removed
    assert _admit(npol, user=user, node="node-a", op="UPDATE",
                  obj=_node("node-a", base, annotations={"a": "c", ANNOTATION_CONFIG_REASON: "x"}), old=why)
    # what the API server keeps (#14): the other annotation the agent owns
    kept = _node("node-a", base, annotations={"a": "b", ANNOTATION_DRA_FIELDS: "counters=kept"})
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=kept,
                  old=_node("node-a", base, annotations={"a": "b"})) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=kept,
                  old=_node("node-a", base, annotations={"a": "x"}))  # "a" changed too
    # the cordon it published (#26): the agent acknowledges it, but never sets or lifts the cordon itself
    cordon = {ANNOTATION_CORDON: '{"0000:3b:00.0":{"effect":"NoSchedule"}}'}
    acked = _node("node-a", base, annotations={**cordon, ANNOTATION_CORDON_APPLIED: cordon[ANNOTATION_CORDON]})
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=acked,
                  old=_node("node-a", base, annotations=cordon)) == []
    assert _admit(npol, user=user, node="node-a", op="UPDATE", obj=_node("node-a", base),
                  old=_node("node-a", base, annotations=cordon))  # lifting the cordon
    # the agent's dry-run probe of kept fields is a slice of its own driver and node: admitted
    probe = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "vgpuctl-doctor-x-d"},
             "spec": {"driver": "vgpu.kubevirt.io", "nodeName": "node-a",
                      "pool": {"name": "vgpuctl-doctor-x", "generation": 1, "resourceSliceCount": 2}}}
    assert _admit(sp, user=user, node="node-a", op="CREATE", obj=probe, old=None) == []


# --------------------------------------------------------------------------- the DaemonSet


def _serve_parser() -> argparse.ArgumentParser:
    from vgpuctl.main import build_parser

    return build_parser("serve")


def _known_option(parser: argparse.ArgumentParser, flag: str) -> bool:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = subs[0].choices["serve"]
    return flag in parser._option_string_actions or flag in serve._option_string_actions


def _args_for_parser(args: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The args with `$(NODE_NAME)` expanded and pending flags the parser lacks removed."""
    out = []
    for a in args:
        flag = a.split("=", 1)[0]
        if flag in PENDING_FLAGS and not _known_option(parser, flag):
            continue
        out.append(a.replace("$(NODE_NAME)", "node-a"))
    return out


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_args_parse_with_vgpuctl(overlay):
    from vgpuctl.main import _fix_simulate

    c = agent(build(overlay))
    assert c["command"] == ["vgpuctl"]
    parser = _serve_parser()
    ns = parser.parse_args(_fix_simulate(_args_for_parser(c["args"], parser)))
    assert ns.cmd == "serve"
    assert ns.node_name == "node-a"
    assert ns.file == "/etc/vgpuctl/layouts.yaml"
    assert ns.driver == DRIVER
    assert ns.kubelet_root == "/var/lib/kubelet" and ns.cdi_root == "/var/run/cdi"
    assert (ns.simulate is not None) == (overlay == "dev")
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else None for a in c["args"]}
    assert flags.get("--layout-label") == LABEL_CONFIG
    assert flags.get("--state-label") == LABEL_CONFIG_STATE
    # probes hit the port the daemon serves them on
    port = int(flags["--metrics-port"])
    assert ns.metrics_port == port
    (p,) = [p for p in c["ports"] if p["name"] == "metrics"]
    assert p["containerPort"] == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_pod_has_node_name_mounts_and_privileges(overlay):
    objs = build(overlay)
    ds = one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = agent(objs)
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for m in mounts.values():
        assert m["name"] in vols
    host = {path: vols[m["name"]].get("hostPath", {}).get("path") for path, m in mounts.items()}
    paths = NodePaths(driver=DRIVER)
    kubelet = {str(paths.data_dir), "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/device-plugins",
               str(paths.cdi_root)}
    for path in kubelet:  # the kubelet and container runtime see the same files
        assert host.get(path) == path, path
    cm = one(objs, "ConfigMap")
    assert vols[mounts["/etc/vgpuctl"]["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    hardware = {"/sys", "/dev/vfio", "/etc/mdevctl.d"}
    sc = c["securityContext"]
    if overlay == "dev":
        assert not hardware & set(mounts)
        assert "emptyDir" in vols[mounts["/var/lib/vgpuctl"]["name"]]
        assert not pod.get("hostPID") and not sc["capabilities"].get("add")
    else:
        for path in hardware | {"/var/lib/vgpuctl"}:
            assert host.get(path) == path, path
            assert not mounts[path].get("readOnly"), f"{path}: the agent writes there"
        # who holds a vGPU: the /proc/<pid>/fd scan of the host's processes
        assert pod["hostPID"] is True
        assert sorted(sc["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]
        assert sc["appArmorProfile"] == {"type": "Unconfined"}  # writes under /sys
    # nothing else: no privileged mode, no escalation, no capability but those named
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not {"hostNetwork", "hostIPC"} & set(pod)
    assert sc["readOnlyRootFilesystem"] is True
    assert "/tmp" in mounts


def test_each_grant_of_the_agent_is_explained_where_it_is_made():
    """Every capability, host namespace, the sysfs profile and the rollout carry a comment saying why."""
    text = (DEPLOY / "base" / "daemonset.yaml").read_text()
    lines = text.splitlines()
    for needle in ("- DAC_READ_SEARCH", "- SYS_PTRACE", "hostPID: true", "appArmorProfile:", "runAsUser: 0",
                   "maxSurge: 0", "privileged: false"):
        (n,) = [i for i, line in enumerate(lines) if line.strip() == needle]
        assert any(line.strip().startswith("#") for line in lines[max(0, n - 5):n]), f"{needle}: no comment says why"
    assert "16-GPU node" in text and "100 MB" in text  # the measured footprint behind the requests


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_image_placement_footprint_and_rollout(overlay):
    objs = build(overlay)
    ds = one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = agent(objs)
    image = c["image"]
    if overlay == "dev":
        assert image == "localhost/vgpuctl:dev"  # the overlay's kustomize `images:` override
        assert "nvidia.com/gpu.present" not in pod["nodeSelector"]  # a simulated host runs anywhere
    else:
        assert re.fullmatch(r"quay\.io/vgpuctl/vgpuctl:v\d+\.\d+\.\d+", image), image
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "vgpu.kubevirt.io/agent": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    res = c["resources"]
    assert res["requests"]["memory"] == "128Mi" and res["limits"]["memory"] == "384Mi"
    assert "cpu" not in res.get("limits", {})
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"


@needs_kubectl
def test_layouts_configmap_parses_and_fits_the_catalog_node():
    objs = build("dra")
    cm = one(objs, "ConfigMap")
    doc = yaml.safe_load(cm["data"]["layouts.yaml"])
    inv = catalog_inventory()
    for name in doc["layouts"]:
        layouts = parse_config(doc, name)
        select_gpus(inv, layouts)  # every example applies to the default simulated node
    for overlay in OVERLAYS:
        args = agent(build(overlay))["args"]
        (layout,) = [a.split("=", 1)[1] for a in args if a.startswith("--layout=")]
        assert layout in doc["layouts"]


def test_docs_name_the_node_labels():
    text = (ROOT / "docs" / "install.md").read_text() + (ROOT / "docs" / "migrate.md").read_text()
    for label in (LABEL_CONFIG, LABEL_CONFIG_STATE, NVIDIA_LABEL_CONFIG, NVIDIA_LABEL_CONFIG_STATE):
        assert label in text
    for state in ("pending", "success", "failed"):
        assert state in text


# --------------------------------------------------------------------------- the image


def test_containerfile_installs_the_tools_and_copies_what_exists():
    text = (DEPLOY / "Containerfile").read_text()
    runs = " ".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for pkg in ("python3", "python3-libvirt", "libvirt-clients", "mdevctl", "kmod"):
        assert re.search(rf"(?<![\w-]){re.escape(pkg)}(?![\w-])", runs), pkg
    for line in text.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for src in shlex.split(line)[1:-1]:
                assert (ROOT / src).exists(), src
    assert 'ENTRYPOINT ["vgpuctl"]' in text
    assert re.search(r"^FROM .*AS build$", text, re.M) and text.count("FROM ") == 2
    # every package of ours is copied, and the node image carries no simulator (#22: an extra)
    copied = {shlex.split(line)[1] for line in text.splitlines() if line.startswith("COPY") and "--from" not in line}
    assert {"vgpuctl", "mdev_manager", "dra_bridge", "kubevirt_templates"} <= copied
    assert re.search(r"rm -rf mdev_manager/sim dra_bridge/sim", runs)
    assert "fuse3" not in runs
    # only the dev overlay's image (tests/kind/run-e2e.sh: --build-arg WITH_SIM=true) keeps it: the
    # sim extra is named once, in that branch, and the argument is false by default
    assert re.search(r"^ARG WITH_SIM=false$", text, re.M)
    assert runs.count("[sim]") == 1 and re.search(r'if \[ "\$WITH_SIM" = true \]; then extra=\'\[sim\]\'', runs)
    kind = (ROOT / "tests" / "kind" / "run-e2e.sh").read_text()
    assert "--build-arg WITH_SIM=true" in kind and '"$K" apply -k deploy/overlays/dev' in kind
