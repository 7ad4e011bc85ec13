"""The agent picks its layout from its Node's label and reports the state label (vgpu-device-manager style)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import ConfigError
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.support.tmp import short_root

LAYOUTS = {"version": "vgpuctl/v1", "layouts": {
    "default": [{"all": True, "mode": "dra"}],
    "t4-2q": [{"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 8}}, {"index": 1, "mode": "dra"}],
    "broken": [{"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 99}}],
}}
LABEL, STATE = "vgpu.kubevirt.io/config", "vgpu.kubevirt.io/config.state"


@pytest.fixture
def setup():
    with tempfile.TemporaryDirectory(dir=short_root(), prefix="vgl") as d, LocalApiServer(version="1.36") as srv:
        root = Path(d)
        node = sim_node(root / "host", "default")
        (root / "layouts.yaml").write_text(yaml.safe_dump(LAYOUTS))
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "sim-node-1", "labels": {}}})
        cfg = ServeConfig(node_name="sim-node-1", layout_file=root / "layouts.yaml", metrics_port=None,
                          kubelet_root=root / "k", cdi_root=root / "cdi", layout_label=LABEL, state_label=STATE)
        daemon = Daemon(cfg, node.env, node.io, srv.api_client())
        yield srv, daemon, node.env, node.io


def _label(srv, layout: str) -> None:
    """An admin labels the node (kubectl label node sim-node-1 vgpu.kubevirt.io/config=...)."""
    from kubernetes import client

    client.CoreV1Api(srv.api_client()).patch_node("sim-node-1", {"metadata": {"labels": {LABEL: layout}}})


def _labels(srv):
    return srv.get_object("nodes", "sim-node-1")["metadata"].get("labels", {})


def test_label_selects_layout_and_state_reports_success(setup):
    srv, daemon, env, io = setup
    daemon.resync()
    assert _labels(srv)[STATE] == "success"
    assert discover(env, io).all_vgpus() == []  # default layout: every GPU in dra mode
    _label(srv, "t4-2q")
    daemon.resync()
    inv = discover(env, io)
    assert [v.type_name for v in inv.all_vgpus()] == ["GRID T4-2Q"] * 8
    assert _labels(srv)[STATE] == "success"
    srv.reset_counters()
    daemon.resync()  # nothing changed: no node patch
    assert not [w for w in srv.writes if w[1] == "nodes"]


def test_rejected_layout_reports_failed_and_changes_nothing(setup):
    srv, daemon, env, io = setup
    _label(srv, "broken")
    with pytest.raises(ConfigError):
        daemon.resync()
    assert _labels(srv)[STATE] == "failed"
    assert discover(env, io).all_vgpus() == []
    srv.reset_counters()
    with pytest.raises(ConfigError):
        daemon.resync()  # still broken: no flapping pending/failed writes
    assert not [w for w in srv.writes if w[1] == "nodes"]
    _label(srv, "t4-2q")
    daemon.resync()
    assert _labels(srv)[STATE] == "success"
    assert len(discover(env, io).all_vgpus()) == 8


def test_start_after_reboot_restores_saved_vgpus_before_anything_else(setup):
    srv, daemon, env, io = setup
    from mdev_manager.config import parse_config
    from mdev_manager.reconcile import reconcile

    layout = parse_config({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 2}},
        {"index": 2, "mode": "vgpu", "vgpus": {"A100-4C": 3}}]}})
    reconcile(env, io, layout)
    before = sorted(v.id for v in discover(env, io).all_vgpus())
    assert len(before) == 5
    io.host.reboot()
    assert discover(env, io).all_vgpus() == []
    daemon.cfg.layout_file = None  # no layout: only what was saved comes back
    daemon.cfg.kubelet_root.mkdir(parents=True, exist_ok=True)
    daemon.start()
    try:
        assert sorted(v.id for v in discover(env, io).all_vgpus()) == before
    finally:
        daemon.stop()
        daemon._shutdown()


def test_device_names_stay_with_their_gpu_when_another_gpu_leaves(setup):
    from tests.support.dra import add_claim, pool_slices, published_devices

    srv, daemon, env, io = setup
    daemon.cfg.layout_file = None  # every GPU offered through DRA
    daemon.resync()
    before = published_devices(pool_slices(srv, node="sim-node-1"))
    assert {"gpu-1-passthrough", "gpu-2-passthrough", "gpu-3-passthrough"} <= before
    io.host.remove_gpu("0000:13:00.0")  # GPU 1 leaves the bus
    daemon.resync()
    after = published_devices(pool_slices(srv, node="sim-node-1"))
    assert not [d for d in after if d.startswith("gpu-1-")]
    assert after == {d for d in before if not d.startswith("gpu-1-")}  # nobody else was renamed
    # a claim allocated before the GPU left fails instead of landing on another board
    ref = add_claim(srv, "late", [("gpu", "gpu-1-passthrough")], node="sim-node-1")
    res = daemon.driver.prepare([ref])[ref.uid]
    assert res.error and "no longer exists" in res.error
    assert discover(env, io).gpu("0000:16:00.0").driver == "nvidia"


def test_the_node_is_labelled_with_the_host_driver_version_as_nvml_reads_it(setup):
    """KubeVirt's vGPU live migration takes as targets nodes whose label says the same vGPU manager
    (issue #33): read from the driver (NVML), never configured; set again after a driver upgrade."""
    srv, daemon, env, io = setup
    daemon.resync()
    want = io.nvml().driver_version()
    assert want == "580.95.02" and _labels(srv)["vgpu-host-driver-version.kubevirt.io/nvidia"] == want
    srv.reset_counters()
    daemon.resync()  # the same driver: the label is not written again
    assert not [w for w in srv.writes if w[1] == "nodes"]
    io.host.upgrade_driver("580.105.06")
    daemon.resync()
    assert _labels(srv)["vgpu-host-driver-version.kubevirt.io/nvidia"] == "580.105.06"
