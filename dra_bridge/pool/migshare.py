"""Shared counters for several vGPUs per MIG GPU instance (MIG time-slicing, GB20x) under DRA.

Not yet published by the pool (docs/blackwell.md): this is the encoding it is to use, proven here.
While claims create the instances, the devices of one instance (up to its type's per-instance
maximum k) must fit together, and any device of an instance overlapping it in a memory slice must
not fit beside any of them. One counter per memory slice cannot say both (k * c <= C and
c + c' > C contradict for k, k' >= 2). A grid can: on each memory slice, one counter of capacity 1
per cell of the product, over the profiles with a placement covering that slice, of each
profile's ``range(k)``; device ``q`` of an instance of profile P takes, on each of its slices,
every cell whose P coordinate is q. Devices of one instance take disjoint rows; devices of two
instances that share a slice always meet in the cell of their two indices. Cost: the product of
the maxima per slice. Pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

Placement = tuple[int, int]  # (first memory slice, slices)


def _covering(placements: Mapping[str, Sequence[Placement]], m: int) -> list[str]:
    return sorted(p for p, pls in placements.items() if any(s <= m < s + z for s, z in pls))


def grid_counters(memory_slices: int, placements: Mapping[str, Sequence[Placement]],
                  share: Mapping[str, int]) -> dict[str, int]:
    """Every counter of the grid (name -> capacity 1). ``placements``: each offered profile's
    instance placements; ``share``: its type's per-instance maximum."""
    out: dict[str, int] = {}
    for m in range(memory_slices):
        for cell in itertools.product(*(range(share[p]) for p in _covering(placements, m))):
            out[cell_name(m, cell)] = 1
    return out


def cell_name(m: int, cell: Sequence[int]) -> str:
    return "share-" + "-".join(map(str, (m, *cell)))


def device_cells(placements: Mapping[str, Sequence[Placement]], share: Mapping[str, int],
                 profile: str, start: int, size: int, q: int) -> list[str]:
    """The counters device ``q`` of the instance of ``profile`` at ``start`` consumes (1 each)."""
    out = []
    for m in range(start, start + size):
        axes = [[q] if p == profile else range(share[p]) for p in _covering(placements, m)]
        out += [cell_name(m, cell) for cell in itertools.product(*axes)]
    return out


def grid_size(memory_slices: int, placements: Mapping[str, Sequence[Placement]], share: Mapping[str, int]) -> int:
    """How many counters the grid takes (what decides whether it fits a counter set of 32)."""
    return len(grid_counters(memory_slices, placements, share))
