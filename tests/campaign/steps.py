"""The campaign's steps: what admins, the kubelet, the scheduler, the kernel, the disk and fate do to
a node.

Each step is a frozen dataclass (its ``repr`` is the line a failing sequence prints) with a
``run(world)`` that returns what to check afterwards (:class:`Checks`). Choices that depend on the
node's state at run time (which device, which claim) are drawn as plain integers and taken modulo
what exists then, so every drawn sequence is runnable and shrinks well.

GPU removal is :class:`tests.campaign.gone.GpuGone` (the first, middle or last GPU off the bus and
back, applied by hand by index while the agent is stopped).
"""

from __future__ import annotations

import contextlib
import hashlib
import io as iolib
import json
import os
import random
import re
import shutil
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from hypothesis import strategies as st

from dra_bridge.api.names import DEFAULT_DRIVER, LABEL_CONFIG
from dra_bridge.rpc.types import ClaimRef
from mdev_manager.host.io import link_name
from tests.campaign.faults import DISK_ERRNOS, KERNEL_ERRNOS, Killed
from tests.campaign.sched import Actor, SchedNodeLock, Stderr
from tests.campaign.world import NAMESPACE, Claim, Holder, World


@dataclass
class Checks:
    """What a step leaves behind to be checked beyond the invariants that always hold."""

    settled: str | None = None  # a layout just applied with no fault: its vgpu GPUs' definitions match devices
    labels: bool = False  # the last act was a clean resync: the labels must tell the truth
    apply_code: int | None = None  # a hand-run apply's exit status, judged against the node
    apply_layout: str | None = None
    problems: list[str] = field(default_factory=list)  # what the step itself found wrong


def _pick(items: list, n: int):
    return items[n % len(items)] if items else None


def _devices(world: World) -> list[str]:
    return sorted(d.name for d in world.daemon._pool.devices)


def _prepared(world: World) -> list[Claim]:
    return sorted(world.prepared.values(), key=lambda c: (c.ref.name, c.ref.uid))


def _resynced(world: World, what: str, layout: str, force: bool = True) -> Checks:
    """One resync of the agent; a clean one must leave true labels and ``layout`` applied. The
    campaign's layouts are all valid: the agent rejecting one is a violation (with the reason)."""
    err = world.resync(force=force)
    world.log.append(f"{what}: {err or 'ok'}")
    if err is not None and err.startswith("ConfigError"):
        return Checks(problems=[f"the agent rejected layout {world.selected}: {_rejection(world, world.selected)}"])
    # a periodic resync may stop at an unchanged fingerprint (by design: a VM's start or stop is not in it)
    clean = err is None and force
    return Checks(labels=clean, settled=layout if clean else None)


def _rejection(world: World, name: str) -> str:
    """Why the node manager rejects layout ``name`` on the node as it is (a dry run)."""
    from mdev_manager.config import ConfigError, load_config
    from mdev_manager.reconcile import reconcile

    try:
        reconcile(world.env, world.node.io, load_config(world.base / "layouts.yaml", name), dry_run=True,
                  node=world.node.node)
    except ConfigError as exc:
        return "; ".join(exc.problems)[:600]
    return "(the dry run accepts it now)"


def _label(world: World, name: str) -> None:
    from kubernetes import client

    client.CoreV1Api(world.srv.api_client()).patch_node(world.node.node, {"metadata": {"labels": {LABEL_CONFIG: name}}})
    world.selected = name


# --------------------------------------------------------------------------- the agent and admins


@dataclass(frozen=True)
class Resync:
    force: bool = True  # False: the periodic loop's resync, which may find nothing changed and stop

    def run(self, world: World) -> Checks:
        return _resynced(world, f"resync (force={self.force})", world.selected, self.force)


@dataclass(frozen=True)
class SelectLayout:
    """The admin labels the node with another layout (vgpu-device-manager style); the agent resyncs."""

    name: str

    def run(self, world: World) -> Checks:
        _label(world, self.name)
        return _resynced(world, f"resync on layout {self.name}", self.name)


@dataclass(frozen=True)
class EditLayout:
    """The admin edits one layout of the mounted ConfigMap; the agent resyncs. With ``selected`` the
    edit is to the layout the node runs (``name`` where that is ``dra``): what a domain or a VM holds
    there must stay (issue 29), drawn often enough that CI's seeds get there (issue 36)."""

    name: str
    entries: tuple
    selected: bool = False

    def target(self, world: World) -> str:
        return world.selected if self.selected and world.selected in world.layouts and world.selected != "dra" \
            else self.name

    def run(self, world: World) -> Checks:
        name = self.target(world)
        world.layouts[name] = json.loads(json.dumps(list(self.entries)))
        world.write_layouts()
        return _resynced(world, f"resync after editing {name}", world.selected)


def _node_digest(world: World) -> str:
    """What plan must leave as it found it: the kernel's devices and bindings, the saved state."""
    h = hashlib.sha256()
    roots = [world.env.mdevctl_root, world.env.state_root, world.paths.data_dir]
    for root in roots:
        for top, dirs, names in os.walk(root):
            dirs.sort()
            for n in sorted(names):
                p = os.path.join(top, n)
                if n in ("node.lock", "dra.sock") or p.endswith(".sock"):
                    continue
                h.update(p.encode())
                with contextlib.suppress(OSError):
                    h.update(Path(p).read_bytes())
    from mdev_manager.discovery import discover

    h.update(discover(world.env, world.node.io).model_dump_json().encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Admin:
    """An admin runs ``vgpuctl apply``, ``plan`` or ``restore`` by hand (``vgpuctl.main.main``) on the
    node where the agent runs."""

    command: str  # apply | plan | restore
    name: str

    def run(self, world: World) -> Checks:
        before = _node_digest(world) if self.command == "plan" else None
        extra = ("--layout", self.name) if self.command in ("apply", "plan") else ()
        code, out, err = world.vgpuctl_main(self.command, *extra)
        world.log.append(f"vgpuctl {self.command} {' '.join(extra)}: exit {code}\n{out[-3000:]}{err[-2000:]}")
        if self.command == "apply":
            return Checks(apply_code=code, apply_layout=self.name, settled=self.name if code in (0, 3) else None)
        problems = []
        if code != 0:
            problems.append(f"vgpuctl {self.command} exited {code} on a healthy node: {err.strip()[-500:]}")
        if before is not None and _node_digest(world) != before:
            problems.append("vgpuctl plan changed the node")
        return Checks(problems=problems)


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
        claim = _new_claim(world, self.picks, self.overlap, self.first_available)
        if claim is not None:
            world.prepare(claim)
        return Checks()


def _free_devices(world: World) -> list[str]:
    """Published devices no claim the kubelet knows holds, on GPUs none of them passes through."""
    held = [d for c in _prepared(world) for d in c.devices]
    whole = {n.split("-passthrough")[0] for n in held if n.endswith("-passthrough")}
    return [n for n in _devices(world) if n not in held and not any(n.startswith(w + "-") for w in whole)]


def _new_claim(world: World, picks: tuple[int, ...], overlap: bool = False, first_available: bool = False,
               name: str | None = None, free: bool = False) -> Claim | None:
    names = _free_devices(world) if free else _devices(world)
    held = [d for c in _prepared(world) for d in c.devices]
    if not names:
        world.log.append("prepare: nothing published")
        return None
    devices = [_pick(names, p) for p in picks]
    if overlap and held:
        devices[0] = _pick(held, picks[0])
    devices = list(dict.fromkeys(devices))  # a claim never lists one device twice
    return world.new_claim(devices, first_available=first_available, name=name)


def _checkpoint(world: World):
    from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore

    try:
        return CheckpointStore(world.paths.checkpoint, world.node.io).load()
    except CheckpointCorrupt:
        return None


def _record(world: World, uid: str):
    cp = _checkpoint(world)
    return cp.claims.get(uid) if cp else None


def unprepare_checked(world: World, claim: Claim) -> list[str]:
    """Unprepare ``claim``; a failure while nothing holds its devices (no VM has them open) is a
    claim the kubelet can never let go of: its pod stays terminating. Only where no fault is injected."""
    rec = _record(world, claim.ref.uid)
    ids = {d.vgpu_id or d.gpu for d in rec.devices} if rec else set()
    err = world.unprepare(claim)
    if err and not any(h.device in ids for h in world.vms.values()):
        return [f"unprepare of {claim.ref.name} ({claim.ref.uid[:8]}) failed while nothing holds its devices "
                f"{sorted(ids)}: {err[:300]}"]
    return []


@dataclass(frozen=True)
class Unprepare:
    """A pod goes: the kubelet unprepares its claim and the claim is deleted."""

    pick: int

    def run(self, world: World) -> Checks:
        claim = _pick(_prepared(world), self.pick)
        return Checks(problems=unprepare_checked(world, claim) if claim is not None else [])


@dataclass(frozen=True)
class KubeletRetry:
    """The kubelet retries what failed: prepares of starting pods, unprepares of going ones."""

    def run(self, world: World) -> Checks:
        for claim in list(world.pending.values()):
            world.prepare(claim)
        problems = []
        for claim in list(world.terminating.values()):
            problems += unprepare_checked(world, claim)
        return Checks(problems=problems)


@dataclass(frozen=True)
class KubeletRestart:
    """The kubelet restarts: it registers the plugin again and

    * ``reprepare``: prepares its pods' claims again (and unprepares those of going pods);
    * ``forget``: lost its state: claims of pods already going are never unprepared (their API
      objects are garbage-collected), running pods' claims are prepared again;
    * ``unknown``: unprepares claims it never prepared (a made-up uid, a claim whose prepare failed);
    * ``wipe``: finds ``plugins_registry`` wiped (the plugin's registration socket gone): it makes the
      directory again as it starts, the plugin's socket keeper serves the socket there again, and the
      kubelet's plugin watcher registers the plugin once it is there (until then a kubelet call fails:
      the plugin is not registered)."""

    kind: str
    pick: int = 0

    def run(self, world: World) -> Checks:
        if self.kind == "wipe":
            shutil.rmtree(world.paths.registration_dir, ignore_errors=True)
            world.paths.registration_dir.mkdir(parents=True)  # the kubelet's own directory, made as it starts
            if not world.wait_for(world.paths.registration_socket.exists, 60.0):
                return Checks(problems=["the registration socket was not served again 60 s after plugins_registry "
                                        "was wiped"])
        if self.kind == "forget":
            for uid, claim in list(world.terminating.items()):
                del world.terminating[uid]
                stored = world.srv.get_object("resourceclaims", claim.ref.name, NAMESPACE)
                if stored is not None and stored["metadata"]["uid"] == uid:
                    world.srv.remove("resourceclaims", claim.ref.name, NAMESPACE)
                world.log.append(f"kubelet forgot {claim.ref.name} ({uid[:8]}), still prepared")
        world.kubelet_register()
        if self.kind == "unknown":
            never = list(world.pending.values())
            uid = str(uuid.UUID(int=random.Random(self.pick).getrandbits(128), version=4))
            ghost = Claim(ref=ClaimRef(namespace=NAMESPACE, name=f"ghost-{self.pick % 7}", uid=uid), devices=[],
                          requests=[])
            target = _pick([ghost, *sorted(never, key=lambda c: c.ref.name)], self.pick)
            err = world.unprepare(target)
            if target is ghost and err is not None:
                return Checks(problems=[f"unprepare of a claim never prepared failed: {err}"])
            return Checks()
        world.kubelet_reprepare()
        return Checks()


@dataclass(frozen=True)
class ClaimGone:
    """A prepared claim's API object is force-deleted (its pod force-deleted) and, but for ``delete``,
    created again under the same namespace and name with a new uid, allocated free devices
    (``picks``: a GitOps controller, a user re-applying it); the kubelet prepares the new one and
    unprepares the old one: ``new-first``, ``old-first``, or ``old-later`` (the old pod lingers)."""

    pick: int
    kind: str  # new-first | old-first | old-later | delete
    picks: tuple[int, ...]

    def run(self, world: World) -> Checks:
        old = _pick(_prepared(world), self.pick)
        if old is None:
            return Checks()
        stored = world.srv.get_object("resourceclaims", old.ref.name, NAMESPACE)
        if stored is not None and stored["metadata"]["uid"] == old.ref.uid:
            world.srv.remove("resourceclaims", old.ref.name, NAMESPACE)
        world.log.append(f"claim {old.ref.name} ({old.ref.uid[:8]}) force-deleted")
        new = _new_claim(world, self.picks, name=old.ref.name, free=True) if self.kind != "delete" else None
        if new is not None:
            world.log.append(f"claim {new.ref.name} re-created as {new.ref.uid[:8]}")
        problems = []
        if self.kind in ("old-first", "delete"):
            problems += unprepare_checked(world, old)
        if new is not None:
            world.prepare(new)
        if self.kind == "new-first":
            problems += unprepare_checked(world, old)
        elif self.kind == "old-later":
            world.prepared.pop(old.ref.uid, None)
            world.told.pop(old.ref.uid, None)
            world.terminating[old.ref.uid] = old
        return Checks(problems=problems)


HOSTILE = ("escape-episode", "escape-run", "absolute-run") * 2 + ("..", "long", "UPPER", "new\nline", "", "a b")


def hostile_value(world: World, kind: str, part: str) -> str:
    """A name that is not a Kubernetes name; the escaping ones are built so that, used as a path part
    below the metadata directory, they land in the episode root or the run's directory (where the
    files invariants look), never elsewhere on the machine."""
    meta = world.paths.metadata_dir
    if kind in ("escape-episode", "escape-run", "absolute-run"):
        target = world.base if kind == "escape-episode" else world.base.parent
        if kind == "absolute-run" and part == "namespace":
            return f"{target}/hostile-{part}"
        return "x/../" + os.path.relpath(target, meta) + f"/hostile-{part}"
    return {"long": "x" * 300}.get(kind, kind)


@dataclass(frozen=True)
class HostileClaim:
    """The kubelet asks to prepare a claim whose identity is not a Kubernetes name: an API server that
    stored one unchecked (a bug, an attacker with etcd), allocated a real device. Prepare must refuse
    it before anything is made; a prepared one fails the run."""

    part: str  # namespace | name | uid
    kind: str
    pick: int

    def run(self, world: World) -> Checks:
        # a device on a GPU that no claim record holds and no claim is allocated anything of: one that clashes
        # with another claim (an overlap, a MIG placement taken) is refused for that before its identity matters
        rec = _checkpoint(world)
        used = [d.device for r in (rec.claims.values() if rec else ()) for d in r.devices]
        used += [res.get("device") or "" for c in world.srv.objects("resourceclaims")
                 for res in ((((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])]
        busy = {m.group(0) for d in used if (m := re.match(r"gpu-\d+-", d))}
        names = [n for n in _free_devices(world) if not any(n.startswith(b) for b in busy)]
        if not names:
            return Checks()
        value = hostile_value(world, self.kind, self.part)
        ns, name = NAMESPACE, "evil"
        if self.part == "namespace":
            ns = value
        elif self.part == "name":
            name = value
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
               "spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": "vgpu.kubevirt.io"}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu0", "driver": DEFAULT_DRIVER, "pool": world.node.node,
                    "device": _pick(names, self.pick)}]}}}}
        try:
            stored = world.srv.add(obj, validate=False)
        except Exception as exc:  # noqa: BLE001 - the server cannot store even that: nothing to ask
            world.log.append(f"hostile {self.part}={value!r}: not storable ({exc})")
            return Checks()
        uid = stored["metadata"]["uid"] if self.part != "uid" else value
        claim = Claim(ref=ClaimRef.model_construct(namespace=ns, name=name, uid=uid), devices=[], requests=["gpu0"])
        reached, err, _ = world._call("prepare", claim.ref)
        world.log.append(f"hostile {self.part}={value!r}: {err}")
        if err is None:
            world.hostile.append(f"{self.part}={value!r} (uid {uid})")
        with contextlib.suppress(Exception):
            world.srv.remove("resourceclaims", name, ns)
        return Checks()


# --------------------------------------------------------------------------- VMs and libvirt


def _targets(world: World) -> list[tuple[str, Path]]:
    """Devices a VM can be given: vGPUs and GPUs on vfio-pci (id, sysfs device directory)."""
    from mdev_manager.discovery import discover

    inv = discover(world.env, world.node.io)
    out = [(v.id, (world.env.mdev_devices / v.id) if v.framework == "mdev" else world.env.pci(v.id))
           for v in inv.all_vgpus()]
    out += [(g.address, world.env.pci(g.address)) for g in inv.gpus if g.driver == "vfio-pci"]
    return sorted(out)


@dataclass(frozen=True)
class VmStart:
    """A VM (QEMU) opens a vGPU's or a passed-through GPU's vfio group, as KubeVirt's launcher does, or
    (``how="cdev"``, iommufd) the device's own vfio cdev."""

    pick: int
    how: str = "group"

    def run(self, world: World) -> Checks:
        held = {h.device for h in world.vms.values()}
        target = _pick([t for t in _targets(world) if t[0] not in held], self.pick)
        if target is None:
            return Checks()
        device, sysdir = target
        path = None
        if self.how == "cdev":
            cdevs = world.node.io.listdir(sysdir / "vfio-dev")
            path = world.env.vfio_cdev_dir / cdevs[0] if cdevs else None
        if path is None:
            group = link_name(world.node.io, sysdir / "iommu_group")
            path = world.env.vfio_group(group)
        try:
            pid = world.node.host.spawn_holder([path], comm="qemu-kvm")
        except FileNotFoundError:
            world.log.append(f"vm on {device}: no {path}")
            return Checks()
        world.vms[pid] = Holder(device=device, how="cdev" if "devices" in str(path) else "group", path=str(path))
        world.log.append(f"vm {pid} holds {device} ({path})")
        return Checks()


@dataclass(frozen=True)
class VmStop:
    pick: int

    def run(self, world: World) -> Checks:
        pid = _pick(sorted(world.vms), self.pick)
        if pid is not None:
            world.node.host.kill(pid)
            world.log.append(f"vm {pid} off {world.vms.pop(pid).device}")
        return Checks()


def _claimed(world: World) -> set[str]:
    """vGPUs and GPUs the plugin's checkpoint on disk holds for claims (all of them, if it does not parse)."""
    cp = _checkpoint(world)
    if cp is None:
        return {t[0] for t in _targets(world)}
    return {d.vgpu_id or d.gpu for rec in cp.claims.values() for d in rec.devices}


@dataclass(frozen=True)
class LibvirtDefine:
    """A libvirt domain is defined with a vGPU (its mdev UUID, or its VF) or a passed-through GPU that
    the layout made: the node manager must leave it alone although no process holds it (a domain not
    running). Host libvirt is for VMs outside Kubernetes: its domains name no DRA claim's device
    (a claim's VM is KubeVirt's, in its own launcher pod: a process holding the device, :class:`VmStart`)."""

    pick: int

    def run(self, world: World) -> Checks:
        named = {d for m, p in world.domains.values() for d in [*m, *p]} | _claimed(world)
        target = _pick([t for t in _targets(world) if t[0] not in named], self.pick)
        if target is None:
            return Checks()
        world.serial += 1
        name = f"domain-{world.serial}"
        device = target[0]
        world.domains[name] = ([device], []) if "-" in device and ":" not in device else ([], [device])
        world.write_domains()
        world.log.append(f"libvirt domain {name} names {device}")
        return Checks()


@dataclass(frozen=True)
class LibvirtUndefine:
    pick: int

    def run(self, world: World) -> Checks:
        name = _pick(sorted(world.domains), self.pick)
        if name is not None:
            del world.domains[name]
            world.write_domains()
            world.log.append(f"libvirt domain {name} undefined")
        return Checks()


# --------------------------------------------------------------------------- faults


def _during(world: World, during: str, pick: int) -> None:
    """The agent does ``during``: prepare a new claim, unprepare one, resync, a binding round."""
    if during == "prepare":
        claim = _new_claim(world, (pick,))
        if claim is not None:
            world.pending[claim.ref.uid] = claim  # the kubelet asked; it retries until answered
            world.prepare(claim)
    elif during == "unprepare":
        claim = _pick(_prepared(world), pick)
        if claim is not None:
            world.unprepare(claim)
    elif during == "bind":
        world.log.append(f"bind: {_call(world.daemon.bind)}")
    else:
        world.log.append(f"resync: {world.resync() or 'ok'}")


def _call(fn) -> str:
    try:
        return f"{fn()}"
    except Exception as exc:  # noqa: BLE001 - reported, the step goes on
        return f"{type(exc).__name__}: {str(exc)[:200]}"


@dataclass(frozen=True)
class KillAgent:
    """``kill -9`` of the agent at its write ``after`` (``at="checkpoint"``: its write number ``after``
    to the checkpoint), during a prepare, an unprepare, a resync, a binding round or its start-up;
    ``torn``: the write in flight is half done. The DaemonSet restarts it and the kubelet prepares
    its pods' claims again."""

    during: str  # prepare | unprepare | resync | bind | start
    after: int
    pick: int
    torn: bool = False
    at: str = "any"  # any | checkpoint

    def run(self, world: World) -> Checks:
        match = "checkpoint.json" if self.at == "checkpoint" else None
        if self.during == "start":
            world.restart_daemon(arm=lambda fio: fio.kill_after(self.after, torn=self.torn, match=match))
            return Checks()
        died = world.kill_during(lambda: _during(world, self.during, self.pick), self.after, torn=self.torn,
                                 match=match)
        world.log.append(f"agent {'killed at ' + str(world.fio.killed_at) if died else 'not killed'}")
        world.restart_daemon()
        return Checks()


@dataclass(frozen=True)
class KillApply:
    """``kill -9`` of a hand-run ``vgpuctl apply`` at its write ``after`` (the agent keeps running);
    ``torn``: the write in flight is half done."""

    name: str
    after: int
    torn: bool = False

    def run(self, world: World) -> Checks:
        io = world.transport()
        io.kill_after(self.after, torn=self.torn)
        try:
            code, out, err = world.vgpuctl_with(io, "apply", "--layout", self.name)
            world.log.append(f"apply {self.name} finished before write {self.after}: exit {code}\n{err[-1000:]}")
            if code not in (0, 3):
                return Checks(problems=[f"vgpuctl apply exited {code}: {err.strip()[-400:]}"])
            return Checks(apply_code=code, apply_layout=self.name, settled=self.name)
        except Killed:
            world.log.append(f"apply {self.name} killed at {io.killed_at}")
            return Checks()


@dataclass(frozen=True)
class Reboot:
    """A cold boot; ``power_loss``: the power was cut, so writes no fsync made durable may be lost;
    ``evict``: the pod of one prepared claim was deleted while the node was down, so the kubelet
    unprepares that claim after the boot (its devices died with the old boot); ``first``: new pods
    are admitted as the node comes up, before the old pods' claims are prepared again, their claims
    allocated the free slots beside one of theirs (same GPU, same size; up to three): the device the
    old claim had is free on the node now, and a new claim may well get it, where its vGPU sat on a
    VF (an SR-IOV GPU, chosen where a prepared claim has one; where none has, a pod allocated a free
    slot there started before the boot) that VF too; ``order``: the kubelet
    prepares (and unprepares) its claims again in an order drawn from it (0: as it knows them).

    A claim prepared before the boot and prepared again after it has its vGPUs on the VFs it had:
    its record holds them (docs/design.md, "A claim's record holds its placement"), whichever claim
    the kubelet prepares first."""

    power_loss: bool = False
    evict: int | None = None
    first: int | None = None
    order: int = 0

    def run(self, world: World) -> Checks:
        victim = _pick(_prepared(world), self.evict) if self.evict is not None else None
        if victim is not None:
            world.prepared.pop(victim.ref.uid)
            world.told.pop(victim.ref.uid, None)
            world.terminating[victim.ref.uid] = victim
            world.log.append(f"{victim.ref.name}'s pod deleted while the node is down")
        newcomers = []
        if self.first is not None and not any(_vfs(world).values()):
            _pod_on_vfs(world, self.first)
        on_vfs = _vfs(world)
        if self.first is not None and (old := _pick([c for c in _prepared(world) if on_vfs.get(c.ref.uid)]
                                                    or _prepared(world), self.first)) is not None:
            family = old.devices[0].rsplit("-", 1)[0] + "-"  # gpu-2-vgpu-1gb-: the same GPU and size
            held = {d for c in world.claims_by_name() for d in c.devices}
            free = [n for n in _devices(world) if n.startswith(family) and n not in held]
            newcomers = [world.new_claim([n]) for n in free[:3]]
        failed = world.reboot(power_loss=self.power_loss, first=newcomers, order=self.order)
        world.log.append("rebooted")
        after = _vfs(world)
        moved = [f"claim {c.ref.name} ({uid[:8]}) had its vGPUs on VFs {sorted(on_vfs[uid].values())} before the "
                 f"reboot and on {sorted(after.get(uid, {}).values())} after it"
                 for uid, c in world.prepared.items() if on_vfs.get(uid) and after.get(uid, {}) != on_vfs[uid]]
        return Checks(problems=[f"after the reboot (no VM left): {f}" for f in failed] + moved)


def _pod_on_vfs(world: World, pick: int) -> None:
    """A pod whose claim the scheduler allocated a free vGPU slot of an SR-IOV GPU (its vGPU on a VF),
    of a size that GPU's claims have (one size per GPU), started before the reboot."""
    from mdev_manager.discovery import discover

    sriov = {g.address for g in discover(world.env, world.node.io).gpus if g.sriov_total_vfs}
    pool = {d.name: d for d in world.daemon._pool.devices if d.kind == "vgpu" and d.gpu in sriov}
    sizes: dict[str, set[str]] = {}
    for c in _prepared(world):
        for d in c.devices:
            if d in pool:
                sizes.setdefault(pool[d].gpu, set()).add(d.rsplit("-", 1)[0])
    free = [n for n in _free_devices(world) if n in pool and n.rsplit("-", 1)[0] in sizes.get(pool[n].gpu, {n.rsplit("-", 1)[0]})]
    if free:
        world.prepare(world.new_claim([_pick(free, pick)]))


def _vfs(world: World) -> dict[str, dict[str, str]]:
    """The VFs the prepared claims' vGPUs sit on, as the plugin recorded them: uid -> device -> VF."""
    cp = _checkpoint(world)
    return {uid: {d.device: d.parent for d in rec.devices if d.kind == "vgpu" and d.parent and d.parent != d.gpu}
            for uid, rec in (cp.claims.items() if cp else ()) if uid in world.prepared and rec.state == "prepared"}


@dataclass(frozen=True)
class PowerCut:
    """The power is cut in the middle of an operation (the agent's prepare, unprepare or resync, or a
    hand-run apply) at its write ``after``: un-synced writes may be lost, the write in flight torn;
    the node boots again."""

    during: str  # prepare | unprepare | resync | apply
    after: int
    pick: int
    name: str = "a"

    def run(self, world: World) -> Checks:
        if self.during == "apply":
            io = world.transport()
            io.kill_after(self.after, torn=True)
            with contextlib.suppress(Killed):
                world.vgpuctl_with(io, "apply", "--layout", self.name)
        else:
            world.kill_during(lambda: _during(world, self.during, self.pick), self.after, torn=True)
        world.reboot(power_loss=True)
        return Checks()


CORRUPTIONS = ("empty", "truncated", "random", "checksum", "null", "list", "directory", "version", "tmp-left")


@dataclass(frozen=True)
class CorruptCheckpoint:
    """The checkpoint is damaged (a full disk, a bad sector, a hand edit, a torn temporary file); the
    agent restarts."""

    kind: str

    def run(self, world: World) -> Checks:
        path = world.paths.checkpoint
        text = path.read_text() if path.is_file() else '{"checksum": "", "data": {"version": 3, "claims": {}}}'
        world.stop_daemon()
        if self.kind == "tmp-left":
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text[: len(text) // 3])
        else:
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
        world.restart_daemon()
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
        _during(world, self.during, self.pick)
        world.log.append(f"kernel fault {self.errno}: {world.fio.failed[-1:] or 'not reached'}")
        world.fio.disarm()
        return Checks()


DISK_TARGETS = ("checkpoint", "state", "metadata", "any")


@dataclass(frozen=True)
class DiskFault:
    """The disk refuses a file write (ENOSPC, EIO) to the checkpoint, the saved state (mdevctl
    definitions, vendor records, MIG and layout records), the claim files or any, during the
    agent's prepare, unprepare or resync, or a hand-run apply; then the disk is well again and the
    node recovers: the agent's clean resync (or the admin's apply again) must leave it as its
    layout says, with true labels (or exit status)."""

    errno: str
    target: str
    during: str
    after: int
    pick: int
    name: str = "a"

    def _match(self, world: World) -> str | None:
        return {"checkpoint": "checkpoint.json", "state": str(world.env.state_root.parent),
                "metadata": "dra-device-metadata", "any": None}[self.target]

    def run(self, world: World) -> Checks:
        code = DISK_ERRNOS[self.errno]
        if self.during == "apply":
            io = world.transport()
            io.fail_file(self.after, code, self._match(world))
            rc, out, err = world.vgpuctl_with(io, "apply", "--layout", self.name)
            world.log.append(f"apply with {self.errno} on {self.target}: exit {rc} {io.failed}\n{err[-800:]}")
            return Admin("apply", self.name).run(world)  # the disk is well again
        world.fio.fail_file(self.after, code, self._match(world))
        _during(world, self.during, self.pick)
        world.log.append(f"disk fault {self.errno} on {self.target}: {world.fio.failed[-1:] or 'not reached'}")
        world.fio.disarm()
        return _resynced(world, "resync once the disk is well", world.selected)


@dataclass(frozen=True)
class ApiFault:
    """The API server fails requests during an operation: ``status`` (the next ``times`` matching
    requests answer 409, 429 or 5xx), ``timeout`` (they answer later than the client waits) or
    ``outage`` (the server is down). During a prepare, unprepare, resync, the agent's start-up, a
    checkpoint rebuild (corrupted, agent restarted) or a reboot (restore and re-creating claims)."""

    kind: str  # status | timeout | outage
    verb: str | None
    resource: str | None
    status: int
    times: int
    during: str  # prepare | unprepare | resync | start | rebuild | reboot
    pick: int

    def run(self, world: World) -> Checks:
        srv = world.srv
        if self.kind == "outage":
            srv.stop()
        elif self.kind == "timeout":
            srv.inject(self.verb, self.resource, None, self.times, delay=2.5)
        else:
            srv.inject(self.verb, self.resource, self.status, self.times, retry_after=1 if self.status == 429 else None)
        try:
            if self.during == "start":
                world.restart_daemon()
            elif self.during == "rebuild":
                world.stop_daemon()
                world.paths.checkpoint.parent.mkdir(parents=True, exist_ok=True)
                world.paths.checkpoint.write_text("not a checkpoint")
                world.restart_daemon()
            elif self.during == "reboot":
                world.reboot()
            else:
                _during(world, self.during, self.pick)
        finally:
            srv.clear_injections()
            if self.kind == "outage":
                srv.start()
        world.log.append(f"API {self.kind} during {self.during}")
        return Checks()


# --------------------------------------------------------------------------- concurrency


@dataclass(frozen=True)
class Act:
    """One actor of a :class:`Concurrent` step."""

    kind: str  # resync | bind | prepare | unprepare | apply | restore | plan | lib-apply | select
    name: str = "dra"
    pick: int = 0


class _Streams:
    """``sys.stdout`` / ``sys.stderr`` for a concurrent step: each thread's text to its own buffer;
    stderr's "waiting for the node lock" becomes a scheduling decision (:class:`.sched.Stderr`)."""

    def __init__(self, make):
        self.make = make
        self.by_thread: dict[int, object] = {}

    def _mine(self):
        me = threading.get_ident()
        if me not in self.by_thread:
            self.by_thread[me] = self.make()
        return self.by_thread[me]

    def write(self, text: str) -> int:
        return self._mine().write(text)

    def text(self) -> str:
        return self._mine().getvalue()

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@dataclass(frozen=True)
class Concurrent:
    """Several things at once, in real threads, interleaved by ``seed`` (:mod:`.sched`): the agent's
    resync and binding rounds, the kubelet's prepares and unprepares through the plugin's gRPC
    server, ``vgpuctl apply`` / ``restore`` (on the main thread, through vgpuctl's own parser and
    command), ``vgpuctl plan``, an apply through the library, a layout label change. At each
    scheduling point another actor runs with probability ``switch``. ``kill``: the agent dies at
    its write number ``kill``, wherever that lands."""

    acts: tuple[Act, ...]
    seed: int
    switch: float
    kill: int | None = None

    def run(self, world: World) -> Checks:
        from vgpuctl.cli.host import Host, prepared_usage

        actors: list[Actor] = []
        has_main = False
        codes: dict[str, tuple[str, int, str]] = {}
        sched = world.sched
        for i, act in enumerate(self.acts):
            kind = act.kind
            if kind in ("apply", "restore") and has_main:
                kind = "lib-apply" if kind == "apply" else "plan"
            label = f"{i}:{kind}" + (f"({act.name})" if kind in ("apply", "plan", "lib-apply", "select") else "")
            if kind == "resync":
                job = lambda: world.daemon.resync()  # noqa: E731
            elif kind == "bind":
                job = lambda: world.daemon.bind()  # noqa: E731
            elif kind == "select":
                job = lambda n=act.name: (_label(world, n), world.daemon.resync())  # noqa: E731
            elif kind == "prepare":
                claim = _new_claim(world, (act.pick,))
                if claim is None:
                    continue
                world.pending[claim.ref.uid] = claim
                job = lambda c=claim: world.prepare(c)  # noqa: E731
            elif kind == "unprepare":
                claim = _pick(_prepared(world), act.pick)
                if claim is None:
                    continue
                job = lambda c=claim: world.unprepare(c)  # noqa: E731
            elif kind in ("apply", "restore", "plan"):
                args = ("--layout", act.name) if kind != "restore" else ()

                def job(kind=kind, args=args, label=label):
                    code, _out, err = world.vgpuctl_with(world.transport(), kind, *args, redirect=False)
                    # with redirect=False its text went to this thread's buffers: what a failure said
                    codes[label] = (kind, code, err or f"{err_streams.text()}{out_streams.text()}")
                    return code
            else:  # lib-apply: what vgpuctl apply does, through the library, under the node lock

                def job(name=act.name):
                    from mdev_manager.config import load_config
                    from mdev_manager.reconcile import reconcile

                    io = world.transport()
                    layouts = load_config(world.base / "layouts.yaml", name)
                    with SchedNodeLock(world.env, "vgpuctl apply (library)", sched).hold():
                        host = Host(env=world.env, io=io, node=world.node.node, kubelet_root=world.paths.kubelet_root)
                        usage = prepared_usage(host, DEFAULT_DRIVER)
                        out = reconcile(world.env, io, layouts, usage_extra=usage, node=world.node.node, read_back=True)
                    return "ok" if out.ok else f"failed: {out.unapplied}"
            main = kind in ("apply", "restore")
            has_main = has_main or main
            actors.append(Actor(label, job, main=main))
        if not actors:
            return Checks()
        if self.kill is not None:
            world.fio.kill_after(self.kill)
        lock_path = world.env.state_root / "node.lock"
        out_streams = _Streams(iolib.StringIO)
        err_streams = _Streams(lambda: Stderr(sched, lock_path))
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out_streams, err_streams
        try:
            sched.run(actors, seed=self.seed, switch=self.switch)
        finally:
            sys.stdout, sys.stderr = old
            world.fio.disarm()
        died = world.dead
        world.log.append(f"concurrent ({'agent killed at ' + str(world.fio.killed_at) if died else 'no kill'}): "
                         + "; ".join(sched.trace[-60:]))
        problems = []
        if sched.deadlock:
            problems.append(f"{sched.deadlock} (interleaving: {'; '.join(sched.trace[-30:])})")
        for a in actors:
            result = a.error if a.error is not None else a.result
            world.log.append(f"  {a.name}: {type(result).__name__ if isinstance(result, BaseException) else ''}"
                             f"{str(result)[:300]}")
            if a.error is not None and not isinstance(a.error, Killed) and not sched.deadlock:
                if not (died and a.name.split(":")[1] in ("resync", "bind", "select")):
                    problems.append(f"{a.name} failed: {type(a.error).__name__}: {str(a.error)[:300]}")
        for label, (kind, code, err) in codes.items():
            ok = (0, 3) if kind in ("apply", "restore") else (0,)  # 3: converging, said why
            if code not in ok:
                problems.append(f"{label}: vgpuctl {kind} exited {code} beside the agent: {err.strip()[-400:]}")
        if died:
            world.restart_daemon()
        if problems:
            return Checks(problems=problems)
        return _resynced(world, "resync after the concurrent step", world.selected)


# --------------------------------------------------------------------------- strategies


def steps(layouts: list[str], edit: st.SearchStrategy, uevents: bool = True):
    """``step(position)``: the strategy of an episode's step number ``position``; ``uevents`` (the
    default) draws the uevent faults (:mod:`.uevent_steps`) too; without them every seed draws other steps.

    Kinds are weighted as a busy node sees them: mostly claims, resyncs and layout changes, a
    fault or a race every few steps. The kind is drawn as an index rotated by the position, so
    hypothesis's simplest example (all draws zero, which it tries first) is a sweep over every
    kind, not fifty resyncs."""
    from tests.campaign.gone import PLACES, GpuGone  # it builds on this module's steps

    name = st.sampled_from(layouts)
    n = st.integers(0, 1000)
    during = st.sampled_from(["prepare", "unprepare", "resync"])
    agent = st.builds(Act, st.sampled_from(["resync", "bind", "prepare", "unprepare", "select"]), name, n)
    admin = st.builds(Act, st.sampled_from(["apply", "restore", "plan", "lib-apply"]), name, n)
    writers = st.tuples(st.builds(Act, st.just("apply"), name, n),
                        st.builds(Act, st.sampled_from(["lib-apply", "select", "prepare", "unprepare"]), name, n))
    kinds: list[tuple[int, st.SearchStrategy]] = [
        (3, st.builds(Resync, st.booleans())),
        (10, st.builds(Prepare, st.lists(n, min_size=1, max_size=2).map(tuple), st.booleans(), st.booleans())),
        (5, st.builds(Prepare, st.tuples(n))),
        (9, st.builds(Unprepare, n)),
        (6, st.builds(SelectLayout, name)),
        (4, edit),
        (4, edit.map(lambda e: replace(e, selected=True))),
        (6, st.builds(Admin, st.just("apply"), name)),
        (2, st.builds(Admin, st.sampled_from(["plan", "restore"]), name)),
        (3, st.builds(KubeletRetry)),
        (3, st.builds(KubeletRestart, st.sampled_from(["reprepare", "forget", "unknown", "wipe"]), n)),
        (6, st.builds(ClaimGone, n, st.sampled_from(["new-first"] * 3 + ["old-first", "old-later", "delete"]),
                      st.tuples(n))),
        (6, st.builds(VmStart, n, st.sampled_from(["group", "cdev"]))),
        (3, st.builds(VmStop, n)),
        (8, st.builds(LibvirtDefine, n)),
        (2, st.builds(LibvirtUndefine, n)),
        (5, st.builds(KillAgent, st.sampled_from(["prepare", "unprepare", "resync", "bind", "start"]),
                      st.integers(0, 12), n, st.booleans(), st.sampled_from(["any", "any", "checkpoint"]))),
        (3, st.builds(KillApply, name, st.integers(0, 30), st.booleans())),
        (4, st.builds(Reboot, st.booleans(), st.one_of(st.none(), n), st.one_of(st.none(), n), n)),
        # new pods admitted first beside a claim on VFs as the node comes up: the reboot placements (#36.5)
        (3, st.builds(Reboot, st.booleans(), st.none(), n, n)),
        (2, st.builds(PowerCut, st.sampled_from(["prepare", "unprepare", "resync", "apply"]), st.integers(0, 20), n,
                      name)),
        (4, st.builds(CorruptCheckpoint, st.sampled_from(CORRUPTIONS))),
        (3, st.builds(KernelFault, st.sampled_from(sorted(KERNEL_ERRNOS)), during, st.integers(0, 6), n)),
        (3, st.builds(DiskFault, st.sampled_from(sorted(DISK_ERRNOS)), st.sampled_from(DISK_TARGETS),
                      st.sampled_from(["prepare", "unprepare", "resync", "apply"]), st.integers(0, 15), n, name)),
        (6, st.builds(GpuGone, st.sampled_from(PLACES), name)),
        (4, st.builds(ApiFault, st.sampled_from(["status", "status", "timeout", "outage"]),
                      st.sampled_from([None, "create", "update", "get", "list", "patch", "delete"]),
                      st.sampled_from([None, "resourceslices", "resourceclaims", "nodes"]),
                      st.sampled_from([409, 429, 500, 503]), st.integers(1, 3),
                      st.sampled_from(["prepare", "unprepare", "resync", "start", "rebuild", "reboot"]), n)),
        (3, st.builds(HostileClaim, st.sampled_from(["namespace", "name", "uid"]), st.sampled_from(HOSTILE), n)),
        (9, st.builds(Concurrent, writers, st.integers(0, 2**32 - 1), st.sampled_from([0.1, 0.3, 0.7]))),
        (9, st.builds(Concurrent, st.lists(st.one_of(agent, admin), min_size=2, max_size=3).map(tuple),
                      st.integers(0, 2**32 - 1), st.sampled_from([0.02, 0.1, 0.3, 0.7]),
                      st.one_of(st.none(), st.none(), st.integers(0, 15)))),
    ]
    from tests.campaign import health_steps  # its steps build on this module's helpers

    kinds += health_steps.kinds(n)  # GPU health faults, during prepares, on held GPUs, recovery (#40.4)
    from tests.campaign import binding, simbuild

    kinds += binding.kinds(n)  # bursts of mixed sizes through the binding verdicts (#36.2)
    kinds += simbuild.kinds()  # the simulated host rebuilt, the build interrupted by a signal (#36.5)
    if uevents:  # a kind in or out changes every seed's draws: CI's seeds were chosen with these in
        from tests.campaign import uevent_steps

        kinds += uevent_steps.kinds(n)  # the kernel's uevents lost, duplicated, reordered, in a storm (#37.5)
    table = [strategy for weight, strategy in kinds for _ in range(weight)]
    stride = next(s for s in range(31, len(table)) if _coprime(s, len(table)))  # the zero example visits every kind

    def step(position: int) -> st.SearchStrategy:
        return st.integers(0, len(table) - 1).flatmap(lambda i: table[(i + position * stride) % len(table)])

    return step


def _coprime(a: int, b: int) -> bool:
    while b:
        a, b = b, a % b
    return a == 1
