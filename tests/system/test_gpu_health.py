"""A sick GPU steps aside by itself and comes back by itself (issue #33, point 1).

The simulated host's NVML raises a critical Xid, ECC page retirement, a lost GPU or a hang
(``vgpuctl sim health``); the agent taints the GPU's devices (``<driver>/xid``, ``/gpu-lost``,
``/unmonitored``, NoSchedule) where the server keeps taints, withdraws its free ones elsewhere, says so
with an Event each way, a node annotation and the kubelet's health service, never removes a device in
use, and lifts it all after the quiet period (hysteresis: a seeded flapping sequence).
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import ANNOTATION_HEALTH, LABEL_CONFIG_STATE
from dra_bridge.pool.health import XID, HealthTracker, Problem
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.discovery import discover
from mdev_manager.sim.node import sim_node
from tests.support.dra import add_claim, pool_slices, set_boot_id
from tests.support.kubelet.fake_kubelet import short_root
from vgpuctl.main import main

L40S, T4A = "0000:19:00.0", "0000:10:00.0"
DRIVER = "vgpu.kubevirt.io"
QUIET = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["1.36", "1.34"], ids=["taints", "no-taints"])
def agent(tmp_path, request):
    short, cleanup = short_root(tmp_path)
    request.addfinalizer(cleanup)
    srv = LocalApiServer(version=request.param, feature_gates={}).start()
    request.addfinalizer(srv.stop)
    node = sim_node(tmp_path / "host", "default")
    set_boot_id(node, str(uuid.uuid4()))
    srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
    layout = tmp_path / "layouts.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}}))
    cfg = ServeConfig(node_name=node.node, layout_file=layout, metrics_port=None, kubelet_root=short / "k",
                      cdi_root=tmp_path / "cdi", state_label=LABEL_CONFIG_STATE, health_quiet_seconds=QUIET)
    daemon = Daemon(cfg, node.env, node.io, srv.api_client())
    daemon._wrap_prepare()
    clock = Clock()
    daemon.health.clock = clock
    return srv, node, daemon, clock, request.param == "1.36"


def _devices(srv, node) -> dict[str, dict]:
    return {d["name"]: d for s in pool_slices(srv, node=node.node) for d in s["spec"].get("devices", [])}


def _events(srv, node) -> list[tuple[str, str]]:
    return [(e["reason"], e.get("message", "")) for e in srv.objects("events")
            if e["involvedObject"]["name"] == node.node and e["reason"].startswith("Gpu")]


def test_a_sick_gpu_is_tainted_or_withdrawn_and_comes_back_after_the_quiet_period(agent, capsys):
    srv, node, daemon, clock, taints = agent
    daemon.resync()
    # a claim holds one device of the GPU that turns sick
    held = next(d.name for d in daemon._pool.devices if d.gpu == L40S and d.kind == "vgpu")
    ref = add_claim(srv, "vm-held", [("gpu", held)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None
    daemon.resync()  # what the node publishes with that claim prepared
    before = _devices(srv, node)
    l40s = sorted(n for n in before if daemon._pool.device(n).gpu == L40S)
    assert held in l40s and len(l40s) > 1
    vgpus = {v.id for v in discover(node.env, node.io).gpu(L40S).vgpus}

    assert main(["--simulate", "default", "--sim-dir", str(node.root), "sim", "health", L40S, "xid", "--xid", "48"]) == 0
    daemon.resync()
    after = _devices(srv, node)
    if taints:
        assert set(after) == set(before)
        for name in l40s:
            assert after[name]["taints"] == [{"key": f"{DRIVER}/xid", "value": "48", "effect": "NoSchedule",
                                              "timeAdded": after[name]["taints"][0]["timeAdded"]}]
        assert not any(after[n].get("taints") for n in after if n not in l40s)
    else:  # free devices withdrawn, the held one stays published
        assert set(after) == (set(before) - set(l40s)) | {held}
    assert {v.id for v in discover(node.env, node.io).gpu(L40S).vgpus} == vgpus  # nothing in use removed
    ((reason, message),) = _events(srv, node)
    assert reason == "GpuUnhealthy" and "Xid 48" in message
    annotations = srv.get_object("nodes", node.node)["metadata"]["annotations"]
    assert annotations[ANNOTATION_HEALTH].startswith(f"{L40S}: xid 48")
    # kubectl vgpu (vgpuctl gpus) says which GPU is sick and why, from the taints or the agent's annotation
    kubeconfig = str(srv.kubeconfig(node.root / "kubeconfig"))
    capsys.readouterr()
    code = main(["gpus", "--kubeconfig", kubeconfig, "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    listed = {g["address"]: g for g in json.loads(out)["items"]}
    assert listed[L40S]["health"].startswith("xid 48") and listed[T4A]["health"] is None
    health = {h.device: h for h in daemon.driver.health()}
    assert health[held].healthy is False and "unhealthy" in health[held].message
    assert all(h.healthy for d, h in health.items() if daemon._pool.device(d).gpu != L40S)

    # the Xid was an event: the GPU stays out until QUIET seconds pass without another
    clock.now += QUIET / 2
    daemon.resync()
    assert _devices(srv, node) == after
    clock.now += QUIET / 2
    daemon.resync()
    assert {n: d.get("taints", []) for n, d in _devices(srv, node).items()} == \
        {n: d.get("taints", []) for n, d in before.items()}
    assert sorted(r for r, _ in _events(srv, node)) == ["GpuHealthy", "GpuUnhealthy"]  # one Event each way
    assert ANNOTATION_HEALTH not in srv.get_object("nodes", node.node)["metadata"].get("annotations", {})
    assert all(h.healthy for h in daemon.driver.health())


@pytest.mark.parametrize(("fault", "kind"), [("lost", "gpu-lost"), ("hang", "unmonitored"), ("ecc", "xid")])
def test_each_fault_is_named_as_nvidia_names_it_and_lasts_while_it_lasts(agent, fault, kind):
    srv, node, daemon, clock, taints = agent
    if not taints:
        pytest.skip("the taint's name shows where the server keeps taints")
    daemon.resync()
    node.host.health(T4A, fault)
    daemon.resync()
    keys = {t["key"] for d in _devices(srv, node).values() if daemon._pool.device(d["name"]).gpu == T4A
            for t in d.get("taints", [])}
    assert keys == {f"{DRIVER}/{kind}"}
    clock.now += 10 * QUIET  # a condition, not an event: it stays while it lasts
    daemon.resync()
    assert any(d.get("taints") for d in _devices(srv, node).values())
    node.host.health(T4A, fault, clear=True)
    clock.now += 1
    daemon.resync()
    assert any(d.get("taints") for d in _devices(srv, node).values())  # not before the quiet period
    clock.now += QUIET
    daemon.resync()
    assert not any(d.get("taints") for d in _devices(srv, node).values())


def test_a_flapping_gpu_does_not_flap_the_slices():
    """A seeded flapping sequence: the tracker turns sick at the first problem and healthy only after
    QUIET seconds without one; each transition is checked against that rule computed apart."""
    rng = random.Random(20261129)
    tracker = HealthTracker(QUIET)
    bad = [rng.random() < (0.3 if (t // 200) % 2 == 0 else 0.002) for t in range(2000)]  # storms and calm
    sick, last_bad, transitions = False, None, 0
    for t, b in enumerate(bad):
        change = tracker.observe("g", [Problem(XID, "Xid 79", "79")] if b else [], float(t))
        want_sick = b or (sick and last_bad is not None and t - last_bad < QUIET)
        if b:
            last_bad = t
        if want_sick != sick:
            transitions += 1
            assert change is not None and change.healthy is (not want_sick), t
        else:
            assert change is None, t
        sick = want_sick
    flips = sum(1 for a, b in zip(bad, bad[1:], strict=False) if a != b)
    assert transitions <= 2 * 6 and flips > 10 * transitions  # hundreds of flips, a few transitions


def test_opt_in_no_execute_for_a_lost_gpu_only(tmp_path):
    """``serve --gpu-lost-effect NoExecute`` (#40.4): a lost GPU's taint is NoExecute (the device-taint
    eviction controller evicts its pods: test_real_health.py), the other health taints stay NoSchedule."""
    from vgpuctl.main import build_parser

    args = build_parser("serve").parse_args(["serve", "--gpu-lost-effect", "NoExecute"])
    assert args.gpu_lost_effect == "NoExecute"
    assert build_parser("serve").parse_args(["serve"]).gpu_lost_effect == "NoSchedule"
    srv = LocalApiServer(version="1.36", feature_gates={}).start()
    try:
        short, cleanup = short_root(tmp_path)
        node = sim_node(tmp_path / "host", "default")
        set_boot_id(node, str(uuid.uuid4()))
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
        layout = tmp_path / "layouts.yaml"
        layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "dra"}]}}))
        cfg = ServeConfig(node_name=node.node, layout_file=layout, metrics_port=None, kubelet_root=short / "k",
                          cdi_root=tmp_path / "cdi", gpu_lost_effect="NoExecute")
        daemon = Daemon(cfg, node.env, node.io, srv.api_client())
        daemon.resync()
        node.host.health(L40S, "lost")
        node.host.health(T4A, "xid", xid=48)
        daemon.resync()
        effects = {(daemon._pool.device(d["name"]).gpu, t["key"], t["effect"]) for d in _devices(srv, node).values()
                   for t in d.get("taints", [])}
        assert effects == {(L40S, f"{DRIVER}/gpu-lost", "NoExecute"), (T4A, f"{DRIVER}/xid", "NoSchedule")}
        cleanup()
    finally:
        srv.stop()
