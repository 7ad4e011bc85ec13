"""Names only the templates make; every name shared with the driver, the device plugin and the
manifests in ``deploy/`` is in :mod:`dra_bridge.api.names` (the published vocabulary), so the
KubeVirt CR permits exactly what the device plugin advertises.
"""

from __future__ import annotations


def _hex(v: str) -> str:
    v = v.strip().lower()
    v = v[2:] if v.startswith("0x") else v
    return v.zfill(4)


def pci_vendor_selector(vendor_id: str, device_id: str) -> str:
    """KubeVirt's ``pciVendorSelector``: ``0x10de``, ``0x1eb8`` -> ``10DE:1EB8``."""
    return f"{_hex(vendor_id)}:{_hex(device_id)}".upper()


__all__ = ["pci_vendor_selector"]
