"""Vendor and device names from pci.ids (pciutils' or hwdata's copy), read once."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _load(path: Path) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    vendors: dict[str, str] = {}
    devices: dict[tuple[str, str], str] = {}
    vendor = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue
                if line.startswith("C "):
                    break  # device classes follow the vendor list
                if not line.startswith("\t"):
                    vendor = line[:4].lower()
                    vendors[vendor] = line[4:].strip()
                elif not line.startswith("\t\t") and vendor:
                    devices[(vendor, line[1:5].lower())] = line[5:].strip()
    except OSError:
        pass
    return vendors, devices


def lookup(paths: tuple[Path, ...], vendor_id: str, device_id: str) -> tuple[str | None, str | None]:
    """(vendor name, device name) for ids like ``0x10de``/``0x1eb8``; None where unknown."""
    v, d = vendor_id.lower().removeprefix("0x"), device_id.lower().removeprefix("0x")
    for path in paths:
        vendors, devices = _load(Path(path))
        if vendors:
            return vendors.get(v), devices.get((v, d))
    return None, None
