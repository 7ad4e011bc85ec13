"""Real kubectl 1.37 against the local API server: what an operator types works as on a cluster.

Printer columns (``get`` asks for a ``meta.k8s.io`` Table), server-side apply (create, update,
conflicts), ``apply -k`` of every deploy/ overlay with kubectl's default validation (it reads the
server's OpenAPI v3; ``explain`` reads v3 and v2), ResourceClaim validation in upstream's words,
and the Node of a simulated node.
"""

from __future__ import annotations

import json

import pytest

from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.deploy import DEPLOY, OVERLAYS, Kubectl, build, needs_kubectl

pytestmark = needs_kubectl
DRIVER = "vgpu.kubevirt.io"


@pytest.fixture
def srv():
    with LocalApiServer(version="1.37", feature_gates={}) as s:  # as `vgpuctl sim apiserver --version 1.37`
        yield s


@pytest.fixture
def k(srv, tmp_path):
    return Kubectl(srv.kubeconfig(tmp_path / "kubeconfig"), tmp_path)


def _slice(name: str, node: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0-passthrough"}]}}


def _claim(name: str, exactly: dict) -> str:
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                       "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})


def test_get_prints_kube_apiservers_columns(srv, k):
    srv.add(_slice("node-a-slice", "node-a"))
    (row,) = k.table("resourceslices", "-o", "wide")
    assert list(row) == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert (row["NAME"], row["NODE"], row["DRIVER"], row["POOL"]) == ("node-a-slice", "node-a", DRIVER, "node-a")
    assert row["AGE"].endswith("s")
    k("create", "-f", "-", stdin=_claim("waiting", {"deviceClassName": DRIVER}))
    srv.add({**json.loads(_claim("running", {"deviceClassName": DRIVER})), "status": {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a",
                                                "device": "gpu-0-passthrough"}]}},
        "reservedFor": [{"resource": "pods", "name": "virt-launcher-vm", "uid": "5b7c8f4e-1d6a-4c1e-9a53-0f3c2b9d8e71"}]}})
    rows = k.table("resourceclaims")
    assert [(r["NAME"], r["STATE"]) for r in rows] == [("running", "allocated,reserved"), ("waiting", "pending")]
    assert list(rows[0]) == ["NAME", "STATE", "AGE"]
    k("apply", "-f", str(DEPLOY / "base" / "deviceclasses.yaml"))
    assert [list(r) for r in k.table("deviceclasses")] == [["NAME", "AGE"]] * 2


def test_server_side_apply_creates_updates_and_answers_conflicts_as_upstream(srv, k):
    def manifest(**labels: str) -> str:
        return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                           "metadata": {"name": "ssa.example.com", "labels": labels},
                           "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})

    assert "serverside-applied" in k("apply", "--server-side", "-f", "-", stdin=manifest(tier="gold", team="a")).stdout
    (entry,) = k.managed("deviceclass", "ssa.example.com")
    assert (entry["manager"], entry["operation"]) == ("kubectl", "Apply")
    assert set(entry["fieldsV1"]["f:metadata"]["f:labels"]) == {"f:tier", "f:team"}
    # an update: a label it no longer applies goes, the other changes
    k("apply", "--server-side", "-f", "-", stdin=manifest(tier="silver"))
    assert srv.get_object("deviceclasses", "ssa.example.com")["metadata"]["labels"] == {"tier": "silver"}
    # another manager changes the field: applying it again is a conflict, as kube-apiserver words it
    k("label", "deviceclass", "ssa.example.com", "tier=bronze", "--overwrite")
    p = k("apply", "--server-side", "-f", "-", stdin=manifest(tier="silver"), ok=False)
    assert p.returncode == 1
    assert 'Apply failed with 1 conflict: conflict with "kubectl-label" using resource.k8s.io/v1: ' \
           '.metadata.labels.tier' in p.stderr
    assert srv.get_object("deviceclasses", "ssa.example.com")["metadata"]["labels"] == {"tier": "bronze"}
    k("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=manifest(tier="silver"))
    assert srv.get_object("deviceclasses", "ssa.example.com")["metadata"]["labels"] == {"tier": "silver"}
    assert {(e["manager"], e["operation"]) for e in k.managed("deviceclass", "ssa.example.com")} == {("kubectl", "Apply")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_apply_k_of_every_overlay_passes_kubectls_default_validation(srv, k, overlay):
    objs = build(overlay)
    p = k("apply", "-k", str(DEPLOY / "overlays" / overlay), "--dry-run=server")
    assert p.stdout.count("(server dry run)") == len(objs), p.stdout
    assert srv.objects("daemonsets") == []
    k("apply", "-k", str(DEPLOY / "overlays" / overlay))
    assert len(srv.objects("daemonsets")) == 1 and len(srv.objects("validatingadmissionpolicies")) == 2
    # applying again patches what changed, with the strategic merge patch kubectl builds from the server's
    # OpenAPI; diff (a server-side dry run) then finds nothing
    other = "dev" if overlay != "dev" else "dra"
    assert "daemonset.apps/vgpuctl-agent configured" in k("apply", "-k", str(DEPLOY / "overlays" / other)).stdout
    assert k("diff", "-k", str(DEPLOY / "overlays" / other), ok=False).returncode == 0


def test_the_monitoring_dashboard_applies_as_a_labelled_configmap(srv, k):
    k("apply", "-k", str(DEPLOY / "monitoring"))
    (cm,) = [c for c in srv.objects("configmaps", namespace="vgpuctl-system")
             if c["metadata"]["name"] == "vgpuctl-grafana-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["grafana-dashboard.json"])["uid"] == "vgpuctl-agent"


def test_a_bad_resource_claim_is_refused_in_upstreams_words(srv, k):
    p = k("create", "-f", "-", stdin=_claim("bad", {"deviceClassName": "", "allocationMode": "Bogus"}), ok=False)
    assert p.returncode == 1
    assert 'The ResourceClaim "bad" is invalid:' in p.stderr
    assert "* spec.devices.requests[0].exactly.deviceClassName: Required value" in p.stderr
    assert ('* spec.devices.requests[0].exactly.allocationMode: Unsupported value: "Bogus": '
            'supported values: "All", "ExactCount"') in p.stderr
    assert srv.objects("resourceclaims") == []
    assert srv.request_log[-1].code == 422


def test_explain_reads_the_servers_openapi_v3_and_v2(k):
    assert "ResourcePool describes the pool" in k("explain", "resourceslices.spec.pool").stdout
    v2 = k("explain", "--output=plaintext-openapiv2", "deviceclasses.spec").stdout
    assert "Spec defines what can be allocated" in v2 and "selectors" in v2


def test_get_nodes_lists_the_simulated_node(tmp_path):
    from dra_bridge.sim.cluster import SimCluster
    from kubevirt_templates.render import render as render_templates

    with SimCluster(render=render_templates, version="1.37", feature_gates={}) as c:  # its sockets under a short /tmp path
        k = Kubectl(c.srv.kubeconfig(tmp_path / "kubeconfig"), tmp_path)
        (row,) = k.table("nodes", "-o", "wide")
        assert (row["NAME"], row["STATUS"], row["VERSION"], row["INTERNAL-IP"]) == (
            c.node, "Ready", c.srv.git_version, "127.0.0.1")
        rows = k.table("resourceslices", "-o", "wide")
        assert rows and {(r["NODE"], r["DRIVER"], r["POOL"]) for r in rows} == {(c.node, DRIVER, c.node)}
