"""The scheduler model's view of published devices: pools read from ResourceSlices (newest
complete generation only), and the allocation state they are drawn from. Pure, no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, TypeAlias

from dra_bridge.api.quantity import parse_quantity

#: an exact amount: an int when whole (fast arithmetic), else a Fraction
Amount: TypeAlias = Fraction | int
#: one counter set a device consumes from: (state key (driver, pool, set), ((counter, amount), ..),
#: compatibility groups, the set's totals or None when the pool does not publish it)
Consumption: TypeAlias = tuple[tuple[str, str, str], tuple[tuple[str, Amount], ...], tuple[str, ...],
                               dict[str, Amount] | None]


@dataclass(eq=False, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str | None  # None: available to every node
    attributes: Mapping[str, Any]  # name -> {"string": ..} as published
    capacity: Mapping[str, Any]  # name -> {"value": .., "requestPolicy": ..}
    consumes: Sequence[dict[str, Any]]  # [{"counterSet", "counters": {name: {"value"}}, "compatibilityGroups"}]
    multi: bool = False
    taints: Sequence[dict[str, Any]] = field(default_factory=list)
    signature: int = 0  # devices with equal driver/attributes/capacity share CEL results
    # ``consumes`` parsed once: ((state key (driver, pool, set), ((counter, amount), ..), groups,
    # the set's totals or None), ..); shared by the devices of a pool that consume alike
    cons: tuple[Consumption, ...] = ()
    # KEP-5007: (bindingConditions, bindingFailureConditions), copied into the allocation result
    binding: tuple[tuple[str, ...], ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str) -> Any:
        q = name if "/" in name else f"{self.driver}/{name}"
        for k in (name, q, name.split("/", 1)[-1] if name.startswith(self.driver + "/") else None):
            if k is not None and k in self.attributes:
                v = self.attributes[k]
                return next(iter(v.values())) if isinstance(v, dict) else v
        return None


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    complete: bool
    counters: dict[str, dict[str, Amount]]  # counter set -> counter -> total
    devices: list[Device]


_QCACHE: dict[str, Amount] = {}
_NONE: Mapping[str, Any] = MappingProxyType({})  # one shared, read-only empty map for devices without attributes/capacity


def quantity_value(v: str | int | Fraction | dict[str, Any]) -> Amount:
    """A quantity as an exact number: an int when whole (fast arithmetic), else a Fraction."""
    raw = v["value"] if isinstance(v, dict) else v
    if isinstance(raw, str):
        got = _QCACHE.get(raw)
        if got is None:
            q = parse_quantity(raw)
            got = int(q) if q.denominator == 1 else q
            if len(_QCACHE) < 65536:
                _QCACHE[raw] = got
        return got
    q = parse_quantity(raw)
    return int(q) if q.denominator == 1 else q


def read_pools(slices: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Pool]:
    slices = list(slices)  # kept alive while ids below are used as memo keys
    by_pool: dict[tuple[str, str], list[dict]] = {}
    for s in slices:
        spec = s["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
    pools = {}
    signatures: dict[str, int] = {}
    # Per published device entry (by identity: slices of many nodes often share them): its
    # CEL signature and its consumption in a pool-independent form.
    per_entry: dict[tuple[str, int], tuple[int, tuple[Any, ...]]] = {}
    generics: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for (driver, name), group in by_pool.items():
        gen = max(s["spec"]["pool"].get("generation", 0) for s in group)
        newest = [s for s in group if s["spec"]["pool"].get("generation", 0) == gen]
        expected = max(s["spec"]["pool"].get("resourceSliceCount", 1) for s in newest)
        counters: dict[str, dict[str, Amount]] = {}
        devices = []
        interned: dict[int, tuple[Consumption, ...]] = {}  # pool-independent consumption (by id) -> this pool's
        for s in newest:
            for cs in s["spec"].get("sharedCounters") or []:
                counters[cs["name"]] = {k: quantity_value(v) for k, v in cs.get("counters", {}).items()}
        for s in newest:
            spec = s["spec"]
            node = spec.get("nodeName")
            for d in spec.get("devices") or []:
                memo = per_entry.get((driver, id(d)))
                if memo is None:
                    sig_src = json.dumps([driver, d.get("attributes", {}), d.get("capacity", {})], sort_keys=True)
                    sig = signatures.setdefault(sig_src, len(signatures))
                    generic = tuple((c["counterSet"],
                                     tuple((k, quantity_value(v)) for k, v in (c.get("counters") or {}).items()),
                                     tuple(c.get("compatibilityGroups") or ()))
                                    for c in d.get("consumesCounters") or [])
                    generic = generics.setdefault(generic, generic)  # equal consumptions: one object
                    memo = per_entry[(driver, id(d))] = (sig, generic)
                sig, generic = memo
                cons = interned.get(id(generic))
                if cons is None:
                    cons = interned[id(generic)] = tuple(((driver, name, cs), amounts, groups, counters.get(cs))
                                                         for cs, amounts, groups in generic)
                devices.append(Device(driver, name, d["name"], node, d.get("attributes") or _NONE,
                                      d.get("capacity") or _NONE, d.get("consumesCounters") or (),
                                      bool(d.get("allowMultipleAllocations")), d.get("taints") or (), sig, cons,
                                      (tuple(d["bindingConditions"]), tuple(d.get("bindingFailureConditions") or ()))
                                      if d.get("bindingConditions") else ()))
        pools[(driver, name)] = Pool(driver, name, gen, len(newest) == expected, counters, devices)
    return pools


# --------------------------------------------------------------------------- state
class State:
    """What is taken: exclusive devices, counter use, capacity shares, compatibility groups."""

    def __init__(self) -> None:
        self.taken: set[tuple[str, str, str]] = set()
        self.used: dict[tuple[str, str, str], dict[str, Amount]] = {}  # (driver, pool, set) -> counter -> used
        self.groups: dict[tuple[str, str, str], list[Sequence[str]]] = {}  # (driver, pool, set) -> group lists in use
        self.shared: dict[tuple[str, str, str], dict[str, Amount]] = {}  # device key -> capacity -> consumed

    def copy(self) -> State:
        c = State()
        c.taken = set(self.taken)
        c.used = {k: dict(v) for k, v in self.used.items()}
        c.groups = {k: [list(g) for g in v] for k, v in self.groups.items()}
        c.shared = {k: dict(v) for k, v in self.shared.items()}
        return c


def groups_compatible(in_use: list[Sequence[str]], mine: Sequence[str]) -> bool:
    for other in in_use:
        if (not other) != (not mine):
            return False
        if mine and not set(mine) & set(other):
            return False
    return True
