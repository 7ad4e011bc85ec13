"""The agent's rounds without the kernel: what the node reads as once it matches a layout.

:func:`preview` runs what :func:`~mdev_manager.reconcile.reconcile` runs (plan, take the steps,
plan again after a structural round) with the node read once: the kernel's steps take effect on
the inventory in memory (:func:`mdev_manager.expect.expected`), the steps that only record state
(definitions, records) run through the agent's executor over a copy-on-write view of the host
(:class:`~mdev_manager.host.overlay.OverlayIO`), so the next round plans on them as the agent's
would. Nothing is written to the host, and nothing is read from a device that does not exist
yet; the same on a real host as on a simulated one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mdev_manager import persist
from mdev_manager.actions import Action, BindDriver, Plan, SavePassthrough
from mdev_manager.config import GpuLayout
from mdev_manager.discovery import discover
from mdev_manager.executor import Executor
from mdev_manager.expect import KERNEL_STEPS, expected
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.host.overlay import OverlayIO
from mdev_manager.models import Inventory, Usage
from mdev_manager.numbering import Numbered
from mdev_manager.plan import make_plan
from mdev_manager.usage import collect_usage


@dataclass
class Preview:
    """The node as the agent leaves it (``inventory``), the plans of its rounds, what the
    expectation assumes, and what went wrong (``failed``: a record step; ``unfinished``: rounds ran out)."""

    inventory: Inventory
    plans: list[Plan] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unfinished: bool = False
    io: HostIO | None = None  # the overlay the records were kept in

    @property
    def steps(self) -> int:
        return sum(len(p.actions) for p in self.plans)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.unfinished


def _records_only(plan: Plan) -> Plan:
    """The steps that write saved state, a bind's passthrough record included (as the executor keeps it)."""
    out: list[Action] = []
    for a in plan.actions:
        if isinstance(a, BindDriver):
            out.append(SavePassthrough(gpu=a.gpu, address=a.address, keep=a.driver == "vfio-pci"))
        elif not isinstance(a, KERNEL_STEPS):
            out.append(a)
    return Plan(actions=out)


def preview(env: HostEnv, io: HostIO, layouts: list[GpuLayout], *, usage_extra: Usage | None = None,
            node: str = "", ids: dict[str, Numbered] | None = None, max_rounds: int = 8,
            inventory: Inventory | None = None) -> Preview:
    """Plan and take the agent's rounds on the node in memory (``inventory``: the node already read)."""
    overlay = OverlayIO(io, kernel_roots=(env.sys_root, env.dev_root))
    inv = inventory if inventory is not None else discover(env, io, node=node, ids=ids)
    usage = collect_usage(env, io, usage_extra, inv=inv)
    out = Preview(inventory=inv, io=overlay)
    for _ in range(max_rounds):
        defs, _problems = persist.load_definitions(env, overlay)
        plan = make_plan(inv, layouts, usage, defs, persist.load_vendor_vfio(env, overlay),
                         passthrough=persist.load_passthrough(env, overlay), mig_records=persist.load_mig(env, overlay),
                         placement_records=persist.load_placements(env, overlay))
        if not plan.actions:
            break
        out.plans.append(plan)
        report = Executor(env, overlay).run(_records_only(plan))
        out.failed += [f"{r.step}: {r.error or r.message}" for r in report.failed]
        exp = expected(inv, plan)
        inv = out.inventory = exp.inventory
        out.assumptions += [n for n in exp.assumptions if n not in out.assumptions]
        if not plan.structural() or out.failed:
            break
    else:
        out.unfinished = True
    return out
