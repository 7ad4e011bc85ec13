"""Discover, plan, execute, until the node matches the layout (or nothing more can change).

Steps that change what a GPU offers (drivers, VFs) come first; after them the node is
discovered again and planned again, so vGPU steps are always planned on real state.

The outcome tells the truth about the end state: ``blocked`` lists the devices in use that
keep the node from the layout (who holds them, what waits for them); the node matches the
layout only when every step succeeded and nothing is blocked (``matches``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pydantic import BaseModel, Field

from mdev_manager import persist
from mdev_manager.actions import CreateMdev, Plan, RemoveDefinition, RemoveMdev, SaveDefinition
from mdev_manager.blocked import blocked_by_use
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.executor import Executor, Report
from mdev_manager.gpurefresh import read_again
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.models import Blocked, Inventory, Usage
from mdev_manager.numbering import Numbered
from mdev_manager.plan import make_plan
from mdev_manager.usage import collect_usage

log = logging.getLogger(__name__)

#: steps that make or remove an mdev (or its definition) and change nothing else of the GPU: its
#: functions, drivers and types stay, so the read-back reads its vGPUs and free instances alone
_VGPU_STEPS = (SaveDefinition, CreateMdev, RemoveMdev, RemoveDefinition)


class Round(BaseModel):
    plan: Plan
    report: Report | None = None


class Outcome(BaseModel):
    rounds: list[Round] = []
    inventory: Inventory | None = None
    warnings: list[str] = []
    blocked: list[Blocked] = []
    # read back after the work: steps a fresh plan of the node still wants (an effect that is missing,
    # or work left by a failure or a stop); empty when the node was read back matching the layout
    unapplied: list[str] = []
    stopped: str | None = None  # the signal that stopped the work between two writes

    @property
    def interrupted(self) -> str | None:
        """The step a stop landed in between two of its writes (the next apply finishes it)."""
        return next((r.report.interrupted for r in self.rounds if r.report and r.report.interrupted), None)
    # who used what when the last round planned: callers reuse it instead of scanning /proc again
    usage: Usage = Field(default_factory=Usage, exclude=True)

    @property
    def changed(self) -> int:
        return sum(r.report.changed for r in self.rounds if r.report)

    @property
    def ok(self) -> bool:
        """Every step succeeded, nothing stopped the work, and the node read back has every effect."""
        return all(not r.report.failed for r in self.rounds if r.report) and not self.unapplied and not self.stopped

    @property
    def left(self) -> int:
        return sum(r.report.left for r in self.rounds if r.report)

    @property
    def matches(self) -> bool:
        """Every step succeeded and no device in use holds the node back."""
        return self.ok and not self.blocked


def plan_once(env: HostEnv, io: HostIO, layouts: list[GpuLayout], usage_extra: Usage | None = None,
              node: str = "", ids: dict[str, Numbered] | None = None, scan: bool = True,
              ) -> tuple[Inventory, Plan, list[str]]:
    """The node read and planned once. ``scan=False``: no look for users in ``/proc`` and libvirt (only
    ``usage_extra``), for a plan that is a preview and never run (``apply``'s look before the node lock,
    which rejects bad input and sizes the progress bar: the plan run is made under the lock, on users
    scanned there)."""
    inv, plan, warnings, _blocked, _usage = _plan_once(env, io, layouts, usage_extra, node, ids,
                                                       usage=None if scan else Usage().merged(usage_extra))
    return inv, plan, warnings


def gone_blocked(plan: Plan) -> list[Blocked]:
    """An entry waiting for a GPU that left the bus keeps the node from its layout, as a device in use does."""
    return [Blocked(device=s.device, gpu=s.device, held_by=[], blocks=s.reason, gone=True) for s in plan.waiting]


def _plan_once(env: HostEnv, io: HostIO, layouts: list[GpuLayout], usage_extra: Usage | None,
               node: str, ids: dict[str, Numbered] | None = None, inv: Inventory | None = None,
               usage: Usage | None = None) -> tuple[Inventory, Plan, list[str], list[Blocked], Usage]:
    inv = inv if inv is not None else discover(env, io, node=node, ids=ids)
    usage = usage if usage is not None else collect_usage(env, io, usage_extra, inv=inv)
    defs, problems = persist.load_definitions(env, io)
    records = persist.load_vendor_vfio(env, io)
    plan = make_plan(inv, layouts, usage, defs, records, passthrough=persist.load_passthrough(env, io),
                     mig_records=persist.load_mig(env, io), placement_records=persist.load_placements(env, io))
    return inv, plan, usage.warnings + problems, blocked_by_use(inv, layouts, plan, usage) + gone_blocked(plan), usage


def reconcile(env: HostEnv, io: HostIO, layouts: list[GpuLayout], *, dry_run: bool = False,
              usage_extra: Usage | None = None, node: str = "", max_rounds: int = 8,
              on_step: Callable[[object], None] | None = None, final_inventory: bool = True,
              stop: Callable[[], str | None] | None = None, read_back: bool = False,
              ids: dict[str, Numbered] | None = None, inventory: Inventory | None = None) -> Outcome:
    """Run rounds until nothing structural is left (``max_rounds``: a passed-through GPU going to MIG-backed
    vGPUs takes five: driver, VFs, MIG mode, GPU instances, vGPUs); ``final_inventory`` discovers the result
    once more.

    ``read_back`` plans the node once more after the work: what that plan still wants to do is an
    effect the node does not show (``unapplied``), so a write the kernel took without effect is a
    failure, not a "matches". It reads again the GPUs the last round's steps named (the others were
    read after the last write to them; where only vGPUs were made or removed, their vGPUs and free
    instances), and judges with the users the last round was planned on; a
    plan that still wants a step or keeps a device for its users is made again on users scanned now
    (users only ever hold steps back: a plan with neither is the same whoever holds what).
    ``stop()`` (a pending signal) ends the work before the next write, or before the next round is
    planned; a stopped outcome has no inventory (the node was not read back).
    ``ids``: the node's GPU numbering where the caller read it (else discovery reads it); an entry
    naming a numbered GPU that left the bus waits (``blocked``). ``inventory``: the node as the caller
    discovered it under the same lock a moment ago, planned on in the first round instead of a
    second discovery (the later rounds discover again)."""
    out = Outcome()
    plan = Plan()
    for _ in range(max_rounds):
        why = stop() if stop and out.rounds else None
        if why:  # asked to stop while the last round ran: the next one is not even planned
            out.stopped = why
            break
        inv, plan, warnings, out.blocked, out.usage = _plan_once(env, io, layouts, usage_extra, node, ids,
                                                                 inventory if not out.rounds else None)
        out.inventory = inv
        out.warnings = sorted(set(out.warnings + warnings))
        if dry_run:
            if plan.structural():
                plan.notes.append("these are round 1's steps: after the driver and VF steps, vgpuctl discovers the "
                                  "GPUs again and plans their vGPUs in round 2 (apply counts the steps of each round)")
            out.rounds.append(Round(plan=plan))
            return out
        if not plan.actions:
            if not out.rounds or plan.skipped:
                out.rounds.append(Round(plan=plan, report=Report()))
            break
        report = Executor(env, io, on_step, stop).run(plan)
        out.rounds.append(Round(plan=plan, report=report))
        if report.stopped:
            out.stopped = report.stopped
            break
        if not plan.structural() or report.failed:
            break
    else:  # rounds ran out with structural work done: what is left is read back, never taken as done
        read_back = True
    executed = any(r.report.results for r in out.rounds if r.report)
    if not out.stopped and stop and not dry_run:
        out.stopped = stop()  # the signal came with the last write: the read-back is skipped too
    if out.stopped:  # stopping is what was asked: no read-back, no inventory it would take a while to make
        out.inventory = None
    elif read_back and not dry_run and executed and out.inventory is not None:
        written = {a.gpu for a in plan.actions}
        structural = {a.gpu for a in plan.actions if not isinstance(a, _VGPU_STEPS)}
        inv = read_again(env, io, out.inventory, written, light=written - structural)
        _, again, _w, blocked, usage = _plan_once(env, io, layouts, usage_extra, node, ids, inv, out.usage)
        if again.actions or again.skipped:
            _, again, _w, blocked, usage = _plan_once(env, io, layouts, usage_extra, node, ids, inv)
        out.inventory, out.blocked, out.usage = inv, blocked, usage
        out.unapplied = [a.describe() for a in again.actions]
    elif final_inventory:
        out.inventory = discover(env, io, node=node, ids=ids)
    return out
