"""Which GPU each layout entry selects (``index``, ``pciAddress``, ``model``, ``all``, device
filters). Pure.

An ``index`` counts in the node's numbering, where a GPU that left the bus keeps its place: an
entry naming such a GPU waits for it instead of moving onto another GPU.
"""

from __future__ import annotations

from mdev_manager.actions import Skip
from mdev_manager.config import GpuLayout, layout_error
from mdev_manager.models import Inventory
from mdev_manager.offers import NVIDIA


def select_gpus(inv: Inventory, layouts: list[GpuLayout]) -> dict[str, GpuLayout]:
    """Map each selected GPU to its entry; a GPU selected twice, or a selector that matches nothing, is an error.

    A device filter (vgpu-device-manager's) narrows a selection and is no error when it
    leaves nothing: one file serves a fleet of differently equipped nodes.
    """
    chosen, problems, _waiting = try_select(inv, layouts)
    if problems:
        raise layout_error(problems, layouts)  # named as the file writes them
    return chosen


def waiting_entries(inv: Inventory, layouts: list[GpuLayout]) -> list[Skip]:
    """The entries that name a GPU which left the bus (``inv.gone``): each waits for its GPU."""
    return try_select(inv, layouts)[2]


def try_select(inv: Inventory, layouts: list[GpuLayout]) -> tuple[dict[str, GpuLayout], list[str], list[Skip]]:
    """:func:`select_gpus` without raising: the GPUs selected, every selection problem, and the
    entries waiting for a GPU that left the bus (by ``pciAddress``, or an ``index`` that pointed at
    it); an ``index`` that a GPU leaving the bus would move onto another GPU is a problem."""
    chosen: dict[str, GpuLayout] = {}
    where_chosen: dict[str, str] = {}
    problems = []
    waiting: list[Skip] = []
    nvidia = [g for g in inv.gpus if g.vendor_id == NVIDIA]
    for i, entry in enumerate(layouts):
        where = f"{entry.at(i)} ({entry.describe()})"
        pool = nvidia if entry.nvidia_only else inv.gpus
        if entry.all:
            hits = pool
        elif entry.index is not None:
            numbered = _numbered(inv, entry.nvidia_only)
            meant = numbered[entry.index] if entry.index < len(numbered) else None
            if meant in inv.gone:
                waiting.append(Skip(device=meant, reason=_gone(where, meant)))
                continue
            hits = [g for g in pool if g.address == meant]
            if not hits:
                problems.append(f"{where}.{entry.field_name('index')}: the node has {len(numbered)} "
                                f"{'NVIDIA ' if entry.nvidia_only else ''}GPUs (indices 0-{len(numbered) - 1})")
                continue
        elif entry.pci_address:
            hits = [g for g in inv.gpus if g.address == entry.pci_address]
            if not hits and entry.pci_address in inv.gone:
                waiting.append(Skip(device=entry.pci_address, reason=_gone(where, entry.pci_address)))
                continue
            if not hits:
                problems.append(f"{where}.pciAddress: no GPU at {entry.pci_address}; GPUs are at "
                                + ", ".join(g.address for g in inv.gpus))
                continue
        else:
            assert entry.model is not None  # GpuLayout: exactly one selector
            m = entry.model.lower()
            hits = [g for g in inv.gpus if m in (g.product_name or "").lower()
                    or m == f"{g.vendor_id[2:]}:{g.device_id[2:]}".lower()]
            if not hits:
                problems.append(f"{where}.model: no GPU matches {entry.model!r}; models here: "
                                + ", ".join(sorted({g.model for g in inv.gpus})))
                continue
        hits = [g for g in hits if entry.matches_device(g.vendor_id, g.device_id, g.subsystem_vendor_id,
                                                        g.subsystem_device_id)]
        for g in hits:
            if g.address in chosen:
                problems.append(f"{where}: GPU {g.index} ({g.address}) is already selected by "
                                f"{where_chosen[g.address]}; select each GPU once")
            else:
                chosen[g.address] = entry
                where_chosen[g.address] = where
    return chosen, problems, waiting


def _numbered(inv: Inventory, nvidia_only: bool) -> list[str]:
    """The addresses an ``index`` counts, in the node's numbering (GPUs that left the bus keep their
    place, so no index moves onto another GPU); ``nvidia_only`` (vgpu-device-manager's ``devices``)
    counts NVIDIA GPUs only, and a gone GPU whose vendor an earlier release did not record as one."""
    numbers = {g.address: g.index for g in inv.gpus if not nvidia_only or g.vendor_id == NVIDIA}
    numbers |= {a: n for a, n in inv.gone_numbers.items() if not nvidia_only or inv.gone_vendors.get(a, NVIDIA) == NVIDIA}
    return sorted(numbers, key=lambda a: numbers[a])


def _gone(where: str, address: str) -> str:
    return (f"{where}: GPU {address} left the bus (hot-unplug, or fallen off it); the entry waits for it and "
            "applies once the GPU is back (a rescan or a reboot); every other GPU follows the layout")
