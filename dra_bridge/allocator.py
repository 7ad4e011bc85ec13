"""A model of kube-scheduler's structured DRA allocation, for planning, the demo and tests.

Production allocation stays with the real scheduler. Given ResourceSlices, DeviceClasses
and ResourceClaims as the API holds them (plain dicts), :class:`Allocator` allocates
claims the way the scheduler does:

* pools: only the newest generation counts, and only when ``resourceSliceCount`` slices of
  it are present (an incomplete pool's devices are not allocated);
* class and request CEL selectors (a pluggable evaluator, see ``Selectors``);
* ``allocationMode`` ExactCount and All; ``firstAvailable`` sub-requests in order;
* ``matchAttribute`` and ``distinctAttribute`` constraints;
* shared counters across the slices of a pool, ``compatibilityGroups``;
* ``allowMultipleAllocations`` with capacity requests and request policies;
* claims already allocated consume what they hold; a pod's claims land on one node.

Where it differs from the scheduler (docs/allocation.md): nodes are tried in name order and
the first that fits wins (no scoring); the search over devices is depth-first with a step
budget; taints are honoured only with effect NoSchedule/NoExecute and simple tolerations;
admin access and extended-resource mapping are not modelled.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Protocol

from .quantity import format_quantity, parse_quantity

SEARCH_BUDGET = 20000


class Selectors(Protocol):
    def matches(self, expression: str, device: "Device") -> bool: ...


@dataclass(eq=False)
class Device:
    driver: str
    pool: str
    name: str
    node: str | None  # None: available to every node
    attributes: dict  # name -> {"string": ..} as published
    capacity: dict  # name -> {"value": .., "requestPolicy": ..}
    consumes: list  # [{"counterSet", "counters": {name: {"value"}}, "compatibilityGroups"}]
    multi: bool = False
    taints: list = field(default_factory=list)
    signature: int = 0  # devices with equal driver/attributes/capacity share CEL results

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str):
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
    counters: dict[str, dict[str, Fraction]]  # counter set -> counter -> total
    devices: list[Device]


class Unsatisfiable(Exception):
    """The reason a claim cannot be allocated, in words a person understands."""


# --------------------------------------------------------------------------- reading slices
def _quantity(v) -> Fraction:
    return parse_quantity(v["value"] if isinstance(v, dict) else v)


def read_pools(slices: Iterable[dict]) -> dict[tuple[str, str], Pool]:
    by_pool: dict[tuple[str, str], list[dict]] = {}
    for s in slices:
        spec = s["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
    pools = {}
    signatures: dict[str, int] = {}
    for (driver, name), group in by_pool.items():
        gen = max(s["spec"]["pool"].get("generation", 0) for s in group)
        newest = [s for s in group if s["spec"]["pool"].get("generation", 0) == gen]
        expected = max(s["spec"]["pool"].get("resourceSliceCount", 1) for s in newest)
        counters: dict[str, dict[str, Fraction]] = {}
        devices = []
        for s in newest:
            spec = s["spec"]
            node = spec.get("nodeName")
            for cs in spec.get("sharedCounters") or []:
                counters[cs["name"]] = {k: _quantity(v) for k, v in cs.get("counters", {}).items()}
            for d in spec.get("devices") or []:
                sig_src = json.dumps([driver, d.get("attributes", {}), d.get("capacity", {})], sort_keys=True)
                sig = signatures.setdefault(sig_src, len(signatures))
                devices.append(Device(driver=driver, pool=name, name=d["name"], node=node,
                                      attributes=d.get("attributes") or {}, capacity=d.get("capacity") or {},
                                      consumes=d.get("consumesCounters") or [],
                                      multi=bool(d.get("allowMultipleAllocations")),
                                      taints=d.get("taints") or [], signature=sig))
        pools[(driver, name)] = Pool(driver, name, gen, len(newest) == expected, counters, devices)
    return pools


# --------------------------------------------------------------------------- state
class State:
    """What is taken: exclusive devices, counter use, capacity shares, compatibility groups."""

    def __init__(self):
        self.taken: set[tuple] = set()
        self.used: dict[tuple, dict[str, Fraction]] = {}  # (driver, pool, set) -> counter -> used
        self.groups: dict[tuple, list[list[str]]] = {}  # (driver, pool, set) -> group lists in use
        self.shared: dict[tuple, dict[str, Fraction]] = {}  # device key -> capacity -> consumed

    def copy(self) -> "State":
        c = State()
        c.taken = set(self.taken)
        c.used = {k: dict(v) for k, v in self.used.items()}
        c.groups = {k: [list(g) for g in v] for k, v in self.groups.items()}
        c.shared = {k: dict(v) for k, v in self.shared.items()}
        return c


def _groups_ok(in_use: list[list[str]], mine: list[str]) -> bool:
    for other in in_use:
        if (not other) != (not mine):
            return False
        if mine and not set(mine) & set(other):
            return False
    return True


# --------------------------------------------------------------------------- the allocator
@dataclass
class Request:
    name: str  # "req" or "req/sub"
    base: str
    device_class: str
    selectors: list[str]
    mode: str
    count: int
    capacity: dict[str, Fraction]
    tolerations: list


@dataclass
class Choice:
    request: Request
    device: Device
    consumed: dict[str, Fraction] | None = None


class Allocator:
    def __init__(self, slices: list[dict], classes: list[dict], selectors: Selectors,
                 nodes: list[str] | None = None):
        self.pools = read_pools(slices)
        self.classes = {c["metadata"]["name"]: c for c in classes}
        self.sel = selectors
        self.state = State()
        devices = [d for p in self.pools.values() if p.complete for d in p.devices]
        self.incomplete = sorted(f"{p.driver}/{p.name}" for p in self.pools.values() if not p.complete)
        self.by_node: dict[str | None, list[Device]] = {}
        for d in devices:
            self.by_node.setdefault(d.node, []).append(d)
        self.nodes = nodes or sorted(n for n in self.by_node if n is not None)
        self._cel: dict[tuple[str, int], bool] = {}
        self._cand: dict[tuple, list[Device]] = {}
        self._full: set[tuple] = set()  # (node, request shape) known not to fit; cleared on release
        self.device_index = {d.key: d for d in devices}

    # ------------------------------------------------------------ selectors
    def _match(self, expr: str, d: Device) -> bool:
        k = (expr, d.signature)
        hit = self._cel.get(k)
        if hit is None:
            hit = self._cel[k] = bool(self.sel.matches(expr, d))
        return hit

    def _class_selectors(self, name: str) -> list[str]:
        cls = self.classes.get(name)
        if cls is None:
            raise Unsatisfiable(f"device class {name!r} does not exist")
        return [s["cel"]["expression"] for s in cls.get("spec", {}).get("selectors") or [] if "cel" in s]

    def candidates(self, node: str, req: Request) -> list[Device]:
        key = (node, req.device_class, tuple(req.selectors))
        got = self._cand.get(key)
        if got is None:
            exprs = self._class_selectors(req.device_class) + req.selectors
            pool = self.by_node.get(node, []) + self.by_node.get(None, [])
            got = self._cand[key] = [d for d in pool if all(self._match(e, d) for e in exprs)]
        return got

    # ------------------------------------------------------------ requests
    @staticmethod
    def _requests(claim: dict) -> list[list[Request]]:
        """Each claim request as its alternatives (one for exactly, several for firstAvailable)."""
        out = []
        for r in claim["spec"].get("devices", {}).get("requests", []):
            alts = []
            subs = r.get("firstAvailable")
            for sub in (subs if subs else [r.get("exactly") or r]):
                name = f"{r['name']}/{sub['name']}" if subs else r["name"]
                sels = [s["cel"]["expression"] for s in sub.get("selectors") or [] if "cel" in s]
                cap = {k: parse_quantity(v) for k, v in ((sub.get("capacity") or {}).get("requests") or {}).items()}
                alts.append(Request(name=name, base=r["name"], device_class=sub["deviceClassName"], selectors=sels,
                                    mode=sub.get("allocationMode", "ExactCount"), count=int(sub.get("count", 1)),
                                    capacity=cap, tolerations=sub.get("tolerations") or []))
            out.append(alts)
        return out

    # ------------------------------------------------------------ feasibility of one device
    def _capacity_share(self, d: Device, req: Request) -> dict[str, Fraction] | None:
        """Capacity a shared device gives this request, after its request policy; None if it does not fit."""
        consumed = {}
        for name, cap in d.capacity.items():
            total = _quantity(cap)
            policy = cap.get("requestPolicy") or {}
            want = req.capacity.get(name)
            if want is None:
                want = parse_quantity(policy["default"]) if "default" in policy else (total if policy or req.capacity else None)
                if want is None:
                    continue
            if "validValues" in policy:
                fits = [parse_quantity(v) for v in policy["validValues"] if parse_quantity(v) >= want]
                if not fits:
                    return None
                want = min(fits)
            elif "validRange" in policy:
                rng = policy["validRange"]
                lo = parse_quantity(rng["min"])
                want = max(want, lo)
                if "step" in rng:
                    step = parse_quantity(rng["step"])
                    want = lo + -(-(want - lo) // step) * step
                if "max" in rng and want > parse_quantity(rng["max"]):
                    return None
            used = self.state.shared.get(d.key, {}).get(name, Fraction(0))
            if used + want > total:
                return None
            consumed[name] = want
        for name in req.capacity:
            if name not in d.capacity:
                return None
        return consumed

    def _tolerated(self, d: Device, req: Request) -> bool:
        for t in d.taints:
            if t.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(tol.get("key") in (None, t.get("key")) and (
                    tol.get("operator") == "Exists" or tol.get("value") == t.get("value"))
                    for tol in req.tolerations):
                return False
        return True

    def _fits(self, d: Device, req: Request, st: State) -> tuple[bool, dict | None]:
        if not self._tolerated(d, req):
            return False, None
        share = None
        if d.multi:
            share = self._capacity_share_in(d, req, st)
            if share is None:
                return False, None
        elif d.key in st.taken:
            return False, None
        for c in d.consumes:
            k = (d.driver, d.pool, c["counterSet"])
            totals = self.pools[(d.driver, d.pool)].counters.get(c["counterSet"])
            if totals is None:
                return False, None  # consumes a set the pool does not publish
            used = st.used.get(k, {})
            for cname, v in c.get("counters", {}).items():
                if used.get(cname, 0) + _quantity(v) > totals.get(cname, Fraction(0)):
                    return False, None
            if not _groups_ok(st.groups.get(k, []), c.get("compatibilityGroups") or []):
                return False, None
        return True, share

    def _capacity_share_in(self, d: Device, req: Request, st: State):
        saved, self.state = self.state, st
        try:
            return self._capacity_share(d, req)
        finally:
            self.state = saved

    @staticmethod
    def _take(d: Device, st: State, share: dict | None) -> None:
        if d.multi:
            bucket = st.shared.setdefault(d.key, {})
            for k, v in (share or {}).items():
                bucket[k] = bucket.get(k, Fraction(0)) + v
            if share is not None and d.key in st.taken:
                return
        st.taken.add(d.key)
        for c in d.consumes:
            k = (d.driver, d.pool, c["counterSet"])
            used = st.used.setdefault(k, {})
            for cname, v in c.get("counters", {}).items():
                used[cname] = used.get(cname, Fraction(0)) + _quantity(v)
            st.groups.setdefault(k, []).append(list(c.get("compatibilityGroups") or []))

    # ------------------------------------------------------------ constraints
    @staticmethod
    def _constraints_ok(constraints: list[dict], chosen: list[Choice]) -> bool:
        for c in constraints:
            reqs = set(c.get("requests") or [])
            scope = [ch for ch in chosen if not reqs or ch.request.base in reqs or ch.request.name in reqs]
            if "matchAttribute" in c:
                vals = [ch.device.attribute(c["matchAttribute"]) for ch in scope]
                if any(v is None for v in vals) or len({json.dumps(v) for v in vals}) > 1:
                    return False
            if "distinctAttribute" in c:
                vals = [json.dumps(ch.device.attribute(c["distinctAttribute"])) for ch in scope]
                if len(vals) != len(set(vals)):
                    return False
        return True

    # ------------------------------------------------------------ search
    def _solve(self, node: str, claims: list[dict], st: State) -> list[list[Choice]] | None:
        plan = [(claim, self._requests(claim)) for claim in claims]
        budget = [SEARCH_BUDGET]

        def per_claim(i: int, st: State, acc: list[list[Choice]]):
            if i == len(plan):
                return acc
            claim, reqs = plan[i]
            cons = claim["spec"].get("devices", {}).get("constraints") or []
            return per_request(i, 0, reqs, cons, st, [], acc)

        def per_request(i, j, reqs, cons, st, chosen, acc):
            if j == len(reqs):
                return per_claim(i + 1, st, acc + [chosen])
            for alt in reqs[j]:
                got = pick(i, j, reqs, cons, alt, st, chosen, acc)
                if got is not None:
                    return got
            return None

        def pick(i, j, reqs, cons, req, st, chosen, acc):
            cands = self.candidates(node, req)
            if req.mode == "All":
                if not cands:
                    return None
                st2 = st.copy()
                picked = []
                for d in cands:
                    ok, share = self._fits(d, req, st2)
                    if not ok:
                        return None
                    self._take(d, st2, share)
                    picked.append(Choice(req, d, share))
                if not self._constraints_ok(cons, chosen + picked):
                    return None
                return per_request(i, j + 1, reqs, cons, st2, chosen + picked, acc)

            def choose(k, start, st, got):
                if k == req.count:
                    if not self._constraints_ok(cons, chosen + got):
                        return None
                    return per_request(i, j + 1, reqs, cons, st, chosen + got, acc)
                for idx in range(start, len(cands)):
                    budget[0] -= 1
                    if budget[0] < 0:
                        return None
                    d = cands[idx]
                    ok, share = self._fits(d, req, st)
                    if not ok:
                        continue
                    trial = chosen + got + [Choice(req, d, share)]
                    if not self._constraints_ok(cons, trial):
                        continue
                    st2 = st.copy()
                    self._take(d, st2, share)
                    res = choose(k + 1, idx + 1, st2, got + [Choice(req, d, share)])
                    if res is not None:
                        return res
                return None

            return choose(0, 0, st, [])

        return per_claim(0, st, [])

    # ------------------------------------------------------------ public API
    def reserve(self, claim: dict) -> None:
        """Account an already allocated claim (its results consume what they hold)."""
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            d = self.device_index.get((r["driver"], r["pool"], r["device"]))
            if d is None:
                continue
            share = {k: parse_quantity(v) for k, v in (r.get("consumedCapacity") or {}).items()} if d.multi else None
            self._take(d, self.state, share)

    def allocate(self, claims: list[dict], node: str | None = None) -> tuple[str, list[dict]]:
        """Allocate a pod's claims together on one node: (node, allocation per claim) or Unsatisfiable."""
        shape = json.dumps([c["spec"] for c in claims], sort_keys=True)
        nodes = [node] if node else self.nodes
        for n in nodes:
            if (n, shape) in self._full:
                continue
            got = self._solve(n, claims, self.state)
            if got is None:
                self._full.add((n, shape))
                continue
            allocations = []
            for claim, chosen in zip(claims, got):
                results = []
                for ch in chosen:
                    self._take(ch.device, self.state, ch.consumed)
                    res = {"request": ch.request.name, "driver": ch.device.driver, "pool": ch.device.pool,
                           "device": ch.device.name}
                    if ch.device.multi:
                        res["shareID"] = str(uuidlib.uuid4())
                        res["consumedCapacity"] = {k: format_quantity(v) for k, v in (ch.consumed or {}).items()}
                    results.append(res)
                allocations.append({"devices": {"results": results},
                                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": [n]}]}]}})
            return n, allocations
        raise Unsatisfiable(self.explain(claims, nodes))

    # ------------------------------------------------------------ reasons
    def explain(self, claims: list[dict], nodes: list[str]) -> str:
        reasons = []
        for n in nodes[:3]:
            for claim in claims:
                for alts in self._requests(claim):
                    req = alts[0]
                    try:
                        cands = self.candidates(n, req)
                    except Unsatisfiable as exc:
                        return str(exc)
                    if not cands:
                        reasons.append(f"{n}: no device matches request {req.name!r} (class {req.device_class})")
                        break
                    free = [d for d in cands if self._fits(d, req, self.state)[0]]
                    if len(free) < req.count:
                        reasons.append(self._why_full(n, req, cands))
                        break
        if self.incomplete:
            reasons.append("incomplete pools ignored: " + ", ".join(self.incomplete))
        more = f" (and {len(nodes) - 3} more nodes)" if len(nodes) > 3 else ""
        return "; ".join(reasons or ["no node satisfies the claims' constraints"]) + more

    def _why_full(self, node: str, req: Request, cands: list[Device]) -> str:
        d = cands[0]
        for c in d.consumes:
            k = (d.driver, d.pool, c["counterSet"])
            totals = self.pools[(d.driver, d.pool)].counters.get(c["counterSet"], {})
            used = self.state.used.get(k, {})
            for cname, v in c.get("counters", {}).items():
                need = _quantity(v)
                left = totals.get(cname, Fraction(0)) - used.get(cname, Fraction(0))
                if left < need:
                    gpu = c["counterSet"].removesuffix("-counter-set")
                    if cname == "memory":
                        return (f"{node}: {gpu} has {format_quantity(left, human=True)} of "
                                f"{format_quantity(totals[cname], human=True)} framebuffer left; "
                                f"needs {format_quantity(need, human=True)}")
                    return f"{node}: {gpu} has {left} of {totals.get(cname)} {cname} left; needs {need}"
            if not _groups_ok(self.state.groups.get(k, []), c.get("compatibilityGroups") or []):
                return (f"{node}: {c['counterSet'].removesuffix('-counter-set')} holds vGPUs of another framebuffer "
                        f"size ({', '.join(sorted({g for gs in self.state.groups.get(k, []) for g in gs}))}); "
                        f"request {req.name!r} needs {', '.join(c.get('compatibilityGroups') or ['none'])}")
        return f"{node}: all {len(cands)} devices matching request {req.name!r} are allocated"


class CelSelectors:
    """Selectors evaluated with a real CEL implementation plus Kubernetes' quantity library."""

    def __init__(self):
        from kubevirt_templates.cel import CelError, compile_selector, device_variable

        self._compile, self._variable, self._error = compile_selector, device_variable, CelError
        self._programs: dict[str, object] = {}
        self.errors: list[str] = []

    def matches(self, expression: str, device: Device) -> bool:
        prog = self._programs.get(expression)
        if prog is None:
            prog = self._programs[expression] = self._compile(expression)
        var = self._variable({"attributes": device.attributes, "capacity": device.capacity,
                              "allowMultipleAllocations": device.multi}, device.driver)
        try:
            return prog.evaluate(var)
        except self._error as exc:  # the scheduler fails the claim; here the device does not match
            self.errors.append(str(exc))
            return False
