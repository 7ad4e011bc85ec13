"""The capacity probes' selectors answered without loading CEL (``kubectl vgpu`` in a blink).

:func:`~dra_bridge.scheduling.capacity.compute` asks the scheduler model how many more of each
profile fit with probe claims whose selectors it writes itself, in a few fixed forms: the driver, an
attribute equal to a string or an int, ``vgpuTypes`` containing a profile else ``profile`` equal to
it. The CEL engine costs more to import (its package loads its own CLI: typer, prompt_toolkit, rich)
than the whole rest of the plugin, so :class:`ProbeSelectors` answers those forms in Python where
the device is well formed and publishes the attributes they read with the kinds they compare. Every
other expression, and every device where CEL could fail or differ (an attribute missing, of another
kind, published both bare and with its domain, a malformed value or quantity), goes to the same
CEL evaluator as before (:class:`~dra_bridge.scheduling.selectors.CelSelectors`, loaded then): the
answer, or the error, is always CEL's. tests/dra_bridge/test_probesel.py holds them equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dra_bridge.api.quantity import parse_quantity

if TYPE_CHECKING:
    from dra_bridge.scheduling.pools import Device
    from dra_bridge.scheduling.selectors import CelSelectors

_STR = r'"((?:[^"\\]|\\.)*)"'
_ATTR = r'device\.attributes\[' + _STR + r'\]\.([A-Za-z_][A-Za-z0-9_]*)'
_DRIVER = re.compile(r'^device\.driver == ' + _STR + '$')
_EQ_STR = re.compile('^' + _ATTR + ' == ' + _STR + '$')
_EQ_INT = re.compile('^' + _ATTR + r' == (-?\d+)$')
_TYPES = re.compile(r'^has\(' + _ATTR + r'\) \? ' + _ATTR + r'\.contains\(' + _STR + r'\) : ' + _ATTR + ' == '
                    + _STR + '$')
_KINDS = ("string", "int", "bool", "version")

Twin = Callable[[dict[str, dict[str, tuple[str, Any]]], str], "bool | None"]


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s)


def _value(attrs: dict[str, dict[str, tuple[str, Any]]], domain: str, name: str, kind: str) -> Any:
    """The attribute's value when published with ``kind``; None: let CEL answer (missing, other kind)."""
    kv = attrs.get(domain, {}).get(name)
    if kv is None or kv[0] != kind or (kind == "int" and type(kv[1]) is not int) or \
            (kind == "string" and not isinstance(kv[1], str)):
        return None
    return kv[1]


def twin(expression: str) -> Twin | None:
    """The Python form of one of the probe forms; None for any other expression."""
    if m := _DRIVER.match(expression):
        want = _unquote(m.group(1))
        return lambda attrs, driver: driver == want
    if m := _EQ_STR.match(expression):
        dom, name, want = _unquote(m.group(1)), m.group(2), _unquote(m.group(3))

        def eq_str(attrs: dict, driver: str) -> bool | None:
            v = _value(attrs, dom, name, "string")
            return None if v is None else v == want
        return eq_str
    if m := _EQ_INT.match(expression):
        dom, name, n = _unquote(m.group(1)), m.group(2), int(m.group(3))

        def eq_int(attrs: dict, driver: str) -> bool | None:
            v = _value(attrs, dom, name, "int")
            return None if v is None else v == n
        return eq_int
    if m := _TYPES.match(expression):
        d1, n1, d2, n2, part, d3, n3, prof = m.groups()
        if not (d1 == d2 == d3 and n1 == n2):
            return None
        dom, types, part, pname, prof = _unquote(d1), n1, _unquote(part), n3, _unquote(prof)

        def in_types(attrs: dict, driver: str) -> bool | None:
            if types in attrs.get(dom, {}):  # has(): then contains() on it, whatever the other
                v = _value(attrs, dom, types, "string")
                return None if v is None else part in v
            p = _value(attrs, dom, pname, "string")
            return None if p is None else p == prof
        return in_types
    return None


def _attributes(d: Device) -> dict[str, dict[str, tuple[str, Any]]] | None:
    """``device.attributes`` as CEL sees it (domain -> name -> (kind, value)); None where building
    the CEL variable could fail or a name is published twice (bare and with its domain)."""
    out: dict[str, dict[str, tuple[str, Any]]] = {}
    for k, v in (d.attributes or {}).items():
        domain, _, ident = k.partition("/") if "/" in k else (d.driver, "", k)
        if not isinstance(v, dict) or len(v) != 1 or next(iter(v)) not in _KINDS or ident in out.get(domain, {}):
            return None
        out.setdefault(domain, {})[ident] = next(iter(v.items()))
    try:
        for c in (d.capacity or {}).values():
            parse_quantity(str(c["value"]))
    except Exception:  # noqa: BLE001 - whatever building the CEL variable raises: CEL's answer then
        return None
    return out


class ProbeSelectors:
    """:class:`~dra_bridge.scheduling.selectors.Selectors` for the capacity probes (module docstring)."""

    def __init__(self) -> None:
        self._twins: dict[str, Twin | None] = {}
        self._cel: CelSelectors | None = None

    def matches(self, expression: str, device: Device) -> bool:
        if expression not in self._twins:
            self._twins[expression] = twin(expression)
        t = self._twins[expression]
        attrs = _attributes(device) if t is not None else None
        answer = t(attrs, device.driver) if t is not None and attrs is not None else None
        if answer is not None:
            return answer
        if self._cel is None:
            from dra_bridge.scheduling.selectors import default_selectors

            self._cel = default_selectors()
        return self._cel.matches(expression, device)
