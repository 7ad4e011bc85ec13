"""``vgpuctl slices`` on simulated nodes, through ``vgpuctl.main``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from dra_bridge.api.compat import parse_gates
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim import load_host
from tests.support.kubelet.fake_kubelet import short_root
from tests.support.simnodes import open_sim
from vgpuctl.main import main

NODE = load_host("default").node


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    d = tmp_path / "sims"
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(d))
    return d


def slices(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(["--simulate", "slices", *argv])
    out, err = capsys.readouterr()
    doc = (json.loads(out) if "json" in argv else yaml.safe_load(out)) if code == 0 else None
    return code, doc, err


def walk(obj, key: str):
    """Every value of ``key`` anywhere in ``obj``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v, key)


def accepted(items: list[dict], version: str, gates: str = "") -> None:
    """Each slice is valid for that API server and loses nothing when written to it."""
    srv = LocalApiServer(version=version, feature_gates=parse_gates(gates))
    for item in items:
        stored = srv.add(item)
        assert stored["spec"] == item["spec"], item["metadata"]["name"]


def test_default_is_a_yaml_v1_list_for_1_37(simdir, capsys):
    code, doc, err = slices(capsys)
    assert code == 0 and err == ""
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    items = doc["items"]
    assert items and {i["kind"] for i in items} == {"ResourceSlice"}
    assert {i["apiVersion"] for i in items} == {"resource.k8s.io/v1"}
    assert {i["spec"]["nodeName"] for i in items} == {NODE}
    assert {i["spec"]["pool"]["resourceSliceCount"] for i in items} == {len(items)}
    # 1.37 split layout: counters-only slices, then devices-only slices
    assert any("sharedCounters" in i["spec"] and "devices" not in i["spec"] for i in items)
    # DRADeviceCompatibilityGroups is alpha (off) in 1.37: no groups published
    assert list(walk(items, "compatibilityGroups")) == []
    accepted(items, "1.37")


def test_json_matches_yaml(simdir, capsys):
    _, as_yaml, _ = slices(capsys)
    code, as_json, _ = slices(capsys, "-o", "json")
    assert code == 0 and as_json == as_yaml


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"])
def test_each_server_version_validates(simdir, capsys, version):
    gates = "DRAPartitionableDevices=true"  # off by default before 1.36: see the next test
    code, doc, err = slices(capsys, "-o", "json", "--server-version", version, "--feature-gates", gates)
    assert code == 0 and err == ""
    combined = any("sharedCounters" in i["spec"] and "devices" in i["spec"] for i in doc["items"])
    assert combined == (version == "1.34")
    accepted(doc["items"], version, gates)


def test_compatibility_groups_when_the_gate_is_on(simdir, capsys):
    code, doc, _ = slices(capsys, "-o", "json", "--server-version", "1.37",
                          "--feature-gates", "DRADeviceCompatibilityGroups=true")
    assert code == 0 and list(walk(doc["items"], "compatibilityGroups"))
    accepted(doc["items"], "1.37", "DRADeviceCompatibilityGroups=true")
    # the same node for a server with the gate off: what that server would store, nothing dropped
    _, off, err = slices(capsys, "-o", "json", "--server-version", "1.37")
    assert err == "" and list(walk(off["items"], "compatibilityGroups")) == []


@pytest.mark.parametrize("version, gates", [("1.36", "DRAPartitionableDevices=false"), ("1.35", "")])
def test_partitionable_devices_off_removes_counters_and_says_so(simdir, capsys, version, gates):
    code, doc, err = slices(capsys, "-o", "json", "--server-version", version, "--feature-gates", gates)
    assert code == 0
    assert list(walk(doc["items"], "sharedCounters")) == []
    assert list(walk(doc["items"], "consumesCounters")) == []
    assert sum(len(i["spec"].get("devices", [])) for i in doc["items"]) > 0
    assert "DRAPartitionableDevices=false" in err and "consumesCounters" in err and "sharedCounters" in err
    assert "without counters" in err
    accepted(doc["items"], version, gates)


def test_layout_file_gives_the_pool_policy(simdir, capsys, tmp_path):
    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {
        "default": [{"index": 0, "mode": "dra", "vgpus": {"T4-2Q": 8}}],
        "none": [{"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}}]}}))
    code, doc, _ = slices(capsys, "-o", "json", "-f", str(layout))
    assert code == 0
    devices = [d for i in doc["items"] for d in i["spec"].get("devices", [])]
    assert devices and all(d["name"].startswith("gpu-0-vgpu-2gb-") for d in devices)  # the 2 GB slots
    assert {d["attributes"]["profile"]["string"] for d in devices} == {"T4-2Q"}
    code, doc, _ = slices(capsys, "-o", "json", "-f", str(layout), "--layout", "none")
    assert code == 0 and doc == {"apiVersion": "v1", "kind": "List", "items": []}


def test_same_slices_as_the_node_agent_publishes(simdir, capsys, tmp_path):
    from dra_bridge.agent.daemon import Daemon, ServeConfig

    code, doc, _ = slices(capsys, "-o", "json", "--server-version", "1.36")
    assert code == 0
    node = open_sim(simdir / "default")
    root, cleanup = short_root(tmp_path)  # the plugin's sockets live under the kubelet root
    try:
        with LocalApiServer(version="1.36", feature_gates={}) as srv:
            cfg = ServeConfig(node_name=NODE, kubelet_root=root / "kl", cdi_root=root / "cdi",
                              metrics_port=None, server_version=(1, 36))
            Daemon(cfg, node.env, node.io, srv.api_client()).resync()
            published = srv.objects("resourceslices")
    finally:
        cleanup()

    def strip(s: dict) -> tuple:
        return s["metadata"]["name"], s["metadata"]["labels"], s["spec"]

    assert [strip(s) for s in doc["items"]] == [strip(s) for s in published]


def test_writes_nothing(simdir, capsys, tmp_path):
    main(["--simulate", "discover"])  # the simulated host exists before
    capsys.readouterr()

    def snapshot(root: Path) -> dict[str, tuple[int, float]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in root.rglob("*") if p.is_file()}

    before = snapshot(simdir)
    code, _, _ = slices(capsys, "--kubelet-root", str(tmp_path / "kl"))
    assert code == 0
    assert snapshot(simdir) == before
    assert not (tmp_path / "kl").exists()  # the GPU numbering is read, never written


def test_bad_feature_gates_exit_2(simdir, capsys):
    code, _, err = slices(capsys, "--server-version", "1.36", "--feature-gates", "DRADeviceCompatibilityGroups=true")
    assert code == 2 and "DRADeviceCompatibilityGroups" in err and "1.37" in err
    code, _, err = slices(capsys, "--feature-gates", "Nope=1")
    assert code == 2 and "'Nope=1'" in err and "DRAPartitionableDevices" in err


def test_node_name_required_off_simulation(capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    code = main(["--sys-root", os.devnull, "slices"])
    assert code == 2 and "node name" in capsys.readouterr().err


@pytest.mark.parametrize("version,gates,counters,groups", [
    ("1.35", {}, False, False),  # DRAPartitionableDevices alpha, off
    ("1.36", {}, True, False),
    ("1.37", {"DRADeviceCompatibilityGroups": True}, True, True),
])
def test_kubeconfig_detects_what_the_server_keeps(simdir, capsys, tmp_path, version, gates, counters, groups):
    with LocalApiServer(version=version, feature_gates=gates) as srv:
        kc = srv.kubeconfig(tmp_path / "kc")
        code, doc, err = slices(capsys, "--kubeconfig", str(kc), "-o", "json")
        assert srv.writes == []  # the probe is a dry run
    assert code == 0, err
    assert f"detected: Kubernetes {version}" in err
    assert ("counters kept" if counters else "counters DROPPED") in err
    assert bool(list(walk(doc, "sharedCounters"))) == counters
    assert bool(list(walk(doc, "compatibilityGroups"))) == groups
    accepted(doc["items"], version, ",".join(f"{k}={str(v).lower()}" for k, v in gates.items()))


def test_a_mig_node_publishes_memory_slice_counters_consumed_by_its_placements(simdir, capsys):
    """#13's done-when, through the CLI: a layout puts the A100s and the H100 of the mig-node in MIG
    mode (vgpuctl apply), and `vgpuctl slices` shows their counter sets in NVIDIA's vocabulary, each
    placement device consuming its memory slices."""
    layout = Path(__file__).resolve().parents[2] / "examples" / "mig-layout.yaml"
    assert main(["--simulate", "mig-node", "apply", "-f", str(layout), "--config-name", "dra"]) == 0
    capsys.readouterr()
    assert main(["--simulate", "mig-node", "slices", "-o", "json", "-f", str(layout), "--layout", "dra",
                 "--server-version", "1.36"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sets = {c["name"]: c["counters"] for i in doc["items"] for c in i["spec"].get("sharedCounters", [])}
    assert {f"memory-slice-{k}" for k in range(8)} <= set(sets["gpu-2-counter-set"])  # the H100
    assert sets["gpu-2-counter-set"]["multiprocessors"] == {"value": "132"}
    devices = {d["name"]: d for i in doc["items"] for d in i["spec"].get("devices", [])}
    dev = devices["gpu-2-mig-4g40gb-5-0"]
    (used,) = dev["consumesCounters"]
    assert used["counterSet"] == "gpu-2-counter-set"
    assert {k for k in used["counters"] if k.startswith("memory-slice-")} == {f"memory-slice-{k}" for k in range(4)}
    assert dev["attributes"]["profile"] == {"string": "4g.40gb"}
    assert len([n for n in devices if n.startswith("gpu-2-mig-")]) == 25  # NVIDIA's placements of an H100


def test_a_preview_without_kernel_steps_runs_over_the_overlay(simdir, capsys, tmp_path):
    """A node that differs from the layout only in what the agent records (a lost definition): the
    agent's rounds run over a copy-on-write view of the host, not a copy of it (issue #37, point 6);
    the host stays byte-identical and the slices are those published once the agent applied it."""
    from tests.mdev_manager.test_overlay import snapshot

    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 4}}, {"index": 1, "mode": "dra", "passthrough": True}]}}))
    assert main(["--simulate", "default", "apply", "-f", str(layout)]) == 0
    defs = simdir / "default/etc/mdevctl.d/0000:10:00.0"
    lost = sorted(p for p in defs.iterdir() if p.is_file())[0]
    lost.unlink()
    capsys.readouterr()
    before = snapshot(simdir / "default")
    code, shown, err = slices(capsys, "-f", str(layout), "-o", "json")
    assert code == 0 and "taken in memory" in err, err
    assert snapshot(simdir / "default") == before and not lost.exists()
    assert main(["--simulate", "default", "apply", "-f", str(layout)]) == 0 and lost.exists()
    capsys.readouterr()
    assert slices(capsys, "-f", str(layout), "-o", "json")[1] == shown


def test_a_real_host_previews_the_agents_setup_too(simdir, capsys, tmp_path, monkeypatch):
    """Off --simulate (a plain sysfs tree, the real host's transport) a node that does not match yet is
    previewed in memory as the simulated one is (#37.6; before, exit 3: "apply it first"); nothing
    is written, not even the kubelet's GPU numbering."""
    from tests.mdev_manager.test_overlay import snapshot

    main(["--simulate", "default", "discover"])
    capsys.readouterr()
    host = simdir / "default"
    before = snapshot(host)
    monkeypatch.setenv("NODE_NAME", NODE)
    layout = Path(__file__).resolve().parents[2] / "examples" / "layout.yaml"
    code = main(["--sys-root", str(host / "sys"), "--dev-root", str(host / "dev"), "--mdevctl-root",
                 str(host / "etc/mdevctl.d"), "--state-root", str(host / "var/lib/vgpuctl"), "slices", "-f",
                 str(layout), "--layout", "dra", "-o", "json", "--kubelet-root", str(tmp_path / "kl")])
    out, err = capsys.readouterr()
    assert code == 0 and "taken in memory" in err and "IOMMU groups unknown" in err, err
    devices = [d for i in json.loads(out)["items"] for d in i["spec"].get("devices", [])]
    assert any(d["attributes"]["profile"]["string"].startswith("L40S-") for d in devices)  # the L40S's VFs, foreseen
    assert snapshot(host) == before and not (tmp_path / "kl").exists()
