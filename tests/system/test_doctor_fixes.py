"""Every command ``vgpuctl doctor`` prints as a fix works against deploy/ as shipped (issue #23,
point 3): it is run, as an admin would paste it, with real kubectl against the local API server."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dra_bridge.api.names import AGENT_SELECTOR, ANNOTATION_CONFIG_REASON, DEPLOY_NAMESPACE, LABEL_CONFIG_STATE
from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.deploy import agent, build, kubectl, needs_kubectl, one
from vgpuctl.main import main

REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"`([^`]+)`")


def _findings(kc: Path, capsys) -> dict[str, dict]:
    main(["doctor", "--kubeconfig", str(kc), "-o", "json"])
    return {f["check"]: f for f in json.loads(capsys.readouterr().out)}


def _run(fix: str, kc: Path) -> list[subprocess.CompletedProcess]:
    """Each backquoted command of ``fix``, through bash as pasted, with kubectl on PATH and the
    cluster as the admin's default ($KUBECONFIG)."""
    env = dict(os.environ, KUBECONFIG=str(kc), PATH=f"{Path(kubectl).parent}:{os.environ['PATH']}")
    cmds = [c for c in COMMAND.findall(fix) if c.startswith("kubectl")]
    assert cmds, f"no command in the fix: {fix}"
    return [subprocess.run(["bash", "-c", c], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            for c in cmds]


@needs_kubectl
def test_every_fix_is_a_command_that_works(tmp_path, capsys):
    with LocalApiServer(version="1.36") as srv:
        kc = srv.kubeconfig(tmp_path / "kc")
        found = _findings(kc, capsys)
        # a bare cluster: the DeviceClasses are missing and no agent runs
        (p,) = _run(found["DeviceClasses"]["fix"], kc)  # kubectl apply -k deploy/overlays/dra
        assert p.returncode == 0, p.stderr
        (p,) = _run(found["GPU nodes"]["fix"], kc)  # the agent's pods, as deploy/ labels them
        assert p.returncode == 0, p.stderr
        assert _findings(kc, capsys)["DeviceClasses"]["status"] == "PASS"

        # a node whose layout failed, one pending, and slices whose node is gone
        ds = one(build("dra"), "DaemonSet")
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert AGENT_SELECTOR == ",".join(f"{k}={v}" for k, v in labels.items())  # the doctor's selector
        assert ds["metadata"]["namespace"] == DEPLOY_NAMESPACE and agent(build("dra"))
        for name, state in (("gpu-a", "failed"), ("gpu-b", "pending")):
            srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": {LABEL_CONFIG_STATE: state},
                "annotations": {ANNOTATION_CONFIG_REASON: f"layout default not reached on {name}"}}})
            srv.add({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"vgpuctl-agent-{name}", "namespace": DEPLOY_NAMESPACE, "labels": dict(labels)},
                "spec": {"nodeName": name, "containers": [{"name": "agent", "image": "x"}]}})
            srv.set_pod_log(DEPLOY_NAMESPACE, f"vgpuctl-agent-{name}", f"the agent's log on {name}\n")
        srv.add({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "old-slice"},
                 "spec": {"driver": "vgpu.kubevirt.io", "nodeName": "gpu-old",
                          "pool": {"name": "gpu-old", "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": "gpu-0-passthrough"}]}})
        found = _findings(kc, capsys)
        (p,) = _run(found["node gpu-a"]["fix"], kc)
        assert p.returncode == 0 and p.stdout == "the agent's log on gpu-a\n", p.stderr
        (p,) = _run(found["node gpu-b"]["fix"], kc)
        assert p.returncode == 0 and p.stdout == "layout default not reached on gpu-b", p.stderr
        (p,) = _run(found["node gpu-old"]["fix"], kc)
        assert p.returncode == 0, p.stderr
        assert srv.objects("resourceslices") == []


@pytest.mark.parametrize("version", ["1.34", "1.36", "1.37"])
def test_no_fix_names_a_namespace_or_path_deploy_lacks(version, tmp_path, capsys):
    """Whatever the server, the fixes name only deploy/'s namespace, overlays and labels."""
    with LocalApiServer(version=version) as srv:
        kc = srv.kubeconfig(tmp_path / "kc")
        fixes = " ".join(f["fix"] or "" for f in _findings(kc, capsys).values())
    for ns in re.findall(r"-n (\S+)", fixes):
        assert ns == DEPLOY_NAMESPACE
    for path in re.findall(r"deploy/[\w/.-]+", fixes):
        assert (REPO / path).exists(), path
