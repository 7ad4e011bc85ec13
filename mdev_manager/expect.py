"""What the node reads as once a plan's steps took effect, without taking them. Pure.

A preview (``vgpuctl slices -f``, ``capacity``) shows what the agent publishes once the node matches
a layout. The agent gets there by steps whose effect only the kernel and NVML know (VFs enabled,
drivers bound, MIG mode, GPU instances, vGPUs); :func:`expected` applies each step's effect to a
copy of the discovered inventory instead, so the same planner and the same publisher run on it
and nothing is written to, or read from, a device that does not exist yet. Only the GPUs a step
touches are copied (the others are the inventory's own objects: copy-on-write).

Where discovery has not read a fact the effect needs (a VF before it exists, the types it will
list), it comes from what the node reports for the parent (the PF's identity, NUMA node, PCIe
root) or from vgpuctl's catalog of the board (its framework, types, MIG profiles, mixed-size
placements), and the result names each such assumption, so a preview that guesses says so.
Type availability follows the driver's rules as ``docs/vgpu-types`` and the reference state them:
equal-size occupancy, mixed-size placements, MIG-backed types one per free GPU instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from mdev_manager import catalog, catalog_mig, catalog_placements
from mdev_manager.actions import (
    BindDriver,
    CreateGpuInstance,
    CreateMdev,
    DestroyGpuInstance,
    DisableVfs,
    EnableVfs,
    Plan,
    RemoveMdev,
    SetMigMode,
    SetMixedSize,
    SetPlacement,
    SetVgpuType,
)
from mdev_manager.catalog_spec import BoardSpec, TypeSpec
from mdev_manager.models import (
    Gpu,
    GpuInstance,
    Inventory,
    MdevParent,
    MigPlacement,
    MigState,
    TypePlacements,
    Vgpu,
    VgpuPlacements,
    VgpuType,
    VirtualFunction,
)
from mdev_manager.offers import NVIDIA, native_driver
from mdev_manager.placeplan import creatable, held
from mdev_manager.typeset import link_instances, mdev_type, summarise, vendor_type

#: the kernel's steps (a write only the kernel or NVML answers); the others only record state
KERNEL_STEPS = (EnableVfs, DisableVfs, BindDriver, CreateMdev, RemoveMdev, SetVgpuType, SetMigMode, CreateGpuInstance,
                DestroyGpuInstance, SetMixedSize, SetPlacement)
#: VF n of a PF sits at devfn PF + offset + n * stride; NVIDIA's boards report offset 4, stride 1
VF_OFFSET, VF_STRIDE = 4, 1


@dataclass
class Expected:
    """The inventory the node is expected to read as, and what that expectation assumes."""

    inventory: Inventory
    assumptions: list[str] = field(default_factory=list)


def vf_address(pf: str, n: int) -> str:
    """VF ``n`` of the PF at ``pf`` (VF_OFFSET, VF_STRIDE)."""
    dom, bus, rest = pf.split(":")
    dev, fn = rest.split(".")
    devfn = int(dev, 16) * 8 + int(fn, 16) + VF_OFFSET + n * VF_STRIDE
    return f"{dom}:{int(bus, 16) + (devfn >> 8):02x}:{(devfn & 0xff) >> 3:02x}.{devfn & 7}"


def expected(inv: Inventory, plan: Plan) -> Expected:
    """``inv`` as it reads once every step of ``plan`` took effect (the planner's own order)."""
    steps = [a for a in plan.actions if isinstance(a, KERNEL_STEPS)]
    touched = {a.gpu for a in steps}
    out = inv.model_copy(update={"gpus": [g.model_copy(deep=True) if g.address in touched else g for g in inv.gpus]})
    notes: dict[str, list[int]] = {}
    for a in steps:
        gpu = out.gpu(a.gpu)
        if gpu is not None:
            _apply(gpu, a, notes)
    for gpu in out.gpus:
        if gpu.address in touched:
            _retype(gpu, notes)
    return Expected(out, [f"GPU {', '.join(map(str, sorted(set(idx))))}: {what}" for what, idx in notes.items()])


def _board(gpu: Gpu) -> BoardSpec | None:
    return catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)


def _note(notes: dict[str, list[int]], gpu: Gpu, what: str) -> None:
    notes.setdefault(what, []).append(gpu.index)


# --------------------------------------------------------------------------- one step

def _apply(gpu: Gpu, a: object, notes: dict[str, list[int]]) -> None:
    if isinstance(a, EnableVfs):
        _enable_vfs(gpu, a.count, notes)
    elif isinstance(a, DisableVfs):
        vfs = {vf.address for vf in gpu.vfs}
        gpu.vfs, gpu.sriov_num_vfs = [], 0
        gpu.parents = [p for p in gpu.parents if p.address not in vfs]
        gpu.vgpus = [v for v in gpu.vgpus if v.parent not in vfs]
        gpu.framework = "mdev" if gpu.parents else "none"
    elif isinstance(a, BindDriver):
        _bind(gpu, a.address, a.driver, notes)
    elif isinstance(a, SetMigMode):
        if gpu.mig is not None:
            gpu.mig.enabled = gpu.mig.pending = a.enabled
            _note(notes, gpu, f"MIG mode {'on' if a.enabled else 'off'} at once (no GPU reset pending)")
        if a.enabled and gpu.placements is not None:
            gpu.placements.enabled = False
    elif isinstance(a, CreateGpuInstance) and gpu.mig is not None:
        gid = min(set(range(1, 64)) - {g.id for g in gpu.mig.instances})
        gpu.mig.instances.append(GpuInstance(id=gid, profile_id=a.profile_id,
                                             placement=MigPlacement(start=a.start, size=a.size)))
        gpu.mig.instances.sort(key=lambda g: g.id)
        _note(notes, gpu, "a new GPU instance takes the lowest free id (NVML chooses it)")
    elif isinstance(a, DestroyGpuInstance) and gpu.mig is not None:
        gpu.mig.instances = [g for g in gpu.mig.instances if g.id != a.gpu_instance]
    elif isinstance(a, SetMixedSize) and gpu.placements is not None:
        gpu.placements.enabled = a.enabled
    elif isinstance(a, CreateMdev):
        gi, inside = _shared_spot(gpu, a.type_id, None)
        gpu.vgpus.append(Vgpu(id=a.uuid, framework="mdev", type_id=a.type_id, type_name=_type_name(gpu, a.type_id),
                              parent=a.parent, gpu=gpu.address, gpu_instance=gi,
                              placement_id=_first_fit(gpu, a.type_id) if inside is None else inside))
    elif isinstance(a, RemoveMdev):
        gpu.vgpus = [v for v in gpu.vgpus if v.id != a.uuid]
    elif isinstance(a, SetVgpuType):
        gpu.vgpus = [v for v in gpu.vgpus if v.id != a.vf]
        if a.type_id != "0":
            vf = next((f for f in gpu.vfs if f.address == a.vf), None)
            gi, inside = _shared_spot(gpu, a.type_id, a.gpu_instance)
            gpu.vgpus.append(Vgpu(id=a.vf, framework="vendor-vfio", type_id=a.type_id,
                                  type_name=_type_name(gpu, a.type_id), parent=a.vf, gpu=gpu.address,
                                  iommu_group=vf.iommu_group if vf else None,
                                  gpu_instance=a.gpu_instance if gi is None else gi,
                                  placement_id=_first_fit(gpu, a.type_id) if inside is None else inside))
    elif isinstance(a, SetPlacement):
        for v in gpu.vgpus:
            if v.id == a.vgpu:
                v.placement_id = a.placement


def _type_name(gpu: Gpu, type_id: str) -> str:
    return next((t.name for t in gpu.types if t.id == type_id), type_id)


def _spec(board: BoardSpec | None, type_id: str) -> TypeSpec | None:
    if board is None:
        return None
    return next((t for t in board.types if type_id in (str(t.num), t.mdev_id(board.driver))), None)


def _rooms(gpu: Gpu, board: BoardSpec, t: TypeSpec, tid: str) -> list[tuple[int, list[int]]]:
    """MIG time-slicing (GB20x): the GPU instances of ``t``'s profile a new vGPU of ``t`` may join,
    each with its free placements inside, lowest id first: empty ones, and those holding only ``t``."""
    if gpu.mig is None or not t.max_per_instance:
        return []
    size, ids = catalog_placements.instance_placements(board.key, t)
    prof = gpu.mig.profile(t.gpu_instance_profile or "")
    out = []
    for g in sorted(gpu.mig.instances, key=lambda g: g.id):
        on = [v for v in gpu.vgpus if v.gpu_instance == g.id]
        if prof is None or g.profile_id != prof.id or any(v.type_id != tid for v in on):
            continue
        taken = {s for v in on if v.placement_id is not None for s in range(v.placement_id, v.placement_id + size)}
        free = [p for p in ids if taken.isdisjoint(range(p, p + size))]
        if free:
            out.append((g.id, free))
    return out


def _shared_spot(gpu: Gpu, type_id: str, wanted: int | None) -> tuple[int | None, int | None]:
    """(GPU instance, placement inside it) a new vGPU of a MIG time-sliced type takes: the first free
    placement of the instance ``wanted`` (else of the lowest with room); (None, None) for other types."""
    board = _board(gpu)
    t = _spec(board, type_id)
    if board is None or t is None or not t.max_per_instance:
        return None, None
    rooms = [(g, free) for g, free in _rooms(gpu, board, t, type_id) if wanted is None or g == wanted]
    return (rooms[0][0], rooms[0][1][0]) if rooms else (wanted, None)


def _first_fit(gpu: Gpu, type_id: str) -> int | None:
    """A new time-sliced vGPU of a mixed-size GPU takes its type's lowest creatable placement."""
    smap = gpu.placements
    if smap is None or not smap.enabled:
        return None
    free = creatable(smap, held(gpu.vgpus, smap), type_id)
    return free[0] if free else None


def _enable_vfs(gpu: Gpu, count: int, notes: dict[str, list[int]]) -> None:
    board = _board(gpu)
    driver = native_driver(gpu)
    gpu.sriov_num_vfs = count
    gpu.vfs = [VirtualFunction(
        index=i, physfn=gpu.address, address=vf_address(gpu.address, i), vendor_id=gpu.vendor_id,
        device_id=gpu.device_id, class_code=gpu.class_code, subsystem_vendor_id=gpu.subsystem_vendor_id,
        subsystem_device_id=gpu.subsystem_device_id, vendor_name=gpu.vendor_name, product_name=gpu.product_name,
        numa_node=gpu.numa_node, driver=driver, pcie_root=gpu.pcie_root) for i in range(count)]
    if gpu.placements is not None:
        gpu.placements.enabled = False  # sriov-manage -e resets the vGPU state: mixed-size mode is set after it
    _note(notes, gpu, f"its {count} VFs at devfn offset {VF_OFFSET}, stride {VF_STRIDE} (as NVIDIA's "
                 "boards report), on its driver, with the PF's identity and NUMA node; their IOMMU groups unknown")
    if board is None or board.framework == "mdev":
        _note(notes, gpu, "no catalog entry says what its VFs offer: none assumed")
        gpu.framework = "mdev" if any(p.address == gpu.address for p in gpu.parents) else "none"
        return
    gpu.framework = board.framework
    _note(notes, gpu, f"its VFs' vGPU types from vgpuctl's catalog of the {board.key}, on {board.framework}")


def _bind(gpu: Gpu, address: str, driver: str | None, notes: dict[str, list[int]]) -> None:
    """``driver`` None: back to the native driver (a function already on one keeps it: only its
    override goes, as the executor does it)."""
    current = gpu.driver if address == gpu.address else gpu.iommu_group_drivers.get(address)
    new = driver or (current if current not in (None, "vfio-pci") else None)
    if new is None:
        if address == gpu.address:
            new = native_driver(gpu)
        else:  # a companion function (audio, ...): the kernel picks its driver
            new = "(its native driver)"
            _note(notes, gpu, f"{address} back on its native driver (the kernel picks which)")
    if address in gpu.iommu_group_drivers or address != gpu.address:
        gpu.iommu_group_drivers[address] = new
    if driver:
        gpu.iommu_group_overrides[address] = driver
    else:
        gpu.iommu_group_overrides.pop(address, None)
    if address != gpu.address:
        return
    gpu.driver, gpu.driver_override = new, driver
    if new == current:  # only a leftover override went: what the GPU offers is unchanged
        return
    board = _board(gpu)
    if driver == "vfio-pci" or new is None:
        gpu.parents, gpu.types, gpu.vgpus, gpu.framework = [], [], [], "none"
        gpu.mig = gpu.placements = gpu.mixed_size = None
        return
    gpu.framework = "mdev" if board is not None and board.framework == "mdev" else "none"
    if board is not None and new == "nvidia" and gpu.vendor_id == NVIDIA:
        if gpu.mig is None and catalog_mig.has_mig(board.key):
            gpu.mig = MigState(enabled=False, pending=False, memory_slices=catalog_mig.MEMORY_SLICES[board.key],
                               profiles=list(catalog_mig.mig_profiles(board.key)))
            _note(notes, gpu, "back on nvidia in MIG mode off, its MIG profiles from vgpuctl's catalog, its NVML UUID "
                              "unknown until then")
        if gpu.placements is None and catalog_placements.placements(board.key) is not None:
            gpu.placements = VgpuPlacements(enabled=False, slots=0)
    if gpu.framework == "mdev" and board is not None:
        gpu.parents = [MdevParent(address=gpu.address)]
        _note(notes, gpu, f"back on {new}, its vGPU types from vgpuctl's catalog of the {board.key}")


# --------------------------------------------------------------------------- the types it then offers

def _retype(gpu: Gpu, notes: dict[str, list[int]]) -> None:
    """What each parent lists once the steps took effect, merged as discovery merges them."""
    board = _board(gpu)
    if gpu.mig is not None:  # on the types as they were: the rooms below count the free instances
        link_instances(gpu.mig, gpu.types, gpu.vgpus)
    if board is None or gpu.driver in (None, "vfio-pci"):
        return
    known = {t.id: t for p in gpu.parents for t in p.types}
    fw = gpu.framework
    specs = [(t, t.mdev_id(board.driver) if fw in ("mdev", "mdev-sriov") else str(t.num)) for t in board.types]
    left = {tid: _room(gpu, board, t, tid) for t, tid in specs}

    def mdev_types(available: dict[str, int]) -> list[VgpuType]:
        out = []
        for t, tid in specs:
            k = known.get(tid)
            out.append(k.model_copy(update={"available_instances": available[tid]}) if k else
                       mdev_type(tid, t.name, t.description or "", "vfio-pci", available[tid]))
        return out

    if fw == "mdev":
        gpu.parents = [MdevParent(address=gpu.address, types=mdev_types(left))]
    elif fw == "mdev-sriov":
        holds = {v.parent for v in gpu.vgpus}
        gpu.parents = [MdevParent(address=vf.address, types=mdev_types(
            {tid: 0 if vf.address in holds else min(1, n) for tid, n in left.items()})) for vf in gpu.vfs]
    elif fw == "vendor-vfio":
        holds = {v.parent for v in gpu.vgpus}
        gpu.parents = [MdevParent(address=vf.address, types=[] if vf.address in holds else [
            vendor_type(tid, t.name, 1) for t, tid in specs if left[tid] > 0]) for vf in gpu.vfs]
    gpu.types, gpu.placements, gpu.mixed_size = summarise(gpu.parents, gpu.vgpus, fw, gpu.vendor_id, board,
                                                          lambda merged: _placements(gpu, board, merged))


def _room(gpu: Gpu, board: BoardSpec, t: TypeSpec, tid: str) -> int:
    """How many more vGPUs of ``t`` the GPU takes now (the driver's rules)."""
    mig_on = gpu.mig is not None and gpu.mig.enabled
    if mig_on or t.mig_backed:
        if not (t.mig_backed and mig_on) or gpu.mig is None:
            return 0
        prof = gpu.mig.profile(t.gpu_instance_profile or "")
        mine = [g for g in gpu.mig.instances if prof is not None and g.profile_id == prof.id]
        if t.max_per_instance:
            return sum(len(free) for _, free in _rooms(gpu, board, t, tid))
        return sum(1 for g in mine if g.vgpu is None)
    smap = gpu.placements
    if smap is not None and smap.enabled:
        return len(creatable(smap, held(gpu.vgpus, smap), tid))
    by_id = {s: spec for spec, s in ((x, x.mdev_id(board.driver)) for x in board.types)}
    by_id.update({str(x.num): x for x in board.types})
    used, sizes = Fraction(0), set()
    for v in gpu.vgpus:
        spec = by_id.get(v.type_id)
        if spec is not None and not spec.mig_backed:
            used += Fraction(1, spec.max_instances)
            sizes.add(spec.fb_mib)
    if board.vendor_id == NVIDIA and sizes - {t.fb_mib}:
        return 0
    return max(0, int((1 - used) * t.max_instances))


def _placements(gpu: Gpu, board: BoardSpec, types: list[VgpuType]) -> VgpuPlacements | None:
    """NVML's mixed-size placements of the GPU's time-sliced types; a type the node has not reported
    yet takes the catalog's. None where NVML reports no mixed-size mode: off its driver, in MIG mode,
    or where it did not before (no NVML) unless the GPU just left MIG mode (NVML answered for that)."""
    smap = gpu.placements
    if gpu.driver != "nvidia" or (gpu.mig is not None and gpu.mig.enabled):
        return None
    if smap is None:
        if gpu.mig is None or catalog_placements.placements(board.key) is None:
            return None
        smap = VgpuPlacements(enabled=False, slots=0)
    placed: dict[str, TypePlacements] = {}
    for t in types:
        if t.mig_backed or not t.id.rsplit("-", 1)[-1].isdigit():
            continue
        have = smap.types.get(t.id)
        if have is None:
            size = catalog_placements.slot_size(board.key, t.framebuffer_mib)
            ids = catalog_placements.type_placements(board.key, t.framebuffer_mib)
            have = TypePlacements(size=size, ids=list(ids)) if size and ids else None
        if have is not None:
            placed[t.id] = have
    slots = max((p + tp.size for tp in placed.values() for p in tp.ids), default=0)
    return VgpuPlacements(enabled=smap.enabled, slots=slots, types=placed)
