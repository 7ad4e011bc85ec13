"""``apply -f LAYOUT --gpu GPU`` (and ``plan``): a re-layout of one GPU that touches nothing else.

The layout is narrowed, in this one place, to the entry that selects that GPU, rewritten to select
it by PCI address alone; the planner only plans the GPUs a layout selects, so every other GPU (its
vGPUs, definitions, VFs, driver, records) is left exactly as it is, in use or not.
"""

from __future__ import annotations

from mdev_manager.config import GpuLayout
from mdev_manager.models import Inventory
from mdev_manager.plan import select_gpus


def gpu_address(inv: Inventory, ref: str) -> str:
    """The PCI address of GPU ``ref`` (its index, or its PCI address; ``3b:00.0`` in domain 0000)."""
    ref = ref.strip().lower()
    for g in inv.gpus:
        if ref == str(g.index) or ref in (g.address, g.address.removeprefix("0000:")):
            return g.address
    have = ", ".join(f"{g.index} ({g.address})" for g in inv.gpus)
    raise ValueError(f"--gpu {ref}: no such GPU on this node; its GPUs: {have or 'none'}")


def scoped(inv: Inventory, layouts: list[GpuLayout], ref: str) -> list[GpuLayout]:
    """Only the entry of GPU ``ref``, selecting it by address (bad input if the layout has none)."""
    addr = gpu_address(inv, ref)
    entry = select_gpus(inv, layouts).get(addr)
    if entry is None:
        raise ValueError(f"--gpu {ref}: the layout has no entry for GPU {addr}; nothing would change")
    return [entry.model_copy(update={"pci_address": addr, "index": None, "model": None, "all": None,
                                     "device_filter": [], "nvidia_only": False})]
