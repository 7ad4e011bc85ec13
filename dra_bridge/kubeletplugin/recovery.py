"""Rebuild the prepared claims from what the node shows, when the checkpoint cannot be trusted.

Prepare leaves three traces that outlive a corrupted checkpoint: the claim's CDI spec
(``<driver>-claim_<uid>.json``: device names, the vfio group of each), the KEP-5304
metadata files (``<ns>_<claim>/<request>/metadata.json``: namespace, name, uid, requests,
each device's ``mdevUUID`` or PCI address) with their CDI specs, and the devices on the
host (vGPUs, GPUs bound to vfio-pci). :func:`observe` reads them (I/O), :func:`rebuild`
turns them into checkpoint records (pure). Every claim found is kept as prepared so none of
its devices counts as free or gets removed; a claim whose devices are all on the host gets
the current boot id, one with a device missing gets none (prepare re-creates it, see the
driver). A passed-through GPU is recorded with nothing to give back (``rebound`` empty):
which functions prepare moved cannot be told afterwards, and leaving a GPU on vfio-pci is
safe where moving an admin's binding is not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Inventory

from dra_bridge.kubeletplugin import cdi, metadata
from dra_bridge.kubeletplugin.checkpoint import ClaimRecord, PreparedDeviceRecord
from dra_bridge.kubeletplugin.paths import PluginPaths, check_label, check_request, check_uid

PCI_ATTR = "resource.kubernetes.io/pciBusID"


@dataclass
class Observed:
    """What the plugin's directories and the host show, keyed by claim uid."""

    claim_specs: dict[str, tuple[str, dict[str, int | None]]] = field(default_factory=dict)  # file, device -> group
    metadata_specs: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)  # base request -> file, host
    metadata_docs: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)  # (file, document)
    inventory: Inventory = field(default_factory=Inventory)

    def uids(self) -> list[str]:
        return sorted(set(self.claim_specs) | set(self.metadata_specs) | set(self.metadata_docs))


def _json(io: HostIO, path: Path) -> object:
    try:
        text = io.read(path)
        return json.loads(text.splitlines()[0] if path.name == "metadata.json" and text.strip() else text)
    except (OSError, ValueError, IndexError):
        return None


def _group(node_path: str) -> int | None:
    head, _, tail = node_path.rpartition("/")
    return int(tail) if head == "/dev/vfio" and tail.isdigit() else None


def observe(paths: PluginPaths, env: HostEnv, io: HostIO) -> Observed:
    obs = Observed(inventory=discover(env, io))
    driver = paths.driver
    for name in io.listdir(paths.cdi_root):
        path = paths.cdi_root / name
        if uid := cdi.parse_spec_name(driver, name):
            spec = _json(io, path)
            devices: dict[str, int | None] = {}
            for d in (spec.get("devices") or []) if isinstance(spec, dict) else []:
                dev = str(d.get("name", "")).removeprefix(f"{uid}-")
                nodes = (d.get("containerEdits") or {}).get("deviceNodes") or []
                groups = [g for g in (_group(str(n.get("path", ""))) for n in nodes) if g is not None]
                devices[dev] = groups[0] if groups else None
            obs.claim_specs[uid] = (str(path), devices)
        elif uid := metadata.parse_cdi_name(driver, name):
            spec = _json(io, path)
            for d in (spec.get("devices") or []) if isinstance(spec, dict) else []:
                _, _, base = str(d.get("name", "")).partition("_")
                mounts = (d.get("containerEdits") or {}).get("mounts") or [{}]
                obs.metadata_specs.setdefault(uid, {})[base] = (str(path), str(mounts[0].get("hostPath", "")))
    for claim_dir in io.listdir(paths.metadata_dir):
        if metadata.claim_dir_name(claim_dir) is None:
            continue
        for request in io.listdir(paths.metadata_dir / claim_dir):
            path = paths.metadata_dir / claim_dir / request / "metadata.json"
            doc = _json(io, path)
            uid = ((doc.get("metadata") or {}).get("uid")) if isinstance(doc, dict) else None
            if isinstance(uid, str):
                obs.metadata_docs.setdefault(uid, []).append((str(path), doc))
    return obs


def _identity(uid: str, obs: Observed) -> tuple[str, str]:
    """(namespace, name) from the metadata files or the metadata specs' host paths; ("", "") if none."""
    for _, doc in obs.metadata_docs.get(uid, []):
        meta = doc.get("metadata") or {}
        found = metadata.claim_dir_name(f"{meta.get('namespace')}_{meta.get('name')}")
        if found:
            return found
    for _, host in obs.metadata_specs.get(uid, {}).values():
        found = metadata.claim_dir_name(Path(host).parent.parent.name)
        if found:
            return found
    return "", ""


def _devices(uid: str, obs: Observed, driver: str, pool: str) -> dict[str, dict]:
    """device name -> what the files say of it (request, pool, attributes, vfio group)."""
    out: dict[str, dict] = {}
    for _, doc in obs.metadata_docs.get(uid, []):
        for req in doc.get("requests") or []:
            for d in req.get("devices") or []:
                if d.get("driver") == driver:
                    out.setdefault(str(d.get("name")), {}).update(
                        request=req.get("name"), pool=d.get("pool"), attributes=d.get("attributes") or {})
    for dev, group in (obs.claim_specs.get(uid) or ("", {}))[1].items():
        out.setdefault(dev, {})["group"] = group
    for info in out.values():
        info.setdefault("pool", pool)
    return out


def _device_record(name: str, info: dict, inv: Inventory) -> tuple[PreparedDeviceRecord, bool]:
    """The device's record and whether the host holds it."""
    attrs = info.get("attributes") or {}
    key = (attrs.get("mdevUUID") or attrs.get(PCI_ATTR) or {}).get("string")
    group = info.get("group")
    vgpus = inv.all_vgpus()
    vg = next((v for v in vgpus if v.id == key), None) or next(
        (v for v in vgpus if group is not None and v.iommu_group == group), None)
    base = {"request": info.get("request") or "", "pool": info.get("pool") or "", "device": name}
    if vg is not None:
        return PreparedDeviceRecord(**base, kind="vgpu", gpu=vg.gpu, framework=vg.framework, vgpu_id=vg.id,
                                    parent=vg.parent, type_id=vg.type_id, iommu_group=vg.iommu_group), True
    gpu = next((g for g in inv.gpus if g.address == key or (group is not None and g.iommu_group == group)), None)
    if gpu is not None and not attrs.get("mdevUUID"):
        return PreparedDeviceRecord(**base, kind="passthrough", gpu=gpu.address, iommu_group=gpu.iommu_group), \
            gpu.driver == "vfio-pci"
    mdev = (attrs.get("mdevUUID") or {}).get("string")
    return PreparedDeviceRecord(**base, kind="vgpu", gpu="", framework="mdev" if mdev else None, vgpu_id=mdev), False


def rebuild(obs: Observed, *, driver: str, pool: str, boot_id: str | None) -> tuple[dict[str, ClaimRecord], list[str]]:
    """(records by uid, what was left out and why). Names that fail validation are left out."""
    claims: dict[str, ClaimRecord] = {}
    skipped: list[str] = []
    for uid in obs.uids():
        try:
            check_uid(uid)
            namespace, name = _identity(uid, obs)
            devices, present, with_metadata = [], [], set()
            for dev, info in sorted(_devices(uid, obs, driver, pool).items()):
                check_label(dev, "device")
                if info.get("request"):
                    check_request(info["request"])
                rec, here = _device_record(dev, info, obs.inventory)
                rec.cdi_ids = [cdi.cdi_id(driver, uid, dev)] if dev in (obs.claim_specs.get(uid) or ("", {}))[1] else []
                base = metadata.base_request(rec.request) if rec.request else None
                # the metadata device goes with the first device of each request only, as prepare
                # answers (upstream kubeletplugin/draplugin.go); the order prepare used is lost, so
                # the first by name
                if base and base in obs.metadata_specs.get(uid, {}) and base not in with_metadata:
                    rec.cdi_ids.append(metadata.cdi_id(driver, uid, base))
                    with_metadata.add(base)
                devices.append(rec)
                present.append(here)
        except ValueError as exc:
            skipped.append(f"{uid}: {exc}")
            continue
        cdi_files = ([obs.claim_specs[uid][0]] if uid in obs.claim_specs else []) + \
            [f for f, _ in obs.metadata_specs.get(uid, {}).values()]
        claims[uid] = ClaimRecord(
            uid=uid, namespace=namespace, name=name, state="prepared", devices=devices,
            cdi_files=sorted(set(cdi_files)), metadata_files=sorted(f for f, _ in obs.metadata_docs.get(uid, [])),
            boot_id=boot_id if devices and all(present) else None)
    return claims, skipped
