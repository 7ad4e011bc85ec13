"""Whether one device can be taken for a request, and taking it: capacity shares and their request
policies, taints, shared counters and compatibility groups. Mirrors upstream's ``allocateDevice``,
``checkAvailableCounters``, ``CmpRequestOverCapacity`` (consumable_capacity.go) and
``taintPreventsAllocation`` (structured/internal/incubating)."""

from __future__ import annotations

from typing import Any

from dra_bridge.scheduling.pools import Amount, Device, State, groups_compatible, quantity_value
from dra_bridge.scheduling.requests import Request


def policy_round(want: Amount, policy: dict[str, Any]) -> Amount:
    """The scheduler's calculateConsumedCapacity for a requested amount: round up to the range's
    step or to the next valid value."""
    rng = policy.get("validRange")
    if rng and "min" in rng:
        lo = quantity_value(rng["min"])
        if want < lo:
            return lo
        if "step" in rng:
            step = quantity_value(rng["step"])
            return lo + -(-(want - lo) // step) * step
        return want
    if "validValues" in policy:
        for v in policy["validValues"]:  # ascending (API validation)
            if want <= quantity_value(v):
                return quantity_value(v)
    return want


def policy_violated(amount: Amount, policy: dict[str, Any]) -> bool:
    """The scheduler's violatesPolicy: the default is always fine; else within the range (max, step)
    or one of the valid values."""
    if not policy:
        return False
    if "default" in policy and amount == quantity_value(policy["default"]):
        return False
    rng = policy.get("validRange")
    if rng is not None:
        if "max" in rng and amount > quantity_value(rng["max"]):
            return True
        if "step" in rng and (amount - quantity_value(rng.get("min", 0))) % quantity_value(rng["step"]) != 0:
            return True
        return False
    if policy.get("validValues"):
        return all(amount != quantity_value(v) for v in policy["validValues"])
    return False


def capacity_share(d: Device, req: Request, st: State) -> dict[str, Amount] | None:
    """Capacity the request consumes on ``d`` after the device's request policies (the scheduler's
    CmpRequestOverCapacity); None if it does not fit. Every capacity of the device is consumed:
    what is not requested takes the policy's default, else the whole capacity."""
    for name in req.capacity:
        if name not in d.capacity:
            return None  # requests a capacity the device does not have
    used = st.shared.get(d.key, {}) if d.multi else {}
    consumed: dict[str, Amount] = {}
    for name, cap in d.capacity.items():
        total = quantity_value(cap)
        policy = cap.get("requestPolicy") or {}
        want = req.capacity.get(name)
        if want is None:
            want = quantity_value(policy["default"]) if "default" in policy else total
        elif policy:
            want = policy_round(want, policy)
        if policy_violated(want, policy):
            return None
        if used.get(name, 0) + want > total:
            return None
        consumed[name] = want
    return consumed


def tolerated(d: Device, req: Request) -> bool:
    """Upstream ``taintPreventsAllocation`` with Kubernetes' ToleratesTaint: effect (empty = any),
    key (empty = any, with Exists), then Exists or an equal value."""
    for t in d.taints:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue  # only these effects keep the scheduler from allocating
        for tol in req.tolerations:
            if tol.get("effect") and tol["effect"] != t.get("effect"):
                continue
            if tol.get("key") and tol["key"] != t.get("key"):
                continue
            if tol.get("operator", "Equal") == "Exists" or (tol.get("value") or "") == (t.get("value") or ""):
                break
        else:
            return False
    return True


def fits(d: Device, req: Request, st: State, taints: bool = True) -> tuple[bool, dict[str, Amount] | None]:
    """Whether ``d`` can be taken for ``req`` now, and the capacity share it would take: upstream
    ``allocateDevice`` (taints when ``taints``, in use, ``CmpRequestOverCapacity``,
    ``checkAvailableCounters`` and the compatibility groups of each counter set)."""
    if d.taints and taints and not tolerated(d, req):
        return False, None
    share = None
    if d.multi:
        share = capacity_share(d, req, st)
        if share is None:
            return False, None
        if d.key in st.taken:
            return True, share  # counters were consumed by the first share of the device
    elif not req.admin and (d.key in st.taken or d.key in st.admin):  # upstream deviceInUse; admin skips it
        return False, None
    elif req.capacity and capacity_share(d, req, st) is None:
        return False, None  # the scheduler checks capacity requests against every device
    used_all, groups_all = st.used, st.groups
    for k, amounts, mine, totals in d.cons:
        if totals is None:
            return False, None  # consumes a set the pool does not publish
        used = used_all.get(k)
        for cname, v in amounts:
            if (used.get(cname, 0) if used else 0) + v > totals.get(cname, 0):
                return False, None
        in_use = groups_all.get(k)
        if in_use and not groups_compatible(in_use, mine):
            return False, None
    return True, share


def take(d: Device, st: State, share: dict[str, Amount] | None, mark: bool = True) -> bool:
    """Account ``d`` in ``st``; True when its counters were consumed (undo with :func:`untake`).
    Upstream: the state ``allocateDevice`` updates (allocating devices, counters, capacity);
    ``mark=False`` for admin access: its counters are reserved, the device is in use only for the
    rest of this attempt (``st.admin``, upstream ``allocatingDevices``)."""
    if d.multi:
        bucket = st.shared.setdefault(d.key, {})
        for k, v in (share or {}).items():
            bucket[k] = bucket.get(k, 0) + v
        if share is not None and d.key in st.taken:
            return False
    if mark:
        st.taken.add(d.key)
    elif not d.multi:
        st.admin[d.key] = st.admin.get(d.key, 0) + 1
    for key, amounts, groups, _ in d.cons:
        used = st.used.get(key)
        if used is None:
            used = st.used[key] = {}
        for cname, v in amounts:
            used[cname] = used.get(cname, 0) + v
        st.groups.setdefault(key, []).append(groups)
    return True


def untake(d: Device, st: State, share: dict[str, Amount] | None, counted: bool, mark: bool = True) -> None:
    """Undo the last :func:`take` of ``d`` (the search takes and undoes in LIFO order): upstream
    ``allocateDevice``'s rollback function."""
    if d.multi:
        bucket = st.shared[d.key]
        for k, v in (share or {}).items():
            bucket[k] -= v
        if not counted:
            return
        del st.shared[d.key]
    if mark:
        st.taken.discard(d.key)
    elif not d.multi:
        st.admin[d.key] -= 1
        if not st.admin[d.key]:
            del st.admin[d.key]
    for key, amounts, _groups, _ in d.cons:
        used = st.used[key]
        for cname, v in amounts:
            used[cname] -= v
        st.groups[key].pop()
