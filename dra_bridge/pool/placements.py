"""Mixed-size ("heterogeneous") vGPU placements as DRA shared counters, exactly.

A GPU in mixed-size mode is published as one device per (placement size, placement ID); the device
of size ``s`` at ID ``p`` holds the slots ``[p, p + s)`` (1 GiB each; sizes are NVML's
``placementSize``, in slots, which is the GiB but for RTX PRO 6000's 2 GB profile; see
``shared/reference/heterogeneous-vgpu.md``). NVIDIA's driver creates any set of them whose slot
ranges are pairwise disjoint, and nothing else. The GPU's shared counters must therefore admit
exactly those sets, plus the whole GPU alone, within the API's limits.

**Encoding.** The GPU's slots ``[0, slots)`` are cut into consecutive parts; each part ``[a, b)`` is
a counter ``slots-<a>-<b>`` of value ``b - a``, and a device consumes, from each part it reaches,
the number of its slots inside that part. The whole GPU is the range ``[0, slots)``: it consumes
every counter in full. The counters add up to the GPU's slots and a device's consumptions to its
size, so they read as memory. One counter per gap between neighbouring placement boundaries (the
finest cut) is exact but too many for the 80/94 GB boards; :func:`encode` finds the fewest parts
of any exact cut at placement boundaries (a dynamic programme over the cut points, milliseconds
per table; where placements nest, parts span several gaps), then fills one counter set
``gpu-<i>-slots-a``, or two (``-a``, ``-b``) when a set's 32 counters are not enough.

**Why it is exact** (checked mechanically per board in ``tests/dra_bridge/test_placement_counters.py``):

1. *Every disjoint family is admitted*: in each part, the slots that pairwise disjoint ranges
   hold inside it are disjoint, so their sum is at most the part's length. (The tests check the
   published numbers instead: each counter's value is at least the largest sum any disjoint
   family reaches on it, a weighted interval scheduling computed exactly.)
2. *Every overlapping family is refused*: the scheduler adds non-negative consumptions, so a
   family is refused as soon as one pair in it is. :func:`encode` keeps only cuts in which every
   overlapping pair (the whole GPU included) has a part ``R`` where the two consume more than
   ``len(R)`` together: ``|x ∩ R| + |y ∩ R| > |R|``.

So the admitted sets are exactly the families of pairwise disjoint ranges, and the whole GPU
excludes every device (it fills every part a device reaches). The tests also count, exhaustively
(memoised over the devices in placement order), the sets the counters admit, the sets that are
admitted and disjoint, and the disjoint families: the three numbers are equal on every board.

**Counters per board** (C series tables of the facts file; devices: placements + the whole GPU):

==========================  =========  =============  ====================================
board                       devices    one per gap    this encoding
==========================  =========  =============  ====================================
L4                          12 + 1     8              1 set of 4 counters
L40S / L40                  29 + 1     16             1 set of 8
A100 40 GB                  27 + 1     20             1 set of 8
H100 / A100 80 GB           58 + 1     40             1 set of 16 (gaps: 2 sets needed)
H100 NVL 94 GB              43 + 1     42             1 set of 16 (gaps: 2 sets needed)
RTX PRO 6000 (8C..48C)      35 + 1     16             1 set of 8
RTX PRO 6000 (3Q..96, all)  108 + 1    48             1 set of 24
==========================  =========  =============  ====================================

Every board fits one set and one devices slice (at most 64 devices consuming counters, 1.35+),
and a 1.34 combined slice (at most 32 counters and 128 devices). Tables needing 33 to 64 parts
get two sets (1.35+ only); more raise :class:`PlacementError`. The device layout into slices is
``slices.build_slices``' (per GPU, 64 devices a slice on 1.35+; sets may live in another slice).

Limits (``k8s.io/api`` ``resource/v1/types.go``, tags v0.34.0, v0.35.0, v0.36.0 and master of
2026-07, the 1.37 cycle):

* 1.34: ``ResourceSliceMaxSharedCounters = 32`` (summed over a slice's sets, and a device's sets
  must share its slice), ``ResourceSliceMaxCountersPerDevice = 32``,
  ``ResourceSliceMaxDeviceCountersPerSlice = 1024``, ``ResourceSliceMaxDevices = 128``;
* 1.35+: ``ResourceSliceMaxCounterSets = 8``, ``ResourceSliceMaxCountersPerCounterSet = 32``,
  ``ResourceSliceMaxDeviceCounterConsumptionsPerDevice = 2``,
  ``ResourceSliceMaxCountersPerDeviceCounterConsumption = 32``, 64 devices when any consumes
  counters (``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`` in 1.35,
  ``ResourceSliceMaxDevicesWithAdvancedFeatures`` from 1.36).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_bridge.api.compat import (
    MAX_COUNTER_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTERS_PER_COUNTER_SET,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS,
    SPLIT_LAYOUT_SINCE,
)
from dra_bridge.pool.model import Consumption, CounterSet

#: The limits, from :mod:`dra_bridge.api.compat` (the one place they are defined): counters per set
#: (on 1.34 the same 32 summed over a slice's sets), counter sets one device consumes (1.35+), devices
#: per slice when any consumes counters (64 from 1.35), and the version from which a device may
#: consume sets published in another slice (so two sets need not share one).
MAX_COUNTERS_PER_SET = MAX_COUNTERS_PER_COUNTER_SET
MAX_SETS_PER_DEVICE = MAX_COUNTER_CONSUMPTIONS_PER_DEVICE
MAX_DEVICES_WITH_COUNTERS = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
SPLIT_SINCE = SPLIT_LAYOUT_SINCE

#: Placement size (slots) -> placement IDs, as NVML lists a type's supported placements.
Table = Mapping[int, Sequence[int]]
Part = tuple[int, int]


class PlacementError(ValueError):
    """A placement table that the counters cannot express within the API's limits."""


def slots_counter(start: int, end: int) -> str:
    """The counter of the slots ``[start, end)``: ``slots-8-12``."""
    return f"slots-{start}-{end}"


def slots_counter_set(gpu_index: int, k: int) -> str:
    """The ``k``-th slots counter set of a GPU: ``gpu-0-slots-a``, ``gpu-0-slots-b``."""
    return f"gpu-{gpu_index}-slots-{'ab'[k]}"


def _overlap(x: Part, r: Part) -> int:
    return max(0, min(x[1], r[1]) - max(x[0], r[0]))


@dataclass(frozen=True)
class PlacementCounters:
    """The counters of one board's placement table: ``parts`` cut ``[0, slots)``; ``parts[:split]``
    form set ``-a``, the rest set ``-b`` (``split == len(parts)``: one set)."""

    slots: int
    parts: tuple[Part, ...]
    split: int

    @property
    def sets(self) -> tuple[tuple[Part, ...], ...]:
        a, b = self.parts[: self.split], self.parts[self.split :]
        return (a, b) if b else (a,)

    def counter_sets(self, gpu_index: int) -> list[CounterSet]:
        """The GPU's shared counter sets (values in slots)."""
        return [CounterSet(name=slots_counter_set(gpu_index, k), counters={slots_counter(a, b): b - a for a, b in parts})
                for k, parts in enumerate(self.sets)]

    def consumes(self, gpu_index: int, start: int, size: int) -> list[Consumption]:
        """What the device of ``size`` slots at placement ``start`` consumes: from each part it
        reaches, its slots in that part (one or two counter sets)."""
        if size < 1 or start < 0 or start + size > self.slots:
            raise PlacementError(f"placement [{start}, {start + size}) is outside the GPU's {self.slots} slots")
        out: list[Consumption] = []
        for k, parts in enumerate(self.sets):
            used = {slots_counter(*r): str(n) for r in parts if (n := _overlap((start, start + size), r))}
            if used:
                out.append(Consumption(counter_set=slots_counter_set(gpu_index, k), counters=used))
        return out

    def whole(self, gpu_index: int) -> list[Consumption]:
        """The whole GPU (passthrough, or the full-size vGPU): every counter in full."""
        return self.consumes(gpu_index, 0, self.slots)


def placement_ranges(slots: int, table: Table) -> list[Part]:
    """The table's slot ranges ``[p, p + size)``, checked, sorted and without repeats."""
    if not isinstance(slots, int) or slots < 1:
        raise PlacementError(f"slots: {slots!r} is not a positive number of slots")
    out: set[Part] = set()
    for size, ids in table.items():
        if not isinstance(size, int) or size < 1:
            raise PlacementError(f"placement size {size!r} is not a positive number of slots")
        for p in ids:
            if not isinstance(p, int) or p < 0 or p + size > slots:
                raise PlacementError(f"size {size} at placement {p!r} does not fit the GPU's {slots} slots")
            out.add((p, p + size))
    return sorted(out)


def encode(slots: int, table: Table, *, server_version: tuple[int, int] = SPLIT_SINCE) -> PlacementCounters:
    """The fewest counters that keep the table's placements apart exactly (module docstring).

    ``server_version`` (1.34) allows one set of 32 counters; 1.35+ two sets of 32.
    :class:`PlacementError` when the table needs more, or is not a table of this GPU's slots.
    """
    ranges = [*placement_ranges(slots, table), (0, slots)]  # the whole GPU keeps apart from all
    parts = _fewest_parts(slots, list(dict.fromkeys(ranges)))
    one_set = tuple(server_version[:2]) < SPLIT_SINCE
    most = MAX_COUNTERS_PER_SET * (1 if one_set else MAX_SETS_PER_DEVICE)
    if len(parts) > most:
        raise PlacementError(
            f"the placement table needs {len(parts)} counters to keep its {len(ranges) - 1} placements apart; "
            f"Kubernetes {server_version[0]}.{server_version[1]} allows {most} on one GPU "
            f"({'one set' if one_set else 'two sets'} of {MAX_COUNTERS_PER_SET}, the whole GPU consuming all)")
    return PlacementCounters(slots=slots, parts=parts, split=_split(parts, ranges))


def _split(parts: tuple[Part, ...], ranges: list[Part]) -> int:
    """Where set ``-b`` starts: all in ``-a`` if it fits, else the cut fewest placements straddle
    (then nearest the middle). A range reaches at most both sets: at most 2 consumptions."""
    m = len(parts)
    if m <= MAX_COUNTERS_PER_SET:
        return m

    def cost(k: int) -> tuple[int, int, int]:
        cut = parts[k][0]
        return sum(1 for a, b in ranges if a < cut < b), abs(m - 2 * k), k

    return min(range(m - MAX_COUNTERS_PER_SET, MAX_COUNTERS_PER_SET + 1), key=cost)


def _fewest_parts(slots: int, ranges: list[Part]) -> tuple[Part, ...]:
    """The cut of ``[0, slots)`` at placement boundaries with the fewest parts such that every two
    overlapping ranges ``x``, ``y`` have a part ``R`` with ``|x ∩ R| + |y ∩ R| > |R|``.

    Dynamic programme over cut points, left to right. A pair can only be kept apart by a part that
    meets ``x ∩ y`` (else ``|x ∩ R| + |y ∩ R| <= |R|``); the state is the cut point and the pairs
    whose intersection crosses it and that no part has kept apart yet. A part ending at or after
    a pending pair's intersection without keeping it apart is a dead end. The finest cut (every
    gap its own part) always qualifies, so there is an answer.
    """
    bounds = sorted({0, slots, *(e for r in ranges for e in r)})
    pairs = [(x, y, max(x[0], y[0]), min(x[1], y[1]))
             for i, x in enumerate(ranges) for y in ranges[i + 1:] if x[0] < y[1] and y[0] < x[1]]
    memo: dict[tuple[int, frozenset[int]], tuple[Part, ...] | None] = {}

    def best(c: int, pending: frozenset[int]) -> tuple[Part, ...] | None:
        if c == slots:
            return ()
        key = (c, pending)
        if key in memo:
            return memo[key]
        found: tuple[Part, ...] | None = None
        for x in bounds:
            if x <= c:
                continue
            part, nxt, ok = (c, x), set(), True
            for i, (u, v, lo, hi) in enumerate(pairs):
                if hi <= c or lo >= x or not (i in pending or lo >= c):
                    continue  # kept apart already, or not met by this part
                if _overlap(u, part) + _overlap(v, part) > x - c:
                    continue
                if hi <= x:
                    ok = False
                    break
                nxt.add(i)
            if not ok:
                continue
            rest = best(x, frozenset(nxt))
            if rest is not None and (found is None or 1 + len(rest) < len(found)):
                found = (part, *rest)
        memo[key] = found
        return found

    out = best(0, frozenset())
    assert out is not None, "the finest cut always keeps every pair apart"
    return out
