"""The node's data: the inventory (GPUs, vGPU types, vGPUs), saved definitions, device users.

The inventory is produced by :mod:`mdev_manager.discovery`, definitions are read and
written by :mod:`mdev_manager.persist`, device users gathered by :mod:`mdev_manager.usage`;
the planner, the CLI and the DRA bridge consume them. Plain data: no method here touches
the host, so the pure planner can import them without importing any transport.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mdev_manager.names import NameError_, check_pci_address, check_type_id, check_uuid, safe_component

_K = TypeVar("_K")
_T = TypeVar("_T")

Framework = Literal["mdev", "vendor-vfio"]
# How a GPU offers vGPUs: mdev on the PF, mdev on SR-IOV VFs, NVIDIA vendor-specific VFIO on VFs.
GpuFramework = Literal["mdev", "mdev-sriov", "vendor-vfio", "none"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=False, extra="forbid", populate_by_name=True)


class VgpuType(_Model):
    """A vGPU type as a parent (or, summed, the GPU) offers it. Frozen: discovery shares one record among
    every parent offering the same reading (:func:`mdev_manager.typeset._shared`); change a copy."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    id: str = Field(description="mdev type id (nvidia-222, i915-GVTg_V5_4) or vendor-VFIO decimal id (1145)")
    name: str = Field(description="full name as the driver prints it, e.g. 'GRID T4-1Q'")
    short_name: str = Field(description="last word of the name, e.g. 'T4-1Q'")
    framework: Framework
    description: str = ""
    device_api: str = "vfio-pci"
    available_instances: int = 0
    max_instances: int | None = Field(None, description="per physical GPU when it holds only this type")
    framebuffer_mib: int | None = None
    mig_backed: bool = False
    gpu_instance_profile: str | None = Field(None, description="MIG-backed: the GPU-instance profile it takes whole (3g.20gb)")
    max_per_instance: int | None = Field(None, description=(
        "MIG time-slicing (GB20x): vGPUs of the type one GPU instance holds; None: one, the instance whole"))
    inferred: list[str] = Field(default_factory=list, description=(
        "facts about the type that vgpuctl's catalog infers, not the driver's sources (id, max_instances)"))


class Vgpu(_Model):
    """One existing vGPU: an mdev (id = UUID) or a VF carrying a vendor-VFIO type (id = VF address)."""

    id: str
    framework: Framework
    type_id: str
    type_name: str
    parent: str = Field(description="PCI address of the device the vGPU lives on (PF or VF)")
    gpu: str = Field(description="PCI address of the physical GPU")
    iommu_group: int | None = None
    gpu_instance: int | None = Field(None, description="MIG-backed: id of the GPU instance it lives on")
    placement_id: int | None = Field(None, description=(
        "mixed-size mode: the first 1 GiB slot it holds (nvidia/placement_id); None in equal-size mode"))


# --- MIG (NVML's view: nvmlGpuInstanceProfileInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceInfo_t)

class MigPlacement(_Model):
    """Where a GPU instance sits: memory slices [start, start + size)."""

    start: int = Field(ge=0)
    size: int = Field(ge=1)

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


class GpuInstanceProfile(_Model):
    """One GPU-instance profile as NVML reports it (``nvidia-smi mig -lgip`` / ``-lgipp``)."""

    id: int = Field(description="NVML profile id (nvidia-smi's ID column: 19 for 1g.5gb on A100)")
    name: str = Field(description="1g.5gb, 1g.5gb+me, 3g.20gb ...")
    slices: int = Field(description="compute slices (the 'Ng' of the name)")
    instances: int = Field(description="most instances of this profile at once")
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: list[MigPlacement]


class GpuInstance(_Model):
    id: int
    profile_id: int
    placement: MigPlacement
    vgpu: str | None = Field(None, description="the vGPU living on it (VF address or mdev UUID), if any")
    vgpus: list[str] = Field(default_factory=list, description=(
        "MIG time-slicing (GB20x): every vGPU sharing it (``vgpu`` is one of them); one at most elsewhere"))


class MigState(_Model):
    """A MIG-capable GPU: its mode (``pending`` differs until a reset), profiles and GPU instances."""

    enabled: bool
    pending: bool
    memory_slices: int = Field(description="memory slices of the GPU (8 on A100 and H100)")
    profiles: list[GpuInstanceProfile] = []
    instances: list[GpuInstance] = []
    uuid: str | None = Field(None, description="the GPU's NVML UUID (GPU-...), where NVML answers")

    def profile(self, ref: int | str) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.id == ref or p.name == ref), None)


# --- mixed-size mode (NVML's nvmlVgpuPlacementList_t per type, nvmlDeviceGetVgpuHeterogeneousMode)

class TypePlacements(_Model):
    """Where a time-sliced type may sit in mixed-size mode."""

    size: int = Field(ge=1, description="placementSize: the 1 GiB slots a vGPU of the type holds")
    ids: list[int] = Field(description="placement ids: the first slot of each placement, ascending")


class VgpuPlacements(_Model):
    """A GPU's mixed-size mode and its types' placements (NVML); a vGPU holds [id, id + size)."""

    enabled: bool = Field(description="the GPU runs in mixed-size mode (NVML heterogeneous mode)")
    slots: int = Field(description="1 GiB slots of the GPU: the widest placement's end")
    types: dict[str, TypePlacements] = Field({}, description="type id -> its placements (none: never placed)")


def held(vgpus: Iterable[Vgpu], smap: VgpuPlacements) -> dict[str, range]:
    """The slots each vGPU with a placement holds."""
    out = {}
    for v in vgpus:
        tp = smap.types.get(v.type_id)
        if v.placement_id is not None and tp is not None:
            out[v.id] = range(v.placement_id, v.placement_id + tp.size)
    return out


def creatable(smap: VgpuPlacements, taken: dict[str, range], type_id: str) -> list[int]:
    """The type's placement ids whose slots no vGPU holds (what NVML calls creatable)."""
    tp = smap.types.get(type_id)
    used = {s for r in taken.values() for s in r}
    return [p for p in tp.ids if used.isdisjoint(range(p, p + tp.size))] if tp else []


def occupancy(counts: Iterable[tuple[VgpuType, int]]) -> Fraction:
    """Share of a physical GPU: each vGPU of type t takes 1/max(t) (vgpu-types.md)."""
    return sum((Fraction(n, t.max_instances) for t, n in counts if t.max_instances), Fraction(0))


def held_types(types: Iterable[VgpuType], vgpus: Iterable[Vgpu]) -> list[VgpuType]:
    """The type of each vGPU, one entry per vGPU (vGPUs of types not in ``types`` left out)."""
    by_id = {t.id: t for t in types}
    return [by_id[v.type_id] for v in vgpus if v.type_id in by_id]


class MdevParent(_Model):
    """A device that offers vGPU types: a PF (mdev), or a VF (mdev on SR-IOV, vendor VFIO)."""

    address: str
    types: list[VgpuType] = []


class PciFunction(_Model):
    address: str
    vendor_id: str
    device_id: str
    class_code: str
    subsystem_vendor_id: str | None = None
    subsystem_device_id: str | None = None
    vendor_name: str | None = None
    product_name: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    driver: str | None = None
    driver_override: str | None = None
    vfio_dev: str | None = Field(None, description="vfioN under vfio-dev/ when bound with iommufd support")
    pcie_root: str | None = Field(None, description="PCI root complex, e.g. pci0000:40")


class VirtualFunction(PciFunction):
    index: int
    physfn: str


class Gpu(PciFunction):
    index: int = Field(description=(
        "the GPU's number on this node (mdev_manager.numbering): PCI order among the GPUs first seen together, "
        "kept when a GPU leaves the bus; what a layout's index and the DRA device names gpu-N mean"))
    framework: GpuFramework = "none"
    iommu_group_members: list[str] = []
    iommu_group_drivers: dict[str, str | None] = Field({}, description="driver of each function in the GPU's IOMMU group")
    iommu_group_overrides: dict[str, str] = Field({}, description="driver_override of the group's functions that set one")
    sriov_total_vfs: int = 0
    sriov_num_vfs: int = 0
    vfs: list[VirtualFunction] = []
    parents: list[MdevParent] = []
    types: list[VgpuType] = Field([], description="types offered by the GPU, instances summed over its parents")
    vgpus: list[Vgpu] = []
    mixed_size: bool | None = Field(None, description=(
        "mixed-size mode: NVML's where it answers, else as the available instances show it; None: cannot tell"))
    mig: MigState | None = Field(None, description="MIG mode, profiles and GPU instances (NVML); None: not MIG-capable")
    placements: VgpuPlacements | None = Field(None, description=(
        "mixed-size mode and the types' placements (NVML); None: NVML reports no mixed-size mode for the GPU"))
    inferred: list[str] = Field(default_factory=list, description=(
        "facts about the board that vgpuctl's catalog infers, not the driver's sources (sriov_total_vfs, "
        "MIG placements); the driver's own values win on a real host"))

    @property
    def model(self) -> str:
        return self.product_name or f"{self.vendor_id}:{self.device_id}"

    def type_by_ref(self, ref: str) -> VgpuType | None:
        """Find an offered type by id, full name or short name (case-insensitive names)."""
        for t in self.types:
            if ref == t.id or ref.lower() in (t.name.lower(), t.short_name.lower()):
                return t
        return None


class Inventory(_Model):
    node: str = ""
    gpus: list[Gpu] = []
    iommufd: bool = False
    gone: list[str] = Field([], description=(
        "GPUs this node numbered that discovery does not see: they left the bus (hot-unplug, fallen off it); "
        "a layout entry naming one waits for it"))
    gone_numbers: dict[str, int] = Field({}, description="the number each GPU of gone keeps")
    gone_vendors: dict[str, str] = Field({}, description="the PCI vendor of each GPU of gone, where recorded")

    def gpu(self, address: str) -> Gpu | None:
        return next((g for g in self.gpus if g.address == address), None)

    def all_vgpus(self) -> list[Vgpu]:
        return [v for g in self.gpus for v in g.vgpus]


# --- saved definitions ---------------------------------------------------------------

def canonical_pci(value: str, field: str) -> str:
    """Exactly the name the kernel uses: mdevctl joins the directory name to sysfs as is."""
    addr = check_pci_address(value, field)
    if addr != value:
        raise NameError_(f"{field}: {value!r} must be written as {addr!r}")
    return addr


class MdevDefinition(BaseModel):
    """One saved mdev in mdevctl's format (``<mdevctl_root>/<parent>/<uuid>``)."""

    model_config = ConfigDict(extra="forbid")

    uuid: str
    parent: str
    mdev_type: str
    start: Literal["auto", "manual"] = "auto"
    attrs: list[dict[str, str]] = []

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, v: str) -> str:
        return check_uuid(v)

    @field_validator("parent")
    @classmethod
    def _parent(cls, v: str) -> str:
        return canonical_pci(v, "parent")

    @field_validator("mdev_type")
    @classmethod
    def _type(cls, v: str) -> str:
        return check_type_id(v, "mdev_type")

    @field_validator("attrs")
    @classmethod
    def _attrs(cls, v: list[dict[str, str]]) -> list[dict[str, str]]:
        """One key each (mdevctl's format); keys become paths below the mdev directory."""
        for a in v:
            if len(a) != 1:
                raise ValueError(f"attrs: {a!r} must hold exactly one attribute")
            (name,) = a
            if name.startswith("/"):
                raise ValueError(f"attrs: {name!r} must be relative to the mdev directory")
            for part in name.split("/"):
                safe_component(part, "attrs")
        return v


# --- device users ----------------------------------------------------------------------

class Holder(BaseModel):
    """A process with a ``/dev/vfio/<group>`` open."""

    pid: int
    comm: str


class CdevHolder(Holder):
    """A process with a device's vfio cdev (``/dev/vfio/devices/vfioN``, iommufd) open."""

    node: str = Field(description="the cdev path it holds")


class Usage(BaseModel):
    """Everything known to use devices. Values of ``mdevs``/``pci`` are user labels such as
    ``libvirt domain vm1``; an empty answer from ``*_users`` means the device is free."""

    vfio_groups: dict[int, list[Holder]] = {}
    vfio_devices: dict[str, list[CdevHolder]] = Field(
        {}, description="device (mdev UUID or PCI address) -> processes holding its vfio cdev")
    mdevs: dict[str, list[str]] = {}
    pci: dict[str, list[str]] = {}
    claimed: dict[str, list[str]] = Field({}, description=(
        "vGPU id (or a passed-through GPU's address) -> the DRA claims it was made (or bound) for: in use, and "
        "never a layout's device (no definition, not counted towards a layout), so one device never serves a "
        "claim and the layout at once"))
    warnings: list[str] = []
    vfio_dir: str = ""

    def claims_of(self, device: str) -> list[str]:
        return self.claimed.get(device.strip().lower(), [])

    def _group_users(self, group: int | None) -> list[str]:
        if group is None:
            return []
        node = f"{self.vfio_dir}/{group}" if self.vfio_dir else f"VFIO group {group}"
        return [f"pid {h.pid} ({h.comm}) holds {node}" for h in self.vfio_groups.get(group, [])]

    def _cdev_users(self, device: str) -> list[str]:
        return [f"pid {h.pid} ({h.comm}) holds {h.node}" for h in self.vfio_devices.get(device, [])]

    def mdev_users(self, uuid: str, iommu_group: int | None = None) -> list[str]:
        uuid = uuid.strip().lower()
        refs = self.mdevs.get(uuid, [])
        return self._group_users(iommu_group) + self._cdev_users(uuid) + [f"{r} references it" for r in refs]

    def pci_users(self, address: str, iommu_group: int | None = None) -> list[str]:
        try:
            address = check_pci_address(address)
        except NameError_:
            address = address.strip().lower()
        refs = self.pci.get(address, [])
        return self._group_users(iommu_group) + self._cdev_users(address) + [f"{r} references it" for r in refs]

    def merged(self, other: Usage | None) -> Usage:
        """Union of two views (duplicates dropped, order kept)."""
        if other is None:
            return self.model_copy(deep=True)
        out = self.model_copy(deep=True)
        _merge_into(out.vfio_groups, other.vfio_groups)
        _merge_into(out.vfio_devices, other.vfio_devices)
        _merge_into(out.mdevs, other.mdevs)
        _merge_into(out.pci, other.pci)
        _merge_into(out.claimed, other.claimed)
        out.warnings.extend(w for w in other.warnings if w not in out.warnings)
        out.vfio_dir = out.vfio_dir or other.vfio_dir
        return out


def _merge_into(mine: dict[_K, list[_T]], theirs: dict[_K, list[_T]]) -> None:
    for key, users in theirs.items():
        add_unique(mine, key, users)


def add_unique(table: dict[_K, list[_T]], key: _K, items: Iterable[_T]) -> None:
    """Append ``items`` to ``table[key]`` (made if missing), skipping those already there, in order."""
    cur = table.setdefault(key, [])
    cur.extend(u for u in items if u not in cur)


class Blocked(BaseModel):
    """A device in use that keeps the node from its layout: the layout wants it gone or changed."""

    device: str = Field(description="vGPU id (mdev UUID or VF address) or GPU address")
    gpu: str = Field(description="PCI address of the physical GPU")
    held_by: list[str] = Field(description="who holds it: processes, libvirt domains, ResourceClaims")
    blocks: str = Field(description="what the layout wants done that waits for its release")
    gone: bool = Field(False, description="the GPU left the bus: the entry waits for it, not for a release")
