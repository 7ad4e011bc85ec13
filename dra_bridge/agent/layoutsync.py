"""The agent's layout: which one the node label names, applying it, and saying how it went (moved out
of :mod:`.daemon`, whose :class:`~.daemon.Daemon` it is a part of: the state label and its reason
annotation, the Events, the applied-layout record). See :mod:`.daemon` for when a resync runs it."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from dra_bridge.agent.config import ServeConfig
from dra_bridge.agent.events import LayoutEvents, blocked_reason, failed_steps_text, unapplied_text
from dra_bridge.agent.gpustate import GpuStates
from dra_bridge.agent.observe import Metrics
from dra_bridge.api.names import ANNOTATION_CONFIG_REASON
from dra_bridge.apiclient.nodes import node_metadata, set_node_annotation, set_node_label
from dra_bridge.kubeletplugin.driver import Driver
from mdev_manager import applied
from mdev_manager.config import ConfigError, GpuLayout, load_config
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.host.lock import NodeLock
from mdev_manager.models import Usage
from mdev_manager.reconcile import Outcome, reconcile

log = logging.getLogger(__name__)


class LayoutSync:
    """The layout half of the agent (a part of :class:`~.daemon.Daemon`, which holds the state)."""

    cfg: ServeConfig
    env: HostEnv
    io: HostIO
    api_client: Any
    events: LayoutEvents
    node_lock: NodeLock
    gpu_states: GpuStates
    metrics: Metrics
    driver: Driver
    device_plugins: Any
    layouts: list[GpuLayout] | None
    _layout_name: str
    _labels: dict[str, str]
    _annotations: dict[str, str] | None
    _digest: str | None
    _failed: tuple[str, str | None] | None
    _applied_layout: str | None
    _last_good: list[GpuLayout] | None
    _recorded: tuple[str, str | None] | None

    # ------------------------------------------------------------ layout selection by node label
    def _usage(self) -> Usage:
        usage = self.driver.usage()
        if self.device_plugins is not None:
            usage = usage.merged(self.device_plugins.usage())
        return usage

    def _set_state(self, labels: dict[str, str], state: str) -> None:
        """The layout state: always in the metrics, on the node label when one is configured."""
        self.metrics.set_layout_state(state)
        if not self.cfg.state_label or labels.get(self.cfg.state_label) == state:
            return
        set_node_label(self.api_client, self.cfg.node_name, self.cfg.state_label, state)
        labels[self.cfg.state_label] = state

    def _current_layouts(self) -> list[GpuLayout] | None:
        """The layout named by the node label (vgpu-device-manager style), else the configured one;
        read again when the name or the file's content changed."""
        if not self.cfg.layout_file:
            return None
        name = self.cfg.layout
        self._labels, self._annotations = {}, None
        if self.cfg.layout_label or self.cfg.state_label:
            self._labels, self._annotations = node_metadata(self.api_client, self.cfg.node_name)
            name = self._labels.get(self.cfg.layout_label or "", name) if self.cfg.layout_label else name
        digest = content_digest(self.cfg.layout_file)
        if (name, digest) == self._failed:
            raise ConfigError(f"layout {name!r} was rejected; fix it or label the node with another layout")
        edited = digest is not None and digest != self._digest  # unreadable (mid-swap): keep the last one
        if name != self._applied_layout or self.layouts is None or edited:
            if edited and name == self._applied_layout and self.layouts is not None:
                log.info("layout file %s changed; reading layout %s again", self.cfg.layout_file, name)
            self._set_state(self._labels, "pending")
            try:
                self.layouts = load_config(self.cfg.layout_file, name)
            except ConfigError as exc:
                self._reject(name, digest, exc)
                raise
            self._layout_name, self._digest = name, digest
        return self.layouts

    def _reject(self, name: str, digest: str | None, exc: ConfigError) -> None:
        """A layout that cannot be applied as written: failed until the label or the file changes."""
        self._set_state(self._labels, "failed")
        self._failed = (name, digest)
        self.layouts = None
        log.error("layout %s rejected: %s", name, exc)
        self.events.report(name, failed=f"layout {name} rejected: {exc}")

    def _apply_layout(self, layouts: list[GpuLayout]) -> Usage:
        """Reconcile the node to ``layouts``; returns who used what as the apply saw it."""
        try:
            # plan without the node lock first: a node that matches its layout (almost every resync)
            # is left alone without making a prepare wait for a whole discovery; when there is
            # something to do, the lock is taken and the node discovered and planned again under it
            out = reconcile(self.env, self.io, layouts, dry_run=True, usage_extra=self._usage(),
                            node=self.cfg.node_name, final_inventory=False)
            if any(r.plan.actions for r in out.rounds):
                self.gpu_states.invalidate()  # the layout's steps change GPUs: the next read is whole
                with self.node_lock.hold():
                    out = reconcile(self.env, self.io, layouts, usage_extra=self._usage(), node=self.cfg.node_name,
                                    final_inventory=False, read_back=True)
        except ConfigError as exc:
            self._reject(self._layout_name, self._digest, exc)
            raise
        self._applied_layout = self._layout_name
        self._last_good = layouts
        if self._recorded != (self._layout_name, self._digest):
            try:  # what the node is for, for vgpuctl slices and capacity on the node (a report: never fatal)
                applied.record(self.env, self.io, layouts, name=self._layout_name,
                               source=str(self.cfg.layout_file) if self.cfg.layout_file else None, by="vgpuctl serve")
                self._recorded = (self._layout_name, self._digest)
            except OSError as exc:
                log.warning("could not record the applied layout: %s", exc)
        self._failed = None
        self._report(out)
        return out.usage

    def _report(self, out: Outcome) -> None:
        """State label and metric, reason annotation, and an Event when there is news."""
        failed = [f for r in out.rounds for f in (r.report.failed if r.report else [])]
        for f in failed:
            log.warning("layout step failed: %s: %s %s", f.step, f.error, f.message)
        for step in out.unapplied:
            log.warning("layout step without effect (the node read back after the apply still needs it): %s", step)
        reason = blocked_reason(self._layout_name, out.blocked) if out.ok and out.blocked else None
        if reason:
            log.warning("%s", reason)
        self._set_state(self._labels, "failed" if not out.ok else "pending" if reason else "success")
        if self.cfg.state_label:
            self._set_reason(reason)
        self.events.report(self._layout_name, changed=out.changed, blocked=reason,
                           failed=failed_steps_text(self._layout_name, failed) if failed else
                           unapplied_text(self._layout_name, out.unapplied) if out.unapplied else None)

    def _set_reason(self, reason: str | None) -> None:
        """The annotation explaining ``pending``; removed once the node matches (one patch per change)."""
        current = (self._annotations or {}).get(ANNOTATION_CONFIG_REASON)
        if current == reason:
            return
        set_node_annotation(self.api_client, self.cfg.node_name, ANNOTATION_CONFIG_REASON, reason)
        if self._annotations is not None:
            if reason is None:
                self._annotations.pop(ANNOTATION_CONFIG_REASON, None)
            else:
                self._annotations[ANNOTATION_CONFIG_REASON] = reason


def content_digest(path: Path) -> str | None:
    """sha256 of the file's content, read through every symlink (a ConfigMap's ``..data``); None if unreadable."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
