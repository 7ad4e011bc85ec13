"""The agent follows its layout file and tells what it did (issue 16).

* an edited layout (a ConfigMap volume: kubelet swaps the ``..data`` symlink) is applied
  within one resync, without a restart or a label change; a rejected one is retried once the
  file changes;
* apply results are Events on the Node: ``LayoutApplied`` (with the number of changes),
  ``LayoutFailed`` (rejected, or steps failed), ``LayoutBlocked``; none when nothing changed,
  and a repeated failure is not recorded again;
* ``/metrics`` carries the free vGPUs per GPU and profile and the layout state.
"""

from __future__ import annotations

import errno
import os
import re
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.agent.observe import ProbeServer
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.config import ConfigError
from mdev_manager.sim import SimIO
from mdev_manager.sim.node import sim_node
from tests.support.dra import set_boot_id
from tests.support.kubelet.fake_kubelet import short_root

T4, T4B = "0000:10:00.0", "0000:13:00.0"


def doc(*entries: dict) -> dict:
    return {"version": "vgpuctl/v1", "layouts": {"default": list(entries)}}


class ConfigMapVolume:
    """A ConfigMap mounted as kubelet mounts it: ``layouts.yaml -> ..data/layouts.yaml``,
    ``..data -> ..<timestamp>``; an update writes a new timestamped dir and swaps ``..data``."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True)
        self.n = 0
        (root / "layouts.yaml").symlink_to("..data/layouts.yaml")

    @property
    def path(self) -> Path:
        return self.root / "layouts.yaml"

    def write(self, content: dict | str) -> None:
        self.n += 1
        version = self.root / f"..2026_11_23_{self.n:02d}"
        version.mkdir()
        (version / "layouts.yaml").write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.rename(tmp, self.root / "..data")  # atomic, as kubelet's AtomicWriter


class FaultyCreates(SimIO):
    """Fails every mdev create with EIO while ``failing`` is set."""

    failing = True

    def write(self, path, data):
        if self.failing and Path(path).name == "create":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().write(path, data)


@pytest.fixture
def agent(tmp_path, request):
    short, cleanup = short_root(tmp_path)
    request.addfinalizer(cleanup)
    with LocalApiServer(version="1.37") as srv:
        node = sim_node(tmp_path / "host", "default")
        set_boot_id(node, str(uuid.uuid4()))  # a real host always has one
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {}}})
        cm = ConfigMapVolume(tmp_path / "config")
        cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 2}}))

        def make(io=None) -> Daemon:
            cfg = ServeConfig(node_name=node.node, layout_file=cm.path, metrics_port=None,
                              kubelet_root=short / "k", cdi_root=tmp_path / "cdi")
            return Daemon(cfg, node.env, io or node.io, srv.api_client())

        yield srv, node, cm, make


def events(srv, node) -> list[tuple[str, str, str]]:
    return [(e["reason"], e["type"], e["message"]) for e in srv.objects("events", "default")
            if e["involvedObject"]["name"] == node.node]


def reasons(srv, node) -> list[str]:
    return sorted(r for r, _, _ in events(srv, node))


def t4_vgpus(daemon: Daemon) -> list[str]:
    return [v.type_name.split()[-1] for v in daemon.inventory.gpu(T4).vgpus]


def scrape(daemon: Daemon) -> dict[str, float]:
    """The daemon's /metrics as its probe server serves it: ``name{labels}`` -> value."""
    probes = ProbeServer(daemon.metrics, lambda: True, host="127.0.0.1", port=0).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{probes.port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        probes.stop()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(vgpuctl_\S+) (\S+)$", text, re.M)}


def test_an_edited_configmap_is_applied_within_one_resync(agent):
    srv, node, cm, make = agent
    daemon = make()
    daemon.resync()
    assert t4_vgpus(daemon) == ["T4-2Q"] * 2
    assert [(r, t) for r, t, _ in events(srv, node)] == [("LayoutApplied", "Normal")]
    assert "applied with 4 changes" in events(srv, node)[0][2]  # 2 definitions saved, 2 vGPUs created
    daemon.resync()  # nothing changed: no event
    assert len(events(srv, node)) == 1

    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 4}}))  # kubelet swaps ..data
    daemon.resync()
    assert t4_vgpus(daemon) == ["T4-2Q"] * 4
    assert reasons(srv, node) == ["LayoutApplied", "LayoutApplied"]
    assert sorted(m for _, _, m in events(srv, node)) == ["layout default applied with 4 changes; the node matches it"] * 2
    daemon.resync()
    assert len(events(srv, node)) == 2


def test_a_rejected_layout_is_retried_once_the_file_changes(agent):
    srv, node, cm, make = agent
    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 99}}))
    daemon = make()
    with pytest.raises(ConfigError):
        daemon.resync()
    ((reason, kind, message),) = events(srv, node)
    assert (reason, kind) == ("LayoutFailed", "Warning") and "rejected" in message and "99" in message
    m = scrape(daemon)
    assert m['vgpuctl_layout_state{state="failed"}'] == 1 and m['vgpuctl_layout_state{state="success"}'] == 0
    with pytest.raises(ConfigError):
        daemon.resync()  # same file: not read again, not reported again
    assert len(events(srv, node)) == 1
    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 3}}))
    daemon.resync()
    assert t4_vgpus(daemon) == ["T4-2Q"] * 3
    assert reasons(srv, node) == ["LayoutApplied", "LayoutFailed"]
    assert scrape(daemon)['vgpuctl_layout_state{state="success"}'] == 1


def test_a_rejected_layout_keeps_the_last_good_pool_published_and_the_plugin_served(agent):
    """A layout the node rejects changes nothing on it, so what the last good layout offers is
    still true: its devices stay published. And an agent whose first resync fails still serves
    the kubelet plugin, so prepared claims can be unprepared (found by the fault campaign)."""
    srv, node, cm, make = agent
    cm.write(doc({"all": True, "mode": "dra"}))
    daemon = make()
    daemon.resync()
    published = sorted(d["name"] for s in srv.objects("resourceslices") for d in s["spec"].get("devices", []))
    assert published and daemon._pool.devices
    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 99}}))
    with pytest.raises(ConfigError):
        daemon.resync()
    assert sorted(d["name"] for s in srv.objects("resourceslices") for d in s["spec"].get("devices", [])) == published
    # the node still changes under a rejected layout (a GPU leaves the bus): the pool follows it
    gone = {d.name for d in daemon._pool.devices if d.gpu == T4B}
    assert gone
    node.host.remove_gpu(T4B)
    with pytest.raises(ConfigError):
        daemon.resync()
    now = {d["name"] for s in srv.objects("resourceslices") for d in s["spec"].get("devices", [])}
    assert now == set(published) - gone and {d.name for d in daemon._pool.devices} == now

    restarted = make()  # a new process: no last good layout; the plugin still starts
    try:
        restarted.start()
        assert restarted.plugin.running and restarted._ready
        assert [r for r, _, _ in events(srv, node)].count("LayoutFailed") == 2
    finally:
        restarted.stop()
        restarted._shutdown()


def test_failed_steps_are_one_event_until_they_succeed(agent):
    srv, node, _cm, make = agent
    io = FaultyCreates(node.host)
    daemon = make(io)
    daemon.resync()
    ((reason, kind, message),) = events(srv, node)
    assert (reason, kind) == ("LayoutFailed", "Warning") and "EIO" in message and "step(s) failed" in message
    assert scrape(daemon)['vgpuctl_layout_state{state="failed"}'] == 1
    daemon.resync()  # the same steps fail again (with new vGPU UUIDs): no second event
    assert len(events(srv, node)) == 1
    io.failing = False
    daemon.resync()
    assert t4_vgpus(daemon) == ["T4-2Q"] * 2
    assert reasons(srv, node) == ["LayoutApplied", "LayoutFailed"]


def test_a_layout_edit_blocked_by_a_vgpu_in_use_is_reported(agent):
    srv, node, cm, make = agent
    daemon = make()
    daemon.resync()
    held = daemon.inventory.gpu(T4).vgpus[0]
    node.host.spawn_holder([node.env.vfio_group(held.iommu_group)])
    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-4Q": 1}}))
    daemon.resync()
    blocked = [e for e in events(srv, node) if e[0] == "LayoutBlocked"]
    assert len(blocked) == 1 and held.id in blocked[0][2] and blocked[0][1] == "Warning"
    m = scrape(daemon)
    assert m['vgpuctl_layout_state{state="pending"}'] == 1 and m['vgpuctl_layout_state{state="success"}'] == 0
    daemon.resync()
    assert len([e for e in events(srv, node) if e[0] == "LayoutBlocked"]) == 1


def test_metrics_free_vgpus_per_gpu_and_profile(agent):
    srv, node, cm, make = agent
    cm.write(doc({"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 4}},
                 {"pciAddress": T4B, "mode": "dra", "vgpus": {"T4-2Q": 0, "T4-4Q": 0}}))
    daemon = make()
    daemon.resync()
    m = scrape(daemon)
    free = {k: v for k, v in m.items() if k.startswith("vgpuctl_gpu_free_vgpus{")}
    # vgpu mode: its idle vGPUs; dra mode: what the GPU can still create, per published profile
    assert free == {
        f'vgpuctl_gpu_free_vgpus{{gpu="{T4}",profile="T4-2Q"}}': 4,
        f'vgpuctl_gpu_free_vgpus{{gpu="{T4B}",profile="T4-2Q"}}': 8,
        f'vgpuctl_gpu_free_vgpus{{gpu="{T4B}",profile="T4-4Q"}}': 4,
    }
    assert m['vgpuctl_layout_state{state="success"}'] == 1
    assert m['vgpuctl_layout_state{state="pending"}'] == 0 and m['vgpuctl_layout_state{state="failed"}'] == 0
    # a VM takes one of the vGPUs; the dra GPU gets one made by hand (no claim's: it takes its room)
    vgpu = daemon.inventory.gpu(T4).vgpus[0]
    node.host.spawn_holder([node.env.vfio_group(vgpu.iommu_group)])
    q2 = next(t for t in daemon.inventory.gpu(T4B).types if t.short_name == "T4-2Q")
    node.io.write(node.env.pci(T4B) / "mdev_supported_types" / q2.id / "create", str(uuid.uuid4()) + "\n")
    daemon.resync()
    m = scrape(daemon)
    assert m[f'vgpuctl_gpu_free_vgpus{{gpu="{T4}",profile="T4-2Q"}}'] == 3
    assert m[f'vgpuctl_gpu_free_vgpus{{gpu="{T4B}",profile="T4-2Q"}}'] == 7
    # equal-size mode: 2Q only now; the hand-made vGPU's size is the only one published (#36.2)
    assert f'vgpuctl_gpu_free_vgpus{{gpu="{T4B}",profile="T4-4Q"}}' not in m
