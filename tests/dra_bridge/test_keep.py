"""dra_bridge.pool.keep: in-place plans, and the cases that must fall back to a generation bump."""

from __future__ import annotations

from dra_bridge.pool.keep import Held, in_place, write_order


def _slice(name: str, devices=(), sets=(), uses: str | None = None, count: int = 3) -> dict:
    spec: dict = {"driver": "d", "nodeName": "n", "pool": {"name": "n", "generation": 4, "resourceSliceCount": count}}
    if sets:
        spec["sharedCounters"] = [{"name": s, "counters": {"c": {"value": "1"}}} for s in sets]
    if devices:
        spec["devices"] = [{"name": d, **({"consumesCounters": [{"counterSet": uses, "counters": {}}]} if uses else {})}
                           for d in devices]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name, "labels": {}},
            "spec": spec}


PUBLISHED = {"s-0": _slice("s-0", sets=("a", "b")), "s-1": _slice("s-1", ("a-0", "a-1"), uses="a"),
             "s-2": _slice("s-2", ("b-0",), uses="b")}
HELD = {n: Held.of(s) for n, s in PUBLISHED.items()}


def test_a_gpu_leaving_empties_its_slice_after_its_devices_and_before_nothing_else():
    want = [_slice("s-0", sets=("b",), count=2), _slice("s-1", ("b-0",), uses="b", count=2)]  # built by position
    bodies = in_place(HELD, want)
    assert bodies is not None
    assert {n: (Held.of(b).devices, Held.of(b).sets, Held.of(b).count) for n, b in bodies.items()} == {
        "s-0": ((), ("b",), 3), "s-1": ((), (), 3), "s-2": (("b-0",), (), 3)}  # nothing moved, count kept
    assert write_order(HELD, bodies, ["s-0", "s-1"]) == ["s-1", "s-0"]  # the devices go before their set


def test_members_stay_where_they_are_however_the_pool_is_built_now():
    repacked = [_slice("s-0", sets=("a", "b")), _slice("s-1", ("a-0", "b-0")), _slice("s-2", ("a-1",))]
    bodies = in_place(HELD, repacked)
    assert bodies is not None
    assert {n: (Held.of(b).devices, Held.of(b).sets) for n, b in bodies.items()} == {
        n: (h.devices, h.sets) for n, h in HELD.items()}


def test_a_member_that_would_move_or_a_count_that_would_grow_has_no_plan():
    joins_two = [_slice("s-0", sets=("a", "b")), _slice("s-1", ("a-0", "a-1", "b-0", "c-0"))]
    assert in_place(HELD, joins_two) is None  # c-0 beside members of two slices: one of them would move
    more = [*PUBLISHED.values(), _slice("s-3", ("c-0",))]
    assert in_place(HELD, more) is None  # no emptied slice to take the new GPU: the count would change
    mixed = {**HELD, "s-2": Held(("b-0",), (), frozenset({"b"}), 3, 3)}  # two generations published
    assert in_place(mixed, list(PUBLISHED.values())) is None


def test_no_order_keeps_a_member_that_changes_slice():
    new = {"s-1": _slice("s-1", ("a-0",), uses="a"), "s-2": _slice("s-2", ("b-0", "a-1"), uses="b")}
    assert write_order(HELD, new, ["s-1", "s-2"]) is None  # a-1 would vanish or be published twice
