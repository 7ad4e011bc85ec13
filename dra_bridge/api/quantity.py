"""Kubernetes resource quantities (``10Gi``, ``1536Mi``, ``500m``) as exact fractions.

The grammar is the API server's (k8s.io/apimachinery ``resource.ParseQuantity``)::

    <quantity>     ::= <sign>? <number> <suffix>?
    <number>       ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>       ::= Ki | Mi | Gi | Ti | Pi | Ei          (binary SI)
                     | n | u | m | k | M | G | T | P | E    (decimal SI)
                     | e<sign>?<digits> | E<sign>?<digits>   (decimal exponent)

One suffix at most (``1e3Ki`` is refused, as the API server refuses it), no blanks. As the
API server does, a value finer than ``1n`` is rounded up (away from zero) to the next ``n``,
and a binary-SI value is capped at 2^63-1 in magnitude (``8Ei``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_SUFFIX: dict[str, int | Fraction] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_NANO = 10**9
_MAX_BINARY = 2**63 - 1


def parse_quantity(value: str | int | Fraction) -> Fraction:
    """A quantity as the exact number the API server stores; ValueError if it is not one."""
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    return _parse(str(value))


@lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction:
    m = _RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 10Gi, 512Mi, 2)")
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
        value = number * Fraction(10) ** int(suffix[1:])
    else:
        value = number * Fraction(_SUFFIX[suffix])
    sign, mag = (-1 if value < 0 else 1), abs(value)
    if (mag * _NANO).denominator != 1:
        mag = Fraction(math.ceil(mag * _NANO), _NANO)
    if suffix.endswith("i") and mag > _MAX_BINARY:
        mag = Fraction(_MAX_BINARY)
    return sign * mag


def format_quantity(value: Fraction | int, human: bool = False) -> str:
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


__all__ = ["format_quantity", "parse_quantity"]
