"""One simulated node under test: the host, a local API server, the agent and a kubelet model.

Everything is the real code: the agent is :class:`dra_bridge.agent.daemon.Daemon` started as
``vgpuctl serve`` starts it (restore, undo half-prepared claims, resync, kubelet sockets);
claims are ``resource.k8s.io/v1`` objects in :class:`LocalApiServer`; a hand-run apply is
``vgpuctl apply`` itself (:func:`vgpuctl.main.main`). Only the transport is the
campaign's (:class:`.faults.FaultIO`), so a kill or a kernel error can land at any write.

The kubelet model is as small as the facts it needs: which claims it believes prepared (it
calls prepare again for each after the agent restarts or the node reboots, and unprepares
them when their pods go) and which it still has to prepare (it retries those).
"""

from __future__ import annotations

import contextlib
import io as iolib
import logging
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import DEFAULT_DRIVER, LABEL_CONFIG, LABEL_CONFIG_STATE
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.rpc.types import ClaimRef
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.host.env import HostEnv
from mdev_manager.sim import HostSpec
from mdev_manager.sim.node import SimNode, sim_node
from tests.campaign.faults import FaultIO, Killed
from vgpuctl.main import main as vgpuctl

log = logging.getLogger(__name__)

#: One board of each vGPU framework: mdev on the PF (with its audio function in the IOMMU
#: group), mdev on SR-IOV VFs, NVIDIA's vendor-specific VFIO on VFs.
HOST = HostSpec(name="campaign", node="campaign-node", gpus=[
    {"board": "T4", "audio_function": True}, {"board": "A100-40GB"}, {"board": "L40S"}])

NAMESPACE = "vms"


@dataclass
class Claim:
    ref: ClaimRef
    devices: list[str]  # the allocated device names, in request order
    requests: list[str]


@dataclass
class World:
    base: Path
    node: SimNode
    srv: LocalApiServer
    layouts: dict[str, list[dict]]
    paths: NodePaths
    daemon: Daemon | None = None
    fio: FaultIO | None = None
    prepared: dict[str, Claim] = field(default_factory=dict)  # the kubelet believes these prepared
    pending: dict[str, Claim] = field(default_factory=dict)  # the kubelet still has to prepare these
    terminating: dict[str, Claim] = field(default_factory=dict)  # their pods are going: to unprepare
    vms: dict[int, str] = field(default_factory=dict)  # simulated QEMU pid -> device it holds
    selected: str = "dra"
    serial: int = 0
    log: list[str] = field(default_factory=list)  # what the last step saw (for a failure report)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, base: Path, template: Path, layouts: dict[str, list[dict]]) -> World:
        root = base / "host"
        shutil.copytree(template, root, symlinks=True)
        node = sim_node(root, None)
        srv = LocalApiServer(version="1.36").start()
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {LABEL_CONFIG: "dra"}}})
        srv.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        paths = NodePaths(driver=DEFAULT_DRIVER, kubelet_root=root / "kubelet", cdi_root=base / "cdi")
        world = cls(base=base, node=node, srv=srv, layouts=dict(layouts), paths=paths)
        world.write_layouts()
        world.start_daemon()
        return world

    @staticmethod
    def template(where: Path) -> Path:
        """A freshly booted campaign host, built once and copied for each episode."""
        node = sim_node(where, HOST)
        node.host.reboot()  # a boot id, as every real host has
        return where

    def close(self) -> None:
        self.stop_daemon()
        self.srv.stop()

    @property
    def env(self) -> HostEnv:
        return self.node.env

    def write_layouts(self) -> None:
        doc = {"version": "vgpuctl/v1", "layouts": self.layouts}
        (self.base / "layouts.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    # ------------------------------------------------------------------ the agent
    def start_daemon(self, attempts: int = 3) -> None:
        """Start ``vgpuctl serve`` as the DaemonSet does, again after a failed start (a crash loop)."""
        self.stop_daemon()
        cfg = ServeConfig(node_name=self.node.node, layout_file=self.base / "layouts.yaml", metrics_port=None,
                          kubelet_root=self.paths.kubelet_root, cdi_root=self.paths.cdi_root,
                          layout_label=LABEL_CONFIG, state_label=LABEL_CONFIG_STATE, server_version=(1, 36))
        last: BaseException | None = None
        for _ in range(attempts):
            self.fio = FaultIO(self.node.host)
            daemon = Daemon(cfg, self.env, self.fio, self.srv.api_client())
            try:
                self.daemon = daemon.start()
                return
            except Exception as exc:  # logged by the daemon; the pod restarts
                last = exc
                daemon.plugin.stop()
        raise RuntimeError(f"the agent does not start: {last}")

    def stop_daemon(self) -> None:
        """The process ends (a kill: nothing is cleaned up but the sockets the kernel frees)."""
        if self.daemon is not None:
            with contextlib.suppress(Exception):
                self.daemon.plugin.stop()
            self.daemon = None

    def kill_daemon_and_restart(self) -> None:
        self.stop_daemon()
        self.start_daemon()
        self.kubelet_reprepare()

    def resync(self) -> str | None:
        """One resync; its error text, if any (the daemon logs and retries)."""
        try:
            self.daemon.resync()
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    # ------------------------------------------------------------------ the kubelet
    def new_claim(self, devices: list[str], *, first_available: bool = False) -> Claim:
        self.serial += 1
        name = f"claim-{self.serial}"
        requests = [f"gpu{i}" for i in range(len(devices))]
        if first_available:
            results = [(f"{r}/pick", d) for r, d in zip(requests, devices, strict=False)]
            spec_requests = [{"name": r, "firstAvailable": [{"name": "pick", "deviceClassName": "vgpu.kubevirt.io"}]}
                             for r in requests]
        else:
            results = list(zip(requests, devices, strict=False))
            spec_requests = [{"name": r, "exactly": {"deviceClassName": "vgpu.kubevirt.io"}} for r in requests]
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": NAMESPACE},
               "spec": {"devices": {"requests": spec_requests}},
               "status": {"allocation": {
                   "devices": {"results": [{"request": r, "driver": DEFAULT_DRIVER, "pool": self.node.node,
                                            "device": d} for r, d in results]},
                   "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                       {"key": "metadata.name", "operator": "In", "values": [self.node.node]}]}]}}}}
        stored = self.srv.add(obj)
        ref = ClaimRef(namespace=NAMESPACE, name=name, uid=stored["metadata"]["uid"])
        return Claim(ref=ref, devices=list(devices), requests=[r for r, _ in results])

    def prepare(self, claim: Claim) -> str | None:
        """NodePrepareResources for one claim; the error, if any. The kubelet retries a failed one."""
        res = self.daemon.driver.prepare([claim.ref])[claim.ref.uid]
        if res.error is None:
            self.prepared[claim.ref.uid] = claim
            self.pending.pop(claim.ref.uid, None)
            answered = sorted((tuple(d.request_names), d.device_name) for d in res.devices)
            self.log.append(f"prepared {claim.ref.name}: {answered}")
        else:
            self.pending[claim.ref.uid] = claim
            self.prepared.pop(claim.ref.uid, None)
            self.log.append(f"prepare {claim.ref.name} refused: {res.error}")
        return res.error

    def unprepare(self, claim: Claim) -> str | None:
        """NodeUnprepareResources: the pod is going; the kubelet retries until it succeeds."""
        self.prepared.pop(claim.ref.uid, None)
        self.pending.pop(claim.ref.uid, None)
        self.terminating[claim.ref.uid] = claim
        err = self.daemon.driver.unprepare([claim.ref])[claim.ref.uid]
        if err is None:
            self.terminating.pop(claim.ref.uid, None)
            with contextlib.suppress(Exception):
                self.srv.remove("resourceclaims", claim.ref.name, NAMESPACE)
        self.log.append(f"unprepare {claim.ref.name}: {err or 'ok'}")
        return err

    def kubelet_reprepare(self) -> None:
        """After the agent (or the node) restarts, the kubelet prepares its pods' claims again and
        unprepares those of pods that are going."""
        for claim in list(self.prepared.values()) + list(self.pending.values()):
            self.prepare(claim)
        for claim in list(self.terminating.values()):
            self.unprepare(claim)

    # ------------------------------------------------------------------ an admin
    def hand_apply(self, layout: str, *extra: str) -> tuple[int, str, str]:
        """``vgpuctl --simulate --sim-dir <host> apply -f layouts.yaml --layout <name>``."""
        out, err = iolib.StringIO(), iolib.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = vgpuctl(["--simulate", "--sim-dir", str(self.node.root), "apply",
                            "-f", str(self.base / "layouts.yaml"), "--layout", layout, *extra])
        return code, out.getvalue(), err.getvalue()

    def two_applies(self, a: str, b: str) -> list[int]:
        """Two admins at once: each ``vgpuctl apply`` in its own thread, on one node."""
        codes: list[int] = [0, 0]
        out, err = iolib.StringIO(), iolib.StringIO()

        def run(i: int, name: str) -> None:
            codes[i] = vgpuctl(["--simulate", "--sim-dir", str(self.node.root), "apply",
                                "-f", str(self.base / "layouts.yaml"), "--layout", name])

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate((a, b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return codes

    # ------------------------------------------------------------------ faults
    def kill_during(self, after_writes: int, action) -> bool:
        """Run ``action`` with the agent's death armed at its write ``after_writes``; True when it died."""
        self.fio.kill_after(after_writes)
        try:
            action()
            died = False
        except Killed:
            died = True
        self.fio.disarm()
        return died

    def reboot(self) -> None:
        """A cold boot: the kernel forgets every vGPU and VF, tmpfs (/var/run/cdi) is empty, the agent
        and every VM are gone; the agent starts again and the kubelet prepares its pods' claims."""
        self.stop_daemon()
        self.node.host.reboot()
        self.vms.clear()
        shutil.rmtree(self.paths.cdi_root, ignore_errors=True)
        self.start_daemon()
        self.kubelet_reprepare()

    def uid(self) -> str:
        return str(uuid.uuid4())
