"""The YAML description of a simulated host, and the named presets shipped with it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mdev_manager import catalog, catalog_placements
from mdev_manager.yamlfile import load_yaml


class GpuGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    board: str = Field(description="catalog key: " + ", ".join(sorted(catalog.BOARDS)))
    count: int = Field(1, ge=1, le=64, description="number of boards")
    framework: Literal["mdev", "mdev-sriov", "vendor-vfio"] | None = Field(
        None, description="override the board's framework (e.g. an L40S on a pre-17 driver uses mdev on VFs)")
    driver: Literal["nvidia", "i915", "vfio-pci", "none"] | None = Field(None, description="initial binding")
    vfs_enabled: bool = Field(False, description="SR-IOV VFs already enabled at boot")
    audio_function: bool = Field(False, description="add an HDA audio function sharing the GPU's IOMMU group")
    numa_node: int | None = None
    mixed_size: bool = Field(False, description=(
        "GPU switched to mixed-size mode by the admin after boot (NVIDIA heterogeneous vGPU); a reboot, a "
        "driver reload or enabling VFs clears it. Only boards with a known placement table: "
        + ", ".join(catalog_placements.KNOWN)))

    @field_validator("board")
    @classmethod
    def _known(cls, v: str) -> str:
        catalog.board(v)
        return v

    @model_validator(mode="after")
    def _mixed_needs_a_table(self) -> GpuGroup:
        if self.mixed_size and catalog_placements.placements(self.board) is None:
            raise ValueError(f"mixed_size: board {self.board} has no known mixed-size placement table, so it refuses "
                             f"mixed-size mode; boards with one: {', '.join(catalog_placements.KNOWN)}")
        return self


class HostSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "sim"
    node: str = "sim-node-1"
    iommufd: bool = False
    #: mdevctl's udev rule: a parent that appears (a GPU bound to its driver, VFs enabled) has its
    #: ``start: auto`` definitions started by mdevctl at once, beside whatever enabled it (so an apply
    #: that enables VFs can find the vGPUs it is about to create already made: EEXIST)
    mdevctl_udev: bool = False
    #: what NVML's nvmlSystemGetDriverVersion answers: the host vGPU manager's version (two simulated
    #: nodes with different ones are no live-migration pair)
    driver_version: str = "580.95.02"
    gpus: list[GpuGroup]


PRESETS = Path(__file__).parent / "presets"  # files on disk: load_yaml reads a path
DEFAULT_PRESET = "default"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in PRESETS.iterdir() if p.name.endswith(".yaml"))


def load_host(ref: str | Path | None = None) -> HostSpec:
    """A preset name, or the path of a host YAML file; ``None`` is the default preset."""
    ref = DEFAULT_PRESET if ref is None else ref
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") and path.exists():
        doc = load_yaml(path, what="host spec")
    elif str(ref) in preset_names():
        doc = load_yaml(PRESETS / f"{ref}.yaml", what="host spec")
    else:
        raise ValueError(f"host: {ref!r} is neither a host YAML file nor a preset ({', '.join(preset_names())})")
    return HostSpec.model_validate(doc)
