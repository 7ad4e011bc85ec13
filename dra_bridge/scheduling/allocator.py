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
budget per node instead of a time limit; slices with a nodeSelector count for every node;
extended-resource mapping is not modelled. Pools, their order and validity and
the scheduler's feature gates follow upstream's pools_incubating.go (see ``pools``); a selector
that fails on a device the search reaches fails the attempt, as upstream (``AllocationError``).
tests/oracle/ checks all of it against Kubernetes' own allocator.

Speed: CEL results are cached per (expression, device signature), candidate lists per (node,
class, selectors); the search takes and undoes devices in place (no state copies); nodes known
full for a request shape are skipped (allocation only adds to the state, there is no release).
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any

from dra_bridge.api.quantity import format_quantity
from dra_bridge.scheduling.constraints import constraints_ok
from dra_bridge.scheduling.counters import capacity_share, fits, take, tolerated, untake
from dra_bridge.scheduling.pools import (
    ALL_FEATURES,
    Amount,
    Device,
    Features,
    State,
    groups_compatible,
    quantity_value,
    read_pools,
)
from dra_bridge.scheduling.requests import Choice, Request, parse_requests
from dra_bridge.scheduling.results import configs, device_result
from dra_bridge.scheduling.selectors import SelectorError, Selectors

SEARCH_BUDGET = 20000
#: devices per claim (resourceapi.AllocationResultsMaxSize)
CLAIM_LIMIT = 32


def _human(q: Amount) -> str:
    return "0 B" if q == 0 else format_quantity(q, human=True)


class Unsatisfiable(Exception):
    """The reason a claim cannot be allocated, in words a person understands."""


class AllocationError(Unsatisfiable):
    """An error for the pod's whole scheduling attempt, not one node (upstream: an error from
    ``Allocate`` that does not wrap ``ErrFailedAllocationOnNode``): no other node is tried."""


class Allocator:
    def __init__(self, slices: list[dict[str, Any]], classes: list[dict[str, Any]], selectors: Selectors,
                 nodes: list[str] | None = None, features: Features = ALL_FEATURES) -> None:
        self.features = features
        self.pools = read_pools(slices, features)
        self.classes = {c["metadata"]["name"]: c for c in classes}
        self.sel = selectors
        self.state = State()
        self.incomplete = sorted(f"{p.driver}/{p.name}" for p in self.pools.values() if not p.complete)
        self.by_node: dict[str | None, list[Device]] = {}
        self.incomplete_by_node: dict[str | None, list[str]] = {}
        self.invalid_by_node: dict[str | None, list[str]] = {}
        for p in self.pools.values():
            if not p.complete or p.invalid:  # upstream allocateDevice skips IsIncomplete and IsInvalid pools
                where = self.incomplete_by_node if not p.complete else self.invalid_by_node
                for n in {d.node for d in p.devices} or {None}:
                    where.setdefault(n, []).append(f"{p.driver}/{p.name}" + (f" ({p.invalid})" if p.invalid else ""))
                continue
            for d in p.devices:
                # isSelectable / allocateDevice: devices with binding conditions need the gates,
                # devices that consume counters need DRAPartitionableDevices
                if d.binding and not features.binding_conditions:
                    continue
                if d.cons and not features.partitionable_devices:
                    continue
                self.by_node.setdefault(d.node, []).append(d)
        self.nodes = nodes or sorted(n for n in self.by_node if n is not None)
        self._cel: dict[tuple[str, int], bool | SelectorError] = {}
        self._sigmatch: dict[tuple, dict[int, bool | SelectorError]] = {}  # selectors -> signature -> all match
        self._cand: dict[tuple, list[Device]] = {}
        self._cand_err: dict[tuple, dict[int, SelectorError]] = {}  # candidates whose selectors failed
        self._node_sigs: dict[str | None, dict[int, Device]] = {}
        # Allocation only ever adds to the state (there is no release), so a node that cannot
        # take a request shape now never can: remember it, and per shape the first node in
        # order that might still fit (everything before it is known full).
        self._full: set[tuple] = set()
        self._cursor: dict[str, int] = {}
        self._device_index: dict[tuple, Device] | None = None
        # feasibility per (node, claims' shape), valid while the node's state is unchanged: only
        # allocate()/reserve() change the state, and they bump the version of the node they take on
        # (a node-less device bumps every node: the global version)
        self._node_ver: dict[str | None, int] = {}
        self._fit_memo: dict[tuple, tuple[int, int, bool]] = {}
        self._filter_state: dict[str, dict] = {}
        self._changes: list[str | None] = []  # nodes whose state changed, in order (filter's change log)
        self._node_pos = {n: i for i, n in enumerate(self.nodes)}

    @property
    def device_index(self) -> dict[tuple, Device]:
        if self._device_index is None:
            self._device_index = {d.key: d for devs in self.by_node.values() for d in devs}
        return self._device_index

    # ------------------------------------------------------------ selectors
    def _match(self, expr: str, d: Device) -> bool | SelectorError:
        """Whether ``d`` satisfies ``expr``, or the error evaluating it (raised by the search when it
        reaches the device, as upstream ``isSelectable`` does)."""
        k = (expr, d.signature)
        hit = self._cel.get(k)
        if hit is None:
            try:
                hit = bool(self.sel.matches(expr, d))
            except SelectorError as exc:
                hit = exc
            self._cel[k] = hit
        return hit

    def _all_match(self, exprs: tuple[str, ...], d: Device) -> bool | SelectorError:
        """Class selectors, then the request's, each until the first that fails (``isSelectable``)."""
        for e in exprs:
            r = self._match(e, d)
            if r is not True:
                return r
        return True

    def _selector_error(self, node: str, req: Request, d: Device) -> None:
        """Raise the selector error of ``d`` for ``req``, if evaluating its selectors failed."""
        errs = self._cand_err.get((node, req.device_class, tuple(req.selectors)))
        if errs and d.signature in errs:
            raise AllocationError(f"request {req.name!r}: a selector failed on device {d.name}: {errs[d.signature]}")

    def _class_selectors(self, name: str) -> list[str]:
        cls = self.classes.get(name)
        if cls is None:
            raise Unsatisfiable(f"device class {name!r} does not exist")
        return [s["cel"]["expression"] for s in cls.get("spec", {}).get("selectors") or [] if "cel" in s]

    def candidates(self, node: str, req: Request) -> list[Device]:
        key = (node, req.device_class, tuple(req.selectors))
        got = self._cand.get(key)
        if got is None:
            exprs = tuple(self._class_selectors(req.device_class) + list(req.selectors))
            memo = self._sigmatch.setdefault(exprs, {})
            devs = self.by_node.get(node, []) + self.by_node.get(None, [])
            sigs = self._node_sigs.get(node)
            if sigs is None:
                sigs = self._node_sigs[node] = {d.signature: d for d in devs}  # one device per signature
            ok = set()
            errs: dict[int, SelectorError] = {}
            for sig, d in sigs.items():
                hit = memo.get(sig)
                if hit is None:
                    hit = memo[sig] = self._all_match(exprs, d)
                if isinstance(hit, SelectorError):
                    errs[sig] = hit  # a candidate: reaching it fails the attempt
                if hit:
                    ok.add(sig)
            got = [d for d in devs if d.signature in ok] if ok else []
            self._cand[key] = got
            if errs:
                self._cand_err[key] = errs
        return got

    # ------------------------------------------------------------ one device (counters.py)
    def _capacity_share(self, d: Device, req: Request, st: State | None = None) -> dict[str, Amount] | None:
        return capacity_share(d, req, st or self.state)

    def _fits(self, d: Device, req: Request, st: State) -> tuple[bool, dict[str, Amount] | None]:
        return fits(d, req, st, self.features.device_taints)

    _take = staticmethod(take)
    _untake = staticmethod(untake)
    _tolerated = staticmethod(tolerated)
    _constraints_ok = staticmethod(constraints_ok)
    _requests = staticmethod(parse_requests)

    # ------------------------------------------------------------ search (upstream allocateOne)
    def _all_devices(self, node: str, req: Request) -> list[Device] | None:
        """The fixed device list of an allocationMode All request (None: cannot be allocated here).
        Like the scheduler: refused while a pool visible to the node is incomplete; devices whose
        capacity cannot hold the request are left out."""
        for where, why in ((self.incomplete_by_node, "is being updated (incomplete)"),
                           (self.invalid_by_node, "is invalid")):
            pending = (where.get(node) or []) + (where.get(None) or [])
            if pending:  # upstream: an error for the whole attempt, not for this node
                raise AllocationError(f"request {req.name!r} asks for all devices, but pool {pending[0]} {why}")
        cands = self.candidates(node, req)
        for d in cands:
            self._selector_error(node, req, d)  # upstream gathers every device of an All request up front
        if req.capacity or any(d.multi for d in cands):
            cands = [d for d in cands if self._capacity_share(d, req, self.state) is not None]
        return cands or None

    def _solve(self, node: str, claims: list[dict[str, Any]], st: State,
               plan: list[tuple[dict[str, Any], list[list[Request]]]] | None = None) -> list[list[Choice]] | None:
        """Depth-first search over the devices of ``node``; ``st`` is changed while searching and
        restored before returning (the chosen devices are not taken)."""
        if plan is None:
            plan = [(claim, self._requests(claim)) for claim in claims]
        budget = [SEARCH_BUDGET]
        every = {id(alt): self._all_devices(node, alt)
                 for _, reqs in plan for alts in reqs for alt in alts if alt.mode == "All"}
        for claim, reqs in plan:  # upstream Allocate: at most 32 devices per claim, by each request's minimum
            held = 0
            for alts in reqs:
                need = min(len(every[id(a)] or []) if a.mode == "All" else a.count for a in alts)
                if need > CLAIM_LIMIT - held:
                    raise AllocationError(f"claim {claim['metadata'].get('name', '')}, request {alts[0].base}: adding "
                                          f"{need} devices exceeds the claim limit of {CLAIM_LIMIT}, with {held} "
                                          "already accounted for")
                held += need

        def per_claim(i: int, acc: list[list[Choice]]) -> list[list[Choice]] | None:
            if i == len(plan):
                return acc
            claim, reqs = plan[i]
            cons = claim["spec"].get("devices", {}).get("constraints") or []
            return per_request(i, 0, reqs, cons, [], acc)

        def per_request(i: int, j: int, reqs: list[list[Request]], cons: list[dict[str, Any]], chosen: list[Choice],
                        acc: list[list[Choice]]) -> list[list[Choice]] | None:
            if j == len(reqs):
                return per_claim(i + 1, acc + [chosen])
            for alt in reqs[j]:
                got = pick(i, j, reqs, cons, alt, chosen, acc)
                if got is not None:
                    return got
            return None

        def pick(i: int, j: int, reqs: list[list[Request]], cons: list[dict[str, Any]], req: Request,
                 chosen: list[Choice], acc: list[list[Choice]]) -> list[list[Choice]] | None:
            if req.mode == "All":
                devs = every[id(req)]
                if not devs:
                    return None
                undo = []
                picked = []
                res = None
                for d in devs:
                    ok, share = self._fits(d, req, st)
                    if req.admin and not d.multi and any(c.device is d for c in chosen):
                        ok = False  # upstream allocatingDeviceForClaim
                    if not ok:
                        break
                    undo.append((d, share, self._take(d, st, share, not req.admin)))
                    picked.append(Choice(req, d, share))
                else:
                    if self._constraints_ok(cons, chosen + picked):
                        res = per_request(i, j + 1, reqs, cons, chosen + picked, acc)
                for d, share, counted in reversed(undo):
                    self._untake(d, st, share, counted, not req.admin)
                return res

            cands = self.candidates(node, req)
            check = bool(cons)

            def choose(k: int, start: int, got: list[Choice]) -> list[list[Choice]] | None:
                if k == req.count:
                    if check and not self._constraints_ok(cons, chosen + got):
                        return None
                    return per_request(i, j + 1, reqs, cons, chosen + got, acc)
                for idx in range(start, len(cands)):
                    budget[0] -= 1
                    if budget[0] < 0:
                        return None
                    d = cands[idx]
                    if req.admin and not d.multi and any(c.device is d for c in chosen + got):
                        continue  # upstream allocatingDeviceForClaim: admin access, once per claim
                    if d.multi or req.admin or (d.key not in st.taken and d.key not in st.admin):  # in use, then selectors
                        self._selector_error(node, req, d)
                    ok, share = self._fits(d, req, st)
                    if not ok:
                        continue
                    ch = Choice(req, d, share)
                    if check and not self._constraints_ok(cons, chosen + got + [ch]):
                        continue
                    counted = self._take(d, st, share, not req.admin)
                    res = choose(k + 1, idx + 1, got + [ch])
                    self._untake(d, st, share, counted, not req.admin)
                    if res is not None:
                        return res
                return None

            return choose(0, 0, [])

        return per_claim(0, [])

    # ------------------------------------------------------------ filter (scheduler's Filter phase)
    def _bump(self, d: Device) -> None:
        self._node_ver[d.node] = self._node_ver.get(d.node, 0) + 1
        self._changes.append(d.node)

    def _could_fit(self, node: str, plan: list[tuple[dict, list[list[Request]]]]) -> bool:
        """Cheap necessary condition: every request has an alternative with enough candidates."""
        for _claim, reqs in plan:
            for alts in reqs:
                if not any(alt.mode == "All" or len(self.candidates(node, alt)) >= alt.count for alt in alts):
                    return False
        return True

    def fits(self, node: str, claims: list[dict], shape: str | None = None,
             plan: list[tuple[dict, list[list[Request]]]] | None = None) -> bool:
        """Whether ``claims`` can be allocated together on ``node`` now (nothing is taken); remembered per
        (node, shape) until the node's state changes. ``shape`` and ``plan``: the claims' specs as a key
        and their requests, when the caller has them for many nodes."""
        shape = shape or json.dumps([c["spec"] for c in claims], sort_keys=True)
        ver = (self._node_ver.get(node, 0), self._node_ver.get(None, 0))
        hit = self._fit_memo.get((node, shape))
        if hit is not None and hit[:2] == ver:
            return hit[2]
        plan = plan or [(c, self._requests(c)) for c in claims]
        try:
            ok = self._could_fit(node, plan) and self._solve(node, claims, self.state, plan) is not None
        except AllocationError:
            ok = False  # the attempt fails on every node; allocate() says why
        self._fit_memo[(node, shape)] = (*ver, ok)
        return ok

    def filter(self, claims: list[dict], start: int = 0, limit: int | None = None) -> tuple[list[str], int]:
        """The scheduler's Filter phase: nodes (in order from ``start``, wrapping) where ``claims`` fit,
        until ``limit`` of them are found; returns them and how many nodes were looked at.

        Per claims' shape the nodes that fit are kept as a sorted index; only nodes whose state changed
        since the shape's last filter (the change log of allocate/reserve) are solved again."""
        shape = json.dumps([c["spec"] for c in claims], sort_keys=True)
        plan = [(c, self._requests(c)) for c in claims]
        nodes, n_nodes = self.nodes, len(self.nodes)
        st = self._filter_state.get(shape)
        glob = self._node_ver.get(None, 0)
        if st is None or st["glob"] != glob:
            ok = [i for i, n in enumerate(nodes) if self.fits(n, claims, shape, plan)]
            st = self._filter_state[shape] = {"ok": ok, "log": len(self._changes), "glob": glob}
        elif st["log"] < len(self._changes):
            ok = st["ok"]
            for n in set(self._changes[st["log"]:]):
                i = None if n is None else self._node_pos.get(n)  # a node-less change bumps glob: not here
                if n is None or i is None:
                    continue
                fit = self.fits(n, claims, shape, plan)
                j = bisect.bisect_left(ok, i)
                present = j < len(ok) and ok[j] == i
                if fit and not present:
                    ok.insert(j, i)
                elif present and not fit:
                    del ok[j]
            st["log"] = len(self._changes)
        ok = st["ok"]
        start %= n_nodes or 1
        j = bisect.bisect_left(ok, start)
        ring = ok[j:] + ok[:j]
        if limit is not None and len(ring) >= limit:
            ring = ring[:limit]
            last = ring[-1]
            scanned = (last - start) % n_nodes + 1
        else:
            scanned = n_nodes
        return [nodes[i] for i in ring], scanned

    # ------------------------------------------------------------ public API
    def reserve(self, claim: dict) -> None:
        """Account an already allocated claim (its results consume what they hold)."""
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            d = self.device_index.get((r["driver"], r["pool"], r["device"]))
            if d is None or r.get("adminAccess"):
                continue  # upstream's claim tracker: admin access holds no device and no counters
            if not d.multi and d.key in self.state.taken:
                continue  # held by another claim too (admin access): counters count once
            share = {k: quantity_value(v) for k, v in (r.get("consumedCapacity") or {}).items()} if d.multi else None
            self._take(d, self.state, share)
            self._bump(d)

    def allocate(self, claims: list[dict], node: str | None = None) -> tuple[str, list[dict]]:
        """Allocate a pod's claims together on one node: (node, allocation per claim) or Unsatisfiable."""
        shape = json.dumps([c["spec"] for c in claims], sort_keys=True)
        plan = [(claim, self._requests(claim)) for claim in claims]
        if node:
            order, first = [node], 0
        else:
            order, first = self.nodes, self._cursor.get(shape, 0)
        for pos in range(first, len(order)):
            n = order[pos]
            if (n, shape) in self._full:
                if not node and pos == self._cursor.get(shape, 0):
                    self._cursor[shape] = pos + 1
                continue
            got = self._solve(n, claims, self.state, plan)
            if got is None:
                self._full.add((n, shape))
                if not node and pos == self._cursor.get(shape, 0):
                    self._cursor[shape] = pos + 1
                continue
            allocations = []
            for claim, chosen in zip(claims, got, strict=False):
                for ch in chosen:
                    if not ch.request.admin:  # admin access holds nothing once allocated
                        self._take(ch.device, self.state, ch.consumed)
                        self._bump(ch.device)
                devices: dict = {"results": [device_result(ch, self.features) for ch in chosen]}
                config = configs(claim, chosen, self.classes, self.features)
                if config:
                    devices["config"] = config
                allocations.append({"devices": devices,
                                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": [n]}]}]}})
            return n, allocations
        raise Unsatisfiable(self.explain(claims, [node] if node else self.nodes))

    # ------------------------------------------------------------ reasons
    def explain(self, claims: list[dict[str, Any]], nodes: list[str]) -> str:
        reasons: list[str] = []
        for n in nodes[:3]:
            before = len(reasons)
            for claim in claims:
                for alts in self._requests(claim):
                    why = []
                    for req in alts:  # a firstAvailable request fails only when every sub-request does
                        try:
                            r = self._why_not(n, req)
                        except Unsatisfiable as exc:
                            return str(exc)
                        if r is None:
                            break
                        why.append(f"{req.name!r}: {r}" if len(alts) > 1 and not r.startswith(
                            ("no device matches", "request ")) else r)
                    else:
                        reasons.append(f"{n}: " + "; or ".join(why))
                        break
                if len(reasons) > before:
                    break
            if len(reasons) == before:
                reasons.append(f"{n}: each request has devices, but not all of them together "
                               "(constraints, or the pod's claims compete for the same GPUs)")
        if self.incomplete:
            reasons.append("incomplete pools ignored: " + ", ".join(self.incomplete))
        invalid = sorted({p for ps in self.invalid_by_node.values() for p in ps})
        if invalid:
            reasons.append("invalid resource pools were encountered: " + ", ".join(invalid))
        more = f" (and {len(nodes) - 3} more nodes)" if len(nodes) > 3 else ""
        return "; ".join(reasons or ["no node satisfies the claims' constraints"]) + more

    def _why_not(self, n: str, req: Request) -> str | None:
        """Why ``req`` alone cannot be allocated on node ``n`` now (without the node prefix)."""
        cands = self.candidates(n, req)
        if req.mode == "All":
            pending = (self.incomplete_by_node.get(n) or []) + (self.incomplete_by_node.get(None) or [])
            if pending:
                return (f"request {req.name!r} asks for all devices, but pool {', '.join(pending)} "
                        "is being updated (incomplete)")
            if not cands:
                return f"no device matches request {req.name!r} (class {req.device_class})"
            busy = [d for d in cands if not self._fits(d, req, self.state)[0]]
            if busy:
                return (f"request {req.name!r} asks for all {len(cands)} matching devices, but {busy[0].name} "
                        "is not available" + (f" (nor {len(busy) - 1} more)" if len(busy) > 1 else ""))
            return None
        if not cands:
            return f"no device matches request {req.name!r} (class {req.device_class})"
        free = sum(1 for d in cands if self._fits(d, req, self.state)[0])
        if free >= req.count:
            return None
        return self._why_full(n, req, cands, free).split(": ", 1)[1]

    def _gpu_reason(self, d: Device, req: Request) -> str | None:
        """Why ``d`` cannot be allocated now, in terms of its counter set (its GPU); None if it can."""
        for k, amounts, groups, totals in d.cons:
            totals = totals or {}
            used = self.state.used.get(k, {})
            gpu = re.sub(r"-(counter-set|slots-[ab])$", "", k[2])
            for cname, need in amounts:
                total = totals.get(cname, 0)
                left = total - used.get(cname, 0)
                if left < need and (cut := re.fullmatch(r"slots-(\d+)-(\d+)", cname)):  # mixed-size placements
                    return f"{gpu} has {left} of its slots {cut[1]}-{int(cut[2]) - 1} free; needs {need}"
                if left < need:
                    if cname == "memory":
                        return (f"{gpu} has {_human(left)} of "
                                f"{format_quantity(total, human=True)} framebuffer left; "
                                f"needs {format_quantity(need, human=True)}")
                    return f"{gpu} has {left} of {total} {cname} left; needs {need}"
            in_use = self.state.groups.get(k, [])
            if not groups_compatible(in_use, groups):
                held = sorted({g for gs in in_use for g in gs})
                return (f"{gpu} holds vGPUs of another framebuffer size ({', '.join(held) or 'passthrough'}); "
                        f"request {req.name!r} needs {', '.join(groups) or 'none'}")
        if d.key in self.state.taken and not d.multi:
            return None  # a slot taken; a sibling slot may still be free
        if d.taints and not self._tolerated(d, req):
            t = d.taints[0]
            return f"{d.name} has taint {t.get('key')}={t.get('value', '')}:{t.get('effect')}, not tolerated"
        return None

    def _why_full(self, node: str, req: Request, cands: list[Device], n_free: int = 0) -> str:
        per_gpu: dict[tuple, str] = {}
        for d in cands:
            key = d.cons[0][0] if d.cons else d.key
            if key in per_gpu:
                continue
            why = self._gpu_reason(d, req)
            if why is not None:
                per_gpu[key] = why
        if not per_gpu:
            if n_free:
                return (f"{node}: request {req.name!r} needs {req.count} devices, "
                        f"only {n_free} of the {len(cands)} matching are free")
            return f"{node}: all {len(cands)} devices matching request {req.name!r} are allocated"
        shown = list(per_gpu.values())[:3]
        rest = len(per_gpu) - len(shown)
        return f"{node}: " + ", ".join(shown) + (f" (and {rest} more GPUs full)" if rest > 0 else "")
