"""Mixed-size placements as shared counters (``dra_bridge.pool.placements``): proof, per published
board, that the counters admit exactly the families of pairwise disjoint slot ranges.

The oracle is the placement tables of ``shared/reference/heterogeneous-vgpu.md``, copied below with
their source key, and the rule "a vGPU of size s at placement p holds slots [p, p + s); a set of
vGPUs is creatable iff their ranges are pairwise disjoint; the whole GPU holds every slot". Every
check reads the counters as published (set and counter names, values parsed as quantities), not the
encoder's parts.

The argument (:func:`test_counters_admit_exactly_the_disjoint_families`): the scheduler admits a set
iff, per counter, the summed consumption stays within the value; consumptions are non-negative.
(1) If each counter's value is at least the largest sum any disjoint family reaches on it (a
weighted interval scheduling, computed exactly), every disjoint family is admitted. (2) If every
overlapping pair is refused, every family containing one is refused (sums only grow). Both are
checked on every board; together: admitted = disjoint. :func:`test_exhaustive_counts_agree` then
counts, over all sets of the board's devices, the admitted sets, the admitted-and-disjoint sets and
the disjoint families, memoised in placement order (236,452,130 sets on an H100 80 GB): equal
counts with admitted-and-disjoint in both mean the two collections coincide. Small boards are also
enumerated set by set.
"""

from __future__ import annotations

import random
from functools import cache

import pytest

from dra_bridge.api.quantity import parse_quantity
from dra_bridge.pool import placements as pl
from dra_bridge.pool.devices import Pool, PoolDevice, co_allocatable
from dra_bridge.pool.slicecheck import limits_for
from dra_bridge.pool.slices import build_slices
from tests.support.k8sschema import kubernetes_problems

# --------------------------------------------------------------------------- the oracle

# [FD] frankdenneman vgpu-catalog.json (NVIDIA vGPU 19.0 user guide, "vGPU placements for GPUs in
# mixed-size mode"), C series, as the facts file lists them; [RM] reproduces every entry. Slots per
# GPU [RM]. Values: (slots, {placement size: placement IDs}).
_H100_80 = (80, {4: (0, 6, 10, 16, 20, 26, 30, 36, 40, 46, 50, 56, 60, 66, 70, 76), 5: tuple(range(0, 80, 5)),
                 8: (0, 12, 20, 32, 40, 52, 60, 72), 10: tuple(range(0, 80, 10)), 16: (0, 24, 40, 64),
                 20: tuple(range(0, 80, 20)), 40: (0, 40)})
BOARDS: dict[str, tuple[int, dict[int, tuple[int, ...]]]] = {
    "L40S": (48, {4: (0, 8, 12, 20, 24, 32, 36, 44), 6: tuple(range(0, 48, 6)), 8: (0, 16, 24, 40),
                  12: (0, 12, 24, 36), 16: (0, 32), 24: (0, 24), 48: (0,)}),  # [FD] "L40S / L40"
    "L4": (24, {4: (0, 8, 12, 20), 6: (0, 6, 12, 18), 8: (0, 16), 12: (0, 12)}),  # [FD]
    "H100-80GB": _H100_80,  # [FD]
    "A100-80GB": _H100_80,  # [FD] "H100 80 GB (and A100 80 GB)"
    "A100-40GB": (40, {4: (0, 6, 10, 16, 20, 26, 30, 36), 5: tuple(range(0, 40, 5)), 8: (0, 12, 20, 32),
                       10: (0, 10, 20, 30), 20: (0, 20), 40: (0,)}),  # [FD]
    "H100-NVL": (94, {4: (0, 7, 11, 19, 23, 31, 35, 43, 47, 54, 58, 66, 70, 78, 82, 90),
                      6: (0, 17, 23, 41, 47, 64, 70, 88), 11: (0, 12, 23, 36, 47, 59, 70, 83), 15: (0, 32, 47, 79),
                      23: (0, 24, 47, 71), 47: (0, 47), 94: (0,)}),  # [FD] "H100 NVL / H100 SXM5 94 GB"
    # [FD] lists only 8C..48C ("at multiples of their size"): an incomplete table, checked as given.
    "RTX-PRO-6000-BSE": (96, {s: tuple(range(0, 96, s)) for s in (8, 12, 16, 24, 32, 48)}),
}
#: The families of pairwise disjoint placements of each table, the empty one included (computed apart,
#: by a slot-by-slot recurrence); the tests add the whole GPU alone.
FAMILIES = {"L40S": 22202, "L4": 144, "H100-80GB": 236452129, "A100-80GB": 236452129, "A100-40GB": 14885,
            "H100-NVL": 7896101, "RTX-PRO-6000-BSE": 90922}
#: Counters per board: (one per gap between neighbouring boundaries, this encoding), as the module says.
COUNTERS = {"L40S": (16, 8), "L4": (8, 4), "H100-80GB": (40, 16), "A100-80GB": (40, 16), "A100-40GB": (20, 8),
            "H100-NVL": (42, 16), "RTX-PRO-6000-BSE": (16, 8)}
#: A Blackwell-rule table (ID = floor(slots * j / max), [RM]) with 1..6 GiB sizes, made up for the
#: test: it needs two counter sets.
BLACKWELL_FULL = (96, {s: tuple(96 * j // (96 // s) for j in range(96 // s))
                       for s in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 96)})

Range = tuple[int, int]


def ranges_of(slots: int, table) -> list[Range]:
    """The devices' slot ranges, the whole GPU last."""
    return sorted({(p, p + s) for s, ids in table.items() for p in ids}) + [(0, slots)]


def overlap(x: Range, y: Range) -> bool:
    return x[0] < y[1] and y[0] < x[1]


class Published:
    """The counters as the scheduler reads them: values and each range's consumptions, by (set, counter)."""

    def __init__(self, slots: int, table, enc: pl.PlacementCounters, gpu: int = 0):
        self.ranges = ranges_of(slots, table)
        self.capacity = {(cs.name, c): int(parse_quantity(str(v)))
                         for cs in enc.counter_sets(gpu) for c, v in cs.counters.items()}
        self.consumptions = [enc.whole(gpu) if r == (0, slots) and k == len(self.ranges) - 1
                             else enc.consumes(gpu, r[0], r[1] - r[0]) for k, r in enumerate(self.ranges)]
        self.usage = [{(c.counter_set, n): int(parse_quantity(q)) for c in cons for n, q in c.counters.items()}
                      for cons in self.consumptions]

    def admits(self, members) -> bool:
        total: dict = {}
        for i in members:
            for key, q in self.usage[i].items():
                total[key] = total.get(key, 0) + q
        return all(q <= self.capacity[key] for key, q in total.items())


def encoded(board: str) -> tuple[int, dict, pl.PlacementCounters, Published]:
    slots, table = BOARDS[board]
    enc = pl.encode(slots, table)
    return slots, table, enc, Published(slots, table, enc)


# --------------------------------------------------------------------------- checks


def check_argument(slots: int, pub: Published) -> None:
    """(1) each counter's value >= the most any disjoint family consumes of it; (2) every
    overlapping pair refused, every disjoint pair and single range admitted."""
    rs = pub.ranges
    for key, value in pub.capacity.items():
        best = [0] * (slots + 1)  # best[x]: most of `key` that disjoint ranges within [x, slots) consume
        for x in range(slots - 1, -1, -1):
            best[x] = max([best[x + 1]] + [pub.usage[i].get(key, 0) + best[r[1]] for i, r in enumerate(rs) if r[0] == x])
        assert best[0] <= value, (key, best[0], value)
        assert best[0] == value, f"{key}: value {value} but disjoint families reach only {best[0]}"
    for i, x in enumerate(rs):
        assert pub.admits([i]), x
        for j in range(i + 1, len(rs)):
            assert pub.admits([i, j]) != overlap(x, rs[j]), (x, rs[j])


def count_disjoint(slots: int, rs: list[Range]) -> int:
    f = [0] * (slots + 1)
    f[slots] = 1
    for x in range(slots - 1, -1, -1):
        f[x] = f[x + 1] + sum(f[r[1]] for r in rs if r[0] == x)
    return f[0]


def count_admitted(pub: Published, *, disjoint_too: bool) -> int:
    """Sets of ranges the counters admit (and, with ``disjoint_too``, that are pairwise disjoint),
    by a memoised walk over the ranges in placement order. The state after k ranges: the usage of
    the counters a later range still consumes, and (for disjointness) how far the chosen ranges
    reach past the k-th start. Exhaustive: every set is counted once, by its choices."""
    order = sorted(range(len(pub.ranges)), key=lambda i: pub.ranges[i])
    rs = [pub.ranges[i] for i in order]
    usage = [pub.usage[i] for i in order]
    last = {key: max((k for k, u in enumerate(usage) if key in u), default=-1) for key in pub.capacity}

    @cache
    def walk(k: int, used: tuple, reach: int) -> int:
        if k == len(rs):
            return 1
        live = tuple((key, q) for key, q in used if last[key] > k)
        nreach = reach if reach > (rs[k + 1][0] if k + 1 < len(rs) else 0) else 0
        n = walk(k + 1, live, nreach)  # without range k
        if disjoint_too and rs[k][0] < reach:
            return n
        total = dict(used)
        for key, q in usage[k].items():
            total[key] = total.get(key, 0) + q
        if all(q <= pub.capacity[key] for key, q in total.items()):
            grown = tuple(sorted((key, q) for key, q in total.items() if last[key] > k))
            r = max(reach, rs[k][1]) if disjoint_too else 0
            n += walk(k + 1, grown, r if k + 1 < len(rs) and r > rs[k + 1][0] else 0)
        return n

    return walk(0, (), 0)


def check_counts(slots: int, pub: Published) -> int:
    d = count_disjoint(slots, pub.ranges)
    assert count_admitted(pub, disjoint_too=False) == count_admitted(pub, disjoint_too=True) == d
    return d


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("board", list(BOARDS))
def test_counters_admit_exactly_the_disjoint_families(board):
    slots, _table, _enc, pub = encoded(board)
    check_argument(slots, pub)
    whole = len(pub.ranges) - 1
    assert not any(pub.admits([whole, i]) for i in range(whole))


@pytest.mark.parametrize("board", list(BOARDS))
def test_exhaustive_counts_agree(board):
    slots, _table, _enc, pub = encoded(board)
    assert check_counts(slots, pub) == FAMILIES[board] + 1


@pytest.mark.parametrize("board", ["L4", "A100-40GB", "L40S"])
def test_every_admitted_set_is_a_disjoint_family_and_back(board):
    """Set by set: the sets the counters admit (grown by backtracking, each device once) are the
    families of pairwise disjoint ranges (grown independently)."""
    slots, _table, _enc, pub = encoded(board)
    rs = pub.ranges

    def grow(ok) -> set[frozenset[int]]:
        out: set[frozenset[int]] = set()

        def rec(start: int, chosen: list[int]) -> None:
            out.add(frozenset(chosen))
            for i in range(start, len(rs)):
                if ok(chosen, i):
                    chosen.append(i)
                    rec(i + 1, chosen)
                    chosen.pop()

        rec(0, [])
        return out

    admitted = grow(lambda chosen, i: pub.admits([*chosen, i]))
    disjoint = grow(lambda chosen, i: not any(overlap(rs[i], rs[j]) for j in chosen))
    assert admitted == disjoint
    assert len(admitted) == FAMILIES[board] + 1


@pytest.mark.parametrize("board", list(BOARDS))
def test_counter_usage_and_limits(board):
    """The figures of the module docstring, and the API's limits: counters per set, sets per device,
    devices per slice."""
    slots, table, enc, pub = encoded(board)
    rs = pub.ranges
    gaps = len({b for r in rs for b in r}) - 1
    assert (gaps, len(enc.parts)) == COUNTERS[board]
    assert [len(cs.counters) for cs in enc.counter_sets(0)] == [len(enc.parts)]
    assert [cs.name for cs in enc.counter_sets(3)] == ["gpu-3-slots-a"]
    assert sum(b - a for a, b in enc.parts) == slots  # the parts cut the GPU: the counters read as memory
    for cons, r in zip(pub.consumptions, rs, strict=True):
        assert 1 <= len(cons) <= pl.MAX_SETS_PER_DEVICE
        assert sum(int(q) for c in cons for q in c.counters.values()) == r[1] - r[0]
    assert len(rs) <= pl.MAX_DEVICES_WITH_COUNTERS


def test_the_limits_are_the_api_servers():
    """The module's constants (from k8s.io/api resource/v1/types.go per tag) agree with slicecheck's."""
    for v in ((1, 35), (1, 36), (1, 37)):
        lim = limits_for(v)
        assert (lim.counters_per_set, lim.counter_sets_per_device, lim.devices_per_slice_with_counters) == (
            pl.MAX_COUNTERS_PER_SET, pl.MAX_SETS_PER_DEVICE, pl.MAX_DEVICES_WITH_COUNTERS)
        assert lim.counter_sets_per_slice == 8 and lim.counters_per_consumption == 32
    old = limits_for((1, 34))
    assert (old.counters_summed_per_slice, old.devices_per_slice_with_counters) == (pl.MAX_COUNTERS_PER_SET, 128)


def pool_of(gpus: list[tuple[int, int, dict]], server_version=(1, 35)) -> Pool:
    """A pool of GPUs in mixed-size mode: (index, slots, table) each; one device per placement and the whole GPU."""
    pool = Pool()
    for gi, slots, table in gpus:
        enc = pl.encode(slots, table, server_version=server_version)
        addr = f"0000:{gi + 16:02x}:00.0"
        pool.counter_sets.extend(enc.counter_sets(gi))
        pool.devices.append(PoolDevice(name=f"gpu-{gi}-passthrough", kind="passthrough", gpu=addr,
                                       consumes=enc.whole(gi)))
        for size, ids in sorted(table.items()):
            pool.devices.extend(PoolDevice(name=f"gpu-{gi}-slots-{size}-at-{p}", kind="vgpu", gpu=addr,
                                           type_id=str(size), consumes=enc.consumes(gi, p, size)) for p in ids)
    return pool


@pytest.mark.parametrize("version", [(1, 34), (1, 35), (1, 36), (1, 37)])
def test_an_8_gpu_node_publishes_within_the_limits(version):
    """Four boards, two GPUs each, through ``slices.build_slices`` (which asserts the API server's
    limits on its output; strict schemas on top): one devices slice per GPU from 1.35."""
    boards = ["L40S", "H100-80GB", "H100-NVL", "A100-40GB"]
    gpus = [(k, *BOARDS[boards[k // 2]]) for k in range(8)]
    pool = pool_of(gpus, version)
    slices = build_slices(pool, driver="vgpu.kubevirt.io", node_name="n", pool_name="n", generation=1,
                          server_version=version)
    for s in slices:
        assert not kubernetes_problems(s, (f"{version[0]}.{version[1]}",))
        assert len(s["spec"].get("devices", [])) <= (128 if version < (1, 35) else 64)
    if version >= (1, 35):
        assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 30, 30, 59, 59, 44, 44, 28, 28]


@pytest.mark.parametrize("board", ["L40S", "H100-NVL"])
def test_the_scheduler_model_agrees_pairwise(board):
    """``co_allocatable`` (the scheduler's rule on the pool, quantities parsed) on every pair."""
    slots, table = BOARDS[board]
    pool = pool_of([(0, slots, table)])
    span = {d.name: (0, slots) if d.kind == "passthrough" else (int(d.name.split("-")[-1]),
            int(d.name.split("-")[-1]) + int(d.type_id)) for d in pool.devices}
    names = list(span)
    for i, a in enumerate(names):
        assert co_allocatable(pool, [a])
        for b in names[i + 1:]:
            assert co_allocatable(pool, [a, b]) != overlap(span[a], span[b]), (a, b)


def test_two_sets_when_one_is_not_enough():
    """A table needing 48 parts: two sets of at most 32, no device in more than two, the whole GPU
    in both; still exact; 4 devices slices of at most 64 on 1.35+; refused for 1.34."""
    slots, table = BLACKWELL_FULL
    enc = pl.encode(slots, table)
    sets = enc.counter_sets(0)
    assert [cs.name for cs in sets] == ["gpu-0-slots-a", "gpu-0-slots-b"]
    assert all(len(cs.counters) <= pl.MAX_COUNTERS_PER_SET for cs in sets) and len(enc.parts) == 48
    pub = Published(slots, table, enc)
    assert all(1 <= len(c) <= 2 for c in pub.consumptions) and len(pub.consumptions[-1]) == 2
    check_argument(slots, pub)
    assert check_counts(slots, pub) == count_disjoint(slots, pub.ranges) > 10**30
    slices = build_slices(pool_of([(0, slots, table)]), driver="vgpu.kubevirt.io", node_name="n", pool_name="n",
                          generation=1, server_version=(1, 36))
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 64, 64, 64, 29]
    with pytest.raises(pl.PlacementError, match="needs 48 counters.*1.34 allows 32"):
        pl.encode(slots, table, server_version=(1, 34))


def test_a_table_beyond_the_limits_is_refused():
    """1 GiB at every slot and 2 GiB at every slot: each slot needs its own counter."""
    for n, version, ok in ((64, (1, 35), True), (65, (1, 35), False), (32, (1, 34), True), (33, (1, 34), False)):
        table = {1: tuple(range(n)), 2: tuple(range(n - 1))}
        if ok:
            assert len(pl.encode(n, table, server_version=version).parts) == n
        else:
            with pytest.raises(pl.PlacementError, match=f"needs {n} counters"):
                pl.encode(n, table, server_version=version)


@pytest.mark.parametrize("slots, table, what", [
    (0, {}, "slots"), (48, {0: (0,)}, "size 0"), (48, {8: (44,)}, "size 8 at placement 44"),
    (48, {4: (-4,)}, "placement -4"),
])
def test_a_malformed_table_is_refused(slots, table, what):
    with pytest.raises(pl.PlacementError, match=what):
        pl.encode(slots, table)


def test_edge_tables():
    """No placement: one counter, the whole GPU. One size without overlaps: the whole GPU keeps them apart."""
    assert pl.encode(24, {}).parts == ((0, 24),)
    enc = pl.encode(24, {8: (0, 8, 16)})
    pub = Published(24, {8: (0, 8, 16)}, enc)
    check_argument(24, pub)
    assert check_counts(24, pub) == 9  # 2^3 subsets + the whole GPU alone
    with pytest.raises(pl.PlacementError, match="outside"):
        enc.consumes(0, 20, 8)
    # [FD] lists no H100-80C; the full-size vGPU at 0 is consumed like the whole GPU: same counters
    slots, table = BOARDS["H100-80GB"]
    assert pl.encode(slots, {**table, 80: (0,)}).parts == pl.encode(slots, table).parts


def test_random_tables():
    """Seeded random tables (any sizes, any IDs, up to 40 slots): exact every time."""
    rnd = random.Random(24)
    for _ in range(150):
        slots = rnd.randint(1, 40)
        table = {s: tuple(sorted(rnd.sample(range(slots - s + 1), rnd.randint(0, min(6, slots - s + 1)))))
                 for s in rnd.sample(range(1, slots + 1), rnd.randint(1, min(5, slots)))}
        enc = pl.encode(slots, table)
        pub = Published(slots, table, enc)
        check_argument(slots, pub)
        check_counts(slots, pub)
        gaps = len({b for r in pub.ranges for b in r}) - 1
        assert len(enc.parts) <= gaps


@pytest.mark.parametrize("board", ["L40S", "H100-80GB", "H100-NVL"])
def test_no_coarser_cut_is_exact_and_the_checks_notice(board):
    """Merging any two neighbouring parts admits some overlapping pair (the cut is minimal among
    cuts at boundaries, and the checks catch an encoding that is too coarse); a counter one slot
    short refuses some disjoint family (they catch one that is too tight)."""
    slots, table, enc, pub = encoded(board)
    for k in range(len(enc.parts) - 1):
        (a, _), (_, b) = enc.parts[k], enc.parts[k + 1]
        coarse = pl.PlacementCounters(slots, (*enc.parts[:k], (a, b), *enc.parts[k + 2:]), len(enc.parts) - 1)
        bad = Published(slots, table, coarse)
        with pytest.raises(AssertionError):
            check_argument(slots, bad)
        assert count_admitted(bad, disjoint_too=False) > count_disjoint(slots, bad.ranges)
    for key in list(pub.capacity)[:3]:
        pub.capacity[key] -= 1
        with pytest.raises(AssertionError):
            check_argument(slots, pub)
        assert count_admitted(pub, disjoint_too=True) < count_disjoint(slots, pub.ranges)
        pub.capacity[key] += 1
