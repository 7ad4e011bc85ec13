"""Validation of every name that can reach a filesystem path, and vGPU name grammar.

Anything an admin or an API object supplies passes through here before it is joined
to a sysfs path, so ``../`` or ``/`` can never escape the tree.
"""

from __future__ import annotations

import re
import uuid as _uuid

NVIDIA = "0x10de"  # NVIDIA's PCI vendor id
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
MDEV_TYPE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")
VENDOR_TYPE_ID = re.compile(r"^[1-9][0-9]{0,9}$")
# Time-sliced: <board>-<GB><series>; MIG-backed: <board>-<slices>-<GB><series>[suffix]
_TIME_SLICED = re.compile(r"^(?P<board>.+?)-(?P<gb>\d+)(?P<series>[ABCQ])$")
_MIG_BACKED = re.compile(r"^(?P<board>.+?)-(?P<slices>\d+)-(?P<gb>\d+)(?P<series>[ABCQ])(?P<suffix>ME|NOME|MEALL|GFX)?$")


class NameError_(ValueError):
    """A name that cannot be used; the message names the field and the fix."""


def check_pci_address(value: str, field: str = "pciAddress") -> str:
    v = value.strip().lower()
    if len(v) == 7 and re.match(r"^[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$", v):
        v = "0000:" + v
    if not PCI_ADDRESS.match(v):
        raise NameError_(f"{field}: {value!r} is not a PCI address; write it as 0000:65:00.0")
    return v


def check_uuid(value: str, field: str = "uuid") -> str:
    try:
        u = _uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise NameError_(f"{field}: {value!r} is not a UUID (8-4-4-4-12 hex digits)") from None
    if str(u) != value.lower():
        raise NameError_(f"{field}: {value!r} is not in canonical 8-4-4-4-12 form")
    return str(u)


def check_type_id(value: str, field: str = "type") -> str:
    if not isinstance(value, str) or not (MDEV_TYPE_ID.match(value) or VENDOR_TYPE_ID.match(value)):
        raise NameError_(
            f"{field}: {value!r} is not a vGPU type; use an id such as nvidia-222 or 1145, "
            "a full name such as 'GRID T4-1Q' or a short name such as T4-1Q"
        )
    return value


def safe_component(value: str, field: str) -> str:
    """A single path component with no separators, no dot names and no control characters."""
    if (
        not isinstance(value, str)
        or not value
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or "\x00" in value
        or any(ord(c) < 32 for c in value)
        or len(value) > 255
    ):
        raise NameError_(f"{field}: {value!r} cannot be used as a name (no '/', '..', or control characters)")
    return value


def short_type_name(name: str) -> str:
    """The short type from a full name: the last word (``NVIDIA A100-4C`` -> ``A100-4C``)."""
    return name.split()[-1] if name.split() else name


def framebuffer_mib_from_name(name: str) -> int | None:
    """Framebuffer of an NVIDIA vGPU type from its name grammar (``0`` means 512 MB)."""
    short = short_type_name(name)
    m = _MIG_BACKED.match(short) or _TIME_SLICED.match(short)
    if not m:
        return None
    gb = int(m.group("gb"))
    return 512 if gb == 0 else gb * 1024


def is_mig_backed(name: str) -> bool:
    return bool(_MIG_BACKED.match(short_type_name(name)))


def type_series(name: str) -> str | None:
    short = short_type_name(name)
    m = _MIG_BACKED.match(short) or _TIME_SLICED.match(short)
    return m.group("series") if m else None


#: NVIDIA's GPU-instance profile names (``1g.5gb``, ``1g.10gb+me``, ``7g.80gb``, ``4g.40gb-me``).
_INSTANCE_PROFILE = re.compile(r"^\d+g\.\d+gb(\+me|\+me\.all|-me|\+gfx)?$")


def is_instance_profile(name: str) -> bool:
    """A GPU-instance profile's name, never a vGPU type's (those start with their board)."""
    return bool(_INSTANCE_PROFILE.match(name))


def mig_profile_of(name: str) -> str | None:
    """The GPU-instance profile a MIG-backed type occupies, from its name: ``A100-3-20C`` ->
    ``3g.20gb``, ``A100-1-5CME`` -> ``1g.5gb+me`` (NVIDIA's vGPU user guide names each MIG-backed
    type after the profile of the GPU instance it takes whole); None for time-sliced types."""
    m = _MIG_BACKED.match(short_type_name(name))
    if not m:
        return None
    suffix = {"ME": "+me", "MEALL": "+me.all", "NOME": "-me", "GFX": "+gfx"}.get(m.group("suffix") or "", "")
    return f"{m.group('slices')}g.{m.group('gb')}gb{suffix}"
