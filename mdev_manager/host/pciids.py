"""Vendor and device names from pci.ids (pciutils' or hwdata's copy).

Only the block of the vendor asked for is parsed (the whole file is 1.3 MB and would cost
a tenth of a second on every command), and each vendor's block once.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path


def _text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@cache
def _vendor(path: Path, vendor: str) -> tuple[str | None, dict[str, str]] | None:
    """(vendor name, device id -> name) for one vendor's block of the file; None where the file cannot
    be read or is empty. The file's text is not kept: the agent would hold its 1.3 MB for good (#37)."""
    text = _text(path)
    if not text:
        return None
    start = text.find(f"\n{vendor}  ")
    if start < 0:
        return None, {}
    lines = text[start + 1:].split("\n", 1)
    name = lines[0][len(vendor):].strip()
    devices: dict[str, str] = {}
    for line in (lines[1] if len(lines) > 1 else "").split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if not line.startswith("\t"):
            break  # the next vendor
        if not line.startswith("\t\t"):
            devices[line[1:5].lower()] = line[5:].strip()
    return name, devices


def lookup(paths: tuple[Path, ...], vendor_id: str, device_id: str) -> tuple[str | None, str | None]:
    """(vendor name, device name) for ids like ``0x10de``/``0x1eb8``, from the first of ``paths`` that can be
    read; None where unknown."""
    v, d = vendor_id.lower().removeprefix("0x"), device_id.lower().removeprefix("0x")
    for path in paths:
        found = _vendor(Path(path), v)
        if found is not None:
            name, devices = found
            return name, devices.get(d)
    return None, None
