"""The scheduler model's view of published devices: pools read from ResourceSlices (newest
complete generation only), and the allocation state they are drawn from. Pure, no I/O.

Mirrors ``GatherPools``/``buildPool`` of k8s.io/dynamic-resource-allocation
``structured/internal/incubating/pools_incubating.go`` (checked against it by
tests/oracle/test_upstream_allocator.py): pools in driver/pool-name order, those with binding
conditions last, a pool's slices in name order; a pool with duplicate device or counter-set names,
or a consumption naming a set or counter it does not publish, is invalid as a whole; the
scheduler's feature gates (:class:`Features`) decide which slices count.
"""

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
    invalid: str | None = None  # why the pool is unusable as a whole (upstream: Pool.IsInvalid)
    binding: bool = False  # a device has bindingConditions (upstream: poolHasBindingConditions)


@dataclass(frozen=True)
class Features:
    """The kube-scheduler feature gates the allocator acts on (upstream ``structured.Features``).
    The defaults are everything on, the model's behaviour before gates were modelled;
    :meth:`from_gates` reads them off a scheduler's resolved gates."""

    partitionable_devices: bool = True  # DRAPartitionableDevices
    compatibility_groups: bool = True  # DRADeviceCompatibilityGroups
    device_taints: bool = True  # DRADeviceTaints
    binding_conditions: bool = True  # DRADeviceBindingConditions and DRAResourceClaimDeviceStatus
    # what the release's Allocate writes into a result (no gate; see scheduling/results.py)
    tolerations_in_results: bool = True  # 1.35+: each result carries its request's tolerations
    config_once: bool = True  # 1.37+: a claim config added once, "requests" cleared where it names all

    @classmethod
    def from_gates(cls, gates: Mapping[str, bool], version: tuple[int, int] | None = None) -> Features:
        """From resolved gates (name -> on); a gate not named counts as on. ``version``: the
        scheduler's minor (None: the newest behaviour)."""
        def on(name: str) -> bool:
            return bool(gates.get(name, True))
        return cls(partitionable_devices=on("DRAPartitionableDevices"),
                   compatibility_groups=on("DRADeviceCompatibilityGroups"),
                   device_taints=on("DRADeviceTaints"),
                   binding_conditions=on("DRADeviceBindingConditions") and on("DRAResourceClaimDeviceStatus"),
                   tolerations_in_results=version is None or version >= (1, 35),
                   config_once=version is None or version >= (1, 37))


ALL_FEATURES = Features()


def _uses_groups(spec: Mapping[str, Any]) -> bool:
    """Upstream ``sliceUsesCompatibilityGroups``."""
    return any(c.get("compatibilityGroups") for d in spec.get("devices") or [] for c in d.get("consumesCounters") or [])


def _invalid(slices: list[dict], partitionable: bool) -> str | None:
    """Why a complete pool is invalid as a whole, or None: upstream ``validateDeviceNames``,
    ``getAndValidateCounterSets`` and ``validateDeviceCounterConsumption``."""
    names: set[str] = set()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] in names:
                return f"device name {d['name']} is not unique"
            names.add(d["name"])
    if not partitionable:
        return None
    sets: dict[str, set[str]] = {}
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] in sets:
                return f"counter set name {cs['name']} is not unique"
            sets[cs["name"]] = set(cs.get("counters") or {})
    for s in slices:
        for d in s["spec"].get("devices") or []:
            for c in d.get("consumesCounters") or []:
                have = sets.get(c["counterSet"])
                if have is None:
                    return f"device {d['name']} consumes counter set {c['counterSet']}, which does not exist"
                for k in c.get("counters") or {}:
                    if k not in have:
                        return f"device {d['name']} consumes counter {k} of set {c['counterSet']}, which does not exist"
    return None


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


def read_pools(slices: Iterable[dict[str, Any]], features: Features = ALL_FEATURES) -> dict[tuple[str, str], Pool]:
    """The pools of ``slices`` in the order the scheduler searches them (upstream ``GatherPools``):
    by driver and pool name, pools with binding conditions last; a pool's slices by name
    (``buildPool``), so devices come in that order whatever order the slices were listed in."""
    slices = list(slices)  # kept alive while ids below are used as memo keys
    by_pool: dict[tuple[str, str], list[dict]] = {}
    for s in slices:
        spec = s["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        group = by_pool.setdefault(key, [])
        # GatherPools: without the gate, slices with counter sets (or per-device node selection) and
        # slices whose devices name compatibility groups are ignored; the pool then misses them
        # (incomplete), which keeps its other devices from being allocated too
        if not features.partitionable_devices and (spec.get("sharedCounters") or spec.get("perDeviceNodeSelection")):
            continue
        if not features.compatibility_groups and _uses_groups(spec):
            continue
        group.append(s)
    pools = {}
    signatures: dict[str, int] = {}
    # Per published device entry (by identity: slices of many nodes often share them): its
    # CEL signature and its consumption in a pool-independent form.
    per_entry: dict[tuple[str, int], tuple[int, tuple[Any, ...]]] = {}
    generics: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for (driver, name), group in sorted(by_pool.items()):
        if not group:  # every slice ignored (gates): nothing visible, an incomplete pool
            pools[(driver, name)] = Pool(driver, name, 0, False, {}, [])
            continue
        gen = max(s["spec"]["pool"].get("generation", 0) for s in group)
        newest = sorted((s for s in group if s["spec"]["pool"].get("generation", 0) == gen),
                        key=lambda s: (s.get("metadata") or {}).get("name", ""))
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
        complete = len(newest) == expected
        pools[(driver, name)] = Pool(driver, name, gen, complete, counters, devices,
                                     _invalid(newest, features.partitionable_devices) if complete else None,
                                     any(d.binding for d in devices))
    # pools with binding conditions last (GatherPools), each group in driver/pool-name order
    return dict(sorted(pools.items(), key=lambda kv: (kv[1].binding, kv[0])))


# --------------------------------------------------------------------------- state
class State:
    """What is taken: exclusive devices, counter use, capacity shares, compatibility groups."""

    def __init__(self) -> None:
        self.taken: set[tuple[str, str, str]] = set()
        self.used: dict[tuple[str, str, str], dict[str, Amount]] = {}  # (driver, pool, set) -> counter -> used
        self.groups: dict[tuple[str, str, str], list[Sequence[str]]] = {}  # (driver, pool, set) -> group lists in use
        self.shared: dict[tuple[str, str, str], dict[str, Amount]] = {}  # device key -> capacity -> consumed
        # devices taken with admin access by the attempt being searched: in use for its other
        # requests (upstream ``allocatingDevices``, which ``deviceInUse`` checks), held by nothing after
        self.admin: dict[tuple[str, str, str], int] = {}

    def copy(self) -> State:
        c = State()
        c.taken = set(self.taken)
        c.used = {k: dict(v) for k, v in self.used.items()}
        c.groups = {k: [list(g) for g in v] for k, v in self.groups.items()}
        c.shared = {k: dict(v) for k, v in self.shared.items()}
        c.admin = dict(self.admin)
        return c


def groups_compatible(in_use: list[Sequence[str]], mine: Sequence[str]) -> bool:
    """Whether a device consuming a counter set with compatibility groups ``mine`` may join the
    devices already on the set (their group lists ``in_use``): upstream
    ``compatibilityGroupIntersection.admits`` (experimental/compatibility_groups.go, the allocator
    kube-scheduler 1.37 runs with DRADeviceCompatibilityGroups on): ``mine`` must meet the running
    intersection of every list in use, not just each list; a device without groups only joins
    devices without groups."""
    if not in_use:
        return True
    if not mine:
        return all(not g for g in in_use)
    if any(not g for g in in_use):
        return False
    common = set(in_use[0])
    for g in in_use[1:]:
        common &= set(g)
    return not common.isdisjoint(mine)
