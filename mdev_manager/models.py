"""The node inventory: one typed description of GPUs, vGPU types and vGPUs.

Produced by :mod:`mdev_manager.discovery`, consumed by the planner, the CLI and the
DRA bridge. Plain data: no method here touches the host.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Framework = Literal["mdev", "vendor-vfio"]
# How a GPU offers vGPUs: mdev on the PF, mdev on SR-IOV VFs, NVIDIA vendor-specific VFIO on VFs.
GpuFramework = Literal["mdev", "mdev-sriov", "vendor-vfio", "none"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=False, extra="forbid", populate_by_name=True)


class VgpuType(_Model):
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


class Vgpu(_Model):
    """One existing vGPU: an mdev (id = UUID) or a VF carrying a vendor-VFIO type (id = VF address)."""

    id: str
    framework: Framework
    type_id: str
    type_name: str
    parent: str = Field(description="PCI address of the device the vGPU lives on (PF or VF)")
    gpu: str = Field(description="PCI address of the physical GPU")
    iommu_group: int | None = None


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
    index: int = Field(description="position among the node's GPUs in PCI address order")
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
    mixed_size: bool | None = Field(None, description="mixed-size mode as the available instances show it; None: cannot tell")

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

    def gpu(self, address: str) -> Gpu | None:
        return next((g for g in self.gpus if g.address == address), None)

    def all_vgpus(self) -> list[Vgpu]:
        return [v for g in self.gpus for v in g.vgpus]
