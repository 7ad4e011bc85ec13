"""The shapes of the catalog's knowledge: a board and its vGPU types (no data here).

Kept apart from :mod:`mdev_manager.catalog` so each family's table (``catalog_blackwell``) can
build boards without importing the catalog that lists them. ``inferred`` fields name the facts
the sources do not state and the catalog infers (../shared/reference/blackwell-vgpu.md marks them
[I] or [NF]): they are shown as such by ``vgpuctl discover --types``; on a real host the driver's
own values (sysfs, NVML) always win over the catalog's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mdev_manager.names import framebuffer_mib_from_name, is_mig_backed, mig_profile_of, short_type_name

BoardFramework = Literal["mdev", "mdev-sriov", "vendor-vfio"]


class TypeSpec(BaseModel):
    num: int | str  # numeric id (nvidia-<num> on mdev, <num> on vendor VFIO) or a full id (i915-GVTg_V5_4)
    name: str
    max_instances: int
    framebuffer_mib: int | None = None
    description: str | None = None
    gi_profile: str | None = Field(None, description=(
        "MIG-backed: the GPU-instance profile it lives on, where the name's grammar does not give it "
        "(DC-2-12Q is a 12 GiB vGPU on a 2g.48gb instance)"))
    max_per_instance: int | None = Field(None, description=(
        "MIG time-slicing (GB20x): how many vGPUs of the type share one GPU instance; None: one, the "
        "instance taken whole"))
    inferred: tuple[str, ...] = Field((), description="fields the sources do not state (id, max_instances, ...)")

    @property
    def fb_mib(self) -> int | None:
        return self.framebuffer_mib or framebuffer_mib_from_name(self.name)

    @property
    def short_name(self) -> str:
        return short_type_name(self.name)

    @property
    def mig_backed(self) -> bool:
        return is_mig_backed(self.name)

    @property
    def gpu_instance_profile(self) -> str | None:
        """The GPU-instance profile a MIG-backed type lives on; None for time-sliced types."""
        return self.gi_profile or mig_profile_of(self.name)

    def mdev_id(self, driver: str = "nvidia") -> str:
        return self.num if isinstance(self.num, str) else f"{driver}-{self.num}"


class BoardSpec(BaseModel):
    key: str
    vendor_id: str
    device_id: str
    class_code: str = "0x030200"
    subsystem_vendor_id: str = "0x10de"
    subsystem_device_id: str = "0x0000"
    subsystem_aliases: tuple[str, ...] = Field((), description=(
        "other subsystem ids the vGPU manager treats as this board (the driver's vgpu_aliases: 2bb5/220b -> 204e)"))
    framebuffer_mib: int
    framework: BoardFramework
    sriov_total_vfs: int = 0
    gpus_per_board: int = 1
    driver: str = "nvidia"
    types: list[TypeSpec]
    made_up_ids: bool = False
    product_name: str | None = Field(None, description="pci.ids name, for hosts whose pci.ids predates the board")
    mig_timeslicing: bool = Field(False, description=(
        "several vGPUs may share one MIG GPU instance (PDB_PROP_GPU_MIG_TIMESLICING_SUPPORTED: GB20x only)"))
    inferred: tuple[str, ...] = Field((), description="board facts the sources do not state (sriov_total_vfs, ...)")


def nv_desc(t: TypeSpec, heads: int = 4) -> str:
    """NVIDIA prints the type's limits in ``description`` (seen on A2: max_instance=16)."""
    fb = t.fb_mib or 0
    return f"num_heads={heads}, frl_config=45, framebuffer={fb}M, max_resolution=5120x2880, max_instance={t.max_instances}"
