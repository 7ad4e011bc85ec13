"""Shared counters for several vGPUs per MIG GPU instance (MIG time-slicing, GB20x) under DRA.

While claims create the instances, the devices of one instance (up to its type's per-instance
maximum k) must fit together, and any device of an instance overlapping it in a memory slice must
not fit beside any of them. One counter per memory slice cannot say both (k * c <= C and
c + c' > C contradict for k, k' >= 2). A grid can: on each memory slice, one counter of capacity 1
per cell of the product, over the profiles with a placement covering that slice, of each
profile's ``range(k)``; device ``q`` of an instance of profile P takes, on each of its slices,
every cell whose P coordinate is q. Devices of one instance take disjoint rows; devices of two
instances that share a slice always meet in the cell of their two indices. Cost: the product of
the maxima per slice, which is also the least any capacity-1 encoding needs (the devices of two
overlapping instances pair up in k * k' ways, each pair needing a counter of its own): offered only
where it fits one counter set (:func:`share_grid`).

The grid stands for NVIDIA's ``memory-slice-<k>`` counters (its counters are named
``memory-slice-<k>-<cell>``); the engine and ``memory`` counters are left out, since a device
holds a k-th of its instance's engines: :func:`engines_implied` checks, for the offered profiles,
that every set of instances the placements admit is within the GPU's engines and instance counts,
so those counters could never refuse what the grid admits. Pure.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_bridge.api.compat import MAX_COUNTERS_PER_COUNTER_SET
from mdev_manager.catalog_placements import blackwell, placement_size
from mdev_manager.models import Gpu, GpuInstanceProfile, MigPlacement, VgpuType

Placement = tuple[int, int]  # (first memory slice, slices)

#: the fields of a profile the GPU's engine counters count, and its memory
_ENGINES = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines", "memory_mib")


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
    return "memory-slice-" + "-".join(map(str, (m, *cell)))


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


def engines_implied(offered: Sequence[GpuInstanceProfile], full: GpuInstanceProfile) -> bool:
    """Whether every set of non-overlapping placements of ``offered`` is within each profile's
    instance count and, summed, within ``full``'s engines and memory (true for the plain profiles
    of a MIG GPU; false where a ``+me`` profile holds engines others need)."""
    items = [(p, pl) for p in offered for pl in p.placements]

    def fits(chosen: list[GpuInstanceProfile]) -> bool:
        if any(chosen.count(p) > p.instances for p in offered):
            return False
        return all(sum(getattr(p, f) for p in chosen) <= getattr(full, f) for f in _ENGINES)

    def walk(i: int, used: frozenset[int], chosen: list[GpuInstanceProfile]) -> bool:
        if i == len(items):
            return fits(chosen)
        p, pl = items[i]
        if not walk(i + 1, used, chosen):
            return False
        return not used.isdisjoint(pl.slices) or walk(i + 1, used | set(pl.slices), [*chosen, p])

    return walk(0, frozenset(), [])


def inside_placements(gpu: Gpu, t: VgpuType) -> list[MigPlacement]:
    """Where the vGPUs of a MIG time-sliced type sit inside their instance (placement id, slots):
    the Blackwell rule ``floor(region * j / k)`` over the instance's nominal GiB (the size of the
    profile's type that takes it whole), the driver's ``_kvgpumgrSetHeterogeneousResources_GB100``
    with ``maxInstancePerGI``; [] where the GPU's types do not tell the region."""
    k, fb = t.max_per_instance or 1, t.framebuffer_mib
    whole = [u.framebuffer_mib for u in gpu.types if u.mig_backed and u.gpu_instance_profile == t.gpu_instance_profile
             and (u.max_per_instance or 1) == 1 and u.framebuffer_mib]
    if k < 2 or not fb or fb % 1024 or not whole or max(whole) % 1024:
        return []
    region, gib = max(whole) // 1024, fb // 1024
    ids = blackwell(region, {gib: k})[gib]
    size = placement_size(gib, region)
    if any(a + size > b for a, b in zip(ids, (*ids[1:], region), strict=True)):
        return []  # placements that overlap: not the rule's table; not offered
    return [MigPlacement(start=s, size=size) for s in ids]


@dataclass(frozen=True)
class Grid:
    """The counters of a GPU whose instances are shared, and where each type's vGPUs sit inside them."""

    placements: dict[str, list[Placement]]  # profile name -> its instance placements
    share: dict[str, int]  # profile name -> vGPUs per instance
    inside: dict[int, list[MigPlacement]]  # profile id -> placements inside an instance ([] : whole)
    counters: dict[str, int]

    def cells(self, prof: GpuInstanceProfile, at: MigPlacement, q: int) -> dict[str, str]:
        return {c: "1" for c in device_cells(self.placements, self.share, prof.name, at.start, at.size, q)}


def share_grid(gpu: Gpu, offered: Mapping[int, VgpuType], warnings: list[str]) -> Grid | None:
    """The grid for ``offered`` (profile id -> type) where a type shares its instance and the
    grid can be published; None (each instance offered whole) otherwise, with a warning saying why."""
    mig = gpu.mig
    assert mig is not None
    shared = {pid: t for pid, t in offered.items() if (t.max_per_instance or 1) > 1}
    if not shared:
        return None
    names = ", ".join(sorted(t.short_name for t in shared.values()))
    profiles = [p for pid in offered if (p := mig.profile(pid)) is not None]
    inside = {pid: inside_placements(gpu, t) if pid in shared else [] for pid, t in offered.items()}
    placements = {p.name: [(pl.start, pl.size) for pl in p.placements] for p in profiles}
    share = {p.name: len(inside[p.id]) or 1 for p in profiles}
    why = None
    if any(not inside[pid] for pid in shared):
        why = "the types do not tell where their vGPUs sit inside an instance"
    elif not engines_implied(profiles, max(mig.profiles, key=lambda p: (p.slices, p.memory_mib, p.multiprocessors))):
        why = "a profile offered holds engines the others need (+me): its engine counters cannot be shared"
    elif (n := grid_size(mig.memory_slices, placements, share)) > MAX_COUNTERS_PER_COUNTER_SET:
        why = (f"keeping their instances apart takes {n} counters, more than a counter set's "
               f"{MAX_COUNTERS_PER_COUNTER_SET}: offer fewer sharing types (their per-instance maxima multiply)")
    if why:
        warnings.append(f"GPU {gpu.address}: {names} offered one per GPU instance: {why}")
        return None
    return Grid(placements=placements, share=share, inside=inside,
                counters=grid_counters(mig.memory_slices, placements, share))
