"""A sick GPU steps aside by itself, and comes back by itself (issue #33). Pure, no I/O.

What the agent's watch saw on a GPU (:class:`Problem`: a critical Xid, ECC page retirement pending a
reset, the GPU lost, a GPU that stops answering; for a GPU on vfio-pci what the kernel shows:
:mod:`dra_bridge.pool.pcihealth`) becomes a device taint under the driver's own domain, named as
NVIDIA's DRA driver names them (``<driver>/xid``, ``/gpu-lost``, ``/unmonitored``; the kernel's own
``/aer``, ``/pci-link``, ``/pci-reset``), effect ``NoSchedule`` (escalating to ``NoExecute`` is the
admin's, through a DeviceTaintRule, or for a lost GPU the agent's opt-in ``serve --gpu-lost-effect
NoExecute``: kube-controller-manager then evicts the pods whose claims hold it). On a server that drops
device taints the GPU's free devices are withdrawn instead, as a cordon does. A device a prepared claim
holds stays published either way: health never removes or rebinds a device in use.

Hysteresis (:class:`HealthTracker`): a GPU turns unhealthy at the first problem seen, and healthy
again only after ``quiet`` seconds without one, so a flapping GPU does not flap the slices. NVIDIA's
driver never lifts its taint (dra-driver-nvidia-gpu#1455); this one does, after the quiet period.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic: the agent's, not kubectl vgpu's (which reads KINDS)
    from dra_bridge.pool.model import Pool

XID, GPU_LOST, UNMONITORED = "xid", "gpu-lost", "unmonitored"
#: every kind a taint names: NVML's, and the kernel's for a passed-through GPU (pcihealth.AER, PCI_LINK, PCI_RESET)
KINDS = (XID, GPU_LOST, UNMONITORED, "aer", "pci-link", "pci-reset")
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
#: the quiet period after the last problem before a GPU counts as healthy again (serve --health-quiet-seconds)
DEFAULT_QUIET_SECONDS = 300.0


@dataclass(frozen=True)
class Problem:
    kind: str  # one of KINDS
    detail: str  # what was seen, for people (Events, kubectl vgpu)
    value: str | None = None  # the taint's value: the Xid number

    def describe(self) -> str:
        return f"{self.kind}{f' {self.value}' if self.value else ''} ({self.detail})"


@dataclass(frozen=True)
class Change:
    """A GPU whose published health changes: unhealthy (with its problems) or healthy again."""

    gpu: str
    healthy: bool
    problems: tuple[Problem, ...] = ()

    def message(self) -> str:
        if self.healthy:
            return f"GPU {self.gpu} is healthy again: its devices take new allocations"
        return (f"GPU {self.gpu} is unhealthy ({'; '.join(p.describe() for p in self.problems)}): its devices are "
                "tainted NoSchedule (free ones withdrawn where the server drops taints); devices in use stay")


@dataclass
class _State:
    since: float  # when it turned unhealthy (the taints' timeAdded)
    last_bad: float
    problems: dict[str, Problem] = field(default_factory=dict)


class HealthTracker:
    """The published health of each GPU, from observations in time order (``now``: seconds, monotonic
    or wall clock, the caller's; ``wall``: the matching wall-clock time for ``timeAdded``)."""

    def __init__(self, quiet: float = DEFAULT_QUIET_SECONDS, lost_effect: str = NO_SCHEDULE):
        self.quiet = quiet
        self.lost_effect = lost_effect  # a lost GPU's taint: NoSchedule, or NoExecute where the admin opted in
        self._sick: dict[str, _State] = {}
        self._added: dict[str, str] = {}  # gpu -> RFC 3339 time the taint was added

    def observe(self, gpu: str, problems: Iterable[Problem], now: float,
                wall: dt.datetime | None = None) -> Change | None:
        found = list(problems)
        state = self._sick.get(gpu)
        if found:
            if state is None:
                state = self._sick[gpu] = _State(since=now, last_bad=now)
                when = wall or dt.datetime.now(dt.UTC)
                self._added[gpu] = when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
                state.problems = {p.kind: p for p in found}
                return Change(gpu, False, tuple(found))
            state.last_bad = now
            new = {p.kind: p for p in found}
            grew = set(new) - set(state.problems)
            state.problems.update(new)
            return Change(gpu, False, tuple(state.problems.values())) if grew else None
        if state is not None and now - state.last_bad >= self.quiet:
            del self._sick[gpu]
            self._added.pop(gpu, None)
            return Change(gpu, True)
        return None

    def forget(self, gpus: Iterable[str]) -> None:
        """GPUs that left the bus: nothing to publish for them."""
        for g in gpus:
            self._sick.pop(g, None)
            self._added.pop(g, None)

    def unhealthy(self) -> dict[str, tuple[Problem, ...]]:
        return {g: tuple(s.problems.values()) for g, s in sorted(self._sick.items())}

    def key(self) -> tuple:
        """What publishing depends on: which GPUs are unhealthy, with which kinds."""
        return tuple((g, tuple(sorted(p))) for g, p in ((g, s.problems) for g, s in sorted(self._sick.items())))

    def taints(self, gpu: str, driver: str) -> list[dict[str, str]]:
        state = self._sick.get(gpu)
        if state is None:
            return []
        return [health_taint(p, driver, self._added.get(gpu), self.lost_effect if p.kind == GPU_LOST else NO_SCHEDULE)
                for p in state.problems.values()]


def health_taint(problem: Problem, driver: str, since: str | None, effect: str = NO_SCHEDULE) -> dict[str, str]:
    out = {"key": f"{driver}/{problem.kind}", "effect": effect}
    if problem.value:
        out["value"] = problem.value
    if since:
        out["timeAdded"] = since
    return out


def healthy_pool(pool: Pool, tracker: HealthTracker, driver: str, *, taints: bool,
                 in_use: Iterable[str] = ()) -> tuple[Pool, dict[str, int]]:
    """The pool to publish: every device of an unhealthy GPU tainted (``taints``: the server keeps
    device taints), or its free devices withdrawn (held ones stay). Returns the pool and, per GPU,
    how many devices were tainted or withdrawn."""
    sick = tracker.unhealthy()
    if not sick:
        return pool, {}
    held = set(in_use)
    affected: dict[str, int] = {}
    devices = []
    for d in pool.devices:
        if d.gpu not in sick:
            devices.append(d)
            continue
        affected[d.gpu] = affected.get(d.gpu, 0) + 1
        if taints:
            devices.append(d.model_copy(update={"taints": [*d.taints, *tracker.taints(d.gpu, driver)]}))
        elif d.name in held:
            devices.append(d)
    return pool.model_copy(update={"devices": devices}), affected


def problems_text(sick: Mapping[str, tuple[Problem, ...]]) -> str | None:
    """For the node annotation ``kubectl vgpu`` reads: ``GPU: problem; ...`` (None: every GPU healthy)."""
    if not sick:
        return None
    return "; ".join(f"{g}: " + ", ".join(p.describe() for p in ps) for g, ps in sick.items())
