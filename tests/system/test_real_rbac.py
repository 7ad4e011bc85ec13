"""deploy/'s RBAC on the real API server, as the agent's own identity (issue #39.6).

tests/system/test_rbac.py checks the ClusterRole against the code and a run on the local server; here
kube-apiserver 1.37 (``--authorization-mode=RBAC``) decides. ``kubectl apply -k deploy/overlays/dra``;
the real DaemonSet controller makes the agent's pod for the simulated node and the real scheduler binds
it; the agent then runs with a token of its ServiceAccount bound to that pod, as the kubelet would mount
it (``kubectl create token --bound-object-kind Pod``), through the kubeconfig path ``vgpuctl serve
--kubeconfig`` takes. Every request it makes is recorded: none may be refused.

Why the pod binding matters (kubernetes v1.37.2, pkg/registry/resource/utils.go,
``AuthorizedForDeviceStatus`` / ``saAssociatedWithAllocatedNode``): with
DRAResourceClaimGranularStatusAuthorization (on by default) a write to a claim's ``status.devices``
also needs the verb ``associated-node:<verb>`` on the synthetic ``resourceclaims/driver`` subresource
named for the driver, and that verb is only tried for a ServiceAccount whose token carries exactly one
node name (``authentication.kubernetes.io/node-name``) equal to the node of the claim's allocation;
otherwise ``arbitrary-node:<verb>``, which deploy/ does not grant. A token bound to a pod carries its
node (pkg/registry/core/serviceaccount/storage/token.go: ``pod.Spec.NodeName``). The refusal is a
validation error (422, cause FieldValueForbidden), not a 403: both count as refused here.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import LABEL_VGPU_HOST_DRIVER
from dra_bridge.apiclient.client import api_client_from
from dra_bridge.sim.kubelet import KubeletClient
from mdev_manager.sim import SimIO
from tests.support.controlplane import RealControlPlane, prepare_claims
from tests.support.deploy import DEPLOY, NAMESPACE, SERVICE_ACCOUNT, Kubectl, agent, build, needs_kubectl, one
from tests.support.dra import DRIVER, assert_consistent_pool, make_node, pool_slices, short_tmp
from tests.system.test_rbac import rbac_of
from tests.system.test_real_controlplane import Serving, _vgpu_pod, node_for, render, wait_for

pytestmark = [pytest.mark.go, needs_kubectl]

# the control plane's own controllers, and the DaemonSet controller: it makes the agent's pod
CONTROLLERS = ("resourceclaim-controller,device-taint-eviction-controller,serviceaccount-controller,"
               "garbage-collector-controller,namespace-controller,daemonset-controller")
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def cp():
    with RealControlPlane(extra=[f"--controllers={CONTROLLERS}"]) as c:
        yield c


@pytest.fixture
def k(cp, tmp_path):
    return Kubectl(cp.kubeconfig_path, tmp_path)


class Recorded:
    """Every request an API client sends, with the server's answer: (method, path, status, body of a
    refusal). Wraps the client's REST layer, which every call and watch goes through."""

    def __init__(self, api_client):
        self.api_client = api_client
        self.seen: list[tuple[str, str, int, str]] = []
        self._lock = threading.Lock()
        rest = api_client.rest_client
        inner = rest.request

        def request(method, url, *args, **kw):
            r = inner(method, url, *args, **kw)
            body = r.read().decode(errors="replace") if r.status >= 400 else ""
            with self._lock:
                self.seen.append((method, url.split("://", 1)[-1].split("/", 1)[-1], r.status, body))
            return r

        rest.request = request

    def refused(self) -> list[tuple[str, str, int, str]]:
        """Requests the server refused: any 4xx/5xx but 404 (a read of what is not there yet) and 409
        (a write that lost a race: the agent reads again). Authorization answers 403, the granular
        status authorization 422 (its message names the synthetic subresource), an admission policy
        422 too: a grant missing from deploy/ shows here whichever way it is refused."""
        return [s for s in self.seen if s[2] >= 400 and s[2] not in (404, 409)]

    def rules(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource, verb) of the requests answered with 2xx."""
        out = set()
        for method, path, code, _ in self.seen:
            rule = rbac_of(method, "/" + path)
            if rule and 200 <= code < 300:
                out.add((rule[0], rule[1], "watch" if "watch=True" in path or "watch=true" in path else rule[2]))
        return out


def token_claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def kubeconfig_with_token(admin: Path, token: str, path: Path) -> Path:
    """The admin kubeconfig's cluster (server, CA) with the ServiceAccount's token as the user."""
    cfg = yaml.safe_load(admin.read_text())
    cluster = cfg["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": cluster["name"], "user": SERVICE_ACCOUNT}}],
        "current-context": "agent"}))
    return path


def _agent_pod(cp, node_name: str) -> dict:
    """The DaemonSet's pod for ``node_name``, once the scheduler bound it there."""
    def bound():
        for p in cp.objects("pods", NAMESPACE):
            if p["spec"].get("nodeName") == node_name and not p["metadata"].get("deletionTimestamp"):
                return p
        return None
    return wait_for(bound, f"the DaemonSet's pod bound to {node_name}", 90)


def _allocated_claim(cp, name: str, node_name: str, device: str) -> dict:
    """A claim allocated (by the admin, as a scheduler would) from ``node_name``'s pool, no binding conditions."""
    claim = cp.add({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": DRIVER}}]}}})
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "vgpu", "driver": DRIVER, "pool": node_name, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}
    return cp.rest("PUT", cp.path("resourceclaims", name, "default") + "/status", claim)


_writes = itertools.count()


def _patch_device_status(api, claim: dict) -> tuple[int, str]:
    """A merge patch of ``status.devices`` (the agent's kind of write; a new condition message each
    time, so each one changes the driver's entry) as ``api``: the HTTP status and the message."""
    (r,) = claim["status"]["allocation"]["devices"]["results"]
    body = {"status": {"devices": [{"driver": r["driver"], "pool": r["pool"], "device": r["device"],
                                    "conditions": [{"type": "Checked", "status": "True", "reason": "Test",
                                                    "message": f"write {next(_writes)}",
                                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}}
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}/status"
    m, url, headers, data, _ = api.param_serialize(
        "PATCH", path, header_params={"Content-Type": "application/merge-patch+json",
                                      "Accept": "application/json"}, body=body, auth_settings=["BearerToken"])
    resp = api.call_api(m, url, headers, data)
    payload = resp.read()
    return resp.status, (json.loads(payload).get("message", "") if resp.status >= 400 else "")


DRIVER_STATUS = 'resource="resourceclaims/driver"'


def _without(role: dict, resource: str) -> dict:
    out = json.loads(json.dumps(role))
    out["rules"] = [r for r in out["rules"] if resource not in r["resources"]]
    assert len(out["rules"]) == len(role["rules"]) - 1, resource
    return out


def _each_claim_status_grant_is_needed(k, api, claim: dict) -> dict[str, int]:
    """deploy/'s ClusterRole less one of its two claim-status rules: the agent's write is refused
    (the RBAC authorizer sees the change through its informer: waited for); restored, admitted."""
    role = one(build("dra"), "ClusterRole")
    refused = {}
    for resource in ("resourceclaims/status", "resourceclaims/driver"):
        k("apply", "-f", "-", stdin=json.dumps(_without(role, resource)))
        refused[resource] = wait_for(lambda: (c := _patch_device_status(api, claim)[0]) != 200 and c,
                                     f"the write refused without {resource}")
        k("apply", "-f", "-", stdin=json.dumps(role))
        wait_for(lambda: _patch_device_status(api, claim)[0] == 200, "the write admitted again")
    return refused


def test_the_agent_as_its_own_service_account_on_the_real_api_server(cp, k, tmp_path):
    objs = build("dra")
    layouts = one(objs, "ConfigMap")["data"]["layouts.yaml"]
    args = agent(objs)["args"]
    label = next(a.split("=", 1)[1] for a in args if a.startswith("--layout-label="))
    state = next(a.split("=", 1)[1] for a in args if a.startswith("--state-label="))
    with short_tmp("rr") as base:
        node = make_node(base / "n", "default", version=(1, 37))
        cp.add(node_for(node.node))  # labelled as a GPU node the operator opted in: the DaemonSet's selector
        k("apply", "-k", str(DEPLOY / "overlays" / "dra"), "--validate=strict")

        # the agent's identity: a token of its ServiceAccount bound to the DaemonSet's pod on this node
        pod = _agent_pod(cp, node.node)
        assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
        token = k("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--bound-object-kind", "Pod",
                  "--bound-object-name", pod["metadata"]["name"], "--bound-object-uid", pod["metadata"]["uid"],
                  "--duration", "1h").stdout.strip()
        assert token_claims(token)["kubernetes.io"]["node"]["name"] == node.node
        kubeconfig = kubeconfig_with_token(cp.kubeconfig_path, token, tmp_path / "agent.kubeconfig")
        whoami = json.loads(Kubectl(kubeconfig, tmp_path)("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]
        assert whoami["username"] == f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
        assert whoami["extra"][NODE_NAME_CLAIM] == [node.node]

        layout_file = base / "layouts.yaml"
        layout_file.write_text(layouts)
        api = Recorded(api_client_from(str(kubeconfig)))
        cfg = ServeConfig(node_name=node.node, kubelet_root=base / "kl", cdi_root=base / "cdi", metrics_port=0,
                          resync_seconds=3600, health_poll_seconds=0.1, layout_file=layout_file,
                          layout_label=label, state_label=state)
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C"))
        with Serving(Daemon(cfg, node.env, SimIO(node.host), api.api_client)):
            slices = wait_for(lambda: pool_slices(cp, node=node.node), "the agent's slices")
            assert_consistent_pool(slices)
            wait_for(lambda: cp.get_object("nodes", node.node)["metadata"]["labels"].get(state) == "success",
                     "the state label on the Node")
            # the host driver's version (read by KubeVirt's vGPU live migration): its own label, admitted
            wait_for(lambda: cp.get_object("nodes", node.node)["metadata"]["labels"].get(LABEL_VGPU_HOST_DRIVER),
                     "the host driver label on the Node")
            k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod("vm-rbac", "vgpu-a100-4c")))
            kubelet = KubeletClient(base / "kl").register()
            try:
                vm = wait_for(lambda: (p := cp.get_object("pods", "vm-rbac", "default"))["spec"].get("nodeName")
                              and p.get("status", {}).get("resourceClaimStatuses") and p, "vm-rbac bound", 90)
                assert vm["spec"]["nodeName"] == node.node
                answers = prepare_claims(cp, kubelet, vm)
                (claim_name,) = [s["resourceClaimName"] for s in vm["status"]["resourceClaimStatuses"]]
                claim = cp.get_object("resourceclaims", claim_name, "default")
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result.get("bindingConditions"), "1.37's defaults: the agent publishes binding conditions"
                conds = {c["type"]: c["status"] for e in claim["status"].get("devices") or []
                         for c in e.get("conditions") or []}
                assert all(conds.get(c) == "True" for c in result["bindingConditions"]), conds
                (answer,) = answers.values()
                assert [d["device_name"] for d in answer["devices"]] == [result["device"]]
            finally:
                kubelet.close()
        print("\n".join(f"{m} {p[:140]} {s} {b[:600]}" for m, p, s, b in api.seen))
        assert api.refused() == []
        done = api.rules()
        # what this run exercised, each answered 2xx as the agent: publishing, its Node, the claims,
        # and the binding conditions confirmed by a status patch
        assert {("resource.k8s.io", "resourceslices", "create"), ("", "nodes", "patch"),
                ("resource.k8s.io", "resourceclaims", "watch"), ("resource.k8s.io", "resourceclaims", "get"),
                ("resource.k8s.io", "resourceclaims/status", "patch")} <= done, sorted(done)

        # the negative: the same identity may not write the status of a claim allocated from another
        # node's pool; a token of the same ServiceAccount bound to no pod (no node) not even on its own
        other = "gpu-node-elsewhere"
        cp.add(node_for(other))
        device = result["device"]
        mine = _allocated_claim(cp, "rbac-mine", node.node, device)
        theirs = _allocated_claim(cp, "rbac-theirs", other, device)
        unbound = k("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration", "1h").stdout.strip()
        plain = api_client_from(str(kubeconfig_with_token(cp.kubeconfig_path, unbound, tmp_path / "plain.kubeconfig")))
        try:
            code, why = _patch_device_status(plain, mine)
            assert code == 422 and DRIVER_STATUS in why, why
            code, why = _patch_device_status(api.api_client, theirs)
            assert code == 422 and DRIVER_STATUS in why, why
            assert _patch_device_status(api.api_client, mine) == (200, "")
            # both of deploy/'s claim-status rules are needed: plain RBAC on the subresource (403),
            # the driver's associated-node:patch (refused by the status strategy: 422)
            assert _each_claim_status_grant_is_needed(k, api.api_client, mine) == {
                "resourceclaims/status": 403, "resourceclaims/driver": 422}
        finally:
            plain.close()
            api.api_client.close()
