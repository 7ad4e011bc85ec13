"""Kubernetes resource quantities (``10Gi``, ``1536Mi``, ``500m``) as exact fractions."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_RE = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value) -> Fraction:
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    m = _RE.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 10Gi, 512Mi, 2)")
    num = Fraction(m.group(1))
    if m.group(2):
        num *= Fraction(10) ** int(m.group(2)[1:])
    return num * Fraction(_SUFFIX[m.group(3) or ""])


def format_quantity(value: Fraction, human: bool = False) -> str:
    """Canonical binary form where exact (``10Gi``), else a plain number; ``human`` adds spaces."""
    v = Fraction(value)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIX[suffix]
        if v and v % unit == 0:
            n = v // unit
            return f"{n} {suffix}B" if human else f"{n}{suffix}"
        if human and v >= unit:
            return f"{float(v / unit):.1f} {suffix}B".replace(".0 ", " ")
    return str(int(v)) if v.denominator == 1 else f"{int(v * 1000)}m"
