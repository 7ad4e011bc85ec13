"""What must hold after every step, observed from the node and the API server, not from our state.

Each check returns the violations it finds as lines; an empty list is a pass.

* claims: every claim the plugin calls prepared (this boot) has its devices on the host, as its
  own (no device in two claims, no whole GPU under a claim's vGPU), and its CDI specs and metadata
  files exist and name those devices; the checkpoint parses;
* devices: no vGPU exists that neither a definition (mdevctl format or vendor-VFIO record) nor
  a claim accounts for, and none is claimed by both; a device a VM holds open still exists;
  after an apply no fault touched, definitions and devices match one to one;
* files: nothing written outside the directories the tool may write;
* status: after a clean resync the node's state label tells the truth (``success`` only when the
  node matches its layout, ``pending`` with the reason while devices in use hold it back), and
  the published slices are one generation without duplicates; a hand-run apply's exit status
  tells the truth the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dra_bridge.api.names import ANNOTATION_CONFIG_REASON, LABEL_CONFIG_STATE
from dra_bridge.kubeletplugin.checkpoint import Checkpoint, CheckpointCorrupt, CheckpointStore
from mdev_manager import persist
from mdev_manager.config import load_config
from mdev_manager.discovery import discover
from mdev_manager.models import Inventory
from mdev_manager.reconcile import reconcile
from tests.campaign.steps import Checks
from tests.campaign.world import World


def check_all(world: World, checks: Checks) -> list[str]:
    io = world.node.io
    inv = discover(world.env, io, node=world.node.node)
    bad: list[str] = []
    try:
        cp = CheckpointStore(world.paths.checkpoint, io).load()
    except CheckpointCorrupt as exc:
        return [f"the checkpoint does not parse: {exc}"]
    bad += claims(world, cp, inv)
    bad += devices(world, cp, inv, settled=checks.settled)
    bad += files(world)
    if checks.labels:
        bad += labels(world, cp)
    if checks.apply_code is not None:
        bad += apply_code(world, cp, checks)
    return bad


def _boot(world: World) -> str:
    return world.env.boot_id.read_text().strip()


def claims(world: World, cp: Checkpoint, inv: Inventory) -> list[str]:
    bad = []
    boot = _boot(world)
    vgpus = {v.id: v for v in inv.all_vgpus()}
    gpus = {g.address: g for g in inv.gpus}
    owner: dict[str, str] = {}
    for uid, rec in cp.claims.items():
        who = f"claim {rec.namespace}/{rec.name}"
        for d in rec.devices:
            for key in filter(None, {d.device, d.vgpu_id, d.gpu if d.kind == "passthrough" else None}):
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
        for f in rec.cdi_files + rec.metadata_files:
            if not Path(f).is_file():
                bad.append(f"{who}: file {f} is missing")
        names = set()
        for f in rec.cdi_files:
            try:
                names |= {f"{json.loads(Path(f).read_text())['kind']}={d['name']}"
                          for d in json.loads(Path(f).read_text())["devices"]}
            except (OSError, ValueError, KeyError):
                bad.append(f"{who}: CDI spec {f} does not parse")
        for d in rec.devices:
            for cdi_id in d.cdi_ids:
                if cdi_id not in names:
                    bad.append(f"{who}: CDI id {cdi_id} of {d.device} is in no spec of the claim")
    # no whole GPU under a claim while another claim holds a vGPU on it
    whole = {d.gpu: uid for uid, rec in cp.claims.items() for d in rec.devices if d.kind == "passthrough"}
    for uid, rec in cp.claims.items():
        for d in rec.devices:
            if d.kind == "vgpu" and whole.get(d.gpu, uid) != uid:
                bad.append(f"GPU {d.gpu} is passed through for {whole[d.gpu]} while {uid} holds vGPU {d.vgpu_id}")
    # the kubelet's view: a claim it was told is prepared is prepared
    for claim in world.prepared.values():
        rec = cp.claims.get(claim.ref.uid)
        if rec is None or rec.state != "prepared":
            bad.append(f"the kubelet was told {claim.ref.name} is prepared; the plugin has "
                       f"{rec.state if rec else 'no record'}")
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
    for pid, dev in world.vms.items():
        if dev not in present and not any(g.address == dev and g.driver == "vfio-pci" for g in inv.gpus):
            bad.append(f"device {dev} was removed while VM {pid} held it")
    if settled:  # an apply just ran with no fault: on the GPUs it gave vGPUs, saved = made
        managed = _vgpu_gpus(world, settled, inv)
        for d in defs:
            if d.start == "auto" and managed.get(d.parent) and d.uuid not in present:
                bad.append(f"after applying {settled}: definition {d.parent}/{d.uuid} ({d.mdev_type}) has no device")
        for vf, t in records.items():
            if managed.get(vf) and vf not in present:
                bad.append(f"after applying {settled}: vendor-VFIO record {vf} ({t}) has no vGPU")
    return bad


def _vgpu_gpus(world: World, layout: str, inv: Inventory) -> dict[str, str]:
    """Parent device (GPU or VF address) -> GPU, for the GPUs ``layout`` puts in vgpu mode."""
    from mdev_manager.plan import select_gpus

    chosen = select_gpus(inv, load_config(world.base / "layouts.yaml", layout))
    out = {}
    for g in inv.gpus:
        if chosen.get(g.address) is not None and chosen[g.address].mode == "vgpu":
            out[g.address] = g.address
            out.update({vf.address: g.address for vf in g.vfs})
    return out


def files(world: World) -> list[str]:
    """Every file outside the host's kernel, process and device trees is one the tool may write."""
    root = world.node.root
    allowed = [world.env.mdevctl_root, world.env.state_root, world.paths.kubelet_root / "plugins",
               world.paths.kubelet_root / "plugins_registry", world.paths.cdi_root, root / ".sim",
               world.base / "layouts.yaml", world.env.boot_id]
    skip = {root / "sys", root / "dev", root / "proc"}
    allowed_s = [str(a) for a in allowed]
    bad = []
    for top, dirs, names in os.walk(world.base):
        dirs[:] = [d for d in dirs if Path(top, d) not in skip]
        for n in names:
            p = os.path.join(top, n)
            if not any(p == a or p.startswith(a + os.sep) for a in allowed_s):
                bad.append(f"file outside the allowed directories: {p}")
    return bad


def _expected(world: World, cp: Checkpoint, layout: str):
    """A dry-run plan of ``layout`` with the node's usage (claims, VMs): what 'matches' means."""
    layouts = load_config(world.base / "layouts.yaml", layout)
    out = reconcile(world.env, world.node.io, layouts, dry_run=True, usage_extra=cp.usage(), node=world.node.node)
    return out


def labels(world: World, cp: Checkpoint) -> list[str]:
    node = world.srv.get_object("nodes", world.node.node)
    meta = node["metadata"]
    state = (meta.get("labels") or {}).get(LABEL_CONFIG_STATE)
    reason = (meta.get("annotations") or {}).get(ANNOTATION_CONFIG_REASON)
    out = _expected(world, cp, world.selected)
    actions = out.rounds[0].plan.actions if out.rounds else []
    bad = []
    if state == "success" and (actions or out.blocked):
        bad.append(f"state label success but the node does not match layout {world.selected}: "
                   f"{len(actions)} steps left, {len(out.blocked)} blocked")
    if state == "pending" and not (out.blocked and reason):
        bad.append(f"state label pending without a block or a reason (reason={reason!r})")
    if state != "success" and not actions and not out.blocked:
        bad.append(f"the node matches layout {world.selected} but the state label reads {state}")
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


def apply_code(world: World, cp: Checkpoint, checks: Checks) -> list[str]:
    if checks.apply_code not in (0, 3):
        return [f"vgpuctl apply exited {checks.apply_code} (expected 0 or 3 on a healthy node)"]
    if checks.apply_layout is None:
        return []
    out = _expected(world, cp, checks.apply_layout)
    actions = out.rounds[0].plan.actions if out.rounds else []
    if checks.apply_code == 0 and (actions or out.blocked):
        return [f"apply said the node matches {checks.apply_layout}, but {len(actions)} steps are left"]
    if checks.apply_code == 3 and not out.blocked:
        return [f"apply said converging on {checks.apply_layout}, but nothing is blocked"]
    return []
