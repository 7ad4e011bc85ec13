"""``python -m tests.controlplane.up`` as a newcomer runs it (issue #39.5): it prints the kubeconfig
and ``ready``; kubectl sees the simulated node registered (Ready, its allocatable, no taint left)
and its ResourceSlices, ``vgpuctl gpus`` its GPUs; Ctrl-C (SIGINT) stops the control plane, the
agent and the node side: no process it started is left.

Skipped where Go is absent (failed under ``CI=true``): tests/support/controlplane.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane import up
from tests.controlplane.up import ROOT, wait_line
from tests.support import controlplane as cpmod
from tests.support.controlplane import openssl_needed  # noqa: F401 (an autouse fixture)
from tests.support.deploy import Kubectl, needs_kubectl

pytestmark = [pytest.mark.go, needs_kubectl]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (by their parents, read from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("minor", cpmod.MINOR_PARAMS)
def test_up_brings_up_a_joined_node_and_ctrl_c_stops_it_all(minor, tmp_path):
    cpmod.binary(minor)  # skips without Go (or, for an older minor, not built), as the other real-control-plane tests
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "up.log"
    with open(log, "wb") as err:
        up = subprocess.Popen([sys.executable, "-m", "tests.controlplane.up", "--preset", "default", "--kubernetes",
                               minor], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        ready = wait_line(up, "ready", 300, "tests.controlplane.up", log)
        kubeconfig = Path(ready.split("KUBECONFIG=", 1)[1].split(";")[0])
        assert kubeconfig.exists(), ready
        children = descendants(up.pid)
        assert len(children) >= 3, children  # the control plane, vgpuctl serve, the node side
        k = Kubectl(kubeconfig, tmp_path)
        (node,) = json.loads(k("get", "nodes", "-o", "json").stdout)["items"]
        assert node["metadata"]["name"] == "sim-node-1"
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
        assert node["status"]["allocatable"]["pods"] == "110"
        # its kubelet is the control plane's own version (no newer than the API server: the skew policy)
        assert node["status"]["nodeInfo"]["kubeletVersion"].startswith(f"v{minor}."), node["status"]["nodeInfo"]
        assert not node["spec"].get("taints"), node["spec"]
        slices = json.loads(k("get", "resourceslices", "-o", "json").stdout)["items"]
        assert slices and {s["spec"]["nodeName"] for s in slices} == {"sim-node-1"}
        gpus = subprocess.run([sys.executable, "-m", "vgpuctl", "gpus", "--kubeconfig", str(kubeconfig)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
        assert gpus.returncode == 0 and "sim-node-1" in gpus.stdout, gpus.stdout + gpus.stderr
        # the agent runs as the DaemonSet runs it: it reports the layout's state on the Node, so doctor
        # has nothing to warn about there (it warned "config.state=unlabelled" before)
        doctor = subprocess.run([sys.executable, "-m", "vgpuctl", "doctor", "--kubeconfig", str(kubeconfig), "-o",
                                 "json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        findings = {f["check"]: (f["status"], f["detail"]) for f in json.loads(doctor.stdout)}
        assert not [c for c, (st, d) in findings.items() if "unlabelled" in d], findings
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, log.read_text()
        assert [p for p in children if alive(p)] == []
        assert not kubeconfig.exists()  # its files removed
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)


def test_ctrl_c_while_it_starts_stops_what_it_started(tmp_path):
    """SIGINT once the control plane is up, while the node is still starting: everything it
    started stops, and it exits 130."""
    cpmod.binary()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "up.log"
    with open(log, "wb") as err:
        up = subprocess.Popen([sys.executable, "-m", "tests.controlplane.up"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=err)
    try:
        wait_line(up, "control plane:", 300, "tests.controlplane.up", log)
        children = descendants(up.pid)
        assert children  # the control plane at least; the node's processes may be starting
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 130, log.read_text()
        assert [p for p in children | descendants(up.pid) if alive(p)] == []
        assert "interrupted while starting" in log.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)


def test_a_ctrl_c_taken_while_a_process_is_spawned_is_raised_once_it_is_held():
    """main()'s handler, during ``spawning()``, only marks the interrupt (``_spawn["pending"]``): a
    KeyboardInterrupt inside ``subprocess.Popen`` would leave its child running with nobody to stop it.
    It is raised as the block ends, after the caller holds the process, so the start's clean-up stops it."""
    held = []
    with pytest.raises(KeyboardInterrupt):
        with up.spawning():
            up._spawn["pending"] = True  # what the handler does for a Ctrl-C meanwhile
            held.append("the process")  # the assignment the block exists for still happens
    assert held == ["the process"] and up._spawn == {"depth": 0, "pending": False}
    with up.spawning():  # nothing pending: nothing raised
        pass
