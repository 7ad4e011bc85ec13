"""The layout a node was last made to match: recorded by ``apply`` and the agent, read by the
tools that say what the node is for (``vgpuctl slices``, ``vgpuctl capacity``).

Without it a tool reading the node alone cannot tell a GPU whose vGPUs a ``vgpu``-mode layout made
(not offered through DRA) from an idle ``dra`` GPU; with it, it answers for the layout the agent
works to. The entries are kept in the vgpuctl/v1 form, whatever format the file was in.
"""

from __future__ import annotations

import datetime
import json
import logging

from pydantic import BaseModel, ValidationError

from mdev_manager.config import ConfigError, GpuLayout, parse_config
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO

log = logging.getLogger(__name__)


class AppliedLayout(BaseModel):
    name: str
    source: str | None = None  # the file it was read from
    applied_by: str  # "vgpuctl apply", "vgpuctl serve"
    at: str  # RFC 3339, UTC
    entries: list[dict]

    def layouts(self) -> list[GpuLayout]:
        return parse_config({"version": "vgpuctl/v1", "layouts": {self.name: self.entries}}, self.name,
                            source=f"{self.source or 'the recorded layout'} ({self.name})")

    def describe(self) -> str:
        return f"layout {self.name}" + (f" of {self.source}" if self.source else "") + \
            f", applied by {self.applied_by} at {self.at}"


def entries_of(layouts: list[GpuLayout]) -> list[dict]:
    return [e.model_dump(mode="json", by_alias=True, exclude_defaults=True) for e in layouts]


def record(env: HostEnv, io: HostIO, layouts: list[GpuLayout], *, name: str, source: str | None, by: str) -> bool:
    """Record ``layouts`` as the node's (written only when it differs from the record); True if written."""
    entries = entries_of(layouts)
    old = load(env, io)
    if old is not None and (old.name, old.source, old.entries) == (name, source, entries):
        return False
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = AppliedLayout(name=name, source=source, applied_by=by, at=now, entries=entries)
    io.write_atomic(env.applied_layout, rec.model_dump_json(indent=2) + "\n")
    return True


def load(env: HostEnv, io: HostIO) -> AppliedLayout | None:
    """The record, or None (none yet; one that cannot be read is said in the log and ignored:
    it is a report, never a reason to change the node)."""
    try:
        text = io.read(env.applied_layout)
    except FileNotFoundError:
        return None
    try:
        rec = AppliedLayout.model_validate(json.loads(text))
        rec.layouts()  # still a valid layout
    except (ValueError, ValidationError, ConfigError) as exc:
        log.warning("ignoring %s: %s", env.applied_layout, str(exc).splitlines()[0])
        return None
    return rec
