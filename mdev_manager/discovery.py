"""Read the node: GPUs, their SR-IOV state, offered vGPU types and existing vGPUs.

All reads go through a ``HostIO`` under ``env.sys_root``. Enumeration uses pyudev on a
real ``/sys`` where udev is present, and plain directory listing otherwise (simulated
trees, containers without udev); both read the same attributes afterwards.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from mdev_manager import catalog, numbering
from mdev_manager.catalog_mig import MIG_INFERRED
from mdev_manager.host import pciids
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO, RealIO, link_name, override_value, read_attr
from mdev_manager.host.nvml import NO_GPU_INSTANCE, Mig, NvmlError, VgpuModes
from mdev_manager.models import (
    Gpu,
    Inventory,
    MdevParent,
    MigState,
    Vgpu,
    VgpuPlacements,
    VgpuType,
    VirtualFunction,
)
from mdev_manager.names import is_mig_backed
from mdev_manager.numbering import Numbered
from mdev_manager.typeset import (  # noqa: F401  infer_mixed_size: read from here too
    infer_mixed_size,
    link_instances,
    mdev_type,
    summarise,
    vendor_type,
)

log = logging.getLogger(__name__)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class HostReadError(OSError):
    """A read of the host failed: which path, why, and what to check (one line for the CLI)."""

    def __init__(self, err: int | None, reason: str, path: str, check: str):
        super().__init__(err, reason, path)
        self.check = check

    def __str__(self) -> str:
        return f"cannot read {self.filename}: {self.strerror}; {self.check}"


def _what_to_check(err: int | None, env: HostEnv) -> str:
    if err == errno.ENOTCONN:
        return ("the file system there is disconnected (a FUSE mount whose process ended?): "
                "unmount it (fusermount3 -u) and mount it again")
    if err == errno.EIO:
        return (f"the device or the mount failed the read: check dmesg, and that {env.sys_root} is the sysfs "
                "meant (--sys-root)")
    if err in (errno.EACCES, errno.EPERM):
        return "run as root (device attributes in sysfs need it)"
    return f"check that {env.sys_root} is a mounted sysfs (--sys-root)"


def read_failed(exc: OSError, env: HostEnv) -> HostReadError:
    """``exc`` worded for the admin: the path (else the sysfs root) and what to check for its errno."""
    path = exc.filename if exc.filename is not None else env.sys_root
    return HostReadError(exc.errno, exc.strerror or str(exc), os.fsdecode(path), _what_to_check(exc.errno, env))


def pci_addresses(env: HostEnv, io: HostIO) -> list[str]:
    """Every PCI function, from udev where it runs on the real /sys, else from sysfs."""
    if env.sys_root == Path("/sys"):
        try:
            import pyudev  # start-up cost (~11 ms), real /sys only; a failing import falls back to sysfs

            ctx = pyudev.Context()
            return sorted(d.sys_name for d in ctx.list_devices(subsystem="pci"))
        except Exception as exc:  # no libudev, or no udev database: plain sysfs works everywhere
            log.debug("pyudev enumeration unavailable: %s", exc)
    return io.listdir(env.pci_devices)


def _int(value: str | None) -> int | None:
    try:
        n = int(value, 0) if value is not None else None
    except ValueError:
        return None
    return None if n is None or n < 0 else n


class DeviceDirs:
    """Each PCI function's real directory, resolved once per discovery.

    ``bus/pci/devices/<addr>`` is a relative link into ``devices/``, whose directories are real
    (sysfs has no links below it, nor does the simulated tree): one ``readlink`` and a lexical
    join resolve it, where ``realpath`` would ``lstat`` every component, and it would be done
    again for every attribute group (four times per VF). Attributes are then opened relative
    to the directory (:meth:`HostIO.read_attrs`).
    """

    def __init__(self, env: HostEnv, io: HostIO):
        self.env, self.io = env, io
        self._dirs: dict[str, Path] = {}

    def __call__(self, addr: str) -> Path:
        d = self._dirs.get(addr)
        if d is None:
            d = self._resolve(self.env.pci_devices, self.env.pci(addr))
            self._dirs[addr] = d
        return d

    def _resolve(self, base: Path, link: Path) -> Path:
        try:
            return Path(os.path.normpath(os.path.join(base, self.io.readlink(link))))
        except OSError:  # not a link (a hand-made tree): the slow way
            return self.io.realpath(link)

    def via(self, parent_dir: Path, entry: str) -> str | None:
        """The function a link in ``parent_dir`` names (``virtfn3``), its directory remembered."""
        try:
            target = self.io.readlink(parent_dir / entry)
        except OSError:
            return None
        addr = os.path.basename(target)
        self._dirs.setdefault(addr, Path(os.path.normpath(os.path.join(parent_dir, target))))
        return addr


def _dev_dir(env: HostEnv, io: HostIO, addr: str, dirs: DeviceDirs | None = None) -> Path:
    return (dirs or DeviceDirs(env, io))(addr)


def read_function(env: HostEnv, io: HostIO, addr: str, dirs: DeviceDirs | None = None) -> dict:
    """The attributes common to every PCI function, as model fields."""
    d = _dev_dir(env, io, addr, dirs)
    a = io.read_attrs(d, ["vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node",
                          "driver_override"])
    vendor = a["vendor"] or "0x0000"
    device = a["device"] or "0x0000"
    vname, dname = pciids.lookup(env.pci_ids, vendor, device)
    if dname is None:
        board = catalog.match_board(vendor, device, a["subsystem_device"])
        dname = board.product_name if board else None
    vfio_dev = io.listdir(d / "vfio-dev")
    real = str(d)
    root = next((part for part in real.split(os.sep) if part.startswith("pci") and ":" in part), None)
    group = link_name(io, d / "iommu_group")
    return dict(
        address=addr, vendor_id=vendor, device_id=device,
        class_code=a["class"] or "0x000000",
        subsystem_vendor_id=a["subsystem_vendor"],
        subsystem_device_id=a["subsystem_device"],
        vendor_name=vname, product_name=dname,
        numa_node=_int(a["numa_node"]),
        iommu_group=int(group) if group and group.isdigit() else None,
        driver=link_name(io, d / "driver"),
        driver_override=override_value(a["driver_override"]),
        vfio_dev=vfio_dev[0] if vfio_dev else None,
        pcie_root=root,
    )


_TYPE_ATTRS = ["name", "description", "device_api", "available_instances"]
_FIXED_ATTRS = ("name", "description", "device_api")


def read_mdev_types(env: HostEnv, io: HostIO, parent: str, dirs: DeviceDirs | None = None,
                    only: set[str] | None = None, fixed: dict[str, dict[str, str | None]] | None = None) -> list[VgpuType]:
    """The parent's types; ``only``: just these type ids (prepare needs one type, not all 23).

    ``fixed``: the name, description and device_api of each type id already read on another parent
    of the same GPU (filled here). The driver's type table is the GPU's: its VFs list the same ids
    with the same names and descriptions, only ``available_instances`` differs per parent. So a
    parent after the first reads one attribute per type it shares instead of four (a GPU of 32 VFs:
    about a quarter of the opens and reads); a type id not seen before is read whole.
    """
    base = _dev_dir(env, io, parent, dirs) / "mdev_supported_types"
    out = []
    if only is not None:
        listed = {tid: io.read_attrs(base / tid, _TYPE_ATTRS) for tid in sorted(only)}
        listed = {tid: a for tid, a in listed.items() if any(v is not None for v in a.values())}
    elif fixed:
        listed = io.read_children(base, ["available_instances"])
        for tid, a in listed.items():
            if tid in fixed:
                a.update(fixed[tid])
            else:
                listed[tid] = io.read_attrs(base / tid, _TYPE_ATTRS)
    else:
        listed = io.read_children(base, _TYPE_ATTRS)
    for tid, a in listed.items():
        if fixed is not None and tid not in fixed and a["name"] is not None:
            fixed[tid] = {k: a[k] for k in _FIXED_ATTRS}
        name = a["name"] or tid
        desc = a["description"] or ""
        out.append(mdev_type(tid, name, desc, a["device_api"] or "vfio-pci", _int(a["available_instances"]) or 0))
    return out


def read_available(env: HostEnv, io: HostIO, parent: str, type_id: str) -> int:
    """One parent's ``available_instances`` of one mdev type, read now (0: not offered there, or gone)."""
    try:
        return _int(read_attr(io, _dev_dir(env, io, parent) / "mdev_supported_types" / type_id / "available_instances")) or 0
    except OSError:
        return 0


def parse_creatable(text: str) -> list[tuple[str, str]]:
    """``creatable_vgpu_types``: a header line, then ``<id> : <name>`` per line."""
    out = []
    for line in text.splitlines()[1:]:
        if ":" in line:
            tid, name = (x.strip() for x in line.split(":", 1))
            if tid.isdigit():
                out.append((tid, name))
    return out


def placement_value(text: str | None) -> int | None:
    """``nvidia/placement_id``: a slot number in mixed-size mode; "Not Applicable" (or nothing) else."""
    text = (text or "").strip()
    return int(text) if text.isdigit() and int(text) != NVML_INVALID_PLACEMENT else None


NVML_INVALID_PLACEMENT = 0xFFFF


def read_mdevs(env: HostEnv, io: HostIO, parent: str, gpu: str, dirs: DeviceDirs | None = None) -> list[Vgpu]:
    out = []
    pdir = _dev_dir(env, io, parent, dirs)
    for name in io.listdir(pdir):
        if not _UUID.match(name):
            continue
        try:  # the link read is the check that it is there: no lstat before it
            tid = os.path.basename(io.readlink(pdir / name / "mdev_type").rstrip("/"))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                continue  # no mdev_type: not an mdev (or gone meanwhile)
            tid = ""  # there, but not a link (a hand-made tree)
        tname = read_attr(io, pdir / name / "mdev_type" / "name") or tid
        group = link_name(io, pdir / name / "iommu_group")
        out.append(Vgpu(id=name, framework="mdev", type_id=tid, type_name=tname, parent=parent, gpu=gpu,
                        iommu_group=int(group) if group and group.isdigit() else None,
                        placement_id=placement_value(read_attr(io, pdir / name / "nvidia" / "placement_id"))))
    return out


def _placements(io: HostIO, addr: str, fields: dict, types: list[VgpuType]) -> VgpuPlacements | None:
    """NVML's mixed-size mode of an NVIDIA GPU on its driver and its time-sliced types' placements
    (NVML names a type by the number in its id: ``nvidia-468`` and ``468`` are type 468)."""
    if fields.get("vendor_id") != "0x10de" or fields.get("driver") != "nvidia":
        return None
    numbers = {t.id: int(n) for t in types if not t.mig_backed and (n := t.id.rsplit("-", 1)[-1]).isdigit()}
    raw = VgpuModes(io.nvml()).state(addr, numbers)
    return None if raw is None else VgpuPlacements.model_validate(raw)


def read_gpu(env: HostEnv, io: HostIO, addr: str, index: int, fields: dict, dirs: DeviceDirs | None = None,
             only_types: set[str] | None = None) -> Gpu:
    """One GPU with its VFs, parents, types and vGPUs. ``only_types`` reads just those mdev types of
    each parent (a claim's prepare): the GPU's ``types`` then hold only them, and what is derived
    from all types (``mixed_size``, the occupancy cap of other types) is not to be relied on."""
    dirs = dirs or DeviceDirs(env, io)
    d = dirs(addr)
    total = _int(read_attr(io, d / "sriov_totalvfs")) or 0
    vfs = []
    for entry in io.listdir(d):
        if entry.startswith("virtfn") and entry[6:].isdigit():
            vf_addr = dirs.via(d, entry)
            if vf_addr:
                vfs.append(VirtualFunction(index=int(entry[6:]), physfn=addr, **read_function(env, io, vf_addr, dirs)))
    vfs.sort(key=lambda v: v.index)
    parents: list[MdevParent] = []
    vgpus: list[Vgpu] = []
    framework = "none"
    fixed: dict[str, dict[str, str | None]] = {}  # each type id's name, description, device_api: one table per GPU
    if io.exists(d / "mdev_supported_types"):
        framework = "mdev"
        parents.append(MdevParent(address=addr, types=read_mdev_types(env, io, addr, dirs, only_types, fixed)))
        vgpus += read_mdevs(env, io, addr, addr, dirs)
    for vf in vfs:
        vd = dirs(vf.address)
        if io.exists(vd / "mdev_supported_types"):
            framework = "mdev-sriov"
            parents.append(MdevParent(address=vf.address, types=read_mdev_types(env, io, vf.address, dirs, only_types, fixed)))
            vgpus += read_mdevs(env, io, vf.address, addr, dirs)
        elif io.exists(vd / "nvidia" / "creatable_vgpu_types"):
            framework = "vendor-vfio"
            listed = parse_creatable(read_attr(io, vd / "nvidia" / "creatable_vgpu_types", "") or "")
            parents.append(MdevParent(address=vf.address, types=[vendor_type(t, n, 1) for t, n in listed]))
            current = read_attr(io, vd / "nvidia" / "current_vgpu_type", "0") or "0"
            if current != "0":
                known = next((n for t, n in listed if t == current), None)
                spec = catalog.match_board(fields["vendor_id"], fields["device_id"], fields.get("subsystem_device_id"))
                if known is None and spec:
                    known = next((t.name for t in spec.types if str(t.num) == current), None)
                gi = _int(read_attr(io, vd / "nvidia" / "gpu_instance_id"))
                vgpus.append(Vgpu(id=vf.address, framework="vendor-vfio", type_id=current,
                                  type_name=known or current, parent=vf.address, gpu=addr,
                                  iommu_group=vf.iommu_group,
                                  gpu_instance=gi if known and is_mig_backed(known) and gi != NO_GPU_INSTANCE else None,
                                  placement_id=placement_value(read_attr(io, vd / "nvidia" / "placement_id"))))
    board = catalog.match_board(fields["vendor_id"], fields["device_id"], fields.get("subsystem_device_id"))
    types, placements, mixed = summarise(parents, vgpus, framework, fields["vendor_id"], board,
                                         lambda merged: _placements(io, addr, fields, merged))
    mig = _mig_state(io, addr, fields, types, vgpus)
    group_members = []
    if fields.get("iommu_group") is not None:
        group_members = io.listdir(env.iommu_groups / str(fields["iommu_group"]) / "devices")
    group_drivers = {m: link_name(io, env.pci(m) / "driver") for m in group_members}
    overrides = {m: override_value(read_attr(io, env.pci(m) / "driver_override")) for m in group_members}
    return Gpu(index=index, framework=framework, iommu_group_members=group_members,
               iommu_group_drivers=group_drivers, sriov_total_vfs=total,
               iommu_group_overrides={m: o for m, o in overrides.items() if o},
               mixed_size=mixed,
               sriov_num_vfs=_int(read_attr(io, d / "sriov_numvfs")) or 0, vfs=vfs, parents=parents,
               types=types, vgpus=vgpus, mig=mig, placements=placements,
               inferred=[*board.inferred, *MIG_INFERRED.get(board.key, ())] if board else [], **fields)




def _mig_state(io: HostIO, addr: str, fields: dict, types: list[VgpuType], vgpus: list[Vgpu]) -> MigState | None:
    """NVML's view of an NVIDIA GPU on its driver, with each GPU instance's vGPUs
    (:func:`~mdev_manager.typeset.link_instances`)."""
    if fields.get("vendor_id") != "0x10de" or fields.get("driver") != "nvidia":
        return None
    raw = Mig(io.nvml()).state(addr)
    mig = None if raw is None else MigState.model_validate(raw)
    if mig is not None:
        if mig.enabled:
            _instances_of_mdevs(io, addr, types, vgpus)
        link_instances(mig, types, vgpus)
    return mig


def _instances_of_mdevs(io: HostIO, addr: str, types: list[VgpuType], vgpus: list[Vgpu]) -> None:
    """Each MIG-backed mdev's GPU instance, as NVML says (sysfs names none for an mdev): set on the
    vGPU in place. Without it an mdev is matched to its profile's instances in id order, a guess an
    apply once acted on, destroying the instance a held vGPU sat in (refused by the driver, IN_USE)."""
    backed = {t.id for t in types if t.gpu_instance_profile}
    nvml = io.nvml()
    for v in vgpus:
        if v.gpu_instance is not None or (v.type_id not in backed and not is_mig_backed(v.type_name)):
            continue
        try:
            gi = nvml.vgpu_gpu_instance_id(addr, v.id)
        except NvmlError:
            continue  # NVML cannot say: the match by profile stands
        if gi != NO_GPU_INSTANCE:
            v.gpu_instance = gi


def is_gpu(fields: dict) -> bool:
    """Display controllers (class 0x03xxxx): VGA, XGA and 3D controllers."""
    return fields["class_code"].lower().startswith("0x03")


def discover(env: HostEnv | None = None, io: HostIO | None = None, node: str = "",
             known: Iterable[str] = (), ids: dict[str, Numbered] | None = None) -> Inventory:
    """The whole node inventory; VFs belong to their PF. GPUs carry the node's numbers
    (:mod:`mdev_manager.numbering`, read here, written by :func:`numbering.record`; ``ids``: a
    numbering already read); a GPU it has not numbered yet gets the number it would be given.
    GPUs numbered (or in ``known``) but not found are the inventory's ``gone``.

    A read that fails (not one that finds nothing) raises :class:`HostReadError` naming the path;
    a numbering that cannot be read, :class:`numbering.NumberingCorrupt`.
    """
    env = env or HostEnv()
    io = io or RealIO()
    try:
        inv = _discover(env, io, node)
        if ids is None:
            ids = numbering.load(env, io)
        ids = numbering.extend(ids, [(g.address, g.vendor_id) for g in inv.gpus])
        for g in inv.gpus:
            g.index = ids[g.address].number
        inv.gpus.sort(key=lambda g: g.index)
        present = {g.address for g in inv.gpus}
        inv.gone = sorted((set(ids) | set(known)) - present)
        inv.gone_numbers = {a: ids[a].number for a in inv.gone if a in ids}
        inv.gone_vendors = {a: v for a in inv.gone if a in ids and (v := ids[a].vendor)}
        return inv
    except HostReadError:
        raise
    except OSError as exc:
        raise read_failed(exc, env) from exc


def _gpu_functions(env: HostEnv, io: HostIO, dirs: DeviceDirs) -> list[tuple[str, int, dict]]:
    """The node's GPUs (PFs, not VFs) in PCI order: (address, position, the function's fields)."""
    found: list[tuple[str, int, dict]] = []
    for addr in pci_addresses(env, io):
        d = dirs(addr)
        if io.exists(d / "physfn"):
            continue
        fields = read_function(env, io, addr, dirs)
        if is_gpu(fields):
            found.append((addr, len(found), fields))
    return found


def gpu_ids(env: HostEnv, io: HostIO) -> list[tuple[str, str]]:
    """(address, vendor id) of each GPU on the bus, without reading its types, VFs or vGPUs: what the
    GPU numbering needs (mdev_manager.numbering). A failing read raises as :func:`discover` does."""
    try:
        return [(addr, fields["vendor_id"]) for addr, _, fields in _gpu_functions(env, io, DeviceDirs(env, io))]
    except HostReadError:
        raise
    except OSError as exc:
        raise read_failed(exc, env) from exc


def _discover(env: HostEnv, io: HostIO, node: str) -> Inventory:
    dirs = DeviceDirs(env, io)
    found = _gpu_functions(env, io, dirs)
    # One thread: sysfs attributes are kernel memory, read without blocking, so threads only
    # fight over the GIL (a pool of 8 took twice as long on a 16-GPU tree; #15).
    gpus = [read_gpu(env, io, *f, dirs=dirs) for f in found]
    return Inventory(node=node or os.uname().nodename, gpus=gpus, iommufd=io.exists(env.iommufd))
