"""``vgpuctl slices`` prints what ``vgpuctl serve`` publishes (issue #23, point 1): for the same node,
layout, server version and gates, on every server shape (1.34-1.37, default gates and flipped).

Both go through one decision (:func:`dra_bridge.pool.shape.choose_shape`) and one builder
(:func:`dra_bridge.pool.shape.node_pool`), and ``slices`` includes the agent's node setup: the
simulated node starts cold (VFs off), the agent enables them before it publishes, ``slices`` shows
that without changing the node. The agent runs against the local API server (what ``vgpuctl sim
apiserver`` serves) with the version's gates; one case runs both commands as processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.compat import parse_gates
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim import load_host
from mdev_manager.sim.node import sim_node
from tests.support.dra import set_boot_id
from tests.support.kubelet.fake_kubelet import short_root
from vgpuctl.main import main

REPO = Path(__file__).resolve().parents[2]
PRESET = "default"
NODE = load_host(PRESET).node
LAYOUT = {"version": "vgpuctl/v1", "layouts": {"default": [
    {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 4}},  # not offered through DRA
    {"index": 1, "mode": "dra", "passthrough": True},
    {"index": 2, "mode": "dra"},  # the A100: VFs to enable first
    {"index": 3, "mode": "dra"},  # the L40S: VFs to enable first
]}}

SHAPES = [
    ("1.34", ""),
    ("1.35", ""),
    ("1.35", "DRAPartitionableDevices=true"),
    ("1.36", ""),
    ("1.36", "DRAPartitionableDevices=false"),
    ("1.36", "DRADeviceBindingConditions=false"),
    ("1.37", ""),
    ("1.37", "DRADeviceCompatibilityGroups=true"),
]


def _strip(s: dict) -> tuple:
    return s["metadata"]["name"], s["metadata"].get("labels"), s["spec"]


def _slices_cli(capsys, sim_dir: Path, layout: Path, version: str, gates: str) -> list[dict]:
    code = main(["--simulate", PRESET, "--sim-dir", str(sim_dir), "slices", "-f", str(layout), "-o", "json",
                 "--server-version", version, "--feature-gates", gates])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "taken in memory" in err  # the cold node needed the agent's setup first
    return json.loads(out)["items"]


def _published(tmp_path: Path, node, layout: Path, version: str, gates: str) -> list[dict]:
    """The slices the agent publishes for ``node`` after one resync, against a local API server of ``version``."""
    root, cleanup = short_root(tmp_path)  # the plugin's sockets live under the kubelet root
    try:
        with LocalApiServer(version=version, feature_gates=parse_gates(gates)) as srv:
            srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            cfg = ServeConfig(node_name=NODE, layout_file=layout, kubelet_root=root / "kl", cdi_root=root / "cdi",
                              metrics_port=None)
            Daemon(cfg, node.env, node.io, srv.api_client()).resync()
            return srv.objects("resourceslices")
    finally:
        cleanup()


@pytest.mark.parametrize("version, gates", SHAPES)
def test_slices_equal_what_the_agent_publishes(version, gates, tmp_path, capsys):
    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump(LAYOUT))
    shown = _slices_cli(capsys, tmp_path / "cli-node", layout, version, gates)
    # the node slices looked at is untouched: still cold
    from mdev_manager.discovery import discover

    cold = sim_node(tmp_path / "cli-node", None)
    assert all(not g.sriov_num_vfs for g in discover(cold.env, cold.io).gpus)

    node = sim_node(tmp_path / "agent-node", PRESET)
    set_boot_id(node, "0c1e7c3e-0000-4000-8000-000000000001")
    published = _published(tmp_path, node, layout, version, gates)
    assert published, "the agent published nothing"
    assert sorted(map(_strip, shown), key=str) == sorted(map(_strip, published), key=str)


def test_the_commands_as_processes(tmp_path):
    """``vgpuctl sim apiserver``, ``vgpuctl --simulate serve`` and ``vgpuctl --simulate slices`` as an
    admin runs them (1.36 defaults)."""
    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump(LAYOUT))
    env = dict(os.environ, PYTHONPATH=str(REPO), VGPUCTL_SIM_DIR=str(tmp_path / "sims"))
    vgpuctl = [sys.executable, "-m", "vgpuctl"]
    kc = tmp_path / "kc"
    root, cleanup = short_root(tmp_path)
    api = subprocess.Popen([*vgpuctl, "sim", "apiserver", "--kubeconfig-out", str(kc), "--version", "1.36"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    agent = None
    try:
        _wait(lambda: kc.exists(), "the API server's kubeconfig")
        shown = subprocess.run([*vgpuctl, "--simulate", PRESET, "--sim-dir", str(tmp_path / "cli-node"), "slices",
                                "-f", str(layout), "-o", "json", "--server-version", "1.36"],
                               env=env, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        items = json.loads(shown.stdout)["items"]
        agent = subprocess.Popen([*vgpuctl, "--simulate", PRESET, "--sim-dir", str(tmp_path / "agent-node"), "serve",
                                  "--kubeconfig", str(kc), "-f", str(layout), "--kubelet-root", str(root / "kl"),
                                  "--cdi-root", str(root / "cdi"), "--metrics-port", "0", "--node-name", NODE],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        got: list[dict] = []

        def published() -> bool:
            got[:] = json.loads(subprocess.run(
                [str(Path(sys.executable).parent / "kubectl") if (Path(sys.executable).parent / "kubectl").exists()
                 else "kubectl", "--kubeconfig", str(kc), "get", "resourceslices", "-o", "json"],
                capture_output=True, text=True, timeout=60).stdout or '{"items": []}')["items"]
            return len(got) == len(items)

        _wait(published, "the agent's slices", timeout=120)
        assert sorted(map(_strip, items), key=str) == sorted(map(_strip, got), key=str)
    finally:
        for p in (agent, api):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
        cleanup()


def _wait(cond, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("version, gates", [("1.36", ""), ("1.37", "DRADeviceCompatibilityGroups=true")])
def test_a_cold_mig_node_previews_what_the_agent_then_publishes(version, gates, tmp_path, capsys):
    """#37.6 on the README's benchmark node: a cold a100-node (8 x 16 VFs to enable, then MIG mode) previewed
    in memory, then the agent run on that same node (same GPU UUIDs): the slices are the same."""
    from mdev_manager.discovery import discover

    layout = REPO / "examples" / "mig-layout.yaml"
    sim_dir = tmp_path / "node"
    code = main(["--simulate", "a100-node", "--sim-dir", str(sim_dir), "slices", "-f", str(layout), "--layout", "dra",
                 "-o", "json", "--server-version", version, "--feature-gates", gates])
    out, err = capsys.readouterr()
    assert code == 0 and "taken in memory" in err and "assumed until the kernel answers" in err, err
    shown = json.loads(out)["items"]
    node = sim_node(sim_dir, None)
    assert all(not g.sriov_num_vfs for g in discover(node.env, node.io).gpus)  # still cold
    published = _agent_publishes(tmp_path, node, layout, version, gates, load_host("a100-node").node, "dra")
    assert shown and sorted(map(_strip, shown), key=str) == sorted(map(_strip, published), key=str)


def _agent_publishes(tmp_path: Path, node, layout: Path, version: str, gates: str, name: str, config: str) -> list[dict]:
    root, cleanup = short_root(tmp_path)
    try:
        with LocalApiServer(version=version, feature_gates=parse_gates(gates)) as srv:
            srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
            cfg = ServeConfig(node_name=name, layout_file=layout, layout=config, kubelet_root=root / "kl",
                              cdi_root=root / "cdi", metrics_port=None)
            Daemon(cfg, node.env, node.io, srv.api_client()).resync()
            return srv.objects("resourceslices")
    finally:
        cleanup()


def test_a_vgpu_no_claim_holds_takes_its_room_in_both(tmp_path, capsys):
    """A vGPU made by hand on a ``dra`` GPU (no claim's; the agent leaves it): ``slices`` reads the kubelet
    plugin's checkpoint as the agent does, and both leave its room out of the GPU's counters (#36.2)."""
    import uuid

    from mdev_manager.discovery import discover

    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump(LAYOUT))
    vgpu = str(uuid.uuid4())
    for name in ("cli-node", "agent-node"):
        node = sim_node(tmp_path / name, PRESET)
        t4 = discover(node.env, node.io).gpus[1]
        q2 = next(t for t in t4.types if t.short_name == "T4-2Q")
        node.io.write(node.env.pci(t4.address) / "mdev_supported_types" / q2.id / "create", vgpu + "\n")
    code = main(["--simulate", PRESET, "--sim-dir", str(tmp_path / "cli-node"), "slices", "-f", str(layout), "-o",
                 "json", "--server-version", "1.37"])
    out, err = capsys.readouterr()
    assert code == 0, err
    shown = json.loads(out)["items"]
    published = _published(tmp_path, sim_node(tmp_path / "agent-node", None), layout, "1.37", "")
    assert sorted(map(_strip, shown), key=str) == sorted(map(_strip, published), key=str)
    (gpu1,) = [c for s in shown for c in s["spec"].get("sharedCounters") or [] if c["name"] == "gpu-1-counter-set"]
    assert gpu1["counters"] == {"memory": {"value": "14Gi"}, "vgpus": {"value": "15"}}
    names = [d["name"] for s in shown for d in s["spec"].get("devices") or [] if d["name"].startswith("gpu-1-")]
    assert names and all("-vgpu-2gb-" in n for n in names)  # its size only; not the whole GPU
