"""A GPU that comes or goes changes only its own slices: the others stay visible throughout (issue #36.6).

The scheduler reads a pool from its newest generation and allocates from it only once every slice
of that generation is visible (upstream ``GatherPools``: ``resourceSliceCount`` slices, the count
taken from one of them). A generation bump therefore hides the whole pool until its last slice is
written, and rewriting slices by position (``<node>-<driver>-<k>``) moves every later GPU into
another slice when one in the middle leaves. So where the pool only gains or loses whole devices and
counter sets (a GPU off the bus, or back), it is changed in place instead, at the same generation
and slice count: each member stays in the slice that holds it (a GPU that left leaves its slices
emptied, placeholders a returning GPU fills), and the writes go one at a time in an order where
every state in between is a valid, complete pool holding every member that is in both the old and
the new pool. Where that cannot be done (a slice count to raise, a member that would move) there is
no plan, and the publisher bumps the generation as before. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_bridge.api.names import LABEL_ROLE


@dataclass(frozen=True)
class Held:
    """What one published slice holds, by name: its devices, its counter sets, the sets its devices
    consume, and the pool's generation and slice count as it says them."""

    devices: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    uses: frozenset[str] = frozenset()
    generation: int = 0
    count: int = 0

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Held:
        spec = obj.get("spec") or {}
        devices = spec.get("devices") or []
        pool = spec.get("pool") or {}
        return cls(tuple(d.get("name", "") for d in devices),
                   tuple(c.get("name", "") for c in spec.get("sharedCounters") or []),
                   frozenset(c.get("counterSet", "") for d in devices for c in d.get("consumesCounters") or []),
                   int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 0))


def _members(body: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    spec = body.get("spec") or {}
    return ([d["name"] for d in spec.get("devices") or []], [c["name"] for c in spec.get("sharedCounters") or []])


def _role(devices: list[Any], sets: list[Any]) -> str:
    return "combined" if devices and sets else "counters" if sets else "devices"


def in_place(held: Mapping[str, Held], want: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """The published slices (name -> :class:`Held`) rewritten to hold what ``want`` (the pool built
    afresh, :func:`~dra_bridge.pool.slices.build_slices`) holds, each member where it already is, a
    built slice of new members in a slice left empty, new members beside old ones in the slice of those
    (where it holds nothing else, so it stays within a built slice's limits); name -> body of every
    slice, or None where that cannot be done (the pool as published is not one complete generation,
    or a member would move)."""
    if not held or not want or {h.generation for h in held.values()} != {next(iter(held.values())).generation} \
            or {h.count for h in held.values()} != {len(held)}:
        return None
    devices = {d["name"]: d for s in want for d in s["spec"].get("devices") or []}
    sets = {c["name"]: c for s in want for c in s["spec"].get("sharedCounters") or []}
    placed: set[str] = set()
    content: dict[str, tuple[list[str], list[str]]] = {}
    for name, h in sorted(held.items()):
        content[name] = ([n for n in h.devices if n in devices], [n for n in h.sets if n in sets])
        placed.update(content[name][0], content[name][1])
    empty = [n for n in sorted(held) if content[n] == ([], [])]
    for s in want:
        ds, cs = _members(s)
        new = set(ds) | set(cs)
        if not new - placed:
            continue
        if new & placed:  # joins members already published: in their slice, if it holds no others
            holders = [n for n, (hd, hc) in content.items() if new & placed & {*hd, *hc}]
            if len(holders) != 1 or not {*content[holders[0]][0], *content[holders[0]][1]} <= new:
                return None  # would move a member, or pass a slice's limits
            content[holders[0]] = (ds, cs)
        elif empty:
            content[empty.pop(0)] = (ds, cs)
        else:  # needs another slice: the count would change
            return None
        placed |= new
    template = want[0]
    generation = next(iter(held.values())).generation
    out = {}
    for name, (ds, cs) in content.items():
        spec = {k: v for k, v in template["spec"].items() if k not in ("devices", "sharedCounters")}
        spec["pool"] = {**spec["pool"], "generation": generation, "resourceSliceCount": len(held)}
        if cs:
            spec["sharedCounters"] = [sets[n] for n in cs]
        if ds:
            spec["devices"] = [devices[n] for n in ds]
        labels = {**(template["metadata"].get("labels") or {}), LABEL_ROLE: _role(ds, cs)}
        out[name] = {"apiVersion": template["apiVersion"], "kind": template["kind"],
                     "metadata": {"name": name, "labels": labels}, "spec": spec}
    return out


def _valid(state: Mapping[str, Held], keep: set[str]) -> bool:
    """A pool the scheduler takes whole (unique device and counter-set names, every consumed set
    published) that holds every member of ``keep``."""
    devices = [n for h in state.values() for n in h.devices]
    sets = [n for h in state.values() for n in h.sets]
    if len(set(devices)) != len(devices) or len(set(sets)) != len(sets):
        return False
    if not set().union(*(h.uses for h in state.values())) <= set(sets):
        return False
    return keep <= set(devices) | set(sets)


def write_order(held: Mapping[str, Held], bodies: Mapping[str, dict[str, Any]],
                changed: Iterable[str]) -> list[str] | None:
    """The ``changed`` slices in an order in which every state after a write is valid and keeps each
    member of both the old and the new pool; None where no such order is found. Writes that only take
    members away go first, then those that add counter sets, then the rest."""
    state = dict(held)
    new = {n: Held.of(b) for n, b in bodies.items()}
    keep = {m for h in held.values() for m in (*h.devices, *h.sets)} & \
        {m for h in new.values() for m in (*h.devices, *h.sets)}

    def rank(n: str) -> tuple[int, str]:
        old, to = held[n], new[n]
        removes_only = set(to.devices) <= set(old.devices) and set(to.sets) <= set(old.sets)
        return (0 if removes_only else 1 if set(to.sets) - set(old.sets) else 2, n)

    pending = sorted(changed, key=rank)
    order: list[str] = []
    while pending:
        for n in pending:
            trial = {**state, n: new[n]}
            if _valid(trial, keep):
                state, order = trial, [*order, n]
                pending.remove(n)
                break
        else:
            return None
    return order


__all__ = ["Held", "in_place", "write_order"]
