"""Check 4's mixed-size part: vGPUs of three different sizes on one GPU in NVIDIA's mixed-size mode.

Such a GPU publishes one device per (size, placement ID), ``placementStart`` and ``placementSize``
attributes saying which 1 GiB slots each holds, on counters that admit exactly the devices whose
slots are disjoint (schema.md). When the node publishes one, three workloads of three different
sizes are started on it, unpinned (the scheduler picks the placements): all must run, each at its
own placement, on the GPU the slices name (and on the simulated cluster, at that placement on the
host), in distinct IOMMU groups. A node without such a GPU gets a note, not a failure.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from dra_bridge.api.attributes import ATTR_GPU_INDEX, ATTR_PROFILE, ATTR_TYPE
from dra_bridge.conformance.backend import KubeBackend, Run, placed_slots, random_suffix
from dra_bridge.conformance.report import CheckResult
from dra_bridge.scheduling.objects import dev_attr, dev_gpu

SIZES = 3


class Checks(Protocol):
    """What this part uses of :class:`dra_bridge.conformance.checks.Conformance` (which calls it)."""

    b: KubeBackend
    ran: list[Run]

    @property
    def chosen(self) -> Any: ...

    def _gpu_sel(self, index: int | None, gpu: str | None, kind: str) -> str: ...

    def _profile_sel(self, profile: str) -> str: ...

    def _same_gpu(self, r: Run, gpu: str | None) -> list[str]: ...

    def _groups(self, r: Run) -> set[int]: ...


def _first_fit(devices: list[dict], sizes: tuple[int, ...], driver: str, held: list[tuple[int, int]]) -> bool:
    """Whether the scheduler, taking for each size in turn the first device (in slice order) whose
    slots are free, places all of ``sizes`` beside the ``held`` slots."""
    taken = list(held)
    for size in sizes:
        spot = next((s for d in devices if (s := placed_slots(d, driver)) and s[1] == size
                     and all(s[0] + s[1] <= a or a + n <= s[0] for a, n in taken)), None)
        if spot is None:
            return False
        taken.append(spot)
    return True


def mixed_sizes(c: Checks, res: CheckResult, problems: list[str], notes: list[str]) -> None:
    """Three workloads of three sizes on the node's first mixed-size GPU (see the module docstring)."""
    t, b, d = c.chosen, c.b, c.b.driver
    by_gpu: dict[str | None, list[dict]] = {}
    for dev in b.slice_devices().values():
        if dev.get("_node") == t.node and dev_attr(dev, ATTR_TYPE, d) == "vgpu" and placed_slots(dev, d):
            by_gpu.setdefault(dev_gpu(dev), []).append(dev)
    if not by_gpu:
        notes.append(f"no GPU in mixed-size mode on node {t.node}: vGPUs of different sizes on one GPU not exercised")
        return
    gpu = min(by_gpu, key=lambda g: (dev_attr(by_gpu[g][0], ATTR_GPU_INDEX, d) is None,
                                     dev_attr(by_gpu[g][0], ATTR_GPU_INDEX, d) or 0, g or ""))
    devices = by_gpu[gpu]
    index = dev_attr(devices[0], ATTR_GPU_INDEX, d)
    cap = b.capacity().gpu(t.node, gpu)
    busy = {h["device"] for h in cap.holders} if cap else set()
    held = [s for dev in devices if dev["name"] in busy and (s := placed_slots(dev, d))]
    sizes = sorted({s[1] for dev in devices if (s := placed_slots(dev, d))})
    # the three smallest sizes the scheduler's first fit places together, largest first
    choice = next((trio for trio in itertools.combinations(sorted(sizes), SIZES)
                   if _first_fit(devices, trio[::-1], d, held)), None)
    if choice is None:
        problems.append(f"GPU {gpu} in mixed-size mode publishes sizes {sizes}: no {SIZES} of them fit at once "
                        f"beside what is allocated there ({sorted(busy) or 'nothing'})")
        return
    runs: list[Run] = []
    for size in choice[::-1]:
        dev = next(x for x in devices if (s := placed_slots(x, d)) and s[1] == size)
        profile = str(dev_attr(dev, ATTR_PROFILE, d))
        sels = [c._gpu_sel(index, gpu, "vgpu"), c._profile_sel(profile),
                f'device.attributes["{d}"].placementSize == {int(size)}']
        tmpl = b.template(f"size-{size}-{random_suffix()}", b.vgpu_class, sels, vgpu_type=profile)
        r = b.start(f"size-{size}-{random_suffix()}", tmpl, t.node)
        res.evidence.append(r.line())
        runs.append(r)
        if r.phase != "Running":
            problems.append(f"{profile} ({size} slots) on the mixed-size GPU {gpu} did not run beside "
                            f"{len(runs) - 1} vGPU(s) of other sizes: {r.phase} ({r.reason})")
        else:
            c.ran.append(r)
            problems.extend(c._same_gpu(r, gpu))
    spots = [(r.name, x["device"], x["slots"]) for r in runs if r.phase == "Running" for x in r.devices]
    for (n1, d1, s1), (n2, d2, s2) in itertools.combinations(spots, 2):
        if not s1 or not s2 or not (s1[0] + s1[1] <= s2[0] or s2[0] + s2[1] <= s1[0]):
            problems.append(f"{n1} ({d1}, slots {s1}) and {n2} ({d2}, slots {s2}) are not at placements of their own")
    groups = [c._groups(r) for r in runs if r.phase == "Running"]
    if any(not g for g in groups) or len(set().union(*groups)) != sum(len(g) for g in groups):
        problems.append(f"IOMMU groups not distinct on the mixed-size GPU {gpu}: {[sorted(g) for g in groups]}")
    for r in runs:
        b.stop(r)
    if len(spots) == SIZES:
        notes.append(f"mixed-size: {SIZES} sizes on GPU {gpu} at once, each at its own placement: "
                     + ", ".join(f"{dev} (slots {s[0]}-{s[0] + s[1] - 1})" for _, dev, s in spots if s))
