"""deploy/: every overlay renders with kustomize, validates against the Kubernetes schemas,
grants exactly the API access the code uses, and fits the agent's command line and paths."""

from __future__ import annotations

import argparse
import inspect
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from dra_bridge.api.names import (
    ANNOTATION_CONFIG_REASON,
    LABEL_CONFIG,
    LABEL_CONFIG_STATE,
    NVIDIA_LABEL_CONFIG,
    NVIDIA_LABEL_CONFIG_STATE,
)
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.kept import ANNOTATION_DRA_FIELDS
from kubevirt_templates import render
from mdev_manager.config import parse_config
from mdev_manager.plan import select_gpus
from tests.support.cel import catalog_inventory
from tests.support.imports import reachable, sources
from tests.support.k8sschema import kubernetes_problems

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ["dra", "device-plugin", "dev"]
NAMESPACE = "vgpuctl-system"
SERVICE_ACCOUNT = "vgpuctl"
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
# RBAC the manifests grant for those pending features, before the code makes the calls.
PENDING_GRANTS: dict = {}
# Authorization-only grants: no client call maps to them; the API server checks them in addition
# (writing status.devices, 1.36+: DRAResourceClaimGranularStatusAuthorization), named for our driver.
AUTHORIZATION_ONLY = {("resource.k8s.io", "resourceclaims/driver", "associated-node:update"): "vgpu.kubevirt.io"}
_WAS_PENDING_GRANTS = {
    ("", "nodes", "get"): "--layout-label: read its own Node's labels",
    ("", "nodes", "patch"): "--state-label: set the state label on its own Node",
}

kubectl = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(kubectl is None, reason="kubectl (kustomize) not installed")


@cache
def _build(overlay: str) -> tuple:
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)],
                         capture_output=True, text=True, check=True)
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def build(overlay: str) -> list[dict]:
    return [dict(d) for d in _build(overlay)]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind} {name}: {len(hits)} found"
    return hits[0]


def agent(objs: list[dict]) -> dict:
    return one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


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


# --------------------------------------------------------------------------- RBAC = what the code calls

# The code is scanned for methods of the official client's API classes; each is mapped to its
# HTTP method and path (read from the generated client), hence to (apiGroup, resource, verb).
# What the agent (vgpuctl serve) runs under the DaemonSet's ServiceAccount: every module the
# serve command can load. The demo, conformance and capacity commands run with the user's own
# credentials, not the agent's.
AGENT_MODULES = reachable("vgpuctl.commands.serve")
SCANNED = [path for name, path in sorted(sources().items()) if name in AGENT_MODULES]
_IDENT = re.compile(r"\.([a-z][a-z0-9_]*)\b")
_WATCH_STREAM = re.compile(r"\.stream\(\s*[\w.]+\.(list_[a-z0-9_]+)")
_WATCH_ARG = re.compile(r"\.(list_[a-z0-9_]+)\([^()]*\bwatch\s*=\s*True")
_UNMAPPABLE = re.compile(r"\b(call_api|DynamicClient|CustomObjectsApi)\b")


@cache
def _client_api_classes() -> tuple:
    import kubernetes.client as kc

    return tuple(getattr(kc, n) for n in dir(kc) if n.endswith("Api") and inspect.isclass(getattr(kc, n)))


def _request_of(method: str) -> set[tuple[str, str]]:
    """(HTTP method, path) of a client method name, over every API class that has it."""
    out = set()
    for cls in _client_api_classes():
        ser = getattr(cls, f"_{method}_serialize", None)
        if ser is None:
            continue
        src = inspect.getsource(ser)
        http = re.search(r"method='([A-Z]+)'", src)
        path = re.search(r"resource_path='([^']+)'", src)
        if http and path:
            out.add((http.group(1), path.group(1)))
    return out


def _rbac_of(http: str, path: str) -> tuple[str, str, str] | None:
    """``GET /apis/resource.k8s.io/v1/resourceslices/{name}`` -> (resource.k8s.io, resourceslices, get);
    None for non-resource URLs (/version: readable by every authenticated user)."""
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1 and rest[1].startswith("{")
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http]
    return group, resource, verb


def required_access() -> dict[tuple[str, str, str], list[str]]:
    """(apiGroup, resource, verb) -> where the code needs it."""
    need: dict[tuple[str, str, str], list[str]] = {}
    for f in SCANNED:
        text = f.read_text()
        rel = f.relative_to(ROOT)
        bad = _UNMAPPABLE.search(text)
        assert bad is None, f"{rel}: {bad.group(1)} cannot be mapped to RBAC here; extend tests/test_deploy.py"
        for name in sorted(set(_IDENT.findall(text))):
            for http, path in _request_of(name):
                rule = _rbac_of(http, path)
                if rule and f"{rel}: {name}" not in need.get(rule, []):
                    need.setdefault(rule, []).append(f"{rel}: {name}")
        for name in set(_WATCH_STREAM.findall(text)) | set(_WATCH_ARG.findall(text)):
            for http, path in _request_of(name):
                rule = _rbac_of(http, path)
                if rule and f"{rel}: {name} (watch)" not in need.get((rule[0], rule[1], "watch"), []):
                    need.setdefault((rule[0], rule[1], "watch"), []).append(f"{rel}: {name} (watch)")
    return need


def granted(role: dict) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs")
        if rule.get("resourceNames"):  # only the driver's own authorization-only subresource
            keys = {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
            assert keys <= set(AUTHORIZATION_ONLY) and rule["resourceNames"] == [AUTHORIZATION_ONLY[min(keys)]], rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    assert "*" not in (g, r, v), f"wildcard in {rule}"
                    out.add((g, r, v))
    return out


def test_rbac_mapping_reads_the_client():
    assert _rbac_of(*next(iter(_request_of("list_resource_slice")))) == ("resource.k8s.io", "resourceslices", "list")
    assert _rbac_of(*next(iter(_request_of("read_namespaced_resource_claim")))) == ("resource.k8s.io", "resourceclaims", "get")
    assert _rbac_of(*next(iter(_request_of("patch_node")))) == ("", "nodes", "patch")
    assert _rbac_of(*next(iter(_request_of("replace_namespaced_resource_claim_status")))) == (
        "resource.k8s.io", "resourceclaims/status", "update")
    assert _rbac_of(*next(iter(_request_of("get_code")))) is None


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_exactly_what_the_code_calls(overlay):
    objs = build(overlay)
    have = granted(one(objs, "ClusterRole"))
    need = required_access()
    assert ("resource.k8s.io", "resourceslices", "create") in need  # the scan finds the publisher
    missing = set(need) - have
    assert not missing, "the code calls APIs the ClusterRole does not grant: " + "; ".join(
        f"{r}: {need[r]}" for r in sorted(missing))
    extra = have - set(need) - set(PENDING_GRANTS) - set(AUTHORIZATION_ONLY)
    assert not extra, f"the ClusterRole grants what no code calls: {sorted(extra)}"
    assert set(PENDING_GRANTS) <= have
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding")]
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one(objs, "ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


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
    hardware = {"/sys", "/dev/vfio", "/etc/mdevctl.d", "/lib/modules"}
    if overlay == "dev":
        assert not hardware & set(mounts)
        assert c["securityContext"]["privileged"] is False
        assert "emptyDir" in vols[mounts["/var/lib/vgpuctl"]["name"]]
    else:
        for path in hardware | {"/var/lib/vgpuctl"}:
            assert host.get(path) == path, path
        assert mounts["/lib/modules"].get("readOnly") is True
        assert c["securityContext"]["privileged"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "/tmp" in mounts


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
