"""The node-safety contract from outside (issue 12, points 1, 4, 5).

* a hand-run ``vgpuctl apply`` counts the kubelet plugin's prepared claims as in use (their
  checkpoint, where ``serve`` keeps it) and says it is converging (exit 3) instead of
  "node matches the layout";
* one node lock serialises writers: ``--no-wait`` fails at once naming the holder, without
  it the second writer waits, says so, then runs;
* the agent reports ``pending`` (with a reason annotation and an Event) while devices in use
  hold its node back, ``success`` once they are released.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import ANNOTATION_CONFIG_REASON, LABEL_CONFIG, LABEL_CONFIG_STATE
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.host.lock import NodeLock
from mdev_manager.sim.node import sim_node
from tests.support.dra import DictClaims, add_claim, claim_object, devices_of, make_driver, make_node, set_boot_id
from tests.support.kubelet.fake_kubelet import short_root
from vgpuctl.main import main

T4 = "0000:10:00.0"
UID = "6f1c1c2e-0000-4000-8000-00000000c001"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _other_t4_type(node, device: str) -> str:
    """A T4 type other than the one ``device`` (a published vGPU) creates."""
    pool = node.build_pool()
    mine = next(d.type_id for d in pool.devices if d.name == device)
    gpu = node.inventory().gpu(T4)
    return next(t.short_name for t in gpu.types if t.id != mine and not t.mig_backed)


def _layout(tmp_path: Path, vgpus: dict[str, int]) -> Path:
    f = tmp_path / "layout.yaml"
    f.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": T4, "mode": "vgpu", "vgpus": vgpus}]}}))
    return f


@pytest.fixture
def prepared(tmp_path):
    """A simulated node in dra mode whose kubelet plugin (kubelet root where ``serve --simulate``
    keeps it) prepared one T4 vGPU for claim vms/vm1-gpu."""
    node = make_node(tmp_path)
    paths = NodePaths(kubelet_root=node.root / "kubelet", cdi_root=tmp_path / "cdi")
    pool = node.build_pool()
    device = devices_of(pool, T4, "vgpu")[0]
    claims = DictClaims()
    ref = claims.add(claim_object("vm1-gpu", [("gpu", device)], node=node.node, namespace="vms"), UID)
    drv = make_driver(node, paths, claims, pool)
    assert drv.prepare([ref])[UID].error is None
    (vgpu,) = [d.vgpu_id for d in drv.cp.claims[UID].devices]
    return node, paths, device, vgpu


def test_apply_keeps_a_prepared_claims_vgpu_and_says_it_is_converging(prepared, tmp_path, capsys):
    node, paths, device, vgpu = prepared
    layout = _layout(tmp_path, {_other_t4_type(node, device): 1})
    sim = ["--simulate", "--sim-dir", str(node.root)]
    code, out, err = run(capsys, *sim, "plan", "-f", str(layout))
    assert code == 0 and "ResourceClaim vms/vm1-gpu" in out
    code, out, err = run(capsys, *sim, "apply", "-f", str(layout))
    assert code == 3, (out, err)
    assert vgpu in {v.id for v in node.inventory().all_vgpus()}
    assert "node matches the layout" not in out
    assert "converging" in out.splitlines()[-1]
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(vgpu)]
    assert "ResourceClaim vms/vm1-gpu" in line
    code, out, _ = run(capsys, *sim, "apply", "-f", str(layout), "-o", "json")
    assert code == 3
    (b,) = json.loads(out)["blocked"]
    assert b["device"] == vgpu and b["gpu"] == T4 and any("vms/vm1-gpu" in h for h in b["held_by"])
    # the kubelet root is the option's: another one holds no claims, and the vGPU goes
    code, out, _ = run(capsys, *sim, "apply", "-f", str(layout), "--kubelet-root", str(tmp_path / "empty"))
    assert code == 0 and vgpu not in {v.id for v in node.inventory().all_vgpus()}


def test_a_corrupted_checkpoint_removes_nothing(prepared, tmp_path, capsys):
    node, paths, device, vgpu = prepared
    paths.checkpoint.write_text("{not json")
    layout = _layout(tmp_path, {_other_t4_type(node, device): 1})
    code, out, err = run(capsys, "--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout))
    assert code == 3
    assert f"checkpoint {paths.checkpoint} cannot be read" in err
    assert vgpu in {v.id for v in node.inventory().all_vgpus()}
    assert paths.checkpoint.read_text() == "{not json"  # read-only: the agent moves it aside, not apply


def test_restore_leaves_a_claims_device_to_the_plugin(prepared, capsys):
    node, paths, device, vgpu = prepared
    code, out, _ = run(capsys, "--simulate", "--sim-dir", str(node.root), "restore")
    assert code == 0 and out.strip().splitlines()[-1] == "0 devices restored"


# --------------------------------------------------------------------------- the node lock

def _hold_lock(env, seconds: float) -> tuple[threading.Thread, threading.Event]:
    taken = threading.Event()

    def hold():
        with NodeLock(env, "test-holder apply").hold():
            taken.set()
            time.sleep(seconds)

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(10)
    return t, taken


def test_no_wait_fails_at_once_naming_the_holder(tmp_path, capsys):
    node = make_node(tmp_path)
    layout = _layout(tmp_path, {"T4-2Q": 8})
    t, _ = _hold_lock(node.env, 3)
    try:
        t0 = time.monotonic()
        code, out, err = run(capsys, "--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout),
                             "--no-wait")
        assert time.monotonic() - t0 < 2.5
        assert code == 75
        import os

        assert f"pid {os.getpid()} (test-holder apply)" in err and "nothing was changed" in err
        assert node.inventory().gpu(T4).vgpus == []
    finally:
        t.join()


def test_a_second_writer_waits_then_runs(tmp_path, capsys):
    node = make_node(tmp_path)
    layout = _layout(tmp_path, {"T4-2Q": 8})
    t, _ = _hold_lock(node.env, 1.5)
    t0 = time.monotonic()
    code, out, err = run(capsys, "--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout))
    t.join()
    assert code == 0, (out, err)
    assert time.monotonic() - t0 >= 1.0
    assert "waiting for the node lock held by pid" in err and "(test-holder apply)" in err
    assert len(node.inventory().gpu(T4).vgpus) == 8


# --------------------------------------------------------------------------- the agent's status


def test_agent_reports_pending_with_reason_and_event_then_success(tmp_path, request):
    layouts = {"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}}
    short, cleanup = short_root(tmp_path)  # the plugin's sockets live under the kubelet root
    request.addfinalizer(cleanup)
    with LocalApiServer(version="1.36") as srv:
        node = sim_node(tmp_path / "host", "default")
        set_boot_id(node, str(uuid.uuid4()))  # a real host always has one
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
        cfg = ServeConfig(node_name=node.node, layout_file=tmp_path / "layouts.yaml", metrics_port=None,
                          kubelet_root=short / "k", cdi_root=tmp_path / "cdi", layout_label=LABEL_CONFIG,
                          state_label=LABEL_CONFIG_STATE)
        (tmp_path / "layouts.yaml").write_text(yaml.safe_dump(layouts))
        daemon = Daemon(cfg, node.env, node.io, srv.api_client())
        daemon._wrap_prepare()
        daemon.resync()
        meta = lambda: srv.get_object("nodes", node.node)["metadata"]  # noqa: E731
        assert meta()["labels"][LABEL_CONFIG_STATE] == "success"
        device = devices_of(daemon._pool, T4, "vgpu")[0]
        ref = add_claim(srv, "vm1-gpu", [("gpu", device)], node=node.node, namespace="default")
        assert daemon.driver.prepare([ref])[ref.uid].error is None
        (vgpu,) = [d.vgpu_id for d in daemon.driver.cp.claims[ref.uid].devices]
        mine = next(d.type_id for d in daemon._pool.devices if d.name == device)
        other = next(t.short_name for t in daemon.inventory.gpu(T4).types if t.id != mine and not t.mig_backed)
        layouts["layouts"]["other"] = [{"pciAddress": T4, "mode": "vgpu", "vgpus": {other: 1}}]
        (tmp_path / "layouts.yaml").write_text(yaml.safe_dump(layouts))
        from kubernetes import client

        client.CoreV1Api(srv.api_client()).patch_node(node.node, {"metadata": {"labels": {LABEL_CONFIG: "other"}}})
        daemon.resync()
        assert meta()["labels"][LABEL_CONFIG_STATE] == "pending"
        reason = meta()["annotations"][ANNOTATION_CONFIG_REASON]
        assert vgpu in reason and "ResourceClaim default/vm1-gpu" in reason
        events = [e for e in srv.objects("events", "default") if e["involvedObject"]["name"] == node.node
                  and e["reason"] != "LayoutApplied"]  # the first resync's own changes (VFs) are an event too
        assert [e["reason"] for e in events] == ["LayoutBlocked"] and vgpu in events[0]["message"]
        count = len(srv.objects("events", "default"))
        daemon.resync()  # still blocked: no new event, no node patch
        assert len(srv.objects("events", "default")) == count
        assert daemon.driver.unprepare([ref])[ref.uid] is None
        daemon.resync()
        assert meta()["labels"][LABEL_CONFIG_STATE] == "success"
        assert ANNOTATION_CONFIG_REASON not in (meta().get("annotations") or {})
        reasons = [e["reason"] for e in sorted(srv.objects("events", "default"),
                                               key=lambda e: int(e["metadata"]["resourceVersion"]))]
        assert reasons[-2:] == ["LayoutBlocked", "LayoutApplied"] and reasons.count("LayoutBlocked") == 1
        assert [v.type_name.split()[-1] for v in daemon.inventory.gpu(T4).vgpus] == [other]
