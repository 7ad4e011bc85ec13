"""DeviceTaintRules as the scheduler sees them: each adds its taint to every device it selects.

KEP-5055: a ``DeviceTaintRule`` "has the same effect as if the taint was specified directly in the
ResourceSlice by the DRA driver". Its ``deviceSelector`` narrows by ``driver``, ``pool`` and
``device`` (all given ones must match; an empty selector matches every device, a missing one
none). The allocator (:mod:`.allocator`) then honours taints and the claims' tolerations as
kube-scheduler does, whatever put the taint there. Pure, no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable


def selects(rule: dict, driver: str, pool: str, device: str) -> bool:
    """Whether ``rule``'s deviceSelector matches the device (driver, pool, name)."""
    sel = (rule.get("spec") or {}).get("deviceSelector")
    if sel is None:
        return False
    return all(sel.get(k) in (None, "", v) for k, v in (("driver", driver), ("pool", pool), ("device", device)))


def rule_taint(rule: dict) -> dict:
    """The rule's taint as it lands on a device (``timeAdded`` from the rule's creation when unset)."""
    t = dict((rule.get("spec") or {}).get("taint") or {})
    created = (rule.get("metadata") or {}).get("creationTimestamp")
    if created and not t.get("timeAdded"):
        t["timeAdded"] = created
    return t


def tainted_slices(slices: Iterable[dict], rules: Iterable[dict]) -> list[dict]:
    """``slices`` with each rule's taint added to the devices it selects (copies only of the slices
    a rule touches; the others are passed through as they are)."""
    rules = [r for r in rules if (r.get("spec") or {}).get("taint")]
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        hits = [[r for r in rules if selects(r, driver, pool, d.get("name", ""))] for d in spec.get("devices") or []]
        if not any(hits):
            out.append(s)
            continue
        s = copy.deepcopy(s)
        for d, matched in zip(s["spec"]["devices"], hits, strict=True):
            if matched:
                d["taints"] = [*(d.get("taints") or []), *(rule_taint(r) for r in matched)]
        out.append(s)
    return out


def device_taints(slices: Iterable[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """(driver, pool, device) -> its taints, for the devices that have any."""
    out = {}
    for s in slices:
        spec = s.get("spec") or {}
        for d in spec.get("devices") or []:
            if d.get("taints"):
                out[(spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""), d.get("name", ""))] = d["taints"]
    return out
