"""A whole node's cordon by a DeviceTaintRule, and the local server against the real one with flipped
gates (issue #39.6), on the real control plane (tests/controlplane/k8s-1.37).

- ``vgpuctl cordon --node`` on 1.37 (``DRADeviceTaintRules`` GA, on) writes a ``resource.k8s.io/v1``
  DeviceTaintRule for the node's pool; the real kube-scheduler honours it (a pod asking a vGPU stays
  Unschedulable), ``uncordon`` deletes it and the pod is scheduled.
- With gates flipped (device taints off, binding conditions off), the slices ``vgpuctl serve``
  publishes are stored alike by both servers, and ``kubectl get -o wide`` prints the same columns.
Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.controlplane import RealControlPlane
from tests.support.deploy import Kubectl, needs_kubectl
from tests.support.dra import make_node, pool_slices, short_tmp
from tests.system.test_real_controlplane import (
    SERVER_FIELDS,
    VGPUCTL,
    Serving,
    _vgpu_pod,
    differences,
    make_daemon,
    node_for,
    render,
    wait_for,
)

pytestmark = [pytest.mark.go, needs_kubectl]


def _vgpuctl(cp, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*VGPUCTL, *args, "--kubeconfig", str(cp.kubeconfig_path)],
                          capture_output=True, text=True, timeout=120)


def _unschedulable(cp, pod: str) -> bool:
    conds = (cp.get_object("pods", pod, "default").get("status") or {}).get("conditions") or []
    return any(c.get("reason") == "Unschedulable" for c in conds)


def test_a_node_cordon_is_a_device_taint_rule_the_real_scheduler_honours(tmp_path):
    with RealControlPlane() as cp, short_tmp("cpr") as base:
        k = Kubectl(cp.kubeconfig_path, tmp_path)
        node = make_node(base / "n", "default", version=(1, 37))
        cp.add(node_for(node.node))
        k("apply", "-f", "-", stdin=render("deviceclasses"))
        k("apply", "-f", "-", stdin=render("claim-template", "--set", "profile=A100-4C", "--set", "name=a100-r"))
        with Serving(make_daemon(node, cp, base)):
            out = _vgpuctl(cp, "cordon", "--node", node.node, "--reason", "firmware", "--wait", "30")
            assert out.returncode == 0, out.stdout + out.stderr
            rules = json.loads(k("get", "devicetaintrules.v1.resource.k8s.io", "-o", "json").stdout)["items"]
            (rule,) = rules
            assert rule["apiVersion"] == "resource.k8s.io/v1"
            assert rule["spec"]["deviceSelector"]["pool"] == node.node
            assert rule["spec"]["taint"]["effect"] == "NoSchedule"
            k("apply", "-f", "-", stdin=yaml.safe_dump(_vgpu_pod("ruled", "a100-r")))
            wait_for(lambda: _unschedulable(cp, "ruled"), "the real scheduler's verdict", 60)
            assert not cp.get_object("pods", "ruled", "default")["spec"].get("nodeName")
            out = _vgpuctl(cp, "uncordon", "--node", node.node, "--wait", "30")
            assert out.returncode == 0, out.stdout + out.stderr
            assert json.loads(k("get", "devicetaintrules.v1.resource.k8s.io", "-o", "json").stdout)["items"] == []
            wait_for(lambda: cp.get_object("pods", "ruled", "default")["spec"].get("nodeName") == node.node,
                     "scheduled after uncordon", 90)


FLIPPED = {"DRADeviceTaints": False, "DRADeviceTaintRules": False, "DRADeviceBindingConditions": False}


def _published(srv, base, node) -> list[dict]:
    with Serving(make_daemon(node, srv, base)) as daemon:
        daemon.resync()
        return sorted(pool_slices(srv, node=node.node), key=lambda s: s["metadata"]["name"])


def _columns(kc: Kubectl, *what: str) -> list[list[str]]:
    """``kubectl get WHAT -o wide`` split into columns, the AGE column dropped."""
    lines = kc("get", *what, "-o", "wide").stdout.splitlines()
    header = lines[0].split()
    age = header.index("AGE") if "AGE" in header else None
    return [[c for i, c in enumerate(line.split()) if i != age] for line in lines]


def test_with_flipped_gates_both_servers_store_the_slices_alike_and_print_the_same_columns(tmp_path):
    """Device taints and binding conditions off on both servers: the agent publishes without them (what
    the server keeps decides), the two servers keep the same objects and ``-o wide`` says the same."""
    with RealControlPlane(FLIPPED, extra=["--no-scheduler", "--no-controller-manager"]) as real, \
            LocalApiServer(version="1.37", feature_gates=FLIPPED) as mine, short_tmp("cpg") as base:
        got = []
        kcs = []
        for i, srv in enumerate((mine, real)):
            node = make_node(base / f"n{i}", "default", version=(1, 37))
            srv.add(node_for(node.node))
            got.append(_published(srv, base / f"s{i}", node))
            home = tmp_path / f"home{i}"
            home.mkdir()
            kubeconfig = mine.kubeconfig(tmp_path / "local.kubeconfig") if srv is mine else real.kubeconfig_path
            kcs.append(Kubectl(kubeconfig, home))
        local, upstream = got
        assert [s["metadata"]["name"] for s in local] == [s["metadata"]["name"] for s in upstream]
        assert local, "nothing published"
        diffs = []
        for a, b in zip(local, upstream, strict=True):
            for s in (a, b):
                for f in SERVER_FIELDS:
                    s["metadata"].pop(f, None)
                s.pop("apiVersion", None)  # a list's items carry neither (the real server's listing)
                s.pop("kind", None)
            diffs += differences(a, b, a["metadata"]["name"])
        assert diffs == [], "\n".join(diffs)
        # the gates really were off: nothing of theirs was published
        text = json.dumps(local)
        assert '"taints"' not in text and '"bindingConditions"' not in text
        for what in (["resourceslices"], ["deviceclasses"]):
            if what == ["deviceclasses"]:
                for kc in kcs:
                    kc("apply", "-f", "-", stdin=render("deviceclasses"))
            assert _columns(kcs[0], *what) == _columns(kcs[1], *what)
