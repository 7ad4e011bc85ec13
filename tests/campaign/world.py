"""One simulated node under test: the host, a local API server, the agent and a kubelet model.

Everything is the real code: the agent is :class:`dra_bridge.agent.daemon.Daemon` started as
``vgpuctl serve`` starts it (restore, undo half-prepared claims, resync, kubelet sockets) and the
kubelet reaches its plugin as the real one does (registration socket, then gRPC); claims are
``resource.k8s.io/v1`` objects in :class:`LocalApiServer`; an admin runs ``vgpuctl`` itself
(:func:`vgpuctl.main.main`, or its parser and command with the campaign's transport when the step
kills it or runs it beside the agent). Only the transport (:class:`.faults.FaultIO`) and the
agent's in-process locks (:mod:`.sched`) are the campaign's, so a kill, a kernel or disk error or
another thread can land at any call.

The kubelet model is as small as the facts it needs: which claims it believes prepared (and in
which boot it was told so), which it still has to prepare (it retries those) and which it has to
unprepare (their pods are going). A kubelet restart may forget them all.

Holders are of three kinds: a process holding a vfio group, a process holding a vfio cdev
(iommufd), a libvirt domain naming a device (``test:///`` driver, a file the campaign writes).
"""

from __future__ import annotations

import contextlib
import io as iolib
import logging
import random
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from dra_bridge.agent.daemon import Daemon, ServeConfig
from dra_bridge.api.names import DEFAULT_DRIVER, LABEL_CONFIG, LABEL_CONFIG_STATE
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.rpc import dra_client
from dra_bridge.rpc.types import ClaimRef
from dra_bridge.sim.apiserver import LocalApiServer
from mdev_manager.host.env import HostEnv
from mdev_manager.host.lock import lock_path
from mdev_manager.sim import HostSpec
from mdev_manager.sim.kernel import SimHost
from mdev_manager.sim.node import SimNode, sim_node
from tests.campaign.faults import Disk, FaultIO, Killed
from tests.campaign.healthclock import HealthClock
from tests.campaign.sched import Aborted, SchedLock, SchedNodeLock, SchedRLock, Scheduler, Stderr
from tests.support.kubelet import protos
from tests.support.kubelet.fake_kubelet import DraClient
from vgpuctl.main import main as vgpuctl

log = logging.getLogger(__name__)

#: One board of each vGPU framework: mdev on the PF (with its audio function in the IOMMU
#: group), mdev on SR-IOV VFs (MIG-capable), NVIDIA's vendor-specific VFIO on VFs; iommufd, so
#: a VM can hold a device's vfio cdev instead of its group.
HOST = HostSpec(name="campaign", node="campaign-node", iommufd=True, mdevctl_udev=True, gpus=[
    {"board": "T4", "audio_function": True}, {"board": "A100-40GB"}, {"board": "L40S"}])

NAMESPACE = "vms"
RPC_TIMEOUT = 600.0  # the kubelet's gRPC deadline: never reached (a parked server thread is not a slow one)


@dataclass
class Claim:
    ref: ClaimRef
    devices: list[str]  # the allocated device names, in request order
    requests: list[str]


@dataclass
class Holder:
    device: str  # mdev UUID or PCI address
    how: str  # group | cdev
    path: str


@dataclass
class World:
    base: Path
    node: SimNode
    srv: LocalApiServer
    layouts: dict[str, list[dict]]
    paths: NodePaths
    rng: random.Random  # the episode's own choices at run time (seeded by hypothesis)
    api_url: str = ""
    sched: Scheduler = field(default_factory=Scheduler)
    disk: Disk = field(default_factory=Disk)
    daemon: Daemon | None = None
    fio: FaultIO | None = None
    client: DraClient | None = None  # the kubelet's gRPC client to the plugin (None: not registered)
    prepared: dict[str, Claim] = field(default_factory=dict)  # the kubelet believes these prepared
    told: dict[str, str] = field(default_factory=dict)  # uid -> boot id in which prepare last answered ok
    pending: dict[str, Claim] = field(default_factory=dict)  # the kubelet still has to prepare these
    terminating: dict[str, Claim] = field(default_factory=dict)  # their pods are going: to unprepare
    # uids whose metadata path (it is the claim's name's) a later claim of the same name was prepared
    # on: each lost its metadata CDI device on purpose, and keeps no file there once that claim goes
    superseded: set[str] = field(default_factory=set)
    named: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (namespace, name) -> uids prepared
    vms: dict[int, Holder] = field(default_factory=dict)  # simulated QEMU pid -> what it holds
    domains: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # libvirt: name -> (mdevs, pci)
    hostile: list[str] = field(default_factory=list)  # hostile claims the plugin prepared (a violation)
    unlocked: list[str] = field(default_factory=list)  # kernel writes made while nobody held the node lock
    selected: str = "dra"
    serial: int = 0
    starts: int = 0
    log: list[str] = field(default_factory=list)  # what the last step saw (for a failure report)
    health: dict[str, set[str]] = field(default_factory=dict)  # GPU -> the health faults raised on it (sim health)
    health_clock: HealthClock = field(default_factory=HealthClock)  # the agent's health clock (no waiting)
    uevents: Any = None  # the agent's event source (.uevent_steps.CampaignEvents): steps deliver the kernel's events
    host_seen: dict = field(default_factory=dict)  # the host's devices when the last uevents were delivered

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, base: Path, template: Path, layouts: dict[str, list[dict]], seed: int) -> World:
        root = base / "host"
        shutil.copytree(template, root, symlinks=True)
        libvirt_xml = base / "libvirt.xml"
        node = sim_node(root, None, libvirt_uri=f"test://{libvirt_xml}")
        srv = LocalApiServer(version="1.36", port=_free_port()).start()
        srv.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node, "labels": {LABEL_CONFIG: "dra"}}})
        srv.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        paths = NodePaths(driver=DEFAULT_DRIVER, kubelet_root=root / "kubelet", cdi_root=base / "cdi")
        world = cls(base=base, node=node, srv=srv, layouts=dict(layouts), paths=paths, rng=random.Random(seed),
                    api_url=srv.url)
        world.write_layouts()
        world.write_domains()
        from tests.campaign.uevent_steps import CampaignEvents, look

        world.uevents, world.host_seen = CampaignEvents(), look(node.env)
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

    @property
    def libvirt_uri(self) -> str:
        return self.env.libvirt_uri or ""

    def boot_id(self) -> str:
        return self.env.boot_id.read_text().strip()

    def write_layouts(self) -> None:
        doc = {"version": "vgpuctl/v1", "layouts": self.layouts}
        (self.base / "layouts.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def write_domains(self) -> None:
        """The libvirt node file the ``test:///`` driver reads at each connection (written aside, renamed)."""
        from tests.support.simnodes import libvirt_node_xml

        path = Path(self.libvirt_uri.removeprefix("test://"))
        tmp = path.with_name(path.name + ".new")
        tmp.write_text(libvirt_node_xml(self.domains))
        tmp.rename(path)

    def transport(self) -> FaultIO:
        """A fresh transport into this node (another process's view of the same kernel and disk)."""
        return FaultIO(SimHost(self.node.root), sched=self.sched, disk=self.disk, lock_file=lock_path(self.env),
                       unlocked=self.unlocked)

    # ------------------------------------------------------------------ the agent
    def config(self) -> ServeConfig:
        return ServeConfig(node_name=self.node.node, layout_file=self.base / "layouts.yaml", metrics_port=None,
                           kubelet_root=self.paths.kubelet_root, cdi_root=self.paths.cdi_root,
                           layout_label=LABEL_CONFIG, state_label=LABEL_CONFIG_STATE, server_version=(1, 36),
                           full_resync_seconds=1e9, probe_seconds=1e9)  # no clock in what a resync decides

    def start_daemon(self, attempts: int = 3, arm=None) -> None:
        """Start ``vgpuctl serve`` as the DaemonSet does, again after a failed start (a crash loop).
        ``arm(fio)`` arms a fault on the first attempt's transport (a kill or an error during start-up)."""
        self.stop_daemon()
        last: BaseException | None = None
        for attempt in range(attempts):
            self.starts += 1
            self.fio = self.transport()
            if arm is not None and attempt == 0:
                arm(self.fio)
            daemon = None
            try:
                daemon = Daemon(self.config(), self.env, self.fio, self.api_client(), events=self.uevents)
                self._instrument(daemon)
                self.daemon = daemon.start()
                self.fio.disarm()
                self._wrap_served(self.daemon)
                self.kubelet_register()
                return
            except (Exception, Killed) as exc:  # logged by the daemon; the pod restarts
                last = exc
                self.log.append(f"agent start {attempt + 1} failed: {type(exc).__name__}: {exc}")
                if daemon is not None:
                    _stop(daemon)
        raise RuntimeError(f"the agent does not start: {last}")

    def api_client(self):
        """A client of the node's API server, its own (an agent process's): one the server's stop
        does not close, so an agent started during an outage finds the server once it is back."""
        from dra_bridge.apiclient.client import plain_http_client

        return plain_http_client(self.api_url)

    def _instrument(self, daemon: Daemon) -> None:
        """The agent's in-process locks the scheduler sees; its publisher without real sleeps."""
        s = self.sched
        daemon._lock = SchedLock(s, "agent: resync lock")
        daemon._bind_lock = SchedLock(s, "agent: bind lock")
        daemon.driver.prepared.lock = SchedRLock(s, "plugin: driver lock")
        # one driver call at a time here: the scheduler does not see the GPU locks and the shared node lock
        daemon.plugin._driver_lock = SchedLock(s, "plugin: gRPC lock")
        daemon.node_lock = SchedNodeLock(self.env, daemon.node_lock.command, s)
        daemon.publisher.sleep = lambda _s: None  # backoff and Retry-After: the order matters, not the wait
        daemon.publisher.rand = random.Random(self.rng.random()).random
        daemon.publisher.timeout = 2.0
        daemon.health.clock = self.health_clock  # the quiet period passes when a step says so

    def _wrap_served(self, daemon: Daemon) -> None:
        """What the plugin's gRPC threads call: a kill there ends the call as the kubelet would see a
        dead plugin end it (an error), not as a hung server thread."""
        for name in ("prepare", "unprepare"):
            inner = getattr(daemon.driver, name)

            def served(claims, inner=inner):
                try:
                    return inner(claims)
                except (Killed, Aborted) as exc:
                    raise RuntimeError(f"the agent died ({exc})") from None

            setattr(daemon.driver, name, served)

    def stop_daemon(self) -> None:
        """The process ends (a kill: nothing is cleaned up but the sockets the kernel frees)."""
        self.kubelet_disconnect()
        if self.daemon is not None:
            _stop(self.daemon)
            self.daemon = None

    @property
    def dead(self) -> bool:
        return self.fio is not None and self.fio.dead

    def restart_daemon(self, arm=None) -> None:
        self.start_daemon(arm=arm)
        self.kubelet_reprepare()

    def resync(self, force: bool = True) -> str | None:
        """One resync; its error text, if any (the daemon logs and retries)."""
        try:
            self.daemon.resync(force=force)
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:300]}"

    # ------------------------------------------------------------------ the kubelet
    def kubelet_register(self) -> None:
        """The kubelet's plugin watcher finds the registration socket, asks GetInfo and dials the endpoint."""
        self.kubelet_disconnect()
        reg = self.paths.registration_socket
        if not reg.exists():
            self.log.append("kubelet: no registration socket; the plugin is unknown to it")
            return
        try:
            info, refused = dra_client.register_plugin(reg, lambda i: None, timeout=30.0, protos=protos)
        except grpc.RpcError as exc:
            self.log.append(f"kubelet: registration failed: {exc.code()}")
            return
        self.client = DraClient(info.endpoint, "v1", RPC_TIMEOUT)

    @staticmethod
    def wait_for(event, timeout: float) -> bool:
        """Whether ``event()`` came true within ``timeout`` seconds (what an agent's own thread does)."""
        import time

        deadline = time.monotonic() + timeout
        while not event():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def kubelet_disconnect(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def new_claim(self, devices: list[str], *, first_available: bool = False, name: str | None = None,
                  requests: list[str] | None = None, binding: dict[str, dict] | None = None) -> Claim:
        """A claim allocated ``devices``; ``binding``: device -> the binding conditions the scheduler copies
        into its allocation result (``bindingConditions``, ``bindingFailureConditions``) from the slice."""
        if name is None:
            self.serial += 1
            name = f"claim-{self.serial}"
        requests = requests or [f"gpu{i}" for i in range(len(devices))]
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
                                            "device": d, **(binding or {}).get(d, {})} for r, d in results]},
                   "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                       {"key": "metadata.name", "operator": "In", "values": [self.node.node]}]}]}}}}
        valid = all(_dns_label(r) for r in requests)
        stored = self.srv.add(obj, validate=valid)  # a hostile allocation is stored as a buggy server would
        ref = ClaimRef(namespace=NAMESPACE, name=name, uid=stored["metadata"]["uid"])
        return Claim(ref=ref, devices=list(devices), requests=[r for r, _ in results])

    def _call(self, verb: str, ref: ClaimRef) -> tuple[bool, str | None, list]:
        """One gRPC call to the plugin: (reached, error, devices answered)."""
        if self.client is None:
            return False, "the plugin is not registered with the kubelet", []
        arg = {"namespace": ref.namespace, "uid": ref.uid, "name": ref.name}
        self.sched.begin_rpc()
        try:
            if verb == "prepare":
                ans = self.client.prepare([arg]).get(ref.uid, {"error": "no answer for the claim", "devices": []})
                return True, ans["error"] or None, ans["devices"]
            err = self.client.unprepare([arg]).get(ref.uid, "no answer for the claim")
            return True, err or None, []
        except grpc.RpcError as exc:
            return False, f"gRPC {exc.code().name}: {exc.details()}", []
        finally:
            self.sched.end_rpc()

    def prepare(self, claim: Claim) -> str | None:
        """NodePrepareResources for one claim; the error, if any. The kubelet retries a failed one."""
        reached, err, devices = self._call("prepare", claim.ref)
        if err is None:
            self.prepared[claim.ref.uid] = claim
            self.told[claim.ref.uid] = self.boot_id()
            self.pending.pop(claim.ref.uid, None)
            self._supersede(claim)
            answered = sorted((tuple(d["request_names"]), d["device_name"]) for d in devices)
            self.log.append(f"prepared {claim.ref.name} ({claim.ref.uid[:8]}): {answered}")
        else:
            self.pending[claim.ref.uid] = claim
            self.prepared.pop(claim.ref.uid, None)
            self.told.pop(claim.ref.uid, None)
            self.log.append(f"prepare {claim.ref.name} ({claim.ref.uid[:8]}) refused: {err[:400]}")
        return err

    def _supersede(self, claim: Claim) -> None:
        """A prepared claim the API server holds under its name owns the name's metadata path: every
        other claim ever prepared under that name has lost it (claimfiles.write_metadata)."""
        uids = self.named.setdefault((claim.ref.namespace, claim.ref.name), set())
        stored = self.srv.get_object("resourceclaims", claim.ref.name, claim.ref.namespace)
        if stored is not None and stored["metadata"]["uid"] == claim.ref.uid:
            self.superseded |= uids - {claim.ref.uid}
        uids.add(claim.ref.uid)

    def unprepare(self, claim: Claim) -> str | None:
        """NodeUnprepareResources: the pod is going; the kubelet retries until it succeeds."""
        self.prepared.pop(claim.ref.uid, None)
        self.told.pop(claim.ref.uid, None)
        self.pending.pop(claim.ref.uid, None)
        self.terminating[claim.ref.uid] = claim
        reached, err, _ = self._call("unprepare", claim.ref)
        if err is None:
            self.terminating.pop(claim.ref.uid, None)
            stored = self.srv.get_object("resourceclaims", claim.ref.name, NAMESPACE)
            if stored is not None and stored["metadata"]["uid"] == claim.ref.uid:  # not a re-created namesake
                self.srv.remove("resourceclaims", claim.ref.name, NAMESPACE)
        self.log.append(f"unprepare {claim.ref.name} ({claim.ref.uid[:8]}): {(err or 'ok')[:400]}")
        return err

    def kubelet_reprepare(self, order: int = 0) -> list[str]:
        """After the agent (or the node) restarts, the kubelet prepares its pods' claims again and
        unprepares those of pods that are going; the unprepares that failed. ``order`` (not 0): in
        an order drawn from it, prepares and unprepares mixed (the kubelet's pod workers run in
        parallel: any order is possible)."""
        acts = [("prepare", c) for c in list(self.prepared.values()) + list(self.pending.values())]
        acts += [("unprepare", c) for c in self.terminating.values()]
        if order:
            random.Random(order).shuffle(acts)
            self.log.append("kubelet retries in order: " + ", ".join(f"{v} {c.ref.name}" for v, c in acts))
        failed = []
        for verb, claim in acts:
            if verb == "prepare":
                self.prepare(claim)
            elif err := self.unprepare(claim):
                failed.append(f"unprepare of {claim.ref.name} ({claim.ref.uid[:8]}): {err[:300]}")
        return failed

    def claims_by_name(self) -> list[Claim]:
        """Every claim the kubelet knows, in a stable order."""
        known = {**self.pending, **self.terminating, **self.prepared}
        return sorted(known.values(), key=lambda c: (c.ref.name, c.ref.uid))

    # ------------------------------------------------------------------ an admin
    def vgpuctl_main(self, command: str, *extra: str) -> tuple[int, str, str]:
        """``vgpuctl --simulate --sim-dir <host> --libvirt-uri ... <command> ...`` (its own transport)."""
        out, err = iolib.StringIO(), iolib.StringIO()
        argv = ["--simulate", "--sim-dir", str(self.node.root), "--libvirt-uri", self.libvirt_uri, command]
        if command in ("apply", "plan"):
            argv += ["-f", str(self.base / "layouts.yaml")]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = vgpuctl(argv + list(extra))
        return code, out.getvalue(), err.getvalue()

    def vgpuctl_with(self, io: FaultIO, command: str, *extra: str, redirect: bool = True) -> tuple[int, str, str]:
        """``vgpuctl <command>`` as :func:`vgpuctl.main.main` runs it (its parser, its command, its exit
        codes), on this node through ``io``: the campaign's transport, so it can be killed, fail, or
        run beside the agent (on the main thread: it handles SIGINT/SIGTERM). ``redirect=False``: the
        caller has set ``sys.stdout`` and ``sys.stderr`` (a concurrent step's per-thread streams)."""
        from vgpuctl.cli.host import Host
        from vgpuctl.main import build_parser, error_lines, exit_code

        argv = [command] + (["-f", str(self.base / "layouts.yaml")] if command in ("apply", "plan") else []) + list(extra)
        env, node, kubelet, root = self.env, self.node.node, self.paths.kubelet_root, self.node.root
        out = iolib.StringIO() if redirect else None
        err = Stderr(self.sched, self.env.state_root / "node.lock") if redirect else None
        with contextlib.redirect_stdout(out) if redirect else contextlib.nullcontext(), \
                contextlib.redirect_stderr(err) if redirect else contextlib.nullcontext():
            try:
                args = build_parser(command).parse_args(argv)
                args.simulated = lambda a: Host(env=env, io=io, node=node, kubelet_root=kubelet, preset="campaign",
                                                sim_root=root)
                code = args.func(args)
            except SystemExit as exc:
                code = int(exc.code or 0)
            except Exception as exc:  # noqa: BLE001 - main's edge
                for line in error_lines(exc):
                    print(line, file=sys.stderr)
                code = exit_code(exc)
            texts = (out.getvalue(), err.getvalue()) if redirect else (_text(sys.stdout), _text(sys.stderr))
        return code, *texts

    # ------------------------------------------------------------------ faults
    def kill_during(self, action, after: int, *, torn: bool = False, match: str | None = None) -> bool:
        """Run ``action`` with the agent's death armed at its write ``after``; True when it died."""
        self.fio.kill_after(after, torn=torn, match=match)
        try:
            action()
        except Killed:
            pass
        self.fio.disarm()
        return self.fio.dead

    def reboot(self, *, power_loss: bool = False, first: list[Claim] | None = None, order: int = 0) -> list[str]:
        """A cold boot: the kernel forgets every vGPU and VF, tmpfs (/var/run/cdi) is empty, the agent
        and every VM are gone; with ``power_loss``, writes no fsync made durable may be lost too.
        The agent starts again and the kubelet prepares its pods' claims (``first``: new pods' claims
        before them)."""
        self.stop_daemon()
        if power_loss:
            lost = self.disk.power_loss(self.rng)
            self.log.append(f"power loss: {len(lost)} un-synced writes lost: {', '.join(lost[:6])}")
        else:
            self.disk.synced()
        self.node.host.reboot()
        self.vms.clear()
        shutil.rmtree(self.paths.cdi_root, ignore_errors=True)
        self.start_daemon()
        for claim in first or []:
            self.prepare(claim)
        return self.kubelet_reprepare(order)


def _stop(daemon: Daemon) -> None:
    with contextlib.suppress(Exception):
        daemon.plugin.stop(grace=0)
    with contextlib.suppress(Exception):
        daemon.publisher.close()
    with contextlib.suppress(Exception):
        daemon.api_client.close()


def _text(stream) -> str:
    getvalue = getattr(stream, "text", None) or getattr(stream, "getvalue", None)
    return getvalue() if getvalue else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dns_label(value: str) -> bool:
    from dra_bridge.api.k8sname import is_dns_label

    return all(is_dns_label(p) for p in value.split("/"))
