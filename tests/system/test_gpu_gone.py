"""A GPU that leaves the bus (issue #23, point 8): hot-unplug, or fallen off it.

Its devices are withdrawn at the next resync; the layout entries naming it are reported waiting
(state label ``pending``, the reason annotation, an Event) while every other GPU keeps converging;
no traceback; an ``index:`` keeps naming the GPU the node numbered so (:mod:`mdev_manager.numbering`),
whichever command numbered it first; prepared claims on the gone GPU unprepare cleanly; the GPU coming back (a rescan)
takes its entry again. The simulated host does it with ``vgpuctl sim unplug|replug``.
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import ANNOTATION_CONFIG_REASON, LABEL_CONFIG_STATE
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.support.dra import add_claim, pool_slices, published_devices, set_boot_id
from tests.support.kubelet.fake_kubelet import short_root
from vgpuctl.main import main

T4A, T4B, A100, L40S = "0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"


def _layout(*entries) -> dict:
    return {"version": "vgpuctl/v1", "layouts": {"default": list(entries)}}


def _agent(tmp_path, request, preset: str):
    """A local API server, a simulated node of ``preset`` and ``make(layout doc) -> Daemon``."""
    short, cleanup = short_root(tmp_path)
    request.addfinalizer(cleanup)
    srv = LocalApiServer(version="1.36", feature_gates={}).start()
    request.addfinalizer(srv.stop)
    node = sim_node(tmp_path / "host", preset)
    set_boot_id(node, str(uuid.uuid4()))
    srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
    layout_file = tmp_path / "layouts.yaml"

    def make(doc: dict) -> Daemon:
        layout_file.write_text(yaml.safe_dump(doc))
        cfg = ServeConfig(node_name=node.node, layout_file=layout_file, metrics_port=None, kubelet_root=short / "k",
                          cdi_root=tmp_path / "cdi", state_label=LABEL_CONFIG_STATE)
        d = Daemon(cfg, node.env, node.io, srv.api_client())
        d._wrap_prepare()
        return d

    return srv, node, make, layout_file


@pytest.fixture
def agent(tmp_path, request):
    return _agent(tmp_path, request, "default")


def _node_meta(srv, node) -> dict:
    return srv.get_object("nodes", node.node)["metadata"]


def _events(srv, node) -> list[str]:
    return [e.get("message", "") for e in srv.objects("events") if e["involvedObject"]["name"] == node.node]


def test_a_gpu_named_by_address_leaves_and_comes_back(agent, caplog):
    srv, node, make, _ = agent
    daemon = make(_layout({"pciAddress": T4A, "mode": "vgpu", "vgpus": {"T4-2Q": 4}},
                          {"pciAddress": T4B, "mode": "dra"}, {"pciAddress": L40S, "mode": "dra"}))
    daemon.resync()
    assert _node_meta(srv, node)["labels"][LABEL_CONFIG_STATE] == "success"
    before = published_devices(pool_slices(srv, node=node.node))
    assert any(d.startswith("gpu-1-") for d in before)
    # a claim prepared on the GPU that will leave
    device = next(d.name for d in daemon._pool.devices if d.gpu == T4B and d.kind == "vgpu")
    ref = add_claim(srv, "vm-gone", [("gpu", device)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None

    node.host.unplug(T4B)
    with caplog.at_level(logging.DEBUG, logger="dra_bridge"):
        daemon.resync()  # no ConfigError: the other GPUs keep converging
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text.split("DEBUG")[0]
    after = published_devices(pool_slices(srv, node=node.node))
    assert not [d for d in after if d.startswith("gpu-1-")]  # withdrawn
    assert after == {d for d in before if not d.startswith("gpu-1-")}  # nobody else renamed or lost
    meta = _node_meta(srv, node)
    assert meta["labels"][LABEL_CONFIG_STATE] == "pending"
    assert T4B in meta["annotations"][ANNOTATION_CONFIG_REASON] and "left the bus" in meta["annotations"][
        ANNOTATION_CONFIG_REASON]
    assert any("left the bus" in m for m in _events(srv, node))
    assert len(discover(node.env, node.io).gpu(T4A).vgpus) == 4  # the vgpu GPU still matches

    # the kubelet unprepares the claim whose GPU is gone: clean, nothing left behind
    assert daemon.driver.unprepare([ref])[ref.uid] is None
    assert ref.uid not in daemon.driver.cp.claims

    node.host.replug(T4B)  # a rescan: the GPU is back, cold
    daemon.resync()
    back = published_devices(pool_slices(srv, node=node.node))
    assert {d for d in back if d.startswith("gpu-1-")}  # republished under its old number
    assert _node_meta(srv, node)["labels"][LABEL_CONFIG_STATE] == "success"


def test_an_index_keeps_its_gpu_when_another_leaves_the_bus(agent):
    srv, node, make, layout_file = agent
    daemon = make(_layout({"index": 0, "mode": "vgpu", "vgpus": {"T4-2Q": 2}}, {"index": 1, "mode": "dra"},
                          {"index": 3, "mode": "dra"}))
    daemon.resync()
    node.host.unplug(T4B)  # GPU 1 leaves: in PCI order, index 3 would name nothing and index 2 the L40S
    daemon.resync()  # no error: index 3 still names the L40S, index 1 waits for its GPU
    devices = published_devices(pool_slices(srv, node=node.node))
    assert any(d.startswith("gpu-3-") for d in devices) and not any(d.startswith("gpu-1-") for d in devices)
    assert _node_meta(srv, node)["labels"][LABEL_CONFIG_STATE] == "pending"
    inv = discover(node.env, node.io)
    assert {g.address: g.index for g in inv.gpus} == {T4A: 0, A100: 2, L40S: 3} and inv.gone == [T4B]


def test_the_cli_says_a_gpu_left_the_bus(agent, tmp_path, monkeypatch, capsys):
    srv, node, make, layout_file = agent
    daemon = make(_layout({"pciAddress": T4A, "mode": "vgpu", "vgpus": {"T4-2Q": 2}}, {"pciAddress": T4B, "mode": "dra"}))
    daemon.resync()  # the agent numbers the node's GPUs: the CLI reads that numbering
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))
    argv = ["--simulate", "default", "--sim-dir", str(node.root)]
    apply = ["apply", "-f", str(layout_file), "--kubelet-root", str(daemon.cfg.kubelet_root)]
    assert main([*argv, "sim", "unplug", T4B]) == 0
    capsys.readouterr()
    code = main([*argv, *apply, "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3  # converging: waiting for the GPU
    assert [b["device"] for b in out["blocked"] if b["gone"]] == [T4B]
    code = main([*argv, *apply])
    text = capsys.readouterr().out
    assert code == 3 and "left the bus" in text
    # the verdict counts the GPU as off the bus, not as a device in use to be released (issue #36)
    assert text.splitlines()[-1].endswith("converging: 1 GPU off the bus keeps the node from the layout; apply "
                                          "again once the GPU is back"), text
    assert main([*argv, "sim", "replug", T4B]) == 0
    capsys.readouterr()
    assert main([*argv, *apply]) == 0


def test_sim_unplug_and_replug(tmp_path):
    node = sim_node(tmp_path / "host", "default")
    assert len(discover(node.env, node.io).gpus) == 4
    node.host.unplug(A100)
    inv = discover(node.env, node.io, known=[T4A, T4B, A100, L40S])
    assert [g.address for g in inv.gpus] == [T4A, T4B, L40S] and inv.gone == [A100]
    node.host.replug(A100)
    gpu = discover(node.env, node.io).gpu(A100)
    assert gpu is not None and gpu.driver == "nvidia" and not gpu.vgpus


@pytest.fixture
def mixed_agent(tmp_path, request):
    srv, node, make, _ = _agent(tmp_path, request, "mixed-node")
    return srv, node, make(_layout(*({"index": i, "mode": "dra"} for i in range(5))))


@pytest.mark.parametrize("gone", ["0000:10:00.0", "0000:13:00.0", "0000:1c:00.0"], ids=["first", "middle", "last"])
def test_a_gpu_leaving_from_anywhere_in_the_numbering_is_withdrawn_and_set_up_again(mixed_agent, gone):
    """Issue #29.4: an index-based dra layout on mixed-node; the first, a middle (the L4) or the last
    GPU leaves the bus. The others keep publishing, the gone GPU's free devices are withdrawn at the
    next resync, and once it is back it is set up again (its VFs enabled) and takes a claim."""
    srv, node, daemon = mixed_agent
    daemon.resync()
    number = discover(node.env, node.io).gpu(gone).index
    mine = f"gpu-{number}-"
    before = published_devices(pool_slices(srv, node=node.node))
    assert any(d.startswith(mine) for d in before)
    node.host.unplug(gone)
    daemon.resync()
    after = published_devices(pool_slices(srv, node=node.node))
    assert not [d for d in after if d.startswith(mine)]
    assert after == {d for d in before if not d.startswith(mine)}  # the others keep theirs
    assert _node_meta(srv, node)["labels"][LABEL_CONFIG_STATE] == "pending"
    node.host.replug(gone)
    daemon.resync()
    gpu = discover(node.env, node.io).gpu(gone)
    assert gpu is not None and gpu.index == number
    assert gpu.sriov_total_vfs == 0 or gpu.sriov_num_vfs == gpu.sriov_total_vfs  # set up again
    back = published_devices(pool_slices(srv, node=node.node))
    assert back == before
    assert _node_meta(srv, node)["labels"][LABEL_CONFIG_STATE] == "success"
    device = next(d.name for d in daemon._pool.devices if d.gpu == gone and d.kind == "vgpu")
    ref = add_claim(srv, "vm-back", [("gpu", device)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None


@pytest.mark.parametrize("gone", ["0000:13:00.0", "0000:10:00.0"], ids=["middle", "first"])
def test_the_other_gpus_stay_allocatable_through_every_write_of_the_resync(mixed_agent, gone):
    """Issue #36.6: after the L4 in the middle of mixed-node (index-based dra layout) leaves, the
    resync that withdraws it never shows the scheduler a pool without the other GPUs' devices (a
    generation bump did: its new generation is incomplete until the last slice is written). The
    server's slices are read after every write the agent makes."""
    from tests.dra_bridge.test_publisher import Recorder
    from tests.dra_bridge.test_publisher_keep import assert_kept_through_every_write, devices_of, scheduler_view

    srv, node, daemon = mixed_agent
    daemon.resync()
    mine = f"gpu-{discover(node.env, node.io).gpu(gone).index}-"
    before = pool_slices(srv, node=node.node)
    others = {d for d in published_devices(before) if not d.startswith(mine)}
    kept = devices_of(before, others)
    daemon.publisher.api = rec = Recorder(daemon.publisher.api, srv, node.node)
    node.host.unplug(gone)
    daemon.resync()
    assert rec.states, "the resync withdrew nothing"
    assert_kept_through_every_write(rec.states, kept, "unplug")
    assert set(scheduler_view(pool_slices(srv, node=node.node)) or {}) == others
    rec.states.clear()
    node.host.replug(gone)
    daemon.resync()
    assert_kept_through_every_write(rec.states, kept, "replug")
    assert published_devices(pool_slices(srv, node=node.node)) == published_devices(before)


def test_restore_says_which_saved_vgpus_it_could_not_restore_and_exits_3(capsys):
    """Issue #36: after a reboot with the A100 off the bus, restore brings back the rest and names
    the A100's 6 saved vGPUs it could not (exit 3, as apply while it converges), not "restored", exit 0;
    once the GPU is back, they are restored and it exits 0."""
    from tests.support.simnodes import EXAMPLE_LAYOUT

    assert main(["--simulate", "apply", "-f", str(EXAMPLE_LAYOUT)]) == 0
    assert main(["--simulate", "sim", "reboot"]) == 0
    assert main(["--simulate", "sim", "unplug", A100]) == 0
    capsys.readouterr()
    code = main(["--simulate", "restore"])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "6 saved vGPUs on bus 0000:16 not restored: their parent device is not on this node" in " ".join(out.split())
    assert out.splitlines()[-1] == "12 devices restored; some saved ones are not (above)", out
    code = main(["--simulate", "restore", "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and not doc["ok"] and len(doc["notRestored"]) == 1 and "6 saved vGPUs" in doc["notRestored"][0]
    assert main(["--simulate", "sim", "replug", A100]) == 0
    capsys.readouterr()
    assert main(["--simulate", "restore"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "6 devices restored"


def test_discover_reports_a_gpu_that_left_the_bus(capsys):
    """newcomer finding 1: after ``sim unplug`` on a fresh simulated node, the ``discover`` table
    names the GPU off the bus (its number, address, what waits for it), not "3 GPUs" and silence;
    the others keep their numbers."""
    assert main(["--simulate", "sim", "unplug", T4B]) == 0
    capsys.readouterr()
    assert main(["--simulate", "discover"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 GPUs, 1 off the bus" in out, out
    assert f"GPU 1 {T4B}: off the bus; the layout entries naming it wait for it" in out, out
    assert f"2 {A100}" in out, out
