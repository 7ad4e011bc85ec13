"""DRA device selectors, compiled and evaluated the way the scheduler does.

A selector (``DeviceClass.spec.selectors[].cel.expression`` or a request's) sees one variable,
``device``, with ``driver``, ``attributes`` and ``capacity`` (both maps domain -> name -> value;
names without a domain belong to the device's driver) and ``allowMultipleAllocations``. It must
evaluate to a bool; any runtime error (a missing attribute, a bad quantity) aborts the
allocation. Capacity values are Kubernetes Quantities.

Built on ``common-expression-language`` (module ``cel``, Rust core, a runtime dependency): the
one CEL evaluator of vgpuctl (the allocator's :class:`~dra_bridge.scheduling.selectors.CelSelectors`
evaluates through it). What that library offers, and how the Kubernetes library is added on top:

* ``cel.Context.add_function(name, fn)`` registers a Python function. A **member call**
  ``x.f(y)`` dispatches to the same registered ``f`` with the receiver first, ``f(x, y)``;
  so the Quantity methods (``compareTo``, ``isGreaterThan``, ...) are plain registered
  functions that check their receiver, and expressions are evaluated as written, never rewritten.
* Values crossing into CEL must be plain data (custom Python classes are refused), so a
  Quantity is a one-key map ``{"@quantity": "<numerator>/<denominator>"}`` holding its exact
  value in lowest terms: equal quantities are equal maps, so ``==`` behaves as Kubernetes'
  semantic comparison (``quantity("1Gi") == quantity("1024Mi")``). Semantic versions (the
  ``version`` attribute kind) are ``{"@semver": "1.2.3"}`` likewise.
* Kubernetes returns an empty map for an unknown domain (``device.attributes["other.io"]``);
  a Python dict cannot answer for keys it lacks, so every domain the expression indexes with a
  string literal is added as an empty map before evaluation.
* Not available: ``cel.bind`` (the library does not implement it), and the compile-time type
  check and cost estimate of the API server (``compile`` here checks the grammar only).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import cel as _cel

from dra_bridge.api.quantity import parse_quantity

MAX_EXPRESSION_LENGTH = 10 * 1024  # the API server's limit on a selector

_Q = "@quantity"
_SV = "@semver"
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


class CelError(ValueError):
    """A selector that does not compile or fails at run time (the allocation would abort)."""


# --------------------------------------------------------------------------- Quantity


def quantity_value(q: Fraction) -> dict[str, str]:
    """The CEL representation of an exact quantity."""
    return {_Q: f"{q.numerator}/{q.denominator}"}


def _as_fraction(v: Any, what: str) -> Fraction:
    if isinstance(v, Mapping) and _Q in v:
        n, _, d = str(v[_Q]).partition("/")
        return Fraction(int(n), int(d))
    raise TypeError(f"{what}: expected a Quantity, got {type(v).__name__} {v!r}")


def _operand(v: Any, what: str) -> Fraction:
    """``add``/``sub`` take a Quantity or an int."""
    if isinstance(v, bool):
        raise TypeError(f"{what}: expected a Quantity or int, got bool")
    if isinstance(v, int):
        return Fraction(v)
    return _as_fraction(v, what)


def _quantity(s: Any) -> dict[str, str]:
    if not isinstance(s, str):
        raise TypeError(f"quantity(): expected a string, got {type(s).__name__}")
    try:
        return quantity_value(parse_quantity(s))
    except ValueError:
        raise ValueError(f"quantity(): {s!r} is not a valid Quantity") from None


def _is_quantity(s: Any) -> bool:
    if not isinstance(s, str):
        raise TypeError(f"isQuantity(): expected a string, got {type(s).__name__}")
    try:
        parse_quantity(s)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- Semver

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _semver(s: Any) -> dict[str, str]:
    if not isinstance(s, str) or not _SEMVER.match(s):
        raise ValueError(f"semver(): {s!r} is not a semantic version")
    return {_SV: s}


def _is_semver(s: Any) -> bool:
    return isinstance(s, str) and bool(_SEMVER.match(s))


def _semver_key(v: Any, what: str) -> tuple:
    if not (isinstance(v, Mapping) and _SV in v):
        raise TypeError(f"{what}: expected a Semver, got {type(v).__name__} {v!r}")
    m = _SEMVER.match(str(v[_SV]))
    assert m
    core = tuple(int(m.group(i)) for i in (1, 2, 3))
    pre = m.group(4)
    if pre is None:
        return core + ((1,),)  # a release sorts after any of its pre-releases
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return core + ((0, parts),)


# --------------------------------------------------------------------------- methods


def _cmp(a: Any, b: Any, what: str) -> int:
    if isinstance(a, Mapping) and _SV in a:
        sa, sb = _semver_key(a, what), _semver_key(b, what)
        return (sa > sb) - (sa < sb)
    fa, fb = _as_fraction(a, what), _as_fraction(b, what)
    return (fa > fb) - (fa < fb)


def _compare_to(a: Any, b: Any) -> int:
    return _cmp(a, b, "compareTo()")


def _is_greater_than(a: Any, b: Any) -> bool:
    return _cmp(a, b, "isGreaterThan()") > 0


def _is_less_than(a: Any, b: Any) -> bool:
    return _cmp(a, b, "isLessThan()") < 0


def _as_integer(a: Any) -> int:
    q = _as_fraction(a, "asInteger()")
    if q.denominator != 1 or not _INT64_MIN <= q.numerator <= _INT64_MAX:
        raise ValueError(f"asInteger(): {q} cannot be represented as an int64")
    return q.numerator


def _is_integer(a: Any) -> bool:
    q = _as_fraction(a, "isInteger()")
    return q.denominator == 1 and _INT64_MIN <= q.numerator <= _INT64_MAX


def _as_approximate_float(a: Any) -> float:
    return float(_as_fraction(a, "asApproximateFloat()"))


def _sign(a: Any) -> int:
    q = _as_fraction(a, "sign()")
    return (q > 0) - (q < 0)


def _add(a: Any, b: Any) -> dict[str, str]:
    return quantity_value(_as_fraction(a, "add()") + _operand(b, "add()"))


def _sub(a: Any, b: Any) -> dict[str, str]:
    return quantity_value(_as_fraction(a, "sub()") - _operand(b, "sub()"))


def _semver_part(i: int, name: str) -> Callable[[Any], int]:
    def part(a: Any) -> int:
        return _semver_key(a, f"{name}()")[i]

    return part


#: The Kubernetes CEL library functions available to DRA selectors (quantity and semver).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "asInteger": _as_integer,
    "isInteger": _is_integer,
    "asApproximateFloat": _as_approximate_float,
    "sign": _sign,
    "add": _add,
    "sub": _sub,
    "semver": _semver,
    "isSemver": _is_semver,
    "major": _semver_part(0, "major"),
    "minor": _semver_part(1, "minor"),
    "patch": _semver_part(2, "patch"),
}


def new_context(variables: Mapping[str, Any] | None = None) -> _cel.Context:
    """A CEL context with the Kubernetes quantity/semver library and ``variables``."""
    ctx = _cel.Context()
    for name, fn in FUNCTIONS.items():
        ctx.add_function(name, fn)
    for k, v in (variables or {}).items():
        ctx.add_variable(k, v)
    return ctx


_local = threading.local()


def _shared_context() -> _cel.Context:
    """One context per thread, reused: building one costs far more than an evaluation."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = new_context()
    return ctx


# --------------------------------------------------------------------------- the device variable


def _attr_value(v: Mapping[str, Any]) -> Any:
    if len(v) != 1:
        raise ValueError(f"attribute value {dict(v)!r} must have exactly one of string, int, bool, version")
    kind, value = next(iter(v.items()))
    if kind in ("string", "int", "bool"):
        return value
    if kind == "version":
        return _semver(value)
    raise ValueError(f"attribute value kind {kind!r} is unknown")


def _split(name: str, driver: str) -> tuple[str, str]:
    if "/" in name:
        domain, _, ident = name.partition("/")
        return domain, ident
    return driver, name


def device_variable(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """The ``device`` CEL variable for a ResourceSlice ``spec.devices[]`` entry of ``driver``."""
    attributes: dict[str, dict[str, Any]] = {}
    for k, v in (device.get("attributes") or {}).items():
        domain, ident = _split(k, driver)
        attributes.setdefault(domain, {})[ident] = _attr_value(v)
    capacity: dict[str, dict[str, Any]] = {}
    for k, v in (device.get("capacity") or {}).items():
        domain, ident = _split(k, driver)
        capacity.setdefault(domain, {})[ident] = quantity_value(parse_quantity(str(v["value"])))
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }


_INDEXED_DOMAIN = re.compile(r"""\b(attributes|capacity)\s*\[\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\s*\]""")


def _indexed_domains(expression: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
    for m in _INDEXED_DOMAIN.finditer(expression):
        out[m.group(1)].add(m.group(2) if m.group(2) is not None else m.group(3))
    return out


# --------------------------------------------------------------------------- selectors


@dataclass
class Selector:
    """One compiled selector expression."""

    expression: str
    program: Any = field(repr=False)
    domains: dict[str, set[str]] = field(repr=False, default_factory=dict)

    def evaluate(self, device: Mapping[str, Any]) -> bool:
        """Evaluate on a ``device`` variable (see :func:`device_variable`); CelError when it fails."""
        dev = dict(device)
        for key in ("attributes", "capacity"):
            missing = self.domains.get(key, set()) - set(dev.get(key, {}))
            if missing:
                dev[key] = {**dev.get(key, {}), **{d: {} for d in missing}}
        ctx = _shared_context()
        ctx.add_variable("device", dev)
        try:
            result = self.program.execute(ctx)
        except KeyError as exc:
            raise CelError(f"{self.expression!r}: evaluation failed: no such key: {exc.args[0] if exc.args else exc}") from None
        except Exception as exc:  # the library raises RuntimeError, TypeError, ValueError, ...
            raise CelError(f"{self.expression!r}: evaluation failed: {exc}") from None
        if not isinstance(result, bool):
            raise CelError(f"{self.expression!r}: evaluated to {type(result).__name__} {result!r}, not a bool")
        return result


def compile_selector(expression: str) -> Selector:
    """Parse ``expression``; CelError names the problem (grammar, length)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelError("selector: the expression is empty")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelError(f"selector: {len(expression)} characters, the API server accepts at most {MAX_EXPRESSION_LENGTH}")
    try:
        program = _cel.compile(expression)
    except Exception as exc:
        raise CelError(f"{expression!r} does not compile: {exc}") from None
    refs = program.references()
    unknown = [v for v in refs.get("variables", []) if v != "device"]
    if unknown:
        raise CelError(f"{expression!r}: unknown variables {unknown}; a device selector sees only `device`")
    return Selector(expression=expression, program=program, domains=_indexed_domains(expression))


@dataclass(frozen=True)
class SliceDevice:
    """A device as the scheduler sees it: where it is published and its CEL variable."""

    driver: str
    pool: str
    name: str
    variable: dict = field(hash=False, compare=False)


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> list[SliceDevice]:
    """Every device of ``slices`` (ResourceSlice dicts), in publication order."""
    out = []
    for s in slices:
        spec = s["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        for d in spec.get("devices") or []:
            out.append(SliceDevice(driver=driver, pool=pool, name=d["name"], variable=device_variable(d, driver)))
    return out


def _selectors_of(obj: Mapping[str, Any] | None) -> list[str]:
    return [s["cel"]["expression"] for s in (obj or {}).get("selectors") or [] if "cel" in s]


def select(devices: Iterable[SliceDevice], expressions: Iterable[str]) -> list[SliceDevice]:
    """The devices every expression selects. Like the scheduler, a runtime error on any device
    aborts (CelError), it does not just skip the device."""
    selectors = [compile_selector(e) for e in expressions]
    return [d for d in devices if all(s.evaluate(d.variable) for s in selectors)]


def class_selectors(device_class: Mapping[str, Any]) -> list[str]:
    return _selectors_of(device_class.get("spec"))


def request_alternatives(
    request: Mapping[str, Any], device_classes: Mapping[str, Mapping[str, Any]]
) -> dict[str, list[str]]:
    """The selector sets of one claim request (``spec.devices.requests[]``): ``{name: expressions}``
    with the class's selectors first. ``exactly`` gives one entry under the request name;
    ``firstAvailable`` one per subrequest, named ``<request>/<subrequest>``, in priority order."""

    def one(r: Mapping[str, Any], where: str) -> list[str]:
        cls_name = r.get("deviceClassName")
        if cls_name is None or cls_name not in device_classes:
            raise KeyError(f"{where}: DeviceClass {cls_name!r} is not known")
        return class_selectors(device_classes[cls_name]) + _selectors_of(r)

    name = request["name"]
    if "exactly" in request:
        return {name: one(request["exactly"], name)}
    return {f"{name}/{sub['name']}": one(sub, f"{name}/{sub['name']}") for sub in request.get("firstAvailable") or []}


def claim_spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec`` of a ResourceClaim, or ``spec.spec`` of a ResourceClaimTemplate."""
    if obj.get("kind") == "ResourceClaimTemplate":
        return obj["spec"]["spec"]
    return obj["spec"]


def expressions_in(obj: Mapping[str, Any]) -> list[str]:
    """Every CEL selector expression a DeviceClass, ResourceClaim or ResourceClaimTemplate carries."""
    kind = obj.get("kind")
    if kind == "DeviceClass":
        return class_selectors(obj)
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        out: list[str] = []
        for r in (claim_spec_of(obj).get("devices") or {}).get("requests") or []:
            if "exactly" in r:
                out += _selectors_of(r["exactly"])
            for sub in r.get("firstAvailable") or []:
                out += _selectors_of(sub)
        return out
    return []


__all__ = [
    "CelError",
    "FUNCTIONS",
    "Selector",
    "SliceDevice",
    "class_selectors",
    "claim_spec_of",
    "compile_selector",
    "device_variable",
    "expressions_in",
    "new_context",
    "quantity_value",
    "request_alternatives",
    "select",
    "slice_devices",
]
