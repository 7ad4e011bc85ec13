"""What a GPU offers, and by which driver: its vGPU types (before its VFs exist, the catalog's),
a type named in a layout, the driver that gives it vGPUs, its size mode. Pure.

The small facts every planner, the DRA pool and the CLI's tables read; kept apart from the
planners so that a command asking only these does not load them.
"""

from __future__ import annotations

from mdev_manager import catalog
from mdev_manager.config import GpuLayout
from mdev_manager.models import Gpu, VgpuType
from mdev_manager.names import NVIDIA  # noqa: F401  read from here too (plan, equalplan, ...)


def offered_types(gpu: Gpu) -> list[VgpuType]:
    """What the GPU offers; before its VFs are enabled the catalog says what they will offer."""
    if gpu.types:
        return gpu.types
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    if not board:
        return []
    fw = "vendor-vfio" if board.framework == "vendor-vfio" else "mdev"
    return [VgpuType(id=str(t.num) if fw == "vendor-vfio" else t.mdev_id(board.driver), name=t.name,
                     short_name=t.short_name, framework=fw, available_instances=t.max_instances,
                     max_instances=t.max_instances, framebuffer_mib=t.fb_mib, mig_backed=t.mig_backed,
                     gpu_instance_profile=t.gpu_instance_profile, inferred=list(t.inferred),
                     max_per_instance=t.max_per_instance)
            for t in board.types]


def resolve_type(types: list[VgpuType], ref: str) -> VgpuType | None:
    low = ref.lower()
    return next((t for t in types if ref == t.id or low in (t.name.lower(), t.short_name.lower())), None)


def gpu_label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.address}, {gpu.model})"


def size_mode(gpu: Gpu, entry: GpuLayout) -> bool:
    """Mixed-size mode for a layout entry: what the GPU shows wins; one that cannot tell yet
    (no vGPUs) is taken at the entry's word (``mixedSize``)."""
    return gpu.mixed_size if gpu.mixed_size is not None else entry.mixed_size


def native_driver(gpu: Gpu) -> str | None:
    board = catalog.match_board(gpu.vendor_id, gpu.device_id, gpu.subsystem_device_id)
    if board:
        return board.driver
    return {"0x10de": "nvidia", "0x8086": "i915"}.get(gpu.vendor_id)
