"""Which classic device plugin resources a node's inventory yields (pure).

One resource per vGPU type name and one per passthrough GPU model, named as NVIDIA's
kubevirt-gpu-device-plugin names them (the rules are in :mod:`dra_bridge.api.names`), so VMs
written for that plugin keep working. Each device carries what its health check and its
``Allocate`` answer need.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dra_bridge.api.names import (
    DEFAULT_RESOURCE_PREFIX,
    ResourceKind,
    normalize_prefix,
    passthrough_name,
    vgpu_type_name,
)
from mdev_manager.models import Inventory

DeviceKind = Literal["mdev", "pci", "vendor-vfio"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceInfo(_Model):
    """One advertised device and what its health and allocation need."""

    id: str
    kind: DeviceKind
    gpu: str
    numa_node: int | None = None
    iommu_group: int | None = None
    type_id: str | None = None
    type_name: str | None = None


class ResourceSpec(_Model):
    name: str
    kind: ResourceKind
    devices: list[DeviceInfo] = []


def _env_kind(kind: DeviceKind) -> ResourceKind:
    return "mdev" if kind == "mdev" else "pci"


def compute_resources(
    inventory: Inventory, prefix: str = DEFAULT_RESOURCE_PREFIX, exclude: Iterable[str] = ()
) -> tuple[dict[str, ResourceSpec], list[str]]:
    """The resources the node's inventory yields, and warnings about what was left out.

    ``exclude``: GPU PCI addresses (all their devices) and device ids (mdev UUIDs, PCI
    addresses) not to advertise, e.g. GPUs handed to the DRA driver.
    """
    prefix = normalize_prefix(prefix)
    skip = {e.strip().lower() for e in exclude}
    out: dict[str, ResourceSpec] = {}
    warnings: list[str] = []

    def add(name_part: str, info: DeviceInfo) -> None:
        if not name_part:
            warnings.append(f"{info.kind} device {info.id}: no usable resource name; not advertised")
            return
        name = prefix + name_part
        kind = _env_kind(info.kind)
        spec = out.setdefault(name, ResourceSpec(name=name, kind=kind))
        if spec.kind != kind:
            warnings.append(f"{info.kind} device {info.id}: resource {name} already holds {spec.kind} devices; not advertised")
            return
        spec.devices.append(info)

    for gpu in inventory.gpus:
        if gpu.address in skip:
            continue
        if gpu.driver == "vfio-pci":
            add(passthrough_name(gpu.product_name, gpu.device_id),
                DeviceInfo(id=gpu.address, kind="pci", gpu=gpu.address, numa_node=gpu.numa_node,
                           iommu_group=gpu.iommu_group, type_name=gpu.product_name))
        for v in gpu.vgpus:
            if v.id.lower() in skip or v.parent in skip:
                continue
            kind: DeviceKind = "mdev" if v.framework == "mdev" else "vendor-vfio"
            add(vgpu_type_name(v.type_name),
                DeviceInfo(id=v.id, kind=kind, gpu=gpu.address, numa_node=gpu.numa_node,
                           iommu_group=v.iommu_group, type_id=v.type_id, type_name=v.type_name))
    for spec in out.values():
        spec.devices.sort(key=lambda d: d.id)
    return dict(sorted(out.items())), warnings



__all__ = ["DeviceInfo", "DeviceKind", "ResourceKind", "ResourceSpec", "compute_resources"]
