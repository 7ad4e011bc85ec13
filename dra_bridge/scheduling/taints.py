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


def tolerates(tolerations: Iterable[dict], taint: dict) -> bool:
    """Kubernetes' ToleratesTaint: effect (empty: any), key (empty with Exists: any), then Exists or
    an equal value."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("key") and tol["key"] != taint.get("key"):
            continue
        if not tol.get("key") and tol.get("operator", "Equal") != "Exists":
            continue
        if tol.get("operator", "Equal") == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def to_evict(claims: Iterable[dict], slices: Iterable[dict]) -> dict[tuple[str, str], str]:
    """The device-taint eviction controller's decision (KEP-5055, kube-controller-manager): claim
    (namespace, name) -> why its pods go, for each allocated claim with a device whose ``NoExecute``
    taint its request does not tolerate."""
    taints = device_taints(slices)
    out = {}
    for c in claims:
        meta, spec = c.get("metadata") or {}, c.get("spec") or {}
        requests = {r.get("name"): (r.get("exactly") or r) for r in (spec.get("devices") or {}).get("requests") or []}
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            tolerations = r.get("tolerations") or requests.get(r.get("request", "").split("/")[0], {}).get(
                "tolerations") or []
            for t in taints.get((r.get("driver"), r.get("pool"), r.get("device")), []):
                if t.get("effect") == "NoExecute" and not tolerates(tolerations, t):
                    out[(meta.get("namespace", ""), meta.get("name", ""))] = (
                        f"device {r.get('device')} has taint {t.get('key')}:NoExecute, not tolerated")
    return out
