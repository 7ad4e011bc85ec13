"""Which shape the published pool takes for an API server, and the pool in that shape.

One decision for the node agent (``serve``: what the server keeps, found by effect) and for
``vgpuctl slices`` / ``capacity`` (what a version's gates keep, from :mod:`dra_bridge.api.compat`),
so what ``slices`` prints is what ``serve`` publishes by construction. The shapes (schema.md):

* counters dropped: per GPU the whole GPU or one type's slots (:func:`.safe.without_counters`);
* counters kept, compatibility groups kept: every size of a GPU at once, kept apart by groups;
* counters kept, groups not (a 1.37 server without the alpha gate is shaped as 1.36): sizes kept
  apart by binding conditions where the server keeps them (``conditions``), by republishing after
  the first allocation where the admin opted in (``first``), else one size per GPU.

Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dra_bridge.api.compat import COMPATIBILITY_GROUPS_SINCE, KeptFields
from dra_bridge.pool.devices import Pool, PoolPolicy, build_pool
from dra_bridge.pool.policy import policy_from_layout
from dra_bridge.pool.safe import without_counters
from mdev_manager.config import GpuLayout
from mdev_manager.models import Inventory


@dataclass(frozen=True)
class Shape:
    """How the pool is built: for which server version, with counters or not, and how the sizes of an
    empty GPU are kept apart where no compatibility groups can (``binding``)."""

    version: tuple[int, int]
    counters: bool = True
    binding: str | None = None  # "conditions" | "first" | None (one size per GPU)

    def describe(self) -> str:
        if not self.counters:
            return "without shared counters: per GPU the whole GPU or one vGPU type"
        if self.version >= COMPATIBILITY_GROUPS_SINCE:
            return "every vGPU size of a GPU, kept apart by compatibility groups"
        return {"conditions": "every vGPU size of an empty GPU, kept apart by binding conditions",
                "first": "every vGPU size of an empty GPU, narrowed to its first allocation's size"}.get(
            self.binding or "", "one vGPU size per GPU")


def choose_shape(version: tuple[int, int], kept: KeptFields, *, sizes_by_first_allocation: bool = False) -> Shape:
    """The shape for a server of ``version`` keeping ``kept`` (None: unknown, taken as kept: the
    writes' answers correct it at the next resync)."""
    if version >= COMPATIBILITY_GROUPS_SINCE and kept.compatibility_groups is False:
        version = (COMPATIBILITY_GROUPS_SINCE[0], COMPATIBILITY_GROUPS_SINCE[1] - 1)
    if kept.counters is False:
        return Shape(version, counters=False)
    if version >= COMPATIBILITY_GROUPS_SINCE:
        return Shape(version)
    if kept.binding_conditions is True:
        return Shape(version, binding="conditions")
    return Shape(version, binding="first" if sizes_by_first_allocation else None)


def shaped_pool(inventory: Inventory, policy: PoolPolicy, driver: str, shape: Shape) -> Pool:
    """The pool this node publishes in ``shape`` (``inventory`` carries the agent's stable GPU numbers)."""
    pool = build_pool(inventory, policy, driver, server_version=shape.version,
                      binding_conditions=shape.binding == "conditions",
                      first_allocation_sizes=shape.binding == "first",
                      pcie_roots={g.address: g.pcie_root for g in inventory.gpus if g.pcie_root})
    return pool if shape.counters else without_counters(pool, inventory)


def node_pool(inventory: Inventory, layouts: list[GpuLayout] | None, driver: str, shape: Shape, *,
              numbered: Inventory | None = None, narrow: Callable[[PoolPolicy], PoolPolicy] | None = None,
              policy: PoolPolicy | None = None) -> Pool:
    """What a node publishes: the layout's DRA policy (GPUs selected as discovery numbers them in
    ``inventory``), narrowed by the sizes already settled where binding keeps them apart (``narrow``),
    built in ``shape`` with the agent's stable GPU numbers (``numbered``). The node agent and
    ``vgpuctl slices`` both call this. ``policy`` replaces the layout's (a node whose GPUs without a
    layout go to the classic device plugin offers none through DRA)."""
    policy = policy if policy is not None else policy_from_layout(inventory, layouts)
    if narrow is not None and shape.binding:
        policy = narrow(policy)
    return shaped_pool(numbered or inventory, policy, driver, shape)
