"""Mixed-size mode of a simulated GPU: its row of 1 GiB slots, who holds which, what is creatable.

The driver's rules (../shared/reference/heterogeneous-vgpu.md, [RM]): a vGPU holds the slots
``[id, id + size)`` of its placement; a type's placement is creatable while all its slots are
free (so the list shrinks as slots fill and an id returns once its whole range is free again);
creation takes the lowest creatable id (first fit); in mixed-size mode only placements limit a
type, not its equal-size maximum. The placements come from :mod:`mdev_manager.catalog_placements`
(boards without a table refuse the mode). The GPU's state keeps ``mixed_size`` (the mode) and
``placements`` (vGPU id -> placement id) beside the rest of the simulated host's state.
"""

from __future__ import annotations

from functools import cache

from mdev_manager import catalog
from mdev_manager.catalog_placements import placements, slot_size, type_placements

NOT_APPLICABLE = "Not Applicable"  # what placement_id reads in equal-size mode (gentlemanautomaton/machina)
INVALID_PLACEMENT_ID = 0xFFFF  # NVML_INVALID_VGPU_PLACEMENT_ID (nvml.h)


@cache
def _framebuffer(board_key: str) -> dict[str, int | None]:
    """Type id (mdev ``nvidia-<n>`` and vendor-VFIO ``<n>``) -> framebuffer MiB; MIG-backed: None."""
    board = catalog.board(board_key)
    out: dict[str, int | None] = {}
    for t in board.types:
        fb = None if t.mig_backed else t.fb_mib
        out.setdefault(t.mdev_id(board.driver), fb)
        out.setdefault(str(t.num), fb)
    return out


def supports(board_key: str) -> bool:
    """The board's table is known: it may run in mixed-size mode."""
    return placements(board_key) is not None


def mixed(gpu: dict) -> bool:
    """The GPU runs in mixed-size mode (only boards with a known table ever do)."""
    return bool(gpu.get("mixed_size")) and supports(gpu["board"])


def size_of(board_key: str, type_id: str) -> int | None:
    """Slots a vGPU of the type holds (its framebuffer in GiB); None for MIG-backed or unknown types."""
    return slot_size(board_key, _framebuffer(board_key).get(type_id))


def supported(board_key: str, type_id: str) -> tuple[int, ...]:
    return type_placements(board_key, _framebuffer(board_key).get(type_id))


def held(gpu: dict, existing: list[tuple[str, str, str]]) -> dict[str, range]:
    """The slots each existing vGPU holds (placements of vGPUs that no longer exist are ignored)."""
    ids = gpu.get("placements", {})
    out = {}
    for _, vgpu, tid in existing:
        size = size_of(gpu["board"], tid)
        if vgpu in ids and size:
            out[vgpu] = range(ids[vgpu], ids[vgpu] + size)
    return out


def creatable(gpu: dict, existing: list[tuple[str, str, str]], type_id: str) -> list[int]:
    """The type's placement ids whose slots are all free, lowest first. A vGPU being moved still
    holds its own slots (the driver reserves the new range before it frees the old)."""
    taken = {s for r in held(gpu, existing).values() for s in r}
    size = size_of(gpu["board"], type_id) or 0
    return [p for p in supported(gpu["board"], type_id) if taken.isdisjoint(range(p, p + size))]


def place(gpu: dict, vgpu: str, placement: int) -> None:
    gpu.setdefault("placements", {})[vgpu] = placement


def forget(gpu: dict, vgpu: str) -> None:
    gpu.get("placements", {}).pop(vgpu, None)


def clear(gpu: dict) -> None:
    """The mode is gone (reboot, driver reload, VFs enabled or disabled) and so are the vGPUs."""
    gpu["mixed_size"] = False
    gpu["placements"] = {}


def read_value(gpu: dict, vgpu: str) -> str:
    """What ``<vgpu>/nvidia/placement_id`` reads: the id in mixed-size mode, else "Not Applicable"."""
    if mixed(gpu) and vgpu in gpu.get("placements", {}):
        return f"{gpu['placements'][vgpu]}\n"
    return NOT_APPLICABLE + "\n"
