"""ResourceSlice objects for a :class:`~dra_bridge.pool.devices.Pool`, per API server version.

Pure functions, no I/O. The layout follows the API server's rules:

* ``<= 1.34``: combined slices. A counter set and every device consuming it share one slice;
  GPUs are packed into as few slices as the limits allow (128 devices, 32 counters summed over
  the sets, 1024 counter consumptions). A GPU whose devices alone exceed one slice loses its
  lowest-priority types (whole types, last in the policy's order) with a warning.
* ``>= 1.35``: a slice holds either counters or devices. Counter-only slices first (8 sets each),
  then device-only slices per GPU (64 devices each, since every device consumes counters).
* ``>= 1.37``: ``consumesCounters[].compatibilityGroups`` is published; older servers never see it
  (and :func:`build_slices` refuses a pool whose groups matter on an older server).

Slice names are deterministic (``<node>-<driver>-<k>``) so a publisher can update only the
slices that changed. See ``schema.md`` for the device model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dra_bridge.api.compat import Limits, checked_version, limits_for
from dra_bridge.api.k8sname import dns_safe, is_dns_subdomain, short_hash
from dra_bridge.api.names import LABEL_DRIVER, LABEL_MANAGED_BY, LABEL_NODE, LABEL_POOL, LABEL_ROLE, MANAGED_BY
from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool.devices import (
    CounterSet,
    Pool,
    PoolDevice,
)
from dra_bridge.pool.slicecheck import check_pool_slices

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

# --------------------------------------------------------------------------- wire form


def counter_set_to_dict(cs: CounterSet) -> dict[str, Any]:
    return {"name": cs.name, "counters": {k: {"value": str(v)} for k, v in cs.counters.items()}}


def device_to_dict(dev: PoolDevice, *, compatibility_groups: bool = False,
                   shared: dict[tuple[str, int], Any] | None = None) -> dict[str, Any]:
    """A pool device as a ResourceSlice ``spec.devices[]`` entry.

    ``compatibility_groups`` publishes ``consumesCounters[].compatibilityGroups`` (1.37+ only).
    ``shared`` (one per build): devices holding the same attributes, capacity or consumption objects
    (a slot's devices, :func:`~dra_bridge.pool.devices.renamed`) get one wire copy of each (#37: a
    large node's slices are built at every full resync); nothing changes a built slice's parts in place.
    """
    def part(what: str, obj: Any, make: Any) -> Any:
        if shared is None:
            return make(obj)
        hit = shared.get((what, id(obj)))
        if hit is None or hit[0] is not obj:  # (the object is kept with its copy: its id is not reused)
            hit = shared[(what, id(obj))] = (obj, make(obj))
        return hit[1]

    out: dict[str, Any] = {"name": dev.name}
    if dev.binding_conditions:
        out["bindingConditions"] = list(dev.binding_conditions)
        out["bindingFailureConditions"] = list(dev.binding_failure_conditions)
    if dev.taints:
        out["taints"] = [dict(t) for t in dev.taints]
    if dev.attributes:
        out["attributes"] = part("attributes", dev.attributes, lambda a: {k: dict(v) for k, v in a.items()})
    if dev.capacity:
        out["capacity"] = part("capacity", dev.capacity, lambda c: {k: {"value": v} for k, v in c.items()})
    if dev.consumes:
        out["consumesCounters"] = part("consumes", dev.consumes, lambda cs: [
            _consumption(c, compatibility_groups) for c in cs])
    return out


def _consumption(c: Any, compatibility_groups: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"counterSet": c.counter_set, "counters": {k: {"value": v} for k, v in c.counters.items()}}
    if compatibility_groups and c.compatibility_groups:
        entry["compatibilityGroups"] = list(c.compatibility_groups)
    return entry


def label_value(value: str) -> str:
    """``value`` as a label value (<= 63 characters, alphanumeric ends); long values are cut and hashed."""
    if len(value) <= 63 and re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", value):
        return value
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:52].strip("-_.")
    return f"{safe}-{short_hash(value, 10)}" if safe else short_hash(value, 10)


def slice_name_prefix(node_name: str, driver: str, pool_name: str | None = None) -> str:
    """``<node>-<driver with dots as dashes>[-<pool>]``, fitting a DNS subdomain with room for ``-<k>``."""
    parts = [node_name.lower(), dns_safe(driver)]
    if pool_name is not None and pool_name != node_name:
        parts.append(dns_safe(pool_name))
    prefix = "-".join(p for p in parts if p)
    if len(prefix) > 240 or not is_dns_subdomain(prefix + "-0"):
        cut = re.sub(r"[^a-z0-9.-]+", "-", prefix)[:200].strip("-.")
        prefix = f"{cut}-{short_hash(prefix, 10)}" if cut else short_hash(prefix, 10)
    return prefix


def slice_name(node_name: str, driver: str, k: int, pool_name: str | None = None) -> str:
    return f"{slice_name_prefix(node_name, driver, pool_name)}-{k}"


# --------------------------------------------------------------------------- planning


@dataclass
class SlicePlan:
    slices: list[dict[str, Any]]
    dropped: list[str] = field(default_factory=list)  # device names left out
    warnings: list[str] = field(default_factory=list)


def build_slices(
    pool: Pool,
    *,
    driver: str,
    node_name: str,
    pool_name: str,
    generation: int,
    server_version: tuple[int, int],
) -> list[dict[str, Any]]:
    """The ResourceSlices (plain dicts) publishing ``pool`` to a server of ``server_version``.

    Returns ``[]`` for an empty pool. Devices that cannot be published on a 1.34 server (a GPU
    whose devices exceed one slice) are dropped with a logged warning; use :func:`plan_slices`
    to see them.
    """
    plan = plan_slices(
        pool,
        driver=driver,
        node_name=node_name,
        pool_name=pool_name,
        generation=generation,
        server_version=server_version,
    )
    for w in plan.warnings:
        log.warning("%s", w)
    return plan.slices


def plan_slices(
    pool: Pool,
    *,
    driver: str,
    node_name: str,
    pool_name: str,
    generation: int,
    server_version: tuple[int, int],
) -> SlicePlan:
    """Like :func:`build_slices`, also reporting dropped devices and warnings."""
    version = checked_version(server_version)
    limits = limits_for(version)
    if not is_dns_subdomain(driver) or len(driver) > 63:
        raise ValueError(f"driver: {driver!r} is not a DNS subdomain of at most 63 characters")
    if not node_name or not is_dns_subdomain(node_name):
        raise ValueError(f"node_name: {node_name!r} is not a node name (DNS subdomain)")
    if not pool_name or len(pool_name) > 253:
        raise ValueError(f"pool_name: {pool_name!r} must be 1..253 characters")
    if generation < 0:
        raise ValueError("generation must be >= 0")
    _check_pool(pool, limits)
    groups = limits.compatibility_groups > 0
    if not groups:
        _check_groups_expressible(pool, version)

    plan = SlicePlan(slices=[])
    if limits.split:
        bodies = _split_layout(pool, limits, groups)
    else:
        bodies = _combined_layout(pool, limits, plan)

    prefix = slice_name_prefix(node_name, driver, pool_name)
    labels = {
        LABEL_DRIVER: label_value(driver),
        LABEL_NODE: label_value(node_name),
        LABEL_POOL: label_value(pool_name),
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    for k, (role, body) in enumerate(bodies):
        spec: dict[str, Any] = {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": pool_name, "generation": generation, "resourceSliceCount": len(bodies)},
            **body,
        }
        plan.slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": f"{prefix}-{k}", "labels": {**labels, LABEL_ROLE: role}},
                "spec": spec,
            }
        )
    problems = check_pool_slices(plan.slices, version)
    if problems:  # a bug here, never the caller's input
        raise AssertionError("built invalid ResourceSlices: " + "; ".join(problems[:10]))
    return plan


def _check_pool(pool: Pool, limits: Limits) -> None:
    names = [cs.name for cs in pool.counter_sets]
    if len(set(names)) != len(names):
        raise ValueError("counter set names are not unique")
    for cs in pool.counter_sets:
        if len(cs.counters) > limits.counters_per_set:
            raise ValueError(f"counter set {cs.name} has {len(cs.counters)} counters (at most {limits.counters_per_set})")
        if limits.counters_summed_per_slice is not None and len(cs.counters) > limits.counters_summed_per_slice:
            raise ValueError(f"counter set {cs.name} alone exceeds a slice's counters")
    by_name = {cs.name: cs for cs in pool.counter_sets}
    dnames = [d.name for d in pool.devices]
    if len(set(dnames)) != len(dnames):
        raise ValueError("device names are not unique")
    for d in pool.devices:
        for c in d.consumes:
            consumed = by_name.get(c.counter_set)
            if consumed is None:
                raise ValueError(f"device {d.name} consumes unknown counter set {c.counter_set}")
            missing = set(c.counters) - set(consumed.counters)
            if missing:
                raise ValueError(f"device {d.name} consumes {sorted(missing)} not in {consumed.name}")


def _exclusive(dev: PoolDevice, set_name: str, cs: CounterSet, siblings: list[PoolDevice]) -> bool:
    """Whether ``dev`` consumes all of some counter of ``cs`` that every sibling also needs."""
    mine = next(c for c in dev.consumes if c.counter_set == set_name)
    for counter, q in mine.counters.items():
        if parse_quantity(q) < parse_quantity(cs.counters[counter]):
            continue
        ok = True
        for s in siblings:
            if s is dev:
                continue
            theirs = next(c for c in s.consumes if c.counter_set == set_name)
            if parse_quantity(theirs.counters.get(counter, "0")) <= 0:
                ok = False
                break
        if ok:
            return True
    return False


def _check_groups_expressible(pool: Pool, version: tuple[int, int]) -> None:
    """Refuse to drop compatibility groups when they forbid something the counters allow.

    On servers without compatibilityGroups the groups vanish; that is only safe when every
    device of a counter set that can co-allocate with others shares a group with all of them
    (one framebuffer size per GPU, which build_pool guarantees when told the server version).
    """
    for cs in pool.counter_sets:
        devs = pool.devices_of(cs.name)
        shared = [d for d in devs if not _exclusive(d, cs.name, cs, devs)]
        lists = [frozenset(next(c for c in d.consumes if c.counter_set == cs.name).compatibility_groups) for d in shared]
        if not lists or all(not g for g in lists):
            continue
        if any(not g for g in lists) or not frozenset.intersection(*lists):
            raise ValueError(
                f"counter set {cs.name}: the pool relies on compatibility groups, which Kubernetes "
                f"{version[0]}.{version[1]} does not have; build the pool with server_version={version}"
            )


def _type_groups(devs: list[PoolDevice]) -> list[list[PoolDevice]]:
    """Consecutive devices of one GPU and one offer (passthrough, or one vGPU type)."""
    out: list[list[PoolDevice]] = []
    for d in devs:
        key = (d.gpu, d.kind, d.type_id)
        if out and (out[-1][0].gpu, out[-1][0].kind, out[-1][0].type_id) == key:
            out[-1].append(d)
        else:
            out.append([d])
    return out


def _n_consumed(devs: Iterable[PoolDevice]) -> int:
    return sum(len(c.counters) for d in devs for c in d.consumes)


def _combined_layout(pool: Pool, limits: Limits, plan: SlicePlan) -> list[tuple[str, dict[str, Any]]]:
    # Units: the counter sets linked by devices (each device must share a slice with every set
    # it consumes), with their devices; devices consuming nothing form their own units.
    parent: dict[str, str] = {cs.name: cs.name for cs in pool.counter_sets}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for d in pool.devices:
        linked = [c.counter_set for c in d.consumes]
        for s in linked[1:]:
            parent[find(s)] = find(linked[0])
    units: dict[str, tuple[list[CounterSet], list[PoolDevice]]] = {}
    order: list[str] = []
    for cs in pool.counter_sets:
        root = find(cs.name)
        if root not in units:
            units[root] = ([], [])
            order.append(root)
        units[root][0].append(cs)
    free: list[PoolDevice] = []
    for d in pool.devices:
        if d.consumes:
            units[find(d.consumes[0].counter_set)][1].append(d)
        else:
            free.append(d)

    max_devices = limits.devices_per_slice_with_counters
    max_counters = limits.counters_summed_per_slice or 10**9
    max_consumed = limits.consumptions_per_slice or 10**9

    # Trim units that cannot fit one slice: drop whole offers, lowest priority (last) first.
    packed: list[tuple[list[CounterSet], list[PoolDevice]]] = []
    for root in order:
        sets, devs = units[root]
        n_counters = sum(len(cs.counters) for cs in sets)
        if n_counters > max_counters:
            raise ValueError(
                f"counter sets {[cs.name for cs in sets]} hold {n_counters} counters, more than one slice allows"
            )
        if len(devs) > max_devices or _n_consumed(devs) > max_consumed:
            kept: list[PoolDevice] = []
            for grp in _type_groups(devs):
                if len(kept) + len(grp) <= max_devices and _n_consumed(kept) + _n_consumed(grp) <= max_consumed:
                    kept.extend(grp)
                else:
                    plan.dropped.extend(d.name for d in grp)
                    what = "passthrough" if grp[0].kind == "passthrough" else f"type {grp[0].type_id}"
                    plan.warnings.append(
                        f"GPU {grp[0].gpu} ({', '.join(cs.name for cs in sets)}): {what} not published "
                        f"({len(grp)} devices): a Kubernetes 1.34 slice holds at most {max_devices} devices "
                        "together with their counter set; offer fewer types or upgrade to 1.35+"
                    )
            devs = kept
        packed.append((sets, devs))

    bodies: list[tuple[str, dict[str, Any]]] = []
    shared: dict[tuple[str, int], Any] = {}  # one wire copy of a slot's common parts (device_to_dict)
    cur_sets: list[CounterSet] = []
    cur_devs: list[PoolDevice] = []

    def flush() -> None:
        if cur_sets or cur_devs:
            body: dict[str, Any] = {}
            if cur_sets:
                body["sharedCounters"] = [counter_set_to_dict(cs) for cs in cur_sets]
            if cur_devs:
                body["devices"] = [device_to_dict(d, shared=shared) for d in cur_devs]
            bodies.append(("combined", body))

    for sets, devs in packed:
        fits = (
            len(cur_devs) + len(devs) <= max_devices
            and sum(len(c.counters) for c in cur_sets + sets) <= max_counters
            and _n_consumed(cur_devs) + _n_consumed(devs) <= max_consumed
        )
        if not fits:
            flush()
            cur_sets, cur_devs = [], []
        cur_sets.extend(sets)
        cur_devs.extend(devs)
    flush()
    for i in range(0, len(free), limits.devices_per_slice):
        bodies.append(("devices", {"devices": [device_to_dict(d, shared=shared)
                                                for d in free[i : i + limits.devices_per_slice]]}))
    return bodies


def _split_layout(pool: Pool, limits: Limits, groups: bool) -> list[tuple[str, dict[str, Any]]]:
    bodies: list[tuple[str, dict[str, Any]]] = []
    shared: dict[tuple[str, int], Any] = {}  # one wire copy of a slot's common parts (device_to_dict)
    per = limits.counter_sets_per_slice or len(pool.counter_sets) or 1
    for i in range(0, len(pool.counter_sets), per):
        sets = pool.counter_sets[i : i + per]
        bodies.append(("counters", {"sharedCounters": [counter_set_to_dict(cs) for cs in sets]}))
    by_gpu: dict[str, list[PoolDevice]] = {}
    for d in pool.devices:
        by_gpu.setdefault(d.gpu, []).append(d)
    for devs in by_gpu.values():
        cap = (
            limits.devices_per_slice_with_counters
            if any(d.consumes or d.taints for d in devs)
            else limits.devices_per_slice
        )
        for i in range(0, len(devs), cap):
            chunk = devs[i : i + cap]
            bodies.append(("devices", {"devices": [device_to_dict(d, compatibility_groups=groups, shared=shared)
                                                for d in chunk]}))
    return bodies
