"""A passed-through GPU steps aside by itself too (issue #40, point 3).

NVML does not see a GPU on vfio-pci; the agent reads what the kernel shows of it in sysfs. Each fault
the simulator raises there (``vgpuctl sim health ADDRESS aer-fatal|aer-nonfatal|link|fell-off|reset-failed``)
taints the GPU's devices with its key, NoSchedule, with an Event and the node annotation, removes nothing
(the claim holding the GPU keeps it, on vfio-pci), and is lifted after the quiet period; a GPU whose files
cannot be read is ``unmonitored``; a GPU on NVIDIA's driver is not touched by any of it.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import ANNOTATION_HEALTH, LABEL_CONFIG_STATE
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.sim.node import sim_node
from tests.support.dra import add_claim, pool_slices, set_boot_id
from tests.support.kubelet.fake_kubelet import short_root
from vgpuctl.main import main

T4A, T4B = "0000:10:00.0", "0000:13:00.0"
DRIVER = "vgpu.kubevirt.io"
QUIET = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def agent(bound):
    """As :func:`bound`, after the agent's first look at the passed-through GPU."""
    srv, node, daemon, clock = bound
    daemon.resync()
    return bound


@pytest.fixture
def bound(tmp_path, request):
    """The agent on the default simulated node, whole GPUs offered for passthrough, T4A passed through to
    a prepared claim (bound to vfio-pci), before the agent's next look at its GPUs."""
    return _start(tmp_path, request)


def _start(tmp_path, request, fault_before_bind: str | None = None):
    short, cleanup = short_root(tmp_path)
    request.addfinalizer(cleanup)
    srv = LocalApiServer(version="1.36", feature_gates={}).start()
    request.addfinalizer(srv.stop)
    node = sim_node(tmp_path / "host", "default")
    set_boot_id(node, str(uuid.uuid4()))
    srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
    layout = tmp_path / "layouts.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1",
                                      "layouts": {"default": [{"all": True, "mode": "dra", "passthrough": True}]}}))
    cfg = ServeConfig(node_name=node.node, layout_file=layout, metrics_port=None, kubelet_root=short / "k",
                      cdi_root=tmp_path / "cdi", state_label=LABEL_CONFIG_STATE, health_quiet_seconds=QUIET)
    daemon = Daemon(cfg, node.env, node.io, srv.api_client())
    daemon._wrap_prepare()
    clock = Clock()
    daemon.health.clock = clock
    daemon.resync()
    if fault_before_bind:
        node.host.health(T4A, fault_before_bind)
        daemon.resync()  # NVML watches the GPU now: it reads no AER counter
        assert _events(srv, node) == []
    whole = next(d.name for d in daemon._pool.devices if d.gpu == T4A and d.kind == "passthrough")
    ref = add_claim(srv, "vm-pt", [("gpu", whole)], node=node.node)
    assert daemon.driver.prepare([ref])[ref.uid].error is None
    assert _driver(node, T4A) == "vfio-pci" and _driver(node, T4B) == "nvidia"
    return srv, node, daemon, clock


def _driver(node, address: str) -> str | None:
    link = node.env.pci(address) / "driver"
    return os.path.basename(os.readlink(link)) if os.path.lexists(link) else None


def _taints(srv, daemon, gpu) -> dict[str, list[dict]]:
    return {d["name"]: d.get("taints", []) for s in pool_slices(srv, node=daemon.cfg.node_name)
            for d in s["spec"].get("devices", []) if daemon._pool.device(d["name"]).gpu == gpu}


def _events(srv, node) -> list[tuple[str, str]]:
    return [(e["reason"], e.get("message", "")) for e in srv.objects("events")
            if e["involvedObject"]["name"] == node.node and e["reason"].startswith("Gpu")]


@pytest.mark.parametrize(("fault", "key", "value", "event"), [
    ("aer-fatal", "aer", "fatal", True),
    ("aer-nonfatal", "aer", "nonfatal", True),
    ("link", "pci-link", None, False),
    ("fell-off", "gpu-lost", None, False),
    ("reset-failed", "pci-reset", None, False),
])
def test_each_kernel_fault_taints_the_passed_through_gpu_and_lifts_after_the_quiet_period(agent, fault, key,
                                                                                         value, event, capsys):
    srv, node, daemon, clock = agent
    before = _taints(srv, daemon, T4A)
    assert before and not any(before.values())
    others = {g: _taints(srv, daemon, g) for g in (T4B,)}
    assert main(["--simulate", "default", "--sim-dir", str(node.root), "sim", "health", T4A, fault]) == 0
    daemon.resync()
    after = _taints(srv, daemon, T4A)
    assert set(after) == set(before)  # nothing withdrawn, nothing removed
    for name, taints in after.items():
        want = {"key": f"{DRIVER}/{key}", "effect": "NoSchedule", "timeAdded": taints[0]["timeAdded"]}
        assert taints == [{**want, **({"value": value} if value else {})}], name
    assert {g: _taints(srv, daemon, g) for g in (T4B,)} == others  # the GPU on NVIDIA's driver is untouched
    assert _driver(node, T4A) == "vfio-pci"  # the claim keeps its GPU
    ((reason, message),) = _events(srv, node)
    assert reason == "GpuUnhealthy" and T4A in message
    annotation = srv.get_object("nodes", node.node)["metadata"]["annotations"][ANNOTATION_HEALTH]
    assert annotation.startswith(f"{T4A}: {key}")
    capsys.readouterr()  # kubectl vgpu's HEALTH column names it, from the taints
    assert main(["gpus", "--kubeconfig", str(srv.kubeconfig(node.root / "kubeconfig")), "-o", "json"]) == 0
    listed = {g["address"]: g["health"] for g in json.loads(capsys.readouterr().out)["items"]}
    assert listed[T4A].startswith(key) and listed[T4B] is None

    if not event:  # a condition stays while it lasts
        clock.now += 10 * QUIET
        daemon.resync()
        assert all(_taints(srv, daemon, T4A).values())
        assert main(["--simulate", "default", "--sim-dir", str(node.root), "sim", "health", T4A, fault,
                     "--clear"]) == 0
    clock.now += QUIET / 2
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values())  # not before the quiet period
    clock.now += QUIET / 2
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values())
    assert sorted(r for r, _ in _events(srv, node)) == ["GpuHealthy", "GpuUnhealthy"]
    assert ANNOTATION_HEALTH not in srv.get_object("nodes", node.node)["metadata"].get("annotations", {})


def test_an_aer_error_that_keeps_coming_keeps_the_gpu_out(agent):
    srv, node, daemon, clock = agent
    for _ in range(3):
        node.host.health(T4A, "aer-nonfatal")
        daemon.resync()
        clock.now += QUIET * 0.9
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values())  # each new error restarted the quiet period
    clock.now += QUIET
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values())


def test_a_passed_through_gpu_whose_files_cannot_be_read_is_unmonitored(agent):
    srv, node, daemon, clock = agent
    fdir = node.env.pci(T4A).resolve()
    hidden = {}
    for name in ("config", "aer_dev_fatal", "aer_dev_nonfatal", "current_link_speed", "current_link_width",
                 "reset_method"):
        hidden[name] = (fdir / name).read_bytes()
        (fdir / name).unlink()
    daemon.resync()
    keys = {t["key"] for ts in _taints(srv, daemon, T4A).values() for t in ts}
    assert keys == {f"{DRIVER}/unmonitored"}
    for name, data in hidden.items():
        (fdir / name).write_bytes(data)
    clock.now += QUIET
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values())


def test_kernel_faults_on_a_gpu_on_nvidias_driver_change_nothing(agent):
    """The kernel's files of a GPU NVML watches are not read: its health is NVML's."""
    srv, node, daemon, clock = agent
    before = _taints(srv, daemon, T4B)
    for fault in ("aer-fatal", "link", "fell-off", "reset-failed"):
        node.host.health(T4B, fault)
    daemon.resync()
    assert _taints(srv, daemon, T4B) == before and not any(before.values())
    assert _events(srv, node) == []


@pytest.mark.parametrize("when", ["after the bind", "before the bind"])
def test_an_aer_error_counted_before_the_watchs_first_look_is_reported(tmp_path, request, when):
    """The AER counters count from boot, not from the bind: one already non-zero at the first look is an
    error nobody reported (raised between the bind and the first look, or while on NVIDIA's driver), not a
    baseline. Reported once, with the count, and lifted after the quiet period when it does not grow."""
    srv, node, daemon, clock = _start(tmp_path, request, "aer-fatal" if when == "before the bind" else None)
    if when == "after the bind":  # before the agent's first look at it on vfio-pci
        node.host.health(T4A, "aer-fatal")
    daemon.resync()
    after = _taints(srv, daemon, T4A)
    assert after and all(ts and ts[0]["key"] == f"{DRIVER}/aer" and ts[0]["value"] == "fatal" for ts in after.values())
    ((reason, message),) = _events(srv, node)
    assert reason == "GpuUnhealthy" and T4A in message and "first look (Completion Timeout 1)" in message
    clock.now += QUIET
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values())  # not growing: lifted after the quiet period
    node.host.health(T4A, "aer-fatal")
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values())  # a later one is news as before


def test_sim_health_says_when_the_watch_for_the_gpus_driver_does_not_read_the_fault(agent, capsys):
    """``raised`` alone would promise a taint the agent never gives: the kernel's faults on a GPU NVML
    watches, NVML's on one on vfio-pci. Exit 0 still: the fault is raised."""
    srv, node, daemon, clock = agent
    sim = ["--simulate", "default", "--sim-dir", str(node.root), "sim", "health"]
    capsys.readouterr()
    assert main([*sim, T4B, "aer-fatal"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(
        f"aer-fatal raised; note: GPU {T4B} is on nvidia: the agent watches it through NVML, not its AER, link or "
        "config files")
    assert main([*sim, T4A, "xid"]) == 0
    assert f"Xid 79 raised; note: GPU {T4A} is on vfio-pci: the agent watches it through the kernel's" in \
        capsys.readouterr().out
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values()) and not any(_taints(srv, daemon, T4B).values())
    assert main([*sim, T4A, "aer-fatal"]) == 0  # one the watch reads: no note
    assert capsys.readouterr().out.rstrip().endswith("aer-fatal raised")


def test_sim_health_clear_sets_an_aer_count_back_to_zero_and_says_so(agent, capsys):
    """``--clear`` of an AER fault said "cleared" and left the count as it was (a counter, not a state):
    it sets the file's counters back to 0, as a reboot or hot-plug would, and says that. The taint it
    raised lifts after the quiet period; an error counted after the clear is news."""
    srv, node, daemon, clock = agent
    sim = ["--simulate", "default", "--sim-dir", str(node.root), "sim", "health", T4A]
    fatal = node.env.pci(T4A) / "aer_dev_fatal"
    assert main([*sim, "aer-fatal"]) == 0
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values()) and "TOTAL_ERR_FATAL 1" in fatal.read_text()
    capsys.readouterr()
    assert main([*sim, "aer-fatal", "--clear"]) == 0
    assert "aer-fatal count set back to 0 (as after a reboot or hot-plug" in capsys.readouterr().out
    assert all(line.endswith(" 0") for line in fatal.read_text().splitlines()), fatal.read_text()
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values())  # within the quiet period: still tainted
    clock.now += QUIET
    daemon.resync()
    assert not any(_taints(srv, daemon, T4A).values())
    assert main([*sim, "aer-fatal"]) == 0  # counted again from 0: news
    daemon.resync()
    assert all(_taints(srv, daemon, T4A).values())
