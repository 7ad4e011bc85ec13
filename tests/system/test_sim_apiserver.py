"""``vgpuctl sim apiserver`` as a process, driven by the real ``kubectl``.

Skipped only where kubectl is not installed (the CI machines have kubectl 1.32).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed on this machine")
COMMAND = [sys.executable, "-m", "vgpuctl.main", "sim", "apiserver"]


def start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, str]:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen([*COMMAND, "--kubeconfig-out", str(kubeconfig), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    line = proc.stdout.readline()  # printed once the server answers and the kubeconfig is written
    if not line:
        proc.kill()
        raise AssertionError(f"vgpuctl sim apiserver exited: {proc.communicate()[1]}")
    return proc, kubeconfig, line


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()


def kubectl(tmp_path: Path, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""}  # no ~/.kube of the machine
    out = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                          *args], input=stdin, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def counters_slice() -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-a-counters"},
            "spec": {"driver": "vgpu.kubevirt.io", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2},
                     "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "16Gi"}}}]}}


def devices_slice() -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "node-a-devices"},
            "spec": {"driver": "vgpu.kubevirt.io", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2},
                     "devices": [{"name": "gpu-0-vgpu-0", "consumesCounters": [
                         {"counterSet": "gpu-0", "counters": {"memory": {"value": "8Gi"}}}]}]}}


@needs_kubectl
def test_kubectl_against_sim_apiserver_with_partitionable_devices_off(tmp_path):
    proc, kubeconfig, line = start(tmp_path, "--version", "1.36", "--feature-gates", "DRAPartitionableDevices=false")
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        url = config["clusters"][0]["cluster"]["server"]
        assert url.startswith("http://127.0.0.1:") and url in line and str(kubeconfig) in line

        listed = json.loads(kubectl(tmp_path, kubeconfig, "get", "resourceslices", "-o", "json"))
        assert listed["kind"] == "List" and listed["items"] == []

        manifests = yaml.safe_dump_all([counters_slice(), devices_slice()])
        created = kubectl(tmp_path, kubeconfig, "create", "-f", "-", stdin=manifests)
        assert "resourceslice.resource.k8s.io/node-a-counters created" in created

        items = {s["metadata"]["name"]: s for s in json.loads(
            kubectl(tmp_path, kubeconfig, "get", "resourceslices", "-o", "json"))["items"]}
        assert set(items) == {"node-a-counters", "node-a-devices"}
        assert "sharedCounters" not in items["node-a-counters"]["spec"]  # dropped, as kube-apiserver 1.36 does
        assert items["node-a-devices"]["spec"]["devices"] == [{"name": "gpu-0-vgpu-0"}]
        assert items["node-a-devices"]["spec"]["pool"]["resourceSliceCount"] == 2
    finally:
        code = stop(proc)
    assert code == 0


@needs_kubectl
def test_version_defaults_keep_counters_on_1_36(tmp_path):
    proc, kubeconfig, _ = start(tmp_path, "--version", "1.36")
    try:
        kubectl(tmp_path, kubeconfig, "create", "-f", "-", stdin=yaml.safe_dump(counters_slice()))
        got = json.loads(kubectl(tmp_path, kubeconfig, "get", "resourceslice", "node-a-counters", "-o", "json"))
        assert got["spec"]["sharedCounters"][0]["name"] == "gpu-0"
        assert json.loads(kubectl(tmp_path, kubeconfig, "version", "-o", "json"))["serverVersion"]["minor"] == "36"
    finally:
        assert stop(proc, signal.SIGINT) == 0  # Ctrl-C ends it as cleanly as SIGTERM


@pytest.mark.parametrize("gates, message", [
    ("NoSuchGate=true", "unknown gate 'NoSuchGate'"),
    ("DRADeviceCompatibilityGroups=true", "no such gate"),  # a 1.37 gate on a 1.36 server
    ("DRAAdminAccess=false", "locked to true"),
    # component-base's featuregate since 1.35, as the real control plane says it
    ("DRADeviceTaintRules=true,DRADeviceTaints=false",
     "DRADeviceTaintRules is enabled, but depends on features that are disabled: [DRADeviceTaints]"),
])
def test_bad_feature_gates_are_refused(tmp_path, gates, message):
    out = subprocess.run([*COMMAND, "--kubeconfig-out", str(tmp_path / "kc"), "--version", "1.36",
                          "--feature-gates", gates], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "kc").exists()
