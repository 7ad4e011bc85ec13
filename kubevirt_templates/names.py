"""Names only the templates make; every name shared with the driver, the device plugin and the
manifests in ``deploy/`` is in :mod:`dra_bridge.api.names` (the published vocabulary), so the
KubeVirt CR permits exactly what the device plugin advertises.
"""

from __future__ import annotations

from collections.abc import Sequence


def _hex(v: str) -> str:
    v = v.strip().lower()
    v = v[2:] if v.startswith("0x") else v
    return v.zfill(4)


def pci_vendor_selector(vendor_id: str, device_id: str) -> str:
    """KubeVirt's ``pciVendorSelector``: ``0x10de``, ``0x1eb8`` -> ``10DE:1EB8``."""
    return f"{_hex(vendor_id)}:{_hex(device_id)}".upper()


def shared_type_problem(key: str, name: str, boards: Sequence[tuple[str, str]], where: str, *,
                        inventory: bool) -> str:
    """Why ``name`` (at ``key``) cannot name a device-plugin resource: a short name several boards
    share (``DC-2-16Q``: RTX PRO 6000 and 4500), each board's type a resource of its own full name.
    ``boards``: (board, its full name) each; ``inventory``: an inventory would tell which is meant."""
    labels = " and of ".join(b for b, _ in boards)
    fix = "write the driver's full name (" + " or ".join(repr(f) for _, f in boards) + ")"
    if inventory:
        fix += ", or give the node's inventory (--inventory FILE or --simulate)"
    return f"{key}: {name} is a vGPU type of {labels} {where}, each its own device-plugin resource; {fix}"


__all__ = ["pci_vendor_selector", "shared_type_problem"]
