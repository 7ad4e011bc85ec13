"""Rebuild the prepared claims from what the node shows, when the checkpoint cannot be trusted.

Prepare leaves three traces that outlive a corrupted checkpoint: the claim's CDI spec
(``<driver>-claim_<uid>.json``: device names, the vfio group of each), the KEP-5304
metadata files (``<ns>_<claim>/<request>/metadata.json``: namespace, name, uid, requests,
each device's ``mdevUUID`` or PCI address) with their CDI specs, and the devices on the
host (vGPUs, GPUs bound to vfio-pci). A fourth witness is off the node: the API server's
ResourceClaims allocated from this node's pool. :func:`observe` reads them all (I/O),
:func:`rebuild` turns them into checkpoint records (pure).

Every claim the files name is kept as prepared so none of its devices counts as free or gets
removed; a claim whose devices are all on the host gets the current boot id, one with a device
missing gets none (prepare re-creates it, see the driver). A passed-through GPU is recorded with
nothing to give back (``rebound`` empty): which functions prepare moved cannot be told
afterwards, and leaving a GPU on vfio-pci is safe where moving an admin's binding is not.
A vGPU's place is kept as prepare recorded it (:func:`.places.place`): its GPU instance and its placement
inside it, or its mixed-size slots, from the node, else from the device the claim was allocated, else
(the daemon's start) from the device's name: a shared instance whole where its vGPU's size is not known.

What the API's claims add (:func:`_from_api`), decided by "never give one device to two claims,
never remove a device in use":

* a claim the files name: its namespace and name come from the API object (the files may hold
  only its uid), the request of each device from the allocation, and a device the allocation
  names but the files do not is recorded too (holding its name);
* a claim the API says is allocated here but no file names: recorded only when the node shows
  something that can be it: a vGPU of the allocated type on the allocated GPU, or the allocated
  GPU on vfio-pci, that no other record holds. Which vGPU of a type is the claim's cannot be told
  for sure, so the one taken is recorded without its parent: it counts as in use (the node
  manager keeps it, another claim is refused its device) but this plugin never removes it, not
  even at unprepare. Nothing on the node that can be it: the claim was allocated but not
  prepared (or its devices died with a reboot); it is not recorded, the kubelet prepares it,
  and prepare then checks it against every record like any other claim;
* the API cannot be asked (a source without ``allocated``, an unreachable server): the rebuild
  goes on from the node alone, and the log line says so.
"""
from __future__ import annotations

import json
import re
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dra_bridge.api.k8sname import dns_safe
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.kubeletplugin import cdi, metadata
from dra_bridge.kubeletplugin.claimsource import allocated_claims, allocation_results
from dra_bridge.kubeletplugin.paths import (
    UnsafeName,
    check_label,
    check_name,
    check_namespace,
    check_request,
    check_uid,
)
from dra_bridge.kubeletplugin.places import place
from dra_bridge.kubeletplugin.state import ClaimRecord, PreparedDeviceRecord
from dra_bridge.pool.devices import Pool
from mdev_manager import numbering, persist
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Inventory
from mdev_manager.names import short_type_name

PCI_ATTR = "resource.kubernetes.io/pciBusID"
_DEVICE_NAME = re.compile(r"^gpu-(\d+)-(passthrough|vgpu-.+|mig-.+)$")  # dra_bridge.api.names: the GPU's stable number
_Kind = Literal["vgpu", "passthrough"]  # a prepared device's (PreparedDeviceRecord.kind)


@dataclass
class Observed:
    """What the plugin's directories and the host show, keyed by claim uid."""

    claim_specs: dict[str, tuple[str, dict[str, int | None]]] = field(default_factory=dict)  # file, device -> group
    metadata_specs: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)  # base request -> file, host
    metadata_docs: dict[str, list[tuple[str, dict]]] = field(default_factory=dict)  # (file, document)
    inventory: Inventory = field(default_factory=Inventory)
    api: dict[str, dict] | None = None  # uid -> ResourceClaim allocated here; None: the API was not read
    api_error: str | None = None  # why the API was not read
    gpu_ids: dict[str, int] = field(default_factory=dict)  # GPU address -> the number device names carry
    # vGPUs (mdev UUIDs, VF addresses) and GPUs the node manager's layout saved: never a claim's
    # (a claim's vGPU is never saved as a layout device), so a stale file naming one cannot take it
    layout_owned: set[str] = field(default_factory=set)

    def uids(self) -> list[str]:
        return sorted(set(self.claim_specs) | set(self.metadata_specs) | set(self.metadata_docs))


@dataclass
class Rebuilt:
    claims: dict[str, ClaimRecord]
    skipped: list[str]  # what was left out and why
    from_api: list[str] = field(default_factory=list)  # what the API's claims added, one phrase each
    not_prepared: list[str] = field(default_factory=list)  # allocated here, nothing on the node shows them


def _json(io: HostIO, path: Path) -> object:
    try:
        text = io.read(path)
        return json.loads(text.splitlines()[0] if path.name == "metadata.json" and text.strip() else text)
    except (OSError, ValueError, IndexError):
        return None


def _group(node_path: str) -> int | None:
    head, _, tail = node_path.rpartition("/")
    return int(tail) if head == "/dev/vfio" and tail.isdigit() else None


def _brief(exc: BaseException) -> str:
    """An API error in one short line (the client's carry headers and bodies)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):  # the client's ApiException: "(503)\nReason: ..."
        line = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    else:
        text = str(exc).strip().splitlines()
        line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= 200 else line[:197] + "..."


def observe(paths: NodePaths, env: HostEnv, io: HostIO, claims: object = None, pool: str = "") -> Observed:
    """The node's traces, and (when ``claims`` can list them) the API's claims allocated from ``pool``."""
    defs, _problems = persist.load_definitions(env, io)
    ids = numbering.load(env, io, paths.gpu_ids)
    obs = Observed(inventory=discover(env, io, ids=ids), gpu_ids={a: n.number for a, n in ids.items()},
                   layout_owned={d.uuid for d in defs} | set(persist.load_vendor_vfio(env, io))
                   | set(persist.load_passthrough(env, io)))
    try:
        listed = allocated_claims(claims, paths.driver, pool)
    except Exception as exc:  # noqa: BLE001 - any client, connection or timeout error: go on from the node
        obs.api_error = f"the API server could not be read ({_brief(exc)})"
    else:
        if listed is None:
            obs.api_error = "the claim source cannot list claims"
        else:
            obs.api = {c["metadata"]["uid"]: c for c in listed
                       if isinstance((c.get("metadata") or {}).get("uid"), str)}
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
            uid = (doc.get("metadata") or {}).get("uid") if isinstance(doc, dict) else None
            if isinstance(doc, dict) and isinstance(uid, str):
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


def _device_record(name: str, info: dict, inv: Inventory,
                   layout_owned: Set[str] = frozenset()) -> tuple[PreparedDeviceRecord, bool]:
    """The device's record and whether the host holds it (a layout's device is not the claim's:
    its vGPU id or group in an old file only means the device was made again for the layout)."""
    attrs = info.get("attributes") or {}
    key = (attrs.get("mdevUUID") or attrs.get(PCI_ATTR) or {}).get("string")
    group = info.get("group")
    vgpus = [v for v in inv.all_vgpus() if v.id not in layout_owned]
    vg = next((v for v in vgpus if v.id == key), None) or next(
        (v for v in vgpus if group is not None and v.iommu_group == group), None)
    base = {"request": info.get("request") or "", "pool": info.get("pool") or "", "device": name}
    if vg is not None:
        return PreparedDeviceRecord(**base, kind="vgpu", gpu=vg.gpu, framework=vg.framework, vgpu_id=vg.id,
                                    parent=vg.parent, type_id=vg.type_id, iommu_group=vg.iommu_group), True
    gpu = next((g for g in inv.gpus if g.address == key or (group is not None and g.iommu_group == group)), None)
    if gpu is not None and not attrs.get("mdevUUID") and gpu.address not in layout_owned:
        return PreparedDeviceRecord(**base, kind="passthrough", gpu=gpu.address, iommu_group=gpu.iommu_group), \
            gpu.driver == "vfio-pci"
    mdev = (attrs.get("mdevUUID") or {}).get("string")
    return PreparedDeviceRecord(**base, kind="vgpu", gpu="", framework="mdev" if mdev else None, vgpu_id=mdev), False


def _results(claim: dict, driver: str, pool: str, skipped: list[str]) -> list[tuple[str, str]]:
    """(device, request) of each device the claim was allocated from this pool; names prepare would
    refuse are left out, each noted (one bad result must not cost a claim its other devices)."""
    out = []
    for r in allocation_results(claim):
        if r.get("driver") != driver or r.get("pool") != pool:
            continue
        try:
            out.append((check_label(r.get("device"), "device"), check_request(r.get("request"))))
        except UnsafeName as exc:
            skipped.append(f"uid {(claim.get('metadata') or {}).get('uid')}: allocated {exc}")
    return out


def _api_identity(claim: dict, files: tuple[str, str], uid: str, notes: list[str]) -> tuple[str, str]:
    """The claim's namespace and name from its API object (checked), else what the files said."""
    meta = claim.get("metadata") or {}
    try:
        api = check_namespace(meta.get("namespace")), check_name(meta.get("name"))
    except UnsafeName:
        return files
    if files == ("", ""):
        notes.append(f"uid {uid} named {api[0]}/{api[1]}")
    elif files != api:
        notes.append(f"uid {uid} named {api[0]}/{api[1]} (the files said {files[0]}/{files[1]})")
    return api


def _published(device: str, published: Pool | None, obs: Observed) -> tuple[_Kind | None, str, str | None]:
    """(kind, GPU address, type id) of a device name: from the published pool, else from the GPU
    number the name carries (the plugin's stable numbers, else the PCI order the pool falls back to)."""
    if published is not None and (d := published.device(device)) is not None:
        return d.kind, d.gpu, d.type_id
    m = _DEVICE_NAME.match(device)
    if not m:
        return None, "", None
    numbers = {n: a for a, n in obs.gpu_ids.items()} or {g.index: g.address for g in obs.inventory.gpus}
    address = numbers.get(int(m.group(1)), "")
    if m.group(2) == "passthrough":
        return "passthrough", address, None
    gpu = obs.inventory.gpu(address)
    if m.group(2).startswith("mig-"):  # gpu-<n>-mig-<profile>-<profile id>-<start>[-at-<id>]: the profile's type
        pid = re.search(r"-(\d+)-\d+(?:-at-\d+)?$", m.group(2))
        prof = gpu.mig.profile(int(pid.group(1))) if gpu and gpu.mig and pid else None
        types = [t.id for t in (gpu.types if gpu else []) if prof and t.gpu_instance_profile == prof.name]
        return "vgpu", address, types[0] if len(types) == 1 else None
    rest = m.group(2).removeprefix("vgpu-")
    size = re.match(r"^(\d+)(gb|mb)-(?:at-)?\d+$", rest)
    if size:  # a size slot or a mixed-size placement (-at-<id>): the claim chose its type; known if the size has one
        fb = int(size.group(1)) * (1024 if size.group(2) == "gb" else 1)
        types = [t.id for t in (gpu.types if gpu else []) if t.framebuffer_mib == fb and not t.mig_backed]
        return "vgpu", address, types[0] if len(types) == 1 else None
    # else the type's DNS-safe short name (its id appended when two share one), as
    # dra_bridge.pool.devices names a slot whose size repeats; a name cut to fit a DNS label
    # leaves the type unknown
    fits = [t.id for t in (gpu.types if gpu else [])
            if rest.startswith(dns_safe(t.short_name or short_type_name(t.name)) + "-")]
    exact = [i for i in fits if f"-{dns_safe(i)}-" in f"-{rest}"]
    return "vgpu", address, (exact or fits)[0] if len(exact or fits) == 1 else None


@dataclass
class _Held:
    vgpus: set[str] = field(default_factory=set)
    gpus: set[str] = field(default_factory=set)  # passed through whole

    def add(self, rec: PreparedDeviceRecord) -> None:
        if rec.kind == "vgpu" and rec.vgpu_id:
            self.vgpus.add(rec.vgpu_id)
        elif rec.kind == "passthrough" and rec.gpu:
            self.gpus.add(rec.gpu)


def _attribute(device: str, request: str, pool: str, obs: Observed, published: Pool | None,
               held: _Held) -> tuple[PreparedDeviceRecord, bool]:
    """A device the API names and no file does: its record, and whether the node shows it.

    Shown: a vGPU of its type on its GPU, or its GPU on vfio-pci, that no record holds yet. The
    vGPU is recorded without its parent, so this plugin never removes it (which vGPU of a type was
    the claim's cannot be told); a passed-through GPU with nothing to give back, as any rebuilt one.
    """
    kind, gpu_address, type_id = _published(device, published, obs)
    base = {"request": request, "pool": pool, "device": device}
    gpu = obs.inventory.gpu(gpu_address) if gpu_address else None
    if gpu is not None and kind == "vgpu":
        for v in sorted(gpu.vgpus, key=lambda v: v.id):
            if v.id not in held.vgpus and v.id not in obs.layout_owned and type_id in (None, v.type_id):
                rec = PreparedDeviceRecord(**base, kind="vgpu", gpu=v.gpu, framework=v.framework, vgpu_id=v.id,
                                           type_id=v.type_id, iommu_group=v.iommu_group)
                held.add(rec)
                return rec, True
    if gpu is not None and kind == "passthrough" and gpu.driver == "vfio-pci" and not gpu.vgpus \
            and gpu.address not in held.gpus and gpu.address not in obs.layout_owned:
        rec = PreparedDeviceRecord(**base, kind="passthrough", gpu=gpu.address, iommu_group=gpu.iommu_group)
        held.add(rec)
        return rec, True
    return PreparedDeviceRecord(**base, kind=kind or "vgpu", gpu=gpu_address, type_id=type_id), False


def rebuild(obs: Observed, *, driver: str, pool: str, boot_id: str | None, published: Pool | None = None) -> Rebuilt:
    """The records, by uid, with what was left out and what the API added. Names that fail
    validation are left out; ``published`` (the pool this node publishes, when known) tells a
    device's GPU and type."""
    out = Rebuilt(claims={}, skipped=[])
    api = obs.api or {}
    pending: dict[str, list[tuple[str, str]]] = {}  # uid -> (device, request) the API names, no file does
    present: dict[str, list[bool]] = {}
    requests_filled = 0
    for uid in obs.uids():
        claim = api.get(uid)
        try:
            check_uid(uid)
            namespace, name = _identity(uid, obs)
            infos = _devices(uid, obs, driver, pool)
            if claim is not None:
                namespace, name = _api_identity(claim, (namespace, name), uid, out.from_api)
                for dev, request in _results(claim, driver, pool, out.skipped):
                    if dev not in infos:
                        pending.setdefault(uid, []).append((dev, request))
                    elif not infos[dev].get("request"):
                        infos[dev]["request"] = request
                        requests_filled += 1
            devices, here, with_metadata = [], [], set()
            for dev, info in sorted(infos.items()):
                check_label(dev, "device")
                if info.get("request"):
                    check_request(info["request"])
                rec, shown = _device_record(dev, info, obs.inventory, obs.layout_owned)
                _fill_gpu(rec, _published(dev, published, obs))
                rec.cdi_ids = [cdi.cdi_id(driver, uid, dev)] if dev in (obs.claim_specs.get(uid) or ("", {}))[1] else []
                base = metadata.base_request(rec.request) if rec.request else None
                # the metadata device goes with the first device of each request only, as prepare
                # answers (upstream kubeletplugin/draplugin.go); the order prepare used is lost, so
                # the first by name
                if base and base in obs.metadata_specs.get(uid, {}) and base not in with_metadata:
                    rec.cdi_ids.append(metadata.cdi_id(driver, uid, base))
                    with_metadata.add(base)
                devices.append(rec)
                here.append(shown)
        except ValueError as exc:
            out.skipped.append(f"{uid}: {exc}")
            pending.pop(uid, None)
            continue
        cdi_files = ([obs.claim_specs[uid][0]] if uid in obs.claim_specs else []) + \
            [f for f, _ in obs.metadata_specs.get(uid, {}).values()]
        out.claims[uid] = ClaimRecord(
            uid=uid, namespace=namespace, name=name, state="prepared", devices=devices,
            cdi_files=sorted(set(cdi_files)), metadata_files=sorted(f for f, _ in obs.metadata_docs.get(uid, [])))
        present[uid] = here
    if requests_filled:
        out.from_api.append(f"the request of {requests_filled} device{'s' * (requests_filled != 1)}")

    held = _Held()
    for claim_rec in out.claims.values():
        for d in claim_rec.devices:
            held.add(d)
    for uid, wanted in pending.items():  # devices of a known claim that no file names
        claim_rec = out.claims[uid]
        for dev, request in wanted:
            d, shown = _attribute(dev, request, pool, obs, published, held)
            claim_rec.devices.append(d)
            present[uid].append(shown)
            out.from_api.append(f"device {dev} of {_who(claim_rec)}" + ("" if shown else " (not on the node)"))
        claim_rec.devices.sort(key=lambda d: d.device)
    files = set(obs.uids())
    for uid, claim in sorted(api.items()):  # claims no file names
        if uid in files:
            continue
        try:
            check_uid(uid)
            namespace, name = _api_identity(claim, ("", ""), uid, [])
            if not namespace:
                raise UnsafeName("its namespace or name is not a valid one")
        except UnsafeName as exc:
            out.skipped.append(f"{uid} (from the API): {exc}")
            continue
        recs = [_attribute(dev, request, pool, obs, published, held)
                for dev, request in _results(claim, driver, pool, out.skipped)]
        if not any(shown for _, shown in recs):
            out.not_prepared.append(f"{namespace}/{name}")
            continue
        out.claims[uid] = ClaimRecord(uid=uid, namespace=namespace, name=name, state="prepared",
                                      devices=sorted((d for d, _ in recs), key=lambda d: d.device))
        present[uid] = [False]  # its files are gone: never "of this boot" until prepare rewrites them
        on_node = ", ".join(f"{d.device} ({d.vgpu_id or d.gpu})" for d, here in recs if here)
        out.from_api.append(f"{namespace}/{name} held without files: {on_node}")
    for uid, claim_rec in out.claims.items():
        claim_rec.boot_id = boot_id if claim_rec.devices and all(present[uid]) else None
        for d in claim_rec.devices:
            place(d, obs.inventory, published)
    return out


def _who(rec: ClaimRecord) -> str:
    return f"{rec.namespace}/{rec.name}" if rec.namespace else f"uid {rec.uid}"


def _fill_gpu(rec: PreparedDeviceRecord, published: tuple[_Kind | None, str, str | None]) -> None:
    """A record the files could not place on a GPU (its vGPU gone with a reboot) learns its GPU and
    type from the published device, so a whole-GPU claim on that GPU still clashes with it."""
    kind, gpu, type_id = published
    if rec.gpu or not gpu or (kind != rec.kind and rec.vgpu_id):
        return
    rec.kind, rec.gpu, rec.type_id = kind or rec.kind, gpu, rec.type_id or type_id

