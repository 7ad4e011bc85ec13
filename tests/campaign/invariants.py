"""What must hold after every step, observed from the node and the API server, not from our state.

Each check returns the violations it finds as lines; an empty list is a pass. Every violation
fails the run (there is no log-only finding).

* claims: every claim the plugin calls prepared (this boot) has its devices on the host, as its
  own (no device in two claims, no whole GPU under a claim's vGPU), and its CDI specs and metadata
  files exist, parse and name those devices; a claim the kubelet was told (in this boot) is
  prepared is recorded prepared and its devices exist, whatever the record's boot says; no two
  records, of any boot, name one VF or overlapping placements; the checkpoint parses; no claim
  with a hostile identity was ever prepared;
* devices: no vGPU exists that neither a definition (mdevctl format or vendor-VFIO record) nor
  a claim accounts for, and none is claimed by both; a device a VM holds (its vfio group or its
  cdev) or a libvirt domain names still exists; after an apply no fault touched, definitions and
  devices match one to one, and every saved MIG-backed vGPU's GPU instance is saved too;
* files: nothing written outside the tool's directories, in the whole episode root, in the run's
  directory around it and in the process's temporary directory (``tempfile.gettempdir()``);
* status, judged by :mod:`.oracle` (the node recomputed, not the planner): after a clean resync
  the state label says ``success`` exactly when the node matches its layout and ``pending`` (with
  a reason) only when every GPU that differs is kept so by a device in use; a hand-run apply's exit
  status says the same (0 / 3); the published slices are one generation without duplicates;
* the step's own findings (:attr:`Checks.problems`): a deadlock, an actor that failed where
  nothing was injected.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from dra_bridge.api.names import ANNOTATION_CONFIG_REASON, LABEL_CONFIG_STATE
from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore
from dra_bridge.kubeletplugin.state import Checkpoint
from mdev_manager import persist
from mdev_manager.discovery import discover
from mdev_manager.models import Inventory
from tests.campaign import oracle
from tests.campaign.steps import Checks
from tests.campaign.world import World


def check_all(world: World, checks: Checks, outside: Outside | None = None) -> list[str]:
    io = world.node.io
    inv = discover(world.env, io, node=world.node.node)
    bad: list[str] = list(checks.problems)
    bad += [f"a claim with a hostile identity was prepared: {h}" for h in world.hostile]
    bad += world.unlocked[:3]
    world.unlocked.clear()
    try:
        cp = CheckpointStore(world.paths.checkpoint, io).load()
    except CheckpointCorrupt as exc:
        return bad + [f"the checkpoint does not parse: {exc}"]
    bad += claims(world, cp, inv)
    bad += devices(world, cp, inv, settled=checks.settled)
    bad += files(world)
    if outside is not None:
        bad += outside.check()
    if checks.labels:
        bad += labels(world, cp, inv)
    if checks.apply_code is not None:
        bad += apply_code(world, cp, inv, checks)
    return bad


def _present(world: World, inv: Inventory, d) -> bool:
    if d.kind == "vgpu":
        return any(v.id == d.vgpu_id for v in inv.all_vgpus())
    g = inv.gpu(d.gpu)
    return g is not None and g.driver == "vfio-pci"


def claims(world: World, cp: Checkpoint, inv: Inventory) -> list[str]:
    bad = []
    boot = world.boot_id()
    vgpus = {v.id: v for v in inv.all_vgpus()}
    gpus = {g.address: g for g in inv.gpus}
    owner: dict[str, str] = {}
    for uid, rec in cp.claims.items():
        who = f"claim {rec.namespace}/{rec.name}"
        # an earlier boot's record holds its device names, not its VF or UUID (died with that boot), unless
        # the kubelet was told in this boot that the claim is prepared
        live = rec.boot_id in (None, boot) or world.told.get(uid) == boot
        for d in rec.devices:
            physical = {d.vgpu_id, d.gpu if d.kind == "passthrough" else None} if live else set()
            for key in filter(None, {d.device, *physical}):
                if key in owner and owner[key] != uid:
                    bad.append(f"{key} belongs to two claims: {owner[key]} and {uid} ({who})")
                owner[key] = uid
        if rec.state != "prepared" or rec.boot_id != boot:
            continue
        for d in rec.devices:
            if d.kind == "vgpu":
                v = vgpus.get(d.vgpu_id or "")
                if v is None:
                    bad.append(f"{who}: its vGPU {d.vgpu_id} ({d.device}) does not exist")
                elif v.gpu != d.gpu:
                    bad.append(f"{who}: vGPU {d.vgpu_id} is on GPU {v.gpu}, not {d.gpu}")
            else:
                g = gpus.get(d.gpu)
                if g is None or g.driver != "vfio-pci":
                    bad.append(f"{who}: passthrough GPU {d.gpu} is not on vfio-pci ({g.driver if g else 'gone'})")
        # a metadata file taken over by a claim of the same name made since (the path is the name's, KEP-5304):
        # this claim's CDI device for it is gone on purpose (a container of it started now would mount the
        # newer claim's device), and the plugin refuses to answer for this claim again. That stays so once
        # the newer claim is unprepared and its file removed with it (seed 1, step 107: ClaimGone old-later,
        # then the new claim unprepared first): ``world.superseded`` remembers the take-over, and the
        # shared file may then be missing, never another claim's content under this claim's uid
        superseded = uid in world.superseded
        taken = _taken_over(rec, cp) or superseded
        for f in rec.cdi_files + rec.metadata_files:
            gone_on_purpose = f"_metadata_{uid}_" in Path(f).name or (superseded and f in rec.metadata_files)
            if not Path(f).is_file() and not (taken and gone_on_purpose):
                bad.append(f"{who}: file {f} is missing")
        names = set()
        for f in rec.cdi_files:
            if taken and not Path(f).is_file() and f"_metadata_{uid}_" in Path(f).name:
                continue
            try:
                names |= {f"{json.loads(Path(f).read_text())['kind']}={d['name']}"
                          for d in json.loads(Path(f).read_text())["devices"]}
            except (OSError, ValueError, KeyError):
                bad.append(f"{who}: CDI spec {f} does not parse")
        for d in rec.devices:
            for cdi_id in d.cdi_ids:
                if cdi_id not in names and not (taken and "/metadata=" in cdi_id):
                    bad.append(f"{who}: CDI id {cdi_id} of {d.device} is in no spec of the claim")
        bad += _metadata(rec, cp, superseded=superseded)
    bad += _held_across_boots(cp)
    # no whole GPU under a claim while another claim holds a vGPU on it
    whole = {d.gpu: uid for uid, rec in cp.claims.items() for d in rec.devices if d.kind == "passthrough"}
    for uid, rec in cp.claims.items():
        for d in rec.devices:
            if d.kind == "vgpu" and whole.get(d.gpu, uid) != uid:
                bad.append(f"GPU {d.gpu} is passed through for {whole[d.gpu]} while {uid} holds vGPU {d.vgpu_id}")
    # the kubelet's view: a claim it was told (in this boot) is prepared is prepared, its devices there
    for uid, claim in world.prepared.items():
        rec = cp.claims.get(uid)
        if rec is None or rec.state != "prepared":
            bad.append(f"the kubelet was told {claim.ref.name} ({uid[:8]}) is prepared; the plugin has "
                       f"{rec.state if rec else 'no record'}")
        elif world.told.get(uid) == boot:
            gone = [d.device for d in rec.devices if not _present(world, inv, d)]
            if gone:
                bad.append(f"the kubelet was told in this boot that {claim.ref.name} ({uid[:8]}) is prepared, but "
                           f"its devices {', '.join(gone)} do not exist (its record says boot {rec.boot_id})")
    return bad


def _held_across_boots(cp: Checkpoint) -> list[str]:
    """A claim's record holds its VF and its placement (memory slices, slots) whatever boot it is of
    (docs/design.md, "A claim's record holds its placement"): after a reboot no claim prepared before
    the earlier boot's claims are re-created (a new pod admitted first, a claim that was refused and
    retried first) takes what their records name. Read from the records here, not through the plugin's
    own overlap check."""
    bad = []
    vfs: dict[str, str] = {}
    spans: list[tuple[str, str, tuple]] = []  # (uid, device, (gpu, kind, start, end, inside))
    for uid, rec in cp.claims.items():
        for d in rec.devices:
            if d.kind != "vgpu":
                continue
            if d.parent and d.parent != d.gpu:
                if vfs.get(d.parent, uid) != uid:
                    bad.append(f"VF {d.parent} is named by the records of two claims: {vfs[d.parent]} and {uid} "
                               f"({rec.namespace}/{rec.name}, {d.device}, boot {rec.boot_id})")
                vfs[d.parent] = uid
            if d.gi_start is not None:
                inside = (d.gi_profile, d.type_id, d.placement, d.placement_size) if d.placement is not None else None
                span = (d.gpu, "memory slices", d.gi_start, d.gi_start + (d.gi_size or 1), inside)
            elif d.placement is not None:
                span = (d.gpu, "slots", d.placement, d.placement + (d.placement_size or 1), None)
            else:
                continue
            for other_uid, other_dev, o in spans:
                if other_uid != uid and _spans_clash(span, o):
                    bad.append(f"{span[1]} {span[2]}-{span[3] - 1} of GPU {span[0]} ({d.device} of {uid}, boot "
                               f"{rec.boot_id}) overlap {o[2]}-{o[3] - 1} ({other_dev} of {other_uid})")
            spans.append((uid, d.device, span))
    return bad


def _spans_clash(a: tuple, b: tuple) -> bool:
    """Two recorded placements on one GPU overlap; two vGPUs sharing one GPU instance (same profile,
    slices and type) clash only where their placements inside it overlap. A record rebuilt without
    its vGPU's type (a placement id, no size: the plugin holds its instance whole but for the claims
    that shared it) clashes with what covers its placement id."""
    if a[:2] != b[:2] or not (a[2] < b[3] and b[2] < a[3]):
        return False
    ia, ib = a[4], b[4]
    if ia is None or ib is None or a[2:4] != b[2:4] or ia[0] != ib[0]:
        return True
    if ia[1] is not None and ib[1] is not None and ia[1] != ib[1]:
        return True
    return ia[2] < ib[2] + (ib[3] or 1) and ib[2] < ia[2] + (ia[3] or 1)


def _taken_over(rec, cp: Checkpoint) -> bool:
    """Whether a metadata file of ``rec`` now names another prepared claim of the same namespace and name."""
    for f in rec.metadata_files:
        try:
            uid = json.loads(Path(f).read_text().splitlines()[0])["metadata"]["uid"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
        other = cp.claims.get(uid)
        if uid != rec.uid and other is not None and (other.namespace, other.name) == (rec.namespace, rec.name):
            return True
    return False


def _metadata(rec, cp: Checkpoint, *, superseded: bool = False) -> list[str]:
    """Each metadata file parses and names a prepared claim of this name, with that claim's devices
    (two claims of one name prepared at once, a re-created claim, share the path: the newer is named);
    a superseded claim's file may be missing (the newer claim's, unprepared with it)."""
    bad = []
    for f in rec.metadata_files:
        if superseded and not Path(f).exists():
            continue
        try:
            doc = json.loads(Path(f).read_text().splitlines()[0])
            uid = doc["metadata"]["uid"]
            named = {d["name"] for r in doc["requests"] for d in r["devices"]}
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            bad.append(f"claim {rec.namespace}/{rec.name}: metadata {f} does not parse")
            continue
        other = cp.claims.get(uid)
        if other is None or (other.namespace, other.name) != (rec.namespace, rec.name):
            bad.append(f"claim {rec.namespace}/{rec.name}: metadata {f} names uid {uid}, no prepared claim of that name")
        elif not named <= {d.device for d in other.devices}:
            bad.append(f"claim {rec.namespace}/{rec.name}: metadata {f} names devices {sorted(named)} not its claim's")
    return bad


def devices(world: World, cp: Checkpoint, inv: Inventory, *, settled: str | None) -> list[str]:
    io = world.node.io
    bad = []
    defs, problems = persist.load_definitions(world.env, io)
    bad += [f"definition unreadable: {p}" for p in problems]
    records = persist.load_vendor_vfio(world.env, io)
    defined = {d.uuid for d in defs} | set(records)
    claimed = {d.vgpu_id for rec in cp.claims.values() for d in rec.devices if d.vgpu_id}
    present = {v.id: v for v in inv.all_vgpus()}
    for vid, v in present.items():
        if vid not in defined and vid not in claimed:
            bad.append(f"vGPU {vid} ({v.type_name} on {v.parent}) is accounted for by no definition and no claim")
        if settled and vid in defined and vid in claimed:  # an apply forgets the layout's record of it
            bad.append(f"after applying {settled}: vGPU {vid} is both a layout device (defined) and a claim's")
    on_vfio = {g.address for g in inv.gpus if g.driver == "vfio-pci"}
    for pid, h in world.vms.items():
        if h.device not in present and h.device not in on_vfio:
            bad.append(f"device {h.device} was removed while VM {pid} held it ({h.how} {h.path})")
    for name, (mdevs, pcis) in world.domains.items():
        for dev in [*mdevs, *pcis]:
            if dev not in present and dev not in on_vfio:
                bad.append(f"device {dev} was removed while libvirt domain {name} named it")
    if settled:  # an apply just ran with no fault: on the GPUs it gave vGPUs, saved = made
        managed = _vgpu_parents(world, settled, inv)
        for d in defs:
            if d.start == "auto" and d.parent in managed and d.uuid not in present:
                bad.append(f"after applying {settled}: definition {d.parent}/{d.uuid} ({d.mdev_type}) has no device")
        for vf, t in records.items():
            if vf in managed and vf not in present:
                bad.append(f"after applying {settled}: vendor-VFIO record {vf} ({t}) has no vGPU")
        # a saved MIG-backed vGPU is re-created after a reboot only on its GPU instance: the instance is saved too
        saved_mig = {gpu: {str(e.get("vgpu", "")).lower() for e in entries}
                     for gpu, entries in persist.load_mig(world.env, io).items()}
        for vid, v in present.items():
            if vid in defined and v.gpu_instance is not None and v.parent in managed \
                    and vid.lower() not in saved_mig.get(v.gpu, set()):
                bad.append(f"after applying {settled}: MIG-backed vGPU {vid} ({v.type_name}) is saved, its GPU "
                           f"instance {v.gpu_instance} on {v.gpu} is not: a reboot loses it")
    return bad


def _vgpu_parents(world: World, layout: str, inv: Inventory) -> set[str]:
    """Parent devices (GPU and VF addresses) of the GPUs ``layout`` puts in vgpu mode."""
    out: set[str] = set()
    for address, e in oracle.entries(world.layouts[layout], inv).items():
        g = inv.gpu(address)
        if g is not None and e.get("mode") == "vgpu":
            out |= {g.address, *(vf.address for vf in g.vfs)}
    return out


def files(world: World) -> list[str]:
    """Every file in the episode root outside the host's kernel, process and device trees is one the
    tool may write."""
    root = world.node.root
    allowed = [world.env.mdevctl_root, world.env.state_root, world.paths.kubelet_root / "plugins",
               world.paths.kubelet_root / "plugins_registry", world.paths.cdi_root, root / ".sim",
               world.base / "layouts.yaml", world.base / "libvirt.xml", world.env.boot_id]
    skip = {root / "sys", root / "dev", root / "proc"}
    allowed_s = [str(a) for a in allowed]
    bad = []
    for top, dirs, names in os.walk(world.base):
        dirs[:] = [d for d in dirs if Path(top, d) not in skip]
        for n in names:
            p = os.path.join(top, n)
            if not any(p == a or p.startswith(a + os.sep) for a in allowed_s):
                bad.append(f"file outside the allowed directories: {p}")
        for d in dirs:  # an empty directory made outside is a write too
            p = os.path.join(top, d)
            if not os.listdir(p) and not any(p == a or p.startswith(a + os.sep) or a.startswith(p + os.sep)
                                             for a in allowed_s):
                bad.append(f"directory outside the allowed directories: {p}")
    return bad


class Outside:
    """Everything around the episode root: the run's directory (the episode's siblings and parents
    up to it) and the process's temporary directory. Snapshot at the episode's start; after each
    step nothing may be new there."""

    def __init__(self, work: Path, episode: Path, skip: list[Path]):
        self.work, self.episode, self.skip = work, episode, set(skip)
        self.tmp = Path(tempfile.gettempdir())
        self.before = self._walk()

    def _walk(self) -> set[str]:
        seen: set[str] = set()
        for top in dict.fromkeys([self.work, self.tmp]):
            for dirpath, dirs, names in os.walk(top):
                dirs[:] = [d for d in dirs if Path(dirpath, d) not in self.skip and Path(dirpath, d) != self.episode]
                seen.update(os.path.join(dirpath, n) for n in names + dirs)
        return seen

    def check(self) -> list[str]:
        new = sorted(self._walk() - self.before)
        return [f"written outside the episode root: {p}" for p in new[:10]]


def labels(world: World, cp: Checkpoint, inv: Inventory) -> list[str]:
    node = world.srv.get_object("nodes", world.node.node)
    meta = node["metadata"]
    state = (meta.get("labels") or {}).get(LABEL_CONFIG_STATE)
    reason = (meta.get("annotations") or {}).get(ANNOTATION_CONFIG_REASON)
    verdicts = oracle.judge(world, world.selected, inv, cp)
    differ = [v for v in verdicts if not v.matches]
    bad = []
    if not differ:
        if state != "success":
            bad.append(f"the node matches layout {world.selected} but the state label reads {state} ({reason})")
    elif state == "success":
        bad.append(f"state label success but the node does not match layout {world.selected}: "
                   + " | ".join(map(str, differ)))
    elif state == "pending":
        if not reason:
            bad.append("state label pending without a reason annotation")
        free = [v for v in differ if not v.blocked]
        if free:
            bad.append(f"state label pending (converging) but nothing in use keeps these from layout "
                       f"{world.selected}: " + " | ".join(map(str, free)))
    else:
        bad.append(f"state label {state} after a clean resync of layout {world.selected}: "
                   + " | ".join(map(str, differ)))
    bad += slices(world)
    return bad


def slices(world: World) -> list[str]:
    mine = [s for s in world.srv.objects("resourceslices") if s["spec"].get("nodeName") == world.node.node]
    bad = []
    generations = {s["spec"]["pool"]["generation"] for s in mine}
    if len(generations) > 1:
        bad.append(f"{len(generations)} generations of the pool are visible: {sorted(generations)}")
    names = [d["name"] for s in mine for d in s["spec"].get("devices", [])]
    if len(names) != len(set(names)):
        bad.append("a device is published twice")
    published = set(names)
    pool = {d.name for d in world.daemon._pool.devices}
    if published != pool:
        bad.append(f"published devices differ from the agent's pool: {len(published ^ pool)} differ")
    return bad


def apply_code(world: World, cp: Checkpoint, inv: Inventory, checks: Checks) -> list[str]:
    if checks.apply_code not in (0, 3):
        return [f"vgpuctl apply exited {checks.apply_code} (expected 0 or 3 on a healthy node)"]
    if checks.apply_layout is None:
        return []
    verdicts = oracle.judge(world, checks.apply_layout, inv, cp)
    differ = [v for v in verdicts if not v.matches]
    if checks.apply_code == 0 and differ:
        return [f"apply said the node matches {checks.apply_layout}, but: " + " | ".join(map(str, differ))]
    if checks.apply_code == 3:
        if not differ:
            return [f"apply said converging on {checks.apply_layout}, but the node matches it"]
        free = [v for v in differ if not v.blocked]
        if free:
            return [f"apply said converging on {checks.apply_layout}, but nothing in use keeps these: "
                    + " | ".join(map(str, free))]
    return []
