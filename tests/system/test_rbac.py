"""deploy's ClusterRole grants exactly the API calls the agent makes, both ways.

Read from the code: every method of the official client's API classes that a module the agent
(``vgpuctl serve``) can load names, on the class it is called on (``client.CoreV1Api(...)``, or
the name that object was assigned to); the generated client gives its HTTP method and path, hence
(apiGroup, resource, verb). A method several classes share with different RBAC (events: core/v1
and events.k8s.io/v1) must be called on a known class. Seen in a run: the agent against the local
API server, its requests logged; every one is in the scan and granted.
"""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.kubelet import node_object
from tests.support.deploy import NAMESPACE, OVERLAYS, ROOT, SERVICE_ACCOUNT, build, needs_kubectl, one
from tests.support.imports import reachable, sources

# The demo, conformance and capacity commands run with the user's own credentials, not the agent's.
AGENT_MODULES = reachable("vgpuctl.commands.serve")
SCANNED = [path for name, path in sorted(sources().items()) if name in AGENT_MODULES]
_UNMAPPABLE = re.compile(r"\b(call_api|DynamicClient|CustomObjectsApi)\b")
# Authorization-only grants: no client call maps to them; the API server checks them in addition
# (writing status.devices, 1.36+: DRAResourceClaimGranularStatusAuthorization), named for our driver.
AUTHORIZATION_ONLY = {("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"): "vgpu.kubevirt.io"}
Rule = tuple[str, str, str]
CORE = Path("dra_bridge/apiclient/core.py")
RESOURCE = Path("dra_bridge/apiclient/resource.py")


@cache
def api_classes() -> dict[str, type]:
    import kubernetes.client as kc

    return {n: getattr(kc, n) for n in dir(kc) if n.endswith("Api") and inspect.isclass(getattr(kc, n))}


@cache
def requests_of(method: str) -> dict[str, tuple[str, str]]:
    """API class name -> (HTTP method, path) of a client method, for every class that has it."""
    out = {}
    for name, cls in api_classes().items():
        ser = getattr(cls, f"_{method}_serialize", None)
        if ser is None:
            continue
        src = inspect.getsource(ser)
        http = re.search(r"method='([A-Z]+)'", src)
        path = re.search(r"resource_path='([^']+)'", src)
        if http and path:
            out[name] = (http.group(1), path.group(1))
    return out


def rbac_of(http: str, path: str) -> Rule | None:
    """``GET /apis/resource.k8s.io/v1/resourceslices/{name}`` -> (resource.k8s.io, resourceslices, get);
    None for non-resource URLs (/version: readable by every authenticated user)."""
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http]
    return group, resource, verb


def _class_of(call: ast.AST) -> str | None:
    """``client.CoreV1Api(...)`` / ``CoreV1Api(...)`` -> ``CoreV1Api``."""
    if not isinstance(call, ast.Call):
        return None
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name if name in api_classes() else None


def client_calls(path: Path) -> list[tuple[str | None, str, bool, int]]:
    """(API class or None when unknown, method, as a watch, line) for each client method a file names."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _class_of(node.value):
            for target in node.targets:
                bound[ast.unparse(target)] = _class_of(node.value)
    watched: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if any(k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in node.keywords):
                watched.add(id(node.func))
            if node.func.attr == "stream" and node.args and isinstance(node.args[0], ast.Attribute):
                watched.add(id(node.args[0]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and requests_of(node.attr):
            cls = _class_of(node.value) or bound.get(ast.unparse(node.value))
            out.append((cls, node.attr, id(node) in watched, node.lineno))
    return out


def required_access() -> dict[Rule, list[str]]:
    """(apiGroup, resource, verb) -> where the agent's code needs it."""
    need: dict[Rule, list[str]] = {}
    for f in SCANNED:
        rel = f.relative_to(ROOT)
        # dra_bridge.apiclient.core and .resource make core/v1 and resource/v1 calls through call_api, each on the
        # generated method's request line (test_the_agents_own_core_calls_are_the_generated_clients); calls to
        # them map by their names
        bad = None if rel in (CORE, RESOURCE) else _UNMAPPABLE.search(f.read_text())
        assert bad is None, f"{rel}: {bad.group(1)} cannot be mapped to RBAC here; extend tests/system/test_rbac.py"
        for cls, method, watch, line in client_calls(f):
            reqs = requests_of(method)
            if cls is not None:
                assert cls in reqs, f"{rel}:{line}: {cls} has no {method}"
                reqs = {cls: reqs[cls]}
            rules = {rbac_of(*r) for r in reqs.values()} - {None}
            assert len(rules) <= 1, (f"{rel}:{line}: which API class {method} is called on decides its RBAC "
                                     f"({sorted(rules)}); call it on client.<Class>(...) or a name bound to one")
            for group, resource, verb in rules:
                for rule in [(group, resource, verb)] + ([(group, resource, "watch")] if watch else []):
                    need.setdefault(rule, []).append(f"{rel}:{line} {method}")
    return need


def granted(role: dict) -> set[Rule]:
    out = set()
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs")
        keys = {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        if rule.get("resourceNames"):  # only the driver's own authorization-only subresource
            assert keys <= set(AUTHORIZATION_ONLY) and rule["resourceNames"] == [AUTHORIZATION_ONLY[min(keys)]], rule
        for key in keys:
            assert "*" not in key, f"wildcard in {rule}"
        out |= keys
    return out


def test_rbac_mapping_reads_the_client():
    def rule(method: str, cls: str) -> Rule | None:
        return rbac_of(*requests_of(method)[cls])

    assert rule("list_resource_slice", "ResourceV1Api") == ("resource.k8s.io", "resourceslices", "list")
    assert rule("read_namespaced_resource_claim", "ResourceV1Api") == ("resource.k8s.io", "resourceclaims", "get")
    assert rule("patch_node", "CoreV1Api") == ("", "nodes", "patch")
    assert rule("replace_namespaced_resource_claim_status", "ResourceV1Api") == (
        "resource.k8s.io", "resourceclaims/status", "update")
    # one method name, two API groups: the class decides
    assert rule("create_namespaced_event", "CoreV1Api") == ("", "events", "create")
    assert rule("create_namespaced_event", "EventsV1Api") == ("events.k8s.io", "events", "create")
    assert rbac_of(*requests_of("get_code")["VersionApi"]) is None


def test_the_agents_own_core_calls_are_the_generated_clients():
    """The agent's light ``CoreV1Api`` (no typed models) sends what ``kubernetes.client.CoreV1Api``'s methods
    of the same names send, so the scan maps its calls to RBAC by their names."""
    from dra_bridge.apiclient import core

    assert CORE in [p.relative_to(ROOT) for p in SCANNED]
    methods = {n for n, f in vars(core.CoreV1Api).items() if callable(f) and not n.startswith("_")}
    assert methods == set(core.CALLS)
    for name, request in core.CALLS.items():
        assert requests_of(name)["CoreV1Api"] == request, name


def test_the_agents_own_resource_calls_are_the_generated_clients():
    """The same for its light ``ResourceV1Api`` (#37.3: the generated one loads 71 model modules, ~5 MB)."""
    from dra_bridge.apiclient import resource

    assert RESOURCE in [p.relative_to(ROOT) for p in SCANNED]
    methods = {n for n, f in vars(resource.ResourceV1Api).items() if callable(f) and not n.startswith("_")}
    assert methods == set(resource.CALLS)
    for name, request in resource.CALLS.items():
        assert requests_of(name)["ResourceV1Api"] == request, name


def test_the_scan_knows_the_class_each_call_is_made_on(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from kubernetes import client\n"
                   "def f(api_client, x):\n"
                   "    client.CoreV1Api(api_client).create_namespaced_event('default', x)\n"
                   "    api = client.ResourceV1Api(api_client)\n"
                   "    api.list_resource_slice(watch=True)\n"
                   "    x.create_namespaced_event('default', x)\n")
    calls = sorted(client_calls(src), key=lambda c: c[3])
    assert calls == [("CoreV1Api", "create_namespaced_event", False, 3),
                     ("ResourceV1Api", "list_resource_slice", True, 5),
                     (None, "create_namespaced_event", False, 6)]  # unknown: required_access refuses it


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_exactly_what_the_code_calls(overlay):
    objs = build(overlay)
    have = granted(one(objs, "ClusterRole"))
    need = required_access()
    assert ("resource.k8s.io", "resourceslices", "create") in need  # the scan finds the publisher
    assert ("", "events", "create") in need and ("events.k8s.io", "events", "create") not in need
    missing = set(need) - have
    assert not missing, "the code calls APIs the ClusterRole does not grant: " + "; ".join(
        f"{r}: {need[r]}" for r in sorted(missing))
    extra = have - set(need) - set(AUTHORIZATION_ONLY)
    assert not extra, f"the ClusterRole grants what no code calls: {sorted(extra)}"
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding")]
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one(objs, "ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


@needs_kubectl
def test_a_recorded_run_of_the_agent_makes_only_granted_calls_the_scan_knows():
    """The agent on a simulated node against the local API server (1.36 defaults: it watches claims
    for binding conditions), labels and state on its Node, one claim prepared by the kubelet."""
    from tests.support.dra import add_claim, make_node, short_tmp
    from tests.system.test_serve import make_daemon, register, running, wait_until

    with short_tmp("rb") as base, LocalApiServer(version="1.36", feature_gates={}) as srv:
        node = make_node(base, "default")
        srv.add(node_object(node.node, labels={"vgpu.kubevirt.io/config": "default"}))
        layouts = base / "layouts.yaml"
        layouts.write_text("version: vgpuctl/v1\nlayouts:\n  default:\n    - all: true\n      mode: dra\n")
        with running(make_daemon(node, srv, base, layout_file=layouts, layout="default",
                                 layout_label="vgpu.kubevirt.io/config",
                                 state_label="vgpu.kubevirt.io/config.state")) as r:
            wait_until(lambda: srv.get_object("nodes", node.node)["metadata"]["labels"].get(
                "vgpu.kubevirt.io/config.state") == "success", what="the state label")
            kubelet, reg = register(base / "kl")
            device = next(d.name for d in r.daemon._pool.devices if d.kind == "vgpu")
            claim = add_claim(srv, "vm", [("vgpu", device)], node=node.node)
            with reg.client("v1") as c:
                assert c.prepare([(claim.namespace, claim.uid, claim.name)])[claim.uid]["error"] == ""
                assert c.unprepare([(claim.namespace, claim.uid, claim.name)])[claim.uid] == ""
            r.daemon.resync()
    seen: dict[Rule, str] = {}
    for rec in srv.request_log:
        rule = rbac_of(rec.method, rec.path)
        if rule is not None:
            seen[(rule[0], rule[1], "watch" if rec.verb == "watch" else rule[2])] = rec.path
    assert {("resource.k8s.io", "resourceslices", "create"), ("", "nodes", "patch"),
            ("resource.k8s.io", "resourceclaims", "get"), ("resource.k8s.io", "resourceclaims", "watch")} <= set(seen)
    have = granted(one(build("dra"), "ClusterRole"))
    assert set(seen) <= have, f"the run made calls RBAC would refuse: {sorted(set(seen) - have)}"
    need = required_access()
    assert set(seen) <= set(need), f"the run made calls the scan does not see: {sorted(set(seen) - set(need))}"
