"""What the API server's validation (beyond the OpenAPI schema) would say of ResourceSlices: a
check of built slices, kept apart from building them. Pure functions, no I/O."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from dra_bridge.api.compat import checked_version, limits_for
from dra_bridge.api.k8sname import MAX_STRING_ATTR, is_dns_label, is_dns_subdomain
from dra_bridge.api.quantity import parse_quantity

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _qualified_name_ok(name: str) -> bool:
    if "/" in name:
        domain, _, ident = name.partition("/")
        return bool(is_dns_subdomain(domain) and len(domain) <= 63 and _C_IDENT.match(ident) and len(ident) <= 32)
    return bool(_C_IDENT.match(name) and len(name) <= 32)


def check_slice(obj: dict[str, Any], server_version: tuple[int, int]) -> list[str]:
    """Problems the API server's validation (beyond the OpenAPI schema) would report for one slice."""
    version = checked_version(server_version)
    lim = limits_for(version)
    errs: list[str] = []
    name = obj.get("metadata", {}).get("name", "")
    where = f"slice {name}"
    if not is_dns_subdomain(name):
        errs.append(f"{where}: name is not a DNS subdomain")
    spec = obj.get("spec", {})
    driver = spec.get("driver", "")
    if not is_dns_subdomain(driver) or len(driver) > 63:
        errs.append(f"{where}: driver {driver!r} invalid")
    selectors = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(selectors) != 1:
        errs.append(f"{where}: exactly one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection, got {selectors}")
    devices = spec.get("devices") or []
    sets = spec.get("sharedCounters") or []
    if lim.split and devices and sets:
        errs.append(f"{where}: only one of sharedCounters or devices is allowed")
    with_counters = any(d.get("consumesCounters") or d.get("taints") for d in devices)
    max_dev = lim.devices_per_slice_with_counters if with_counters else lim.devices_per_slice
    if len(devices) > max_dev:
        errs.append(f"{where}: {len(devices)} devices (at most {max_dev})")
    set_names = [s.get("name", "") for s in sets]
    if len(set(set_names)) != len(set_names):
        errs.append(f"{where}: duplicate counter set names")
    if lim.counter_sets_per_slice is not None and len(sets) > lim.counter_sets_per_slice:
        errs.append(f"{where}: {len(sets)} counter sets (at most {lim.counter_sets_per_slice})")
    total_counters = 0
    for s in sets:
        if not is_dns_label(s.get("name", "")):
            errs.append(f"{where}: counter set name {s.get('name')!r} is not a DNS label")
        counters = s.get("counters") or {}
        if not counters:
            errs.append(f"{where}: counter set {s.get('name')} has no counters")
        if len(counters) > lim.counters_per_set:
            errs.append(f"{where}: counter set {s.get('name')} has {len(counters)} counters")
        for c in counters:
            if not is_dns_label(c):
                errs.append(f"{where}: counter name {c!r} is not a DNS label")
        total_counters += len(counters)
    if lim.counters_summed_per_slice is not None and total_counters > lim.counters_summed_per_slice:
        errs.append(f"{where}: {total_counters} counters over all sets (at most {lim.counters_summed_per_slice})")
    consumed = 0
    for d in devices:
        dn = d.get("name", "")
        if not is_dns_label(dn):
            errs.append(f"{where}: device name {dn!r} is not a DNS label")
        attrs = d.get("attributes") or {}
        cap = d.get("capacity") or {}
        if len(attrs) + len(cap) > lim.attributes_and_capacity:
            errs.append(f"{where}: device {dn} has {len(attrs) + len(cap)} attributes and capacities")
        for k, v in attrs.items():
            if not _qualified_name_ok(k):
                errs.append(f"{where}: device {dn} attribute name {k!r} invalid")
            if len(v) != 1:
                errs.append(f"{where}: device {dn} attribute {k} must have exactly one value")
            s = v.get("string")
            if s is not None and len(s.encode()) > MAX_STRING_ATTR:
                errs.append(f"{where}: device {dn} attribute {k} longer than {MAX_STRING_ATTR} bytes")
        for k in cap:
            if not _qualified_name_ok(k):
                errs.append(f"{where}: device {dn} capacity name {k!r} invalid")
        cons = d.get("consumesCounters") or []
        for field, most in (("bindingConditions", lim.binding_conditions),
                            ("bindingFailureConditions", lim.binding_failure_conditions)):
            if len(d.get(field) or []) > most:
                errs.append(f"{where}: device {dn} has more than {most} {field}")
        if lim.counter_sets_per_device is not None and len(cons) > lim.counter_sets_per_device:
            errs.append(f"{where}: device {dn} consumes {len(cons)} counter sets")
        n_dev = 0
        for c in cons:
            n = len(c.get("counters") or {})
            n_dev += n
            if n > lim.counters_per_consumption:
                errs.append(f"{where}: device {dn} consumes {n} counters of {c.get('counterSet')}")
            if not lim.split and c.get("counterSet") not in set_names:
                errs.append(f"{where}: device {dn} consumes {c.get('counterSet')} from another slice (1.34)")
            grp = c.get("compatibilityGroups")
            if grp is not None:
                if lim.compatibility_groups == 0:
                    errs.append(f"{where}: device {dn}: compatibilityGroups needs Kubernetes 1.37+")
                elif len(grp) > lim.compatibility_groups or len(set(grp)) != len(grp):
                    errs.append(f"{where}: device {dn}: at most {lim.compatibility_groups} unique compatibility groups")
        if lim.counters_per_device is not None and n_dev > lim.counters_per_device:
            errs.append(f"{where}: device {dn} consumes {n_dev} counters (at most {lim.counters_per_device})")
        consumed += n_dev
        if len(d.get("taints") or []) > lim.taints_per_device:
            errs.append(f"{where}: device {dn} has too many taints")
    if lim.consumptions_per_slice is not None and consumed > lim.consumptions_per_slice:
        errs.append(f"{where}: {consumed} counter consumptions (at most {lim.consumptions_per_slice})")
    return errs


def check_pool_slices(slices: list[dict[str, Any]], server_version: tuple[int, int]) -> list[str]:
    """:func:`check_slice` for each slice, plus the rules that span the slices of one pool."""
    errs: list[str] = []
    for s in slices:
        errs.extend(check_slice(s, server_version))
    if not slices:
        return errs
    pools = {(s["spec"]["driver"], s["spec"]["pool"]["name"]) for s in slices}
    if len(pools) != 1:
        errs.append(f"slices belong to several pools: {sorted(pools)}")
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    if len(gens) != 1:
        errs.append(f"slices carry several generations: {sorted(gens)}")
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if counts != {len(slices)}:
        errs.append(f"resourceSliceCount {sorted(counts)} but {len(slices)} slices")
    names = [s["metadata"]["name"] for s in slices]
    if len(set(names)) != len(names):
        errs.append("duplicate slice names")
    sets: dict[str, dict[str, Fraction]] = {}
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] in sets:
                errs.append(f"counter set {cs['name']} published twice in the pool")
            sets[cs["name"]] = {k: parse_quantity(v["value"]) for k, v in cs["counters"].items()}
    dev_names: set[str] = set()
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] in dev_names:
                errs.append(f"device {d['name']} published twice in the pool")
            dev_names.add(d["name"])
            for c in d.get("consumesCounters") or []:
                cs = sets.get(c["counterSet"])
                if cs is None:
                    errs.append(f"device {d['name']} consumes unknown counter set {c['counterSet']}")
                    continue
                for k, v in c["counters"].items():
                    if k not in cs:
                        errs.append(f"device {d['name']} consumes counter {k} missing from {c['counterSet']}")
                    elif parse_quantity(v["value"]) > cs[k]:
                        errs.append(f"device {d['name']} consumes more {k} than {c['counterSet']} holds")
    return errs
