"""Packing mixed-size claims (issue #24, point 6): GPUs used and claims refused, mixed-size mode
against today's equal-size mode, beside a perfect bin-packing bound.

One seeded random stream of C-series claims per board (L40S, H100 80 GB; sizes drawn from
:data:`MIX`) is fed, claim by claim, to:

* **mixed** (vgpuctl column): the GPU runs in mixed-size mode; **first fit**, as the scheduler
  walks the published devices in order and NVIDIA's driver creates a type at its lowest creatable
  placement: the first GPU where the size has a placement ID whose slots are all free, at the
  lowest such ID;
* **equal** (peer column): equal-size mode, what vgpuctl publishes today: a GPU takes the size of
  its first vGPU, then only that size, up to the equal-size maximum (``slots // size``: NVIDIA's
  count for every C type drawn here), first fit over the GPUs; an emptied GPU takes any size again;
* **bound**: perfect bin packing: ``ceil(GiB / slots)`` GPUs, a lower bound on GPUs used; for
  refusals a fluid fleet (perfectly divisible memory) that refuses a claim, in arrival order, only
  when the fleet's free GiB are fewer than its size. That is what capacity alone refuses, not a
  lower bound on the count: a policy that refuses a large claim may then take several small ones
  (equal-size mode does), so the GiB refused are printed too.

Three runs per board: every claim placed on as many GPUs as needed (GPUs used); a fixed fleet
offered 125% of its GiB (claims refused); a fixed fleet with departures (each claim leaves after
a random lifetime, offered load 100%; claims refused).

The placement tables are parameters (:func:`simulate`); :func:`placement_table` reads them from
the catalog (``mdev_manager.catalog_placements``), the tables the node manager places by and the DRA
bridge publishes.
"""

from __future__ import annotations

import heapq
import math
import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_bridge.api.names import VGPU_CLASS
from dra_bridge.pool.devices import build_pool
from dra_bridge.scheduling.allocator import Allocator, Unsatisfiable
from dra_bridge.scheduling.selectors import default_selectors
from mdev_manager import catalog_placements
from tests.support.upstream_allocator import UpstreamScheduler

from .common import HEADER, row, scheduler_allocator

DRIVER = "vgpu.kubevirt.io"

Table = Mapping[int, Sequence[int]]

#: Claim sizes (GiB) and their weights: small vGPUs most common, a few large ones.
MIX = {"L40S": {4: 30, 6: 10, 8: 25, 12: 15, 16: 10, 24: 7, 48: 3},
       "H100-80GB": {4: 20, 5: 10, 8: 25, 10: 15, 16: 12, 20: 10, 40: 8}}
SEED = 24
POLICIES = ("mixed", "equal", "bound")


def placement_table(board: str) -> tuple[int, Table, str]:
    """(slots, table, where from): the catalog's mixed-size placements of ``board``
    (:mod:`mdev_manager.catalog_placements`, the driver's halving rule, checked against NVIDIA's tables)."""
    slots, table = catalog_placements.slots(board), catalog_placements.placements(board)
    if not slots or not table:
        raise KeyError(f"{board}: no mixed-size placement table in the catalog ({', '.join(catalog_placements.KNOWN)})")
    return slots, table, "catalog"


@dataclass
class Outcome:
    gpus_used: int = 0
    refused: int = 0
    refused_gib: int = 0


class _Mixed:
    """GPUs in mixed-size mode: a bitmask of used slots each; first fit at the lowest free ID."""

    def __init__(self, slots: int, table: Table):
        self.table = {s: sorted(ids) for s, ids in table.items()}
        self.used: list[int] = []

    def place(self, size: int, fleet: int | None) -> tuple[int, int] | None:
        for g in range(len(self.used) + (1 if fleet is None or len(self.used) < fleet else 0)):
            if g == len(self.used):
                self.used.append(0)
            for p in self.table.get(size, ()):
                mask = ((1 << size) - 1) << p
                if not self.used[g] & mask:
                    self.used[g] |= mask
                    return g, mask
        return None

    def free(self, where: tuple[int, int]) -> None:
        g, mask = where
        self.used[g] &= ~mask


class _Equal:
    """GPUs in equal-size mode: (size, count) each; a size up to ``slots // size`` per GPU."""

    def __init__(self, slots: int, table: Table):
        self.slots = slots
        self.gpus: list[list[int]] = []  # [size or 0, count]

    def place(self, size: int, fleet: int | None) -> tuple[int, int] | None:
        for g in range(len(self.gpus) + (1 if fleet is None or len(self.gpus) < fleet else 0)):
            if g == len(self.gpus):
                self.gpus.append([0, 0])
            s, n = self.gpus[g]
            if (s in (0, size)) and n < self.slots // size:
                self.gpus[g] = [size, n + 1]
                return g, size
        return None

    def free(self, where: tuple[int, int]) -> None:
        g, _ = where
        self.gpus[g][1] -= 1
        if not self.gpus[g][1]:
            self.gpus[g][0] = 0


def simulate(policy: str | _Scheduler, slots: int, table: Table, claims: Sequence[tuple[int, float, float]],
             fleet: int | None) -> Outcome:
    """Feed ``claims`` (size, arrival, departure) in arrival order to ``policy`` (``mixed``,
    ``equal``, ``bound`` or a :class:`_Scheduler`, whose fleet is fixed) on ``fleet`` GPUs (None:
    as many as needed)."""
    state: Any = (_Mixed(slots, table) if policy == "mixed" else _Equal(slots, table) if policy == "equal"
                  else None)
    if isinstance(policy, _Scheduler):
        state = policy
    out, in_use, touched = Outcome(), 0, set()
    leaving: list[tuple[float, int, int, tuple[int, int]]] = []  # (departure, k, size, where): a heap
    capacity = math.inf if fleet is None else fleet * slots
    for k, (size, arrive, depart) in enumerate(claims):
        while leaving and leaving[0][0] <= arrive:
            _, _, size_gone, freed = heapq.heappop(leaving)
            in_use -= size_gone
            if state is not None:
                state.free(freed)
        if state is None:
            where = (0, 0) if in_use + size <= capacity else None
        else:
            where = state.place(size, fleet)
        if where is None:
            out.refused += 1
            out.refused_gib += size
            continue
        in_use += size
        touched.add(where[0])
        heapq.heappush(leaving, (depart, k, size, where))
    out.gpus_used = math.ceil(sum(c[0] for c in claims) / slots) if state is None else len(touched)
    return out


class _Scheduler:
    """The fleet as the agent publishes it (``build_slices`` of ``fleet`` GPUs of ``board`` in
    mixed-size mode, Kubernetes 1.36), each claim allocated by the scheduler's allocator
    (Kubernetes' own where built, else the Python model: :func:`common.scheduler_allocator`): a
    request for a vGPU of ``size`` slots (``placementSize``) from the vGPU DeviceClass."""

    def __init__(self, board: str, fleet: int, up: Any) -> None:
        from dra_bridge.pool.policy import policy_from_layout
        from dra_bridge.pool.slices import build_slices
        from kubevirt_templates.render import render
        from mdev_manager.config import parse_config
        from mdev_manager.discovery import discover
        from mdev_manager.reconcile import reconcile
        from mdev_manager.sim.hostspec import GpuGroup, HostSpec
        from mdev_manager.sim.node import sim_node

        layouts = parse_config({"version": "vgpuctl/v1",
                                "layouts": {"default": [{"all": True, "mode": "dra", "mixedSize": True}]}})
        with tempfile.TemporaryDirectory(prefix="vgpack") as d:
            sim = sim_node(Path(d) / "h", HostSpec(name=board, node="n-pack", gpus=[GpuGroup(board=board, count=fleet)]))
            reconcile(sim.env, sim.io, layouts, node="n-pack")
            inv = discover(sim.env, sim.io)
        self.pool = build_pool(inv, policy_from_layout(inv, layouts), DRIVER, server_version=(1, 36))
        self.slices = build_slices(self.pool, driver=DRIVER, node_name="n-pack", pool_name="n-pack", generation=1,
                                   server_version=(1, 36))
        self.classes = [o for o in render("deviceclasses") if o["kind"] == "DeviceClass"]
        self.up, self.k = up, 0
        self.held: list[dict] = []
        self.sched = UpstreamScheduler(up, self.slices, self.classes, []) if up is not None else None

    def place(self, size: int, fleet: int | None) -> tuple[int, int] | None:
        self.k += 1
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"c{self.k}", "namespace": "default", "uid": f"u{self.k}"},
                 "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                     "deviceClassName": VGPU_CLASS, "selectors": [{"cel": {"expression":
                         f'device.attributes["{DRIVER}"].placementSize == {size}'}}]}}]}}}
        if self.sched is not None:
            try:
                _, (allocation,) = self.sched.allocate([claim])
            except Unsatisfiable:
                return None
        else:
            alloc = Allocator(self.slices, self.classes, default_selectors())
            for c in self.held:
                alloc.reserve(c)
            try:
                _, (allocation,) = alloc.allocate([claim])
            except Unsatisfiable:
                return None
            self.held.append(dict(claim, status={"allocation": allocation}))
        dev = self.pool.device(allocation["devices"]["results"][0]["device"])
        assert dev is not None and dev.slots is not None and dev.slots.size == size, dev
        gpus = sorted({d.gpu for d in self.pool.devices})
        return gpus.index(dev.gpu), self.k

    def free(self, where: tuple[int, int]) -> None:
        name = f"c{where[1]}"
        if self.sched is not None:
            self.sched.allocated = [c for c in self.sched.allocated if c["metadata"]["name"] != name]
        self.held = [c for c in self.held if c["metadata"]["name"] != name]


def stream(board: str, n: int, *, lifetime: float | None = None, seed: int = SEED) -> list[tuple[int, float, float]]:
    """``n`` claims (size, arrival, departure): one a time unit, staying ``lifetime`` on average
    (exponential; None: for ever)."""
    rnd = random.Random(f"{seed}-{board}-{n}-{lifetime}")
    sizes, weights = zip(*MIX[board].items(), strict=True)
    out = []
    for t in range(n):
        stay = math.inf if lifetime is None else rnd.expovariate(1 / lifetime)
        out.append((rnd.choices(sizes, weights)[0], float(t), t + stay))
    return out


def run(boards: Sequence[str] = ("L40S", "H100-80GB"), fleet: int = 32, scheduler: bool = True) -> list[str]:
    lines = ["Packing one seeded stream of C-series claims: mixed-size placements (vgpuctl column, first fit) "
             "vs equal-size (peer column); bound: perfect bin packing", HEADER]
    for board in boards:
        slots, table, source = placement_table(board)
        mean = sum(s * w for s, w in MIX[board].items()) / sum(MIX[board].values())
        static = stream(board, 400)
        over = stream(board, round(1.25 * fleet * slots / mean))
        # departures: arrivals one a time unit, so a mean lifetime of fleet * slots / mean offers 100%
        churn = stream(board, 4000, lifetime=fleet * slots / mean)
        got = {p: simulate(p, slots, table, static, None) for p in POLICIES}
        lines.append(row(f"{board}: GPUs used by {len(static)} claims", str(got["mixed"].gpus_used),
                         str(got["equal"].gpus_used), got["mixed"].gpus_used / got["equal"].gpus_used,
                         f"bound {got['bound'].gpus_used} (GiB / {slots}); tables: {source}"))
        for what, claims in (("125%", over), ("churn 100%", churn)):
            got = {p: simulate(p, slots, table, claims, fleet) for p in POLICIES}
            m, e, b = got["mixed"], got["equal"], got["bound"]
            lines.append(row(f"{board} x{fleet} {what}: refused of {len(claims)}", str(m.refused), str(e.refused),
                             m.refused / e.refused if e.refused else None,
                             f"fluid {b.refused}; GiB refused {m.refused_gib} / {e.refused_gib} / {b.refused_gib}"))
    return lines + (scheduled(boards) if scheduler else [])


def scheduled(boards: Sequence[str], fleet: int = 4) -> list[str]:
    """The mixed column's first fit checked by the scheduler's allocator on the slices a fleet of
    ``fleet`` GPUs publishes (smaller: every claim is a request over every device of the fleet)."""
    up, which = scheduler_allocator("1.36")
    lines = [f"The same on {fleet} published GPUs, each claim allocated by the scheduler; {which}"]
    for board in boards:
        slots, table, _ = placement_table(board)
        mean = sum(s * w for s, w in MIX[board].items()) / sum(MIX[board].values())
        over = stream(board, round(1.25 * fleet * slots / mean))
        churn = stream(board, 300, lifetime=fleet * slots / mean)
        for what, claims in (("125%", over), ("churn 100%", churn)):
            got = simulate(_Scheduler(board, fleet, up), slots, table, claims, fleet)
            first = simulate("mixed", slots, table, claims, fleet)
            lines.append(row(f"{board} x{fleet} {what}: refused of {len(claims)}", str(got.refused),
                             str(first.refused), got.refused / first.refused if first.refused else None,
                             f"scheduler vs first fit; GiB refused {got.refused_gib} / {first.refused_gib}"))
    return lines
