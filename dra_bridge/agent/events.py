"""Events on the agent's Node about its layout (``kubectl describe node`` shows them).

One Event per change of what the admin should know, never one per resync:

* ``LayoutApplied`` (Normal): a resync changed the node and it now matches the layout
  (``applied with N changes``), or the node matches again after being blocked or failed;
* ``LayoutBlocked`` (Warning): devices in use keep the node from the layout;
* ``LayoutFailed`` (Warning): the layout was rejected, or steps failed.

A resync that changes nothing and finds the node as before records nothing; a warning repeated
with the same content (vGPU UUIDs aside: a failing create gets a new one each round) neither.
Deciding is pure (:func:`layout_event`); :class:`LayoutEvents` only remembers and records.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dra_bridge.apiclient.errors import brief
from dra_bridge.apiclient.events import record_node_event
from mdev_manager.config import ConfigError
from mdev_manager.executor import StepResult
from mdev_manager.models import Blocked

log = logging.getLogger(__name__)

APPLIED, BLOCKED, FAILED = "LayoutApplied", "LayoutBlocked", "LayoutFailed"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


@dataclass(frozen=True)
class LayoutEvent:
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        return self.reason != APPLIED

    @property
    def key(self) -> tuple[str, str]:
        """What makes two events the same news."""
        return self.reason, _UUID.sub("<uuid>", self.message)


def failed_steps_text(layout: str, failed: list[StepResult]) -> str:
    """The failed steps, without the count of steps that succeeded: a retry that fails the same
    way after saving fewer definitions is the same news."""
    parts = [f"{r.step}: {r.error or 'skipped'}{f' ({r.message})' if r.message and not r.skipped else ''}"
             for r in failed if not r.skipped]
    skipped = sum(1 for r in failed if r.skipped)
    tail = f"; {skipped} dependent step(s) skipped" if skipped else ""
    return (f"layout {layout}: {len(failed) - skipped} step(s) failed{tail}: "
            + " | ".join(parts))


def unapplied_text(layout: str, steps: list[str]) -> str:
    """Steps that reported success but whose effect the node, read back, does not show."""
    return (f"layout {layout}: {len(steps)} step(s) without effect (the node read back after the apply still "
            "needs them): " + " | ".join(steps[:5]) + (f" | and {len(steps) - 5} more" if len(steps) > 5 else ""))


def layout_event(layout: str, *, changed: int, failed: str | None = None, blocked: str | None = None,
                 previous: LayoutEvent | None = None) -> LayoutEvent | None:
    """The Event one resync's outcome calls for, given the last one recorded (None: none needed).

    ``failed`` is a rejection or failed-steps text, ``blocked`` the blocked reason.
    """
    if failed:
        event = LayoutEvent(FAILED, failed)
    elif blocked:
        event = LayoutEvent(BLOCKED, blocked)
    elif changed:
        event = LayoutEvent(APPLIED, f"layout {layout} applied with {changed} change{'' if changed == 1 else 's'}; "
                                     "the node matches it")
    elif previous is not None and previous.warning:
        why = "; the devices in use were released" if previous.reason == BLOCKED else ""
        event = LayoutEvent(APPLIED, f"layout {layout}: the node matches it{why}")
    else:
        return None
    if event.warning and previous is not None and previous.key == event.key:
        return None
    return event


class LayoutEvents:
    """Records the Events :func:`layout_event` decides on, remembering the last one."""

    def __init__(self, api_client: Any, node: str) -> None:
        self.api_client = api_client
        self.node = node
        self.last: LayoutEvent | None = None

    def report(self, layout: str, *, changed: int = 0, failed: str | None = None,
               blocked: str | None = None) -> LayoutEvent | None:
        event = layout_event(layout, changed=changed, failed=failed, blocked=blocked, previous=self.last)
        if event is None:
            return None
        self.last = event
        try:
            record_node_event(self.api_client, self.node, event.reason, event.message, warning=event.warning)
        except Exception as exc:  # an event is a courtesy: the labels and metrics carry the state
            log.warning("cannot record an Event on node %s: %s", self.node, exc)
        return event


def one_line(exc: BaseException) -> str:
    """An error in one line: a rejected layout's problems joined, an API answer as status and message."""
    if isinstance(exc, ConfigError):
        return "; ".join(exc.problems) or str(exc)
    text = brief(exc)
    return " ".join(text.split()) or type(exc).__name__


def blocked_reason(layout: str, blocked: Sequence[Blocked]) -> str:
    """One line for the annotation and the Event: which devices in use, and which GPUs that left the
    bus, hold back which layout."""
    used = [b for b in blocked if not b.gone]
    parts = [f"{b.device} on GPU {b.gpu} held by {'; '.join(b.held_by)} blocks {b.blocks}" for b in used]
    parts += [b.blocks for b in blocked if b.gone]
    what = ", ".join(x for x in (f"{len(used)} device(s) in use" if used else "",
                                 f"{len(blocked) - len(used)} GPU(s) off the bus" if len(used) < len(blocked) else "")
                     if x)
    return f"layout {layout} not reached: {what}: " + " | ".join(parts)
