"""The campaign's steps: what admins, the kubelet, the scheduler, the kernel and fate do to a node.

Each step is a frozen dataclass (its ``repr`` is the line a failing sequence prints) with a
``run(world)`` that returns what to check afterwards (:class:`Checks`). Choices that depend
on the node's state at run time (which device, which claim) are drawn as plain integers and
taken modulo what exists then, so every drawn sequence is runnable and shrinks well.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from hypothesis import strategies as st

from dra_bridge.rpc.types import ClaimRef
from mdev_manager.host.io import link_name
from mdev_manager.sim.kernel import SimHost
from tests.campaign.faults import KERNEL_ERRNOS
from tests.campaign.world import World


@dataclass
class Checks:
    """What a step leaves behind to be checked beyond the invariants that always hold."""

    settled: str | None = None  # a layout just applied with no fault: its vgpu GPUs' definitions match devices
    labels: bool = False  # the last act was a clean resync: the labels must tell the truth
    apply_code: int | None = None  # a hand-run apply's exit status
    apply_layout: str | None = None


def _pick(items: list, n: int):
    return items[n % len(items)] if items else None


def _devices(world: World) -> list[str]:
    return [d.name for d in world.daemon._pool.devices]


def _resynced(world: World, what: str, layout: str) -> Checks:
    """One resync of the agent; a clean one must leave true labels and ``layout`` applied."""
    err = world.resync()
    world.log.append(f"{what}: {err or 'ok'}")
    return Checks(labels=err is None, settled=layout if err is None else None)


# --------------------------------------------------------------------------- the agent and admins


@dataclass(frozen=True)
class Resync:
    def run(self, world: World) -> Checks:
        return _resynced(world, "resync", world.selected)


@dataclass(frozen=True)
class SelectLayout:
    """The admin labels the node with another layout (vgpu-device-manager style); the agent resyncs."""

    name: str

    def run(self, world: World) -> Checks:
        from kubernetes import client

        from dra_bridge.api.names import LABEL_CONFIG

        client.CoreV1Api(world.srv.api_client()).patch_node(
            world.node.node, {"metadata": {"labels": {LABEL_CONFIG: self.name}}})
        world.selected = self.name
        return _resynced(world, f"resync on layout {self.name}", self.name)


@dataclass(frozen=True)
class EditLayout:
    """The admin edits one layout of the mounted ConfigMap; the agent resyncs."""

    name: str
    entries: tuple

    def run(self, world: World) -> Checks:
        world.layouts[self.name] = json.loads(json.dumps(list(self.entries)))
        world.write_layouts()
        return _resynced(world, f"resync after editing {self.name}", world.selected)


@dataclass(frozen=True)
class HandApply:
    """An admin runs ``vgpuctl apply`` by hand on the node where the agent runs."""

    name: str

    def run(self, world: World) -> Checks:
        code, out, err = world.hand_apply(self.name)
        world.log.append(f"vgpuctl apply --layout {self.name}: exit {code}\n{out}{err}")
        return Checks(apply_code=code, apply_layout=self.name, settled=self.name if code in (0, 3) else None)


@dataclass(frozen=True)
class TwoApplies:
    a: str
    b: str

    def run(self, world: World) -> Checks:
        codes = world.two_applies(self.a, self.b)
        world.log.append(f"two applies ({self.a}, {self.b}): exit {codes}")
        # the one that ran second decided what the node looks like: its code is the verdict
        return Checks(apply_code=max(codes) if 1 in codes else None)


# --------------------------------------------------------------------------- the kubelet and scheduler


@dataclass(frozen=True)
class Prepare:
    """The scheduler allocates devices to a new claim (from what the node publishes) and the kubelet
    prepares it. ``overlap``: one device is also another prepared claim's (a scheduler race, a
    force-deleted pod); ``first_available``: the claim's requests are firstAvailable sub-requests."""

    picks: tuple[int, ...]
    overlap: bool = False
    first_available: bool = False

    def run(self, world: World) -> Checks:
        names = _devices(world)
        if not names:
            world.log.append("prepare: nothing published")
            return Checks()
        devices = [_pick(names, p) for p in self.picks]
        held = [d for c in world.prepared.values() for d in c.devices]
        if self.overlap and held:
            devices[0] = _pick(held, self.picks[0])
        devices = list(dict.fromkeys(devices))  # a claim never lists one device twice
        world.prepare(world.new_claim(devices, first_available=self.first_available))
        return Checks()


@dataclass(frozen=True)
class Unprepare:
    """A pod goes: the kubelet unprepares its claim and the claim is deleted."""

    pick: int

    def run(self, world: World) -> Checks:
        claim = _pick(sorted(world.prepared.values(), key=lambda c: c.ref.name), self.pick)
        if claim is not None:
            world.unprepare(claim)
        return Checks()


@dataclass(frozen=True)
class KubeletRetry:
    """The kubelet retries what failed: prepares of starting pods, unprepares of going ones."""

    def run(self, world: World) -> Checks:
        for claim in list(world.pending.values()):
            world.prepare(claim)
        for claim in list(world.terminating.values()):
            world.unprepare(claim)
        return Checks()


HOSTILE = ("../../../../etc", "/etc/passwd", "a/../../b", "..", "x" * 300, "UPPER", "a\nb", "", "a b")


@dataclass(frozen=True)
class HostileClaim:
    """The kubelet asks to prepare a claim whose identity is not a Kubernetes name (a bug, an attacker)."""

    part: str  # namespace | name | uid
    value: str

    def run(self, world: World) -> Checks:
        ref = {"namespace": "vms", "name": "evil", "uid": world.uid()}
        ref[self.part] = self.value
        res = world.daemon.driver.prepare([ClaimRef(**ref)])
        world.log.append(f"hostile {self.part}={self.value!r}: {list(res.values())[0].error}")
        (answer,) = res.values()
        if answer.error is None:
            world.log.append("VIOLATION: a claim with a hostile identity was prepared")
        return Checks()


# --------------------------------------------------------------------------- VMs


@dataclass(frozen=True)
class VmStart:
    """A VM (QEMU) opens a vGPU's or a passed-through GPU's vfio group, as KubeVirt's launcher does."""

    pick: int

    def run(self, world: World) -> Checks:
        inv = world.daemon.inventory if world.daemon.inventory else None
        from mdev_manager.discovery import discover

        inv = discover(world.env, world.node.io)
        targets = [(v.id, (world.env.mdev_devices / v.id) if v.framework == "mdev" else world.env.pci(v.id))
                   for v in inv.all_vgpus()]
        targets += [(g.address, world.env.pci(g.address)) for g in inv.gpus if g.driver == "vfio-pci"]
        held = set(world.vms.values())
        targets = [t for t in targets if t[0] not in held]
        target = _pick(targets, self.pick)
        if target is None:
            return Checks()
        group = link_name(world.node.io, target[1] / "iommu_group")
        try:
            pid = world.node.host.spawn_holder([world.env.vfio_group(group)], comm="qemu-kvm")
        except FileNotFoundError:
            world.log.append(f"vm on {target[0]}: no /dev/vfio/{group}")
            return Checks()
        world.vms[pid] = target[0]
        world.log.append(f"vm {pid} holds {target[0]} (group {group})")
        return Checks()


@dataclass(frozen=True)
class VmStop:
    pick: int

    def run(self, world: World) -> Checks:
        pid = _pick(sorted(world.vms), self.pick)
        if pid is not None:
            world.node.host.kill(pid)
            world.log.append(f"vm {pid} off {world.vms.pop(pid)}")
        return Checks()


# --------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class KillAgent:
    """``kill -9`` of the agent at its write ``after``, during a prepare, an unprepare or a resync;
    the DaemonSet restarts it and the kubelet prepares its pods' claims again."""

    during: str  # prepare | unprepare | resync
    after: int
    pick: int

    def run(self, world: World) -> Checks:
        if self.during == "prepare":
            names = _devices(world)
            if names:
                claim = world.new_claim([_pick(names, self.pick)])
                world.pending[claim.ref.uid] = claim  # the kubelet asked; it retries until answered
                world.kill_during(self.after, lambda: world.prepare(claim))
        elif self.during == "unprepare":
            claim = _pick(sorted(world.prepared.values(), key=lambda c: c.ref.name), self.pick)
            if claim is not None:
                world.kill_during(self.after, lambda: world.unprepare(claim))
        else:
            world.kill_during(self.after, world.daemon.resync)
        world.kill_daemon_and_restart()
        return Checks()


@dataclass(frozen=True)
class KillApply:
    """``kill -9`` of a hand-run ``vgpuctl apply`` at its write ``after`` (the agent keeps running)."""

    name: str
    after: int

    def run(self, world: World) -> Checks:
        from dra_bridge.kubeletplugin.checkpoint import CheckpointStore
        from mdev_manager.config import load_config
        from mdev_manager.host.lock import NodeLock
        from mdev_manager.reconcile import reconcile
        from tests.campaign.faults import FaultIO, Killed

        fio = FaultIO(SimHost(world.node.root))
        layouts = load_config(world.base / "layouts.yaml", self.name)
        fio.kill_after(self.after)
        try:  # what `vgpuctl apply` does: the node lock, claims in use from the checkpoint, reconcile
            with NodeLock(world.env, "vgpuctl apply (campaign)").hold():
                usage = CheckpointStore(world.paths.checkpoint, fio).load().usage()
                reconcile(world.env, fio, layouts, usage_extra=usage, node=world.node.node)
            world.log.append(f"apply {self.name} finished before write {self.after}")
            return Checks()
        except Killed:
            world.log.append(f"apply {self.name} killed before write {self.after}")
            return Checks()


@dataclass(frozen=True)
class Reboot:
    def run(self, world: World) -> Checks:
        world.reboot()
        world.log.append("rebooted")
        return Checks()


CORRUPTIONS = ("empty", "truncated", "random", "checksum", "null", "list", "directory", "version")


@dataclass(frozen=True)
class CorruptCheckpoint:
    """The checkpoint is damaged (a full disk, a bad sector, a hand edit); the agent restarts."""

    kind: str

    def run(self, world: World) -> Checks:
        import shutil

        path = world.paths.checkpoint
        text = path.read_text() if path.is_file() else '{"checksum": "", "data": {"version": 3, "claims": {}}}'
        world.stop_daemon()
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.kind == "directory":
            path.mkdir()
        else:
            doc = json.loads(text)
            bad = {"empty": "", "truncated": text[: len(text) // 2], "null": "null", "list": "[1, 2]",
                   "random": "".join(chr(random.Random(len(text)).randrange(32, 127)) for _ in range(64)),
                   "checksum": json.dumps({**doc, "checksum": "0" * 64}),
                   "version": json.dumps({**doc, "data": {**doc["data"], "version": 99}})}[self.kind]
            path.write_text(bad)
        world.start_daemon()
        world.kubelet_reprepare()
        world.log.append(f"checkpoint corrupted ({self.kind}); agent restarted")
        return Checks()


@dataclass(frozen=True)
class KernelFault:
    """The kernel refuses one write (``errno``) during the agent's next prepare, unprepare or resync."""

    errno: str
    during: str
    after: int
    pick: int

    def run(self, world: World) -> Checks:
        world.fio.fail_kernel(self.after, KERNEL_ERRNOS[self.errno])
        if self.during == "prepare":
            names = _devices(world)
            if names:
                world.prepare(world.new_claim([_pick(names, self.pick)]))
        elif self.during == "unprepare":
            claim = _pick(sorted(world.prepared.values(), key=lambda c: c.ref.name), self.pick)
            if claim is not None:
                world.unprepare(claim)
        else:
            world.log.append(f"resync: {world.resync() or 'ok'}")
        world.log.append(f"kernel fault {self.errno}: {world.fio.failed[-1:] or 'not reached'}")
        world.fio.disarm()
        return Checks()


@dataclass(frozen=True)
class ApiFault:
    """The API server fails the next request(s) of a kind (conflicts, 5xx, throttling) during a resync
    or a prepare."""

    verb: str | None
    resource: str | None
    status: int
    times: int
    during: str
    pick: int

    def run(self, world: World) -> Checks:
        world.srv.inject(self.verb, self.resource, self.status, self.times)
        try:
            if self.during == "prepare":
                names = _devices(world)
                if names:
                    world.prepare(world.new_claim([_pick(names, self.pick)]))
            else:
                world.log.append(f"resync: {world.resync() or 'ok'}")
        finally:
            world.srv.clear_injections()
        return Checks()


# --------------------------------------------------------------------------- strategies


def layout_names(layouts: dict) -> list[str]:
    return sorted(layouts)


def steps(layouts: list[str], edit: st.SearchStrategy):
    """``step(position)``: the strategy of an episode's step number ``position``.

    Kinds are weighted as a busy node sees them: mostly claims, resyncs and layout changes, a
    fault every few steps. The kind is drawn as an index rotated by the position, so hypothesis's
    simplest example (all draws zero, which it tries first) is a sweep over every kind, not
    fifty resyncs."""
    name = st.sampled_from(layouts)
    n = st.integers(0, 1000)
    during = st.sampled_from(["prepare", "unprepare", "resync"])
    kinds: list[tuple[int, st.SearchStrategy]] = [
        (6, st.builds(Resync)),
        (14, st.builds(Prepare, st.lists(n, min_size=1, max_size=2).map(tuple), st.booleans(), st.booleans())),
        (8, st.builds(Prepare, st.tuples(n))),
        (10, st.builds(Unprepare, n)),
        (7, st.builds(SelectLayout, name)),
        (4, edit),
        (6, st.builds(HandApply, name)),
        (3, st.builds(TwoApplies, name, name)),
        (4, st.builds(KubeletRetry)),
        (6, st.builds(VmStart, n)),
        (4, st.builds(VmStop, n)),
        (6, st.builds(KillAgent, during, st.integers(0, 12), n)),
        (4, st.builds(KillApply, name, st.integers(0, 30))),
        (3, st.builds(Reboot)),
        (3, st.builds(CorruptCheckpoint, st.sampled_from(CORRUPTIONS))),
        (6, st.builds(KernelFault, st.sampled_from(sorted(KERNEL_ERRNOS)), during, st.integers(0, 6), n)),
        (5, st.builds(ApiFault, st.sampled_from([None, "create", "update", "get", "list", "patch"]),
                      st.sampled_from([None, "resourceslices", "resourceclaims", "nodes"]),
                      st.sampled_from([409, 429, 500, 503]), st.integers(1, 3), st.sampled_from(["prepare", "resync"]),
                      n)),
        (3, st.builds(HostileClaim, st.sampled_from(["namespace", "name", "uid"]), st.sampled_from(HOSTILE))),
    ]
    table = [strategy for weight, strategy in kinds for _ in range(weight)]
    stride = 31  # prime to len(table) (107): the zero example visits every kind

    def step(position: int) -> st.SearchStrategy:
        return st.integers(0, len(table) - 1).flatmap(lambda i: table[(i + position * stride) % len(table)])

    return step
