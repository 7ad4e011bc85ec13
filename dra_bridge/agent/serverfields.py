"""What the agent learns from the API server and tells the node (moved out of :mod:`.daemon`, whose
:class:`~.daemon.Daemon` it is a part of): which DRA fields the server keeps (a dry-run probe, then
every write's answer), the pool's shape that follows from them, the node annotation saying so, and
the host driver version label KubeVirt picks live-migration targets by."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from dra_bridge.agent.config import ServeConfig
from dra_bridge.agent.events import one_line
from dra_bridge.agent.observe import Metrics
from dra_bridge.api.names import LABEL_VGPU_HOST_DRIVER
from dra_bridge.apiclient.errors import brief, report_level
from dra_bridge.apiclient.kept import ANNOTATION_DRA_FIELDS, KeptFields, probe_kept
from dra_bridge.apiclient.nodes import set_node_annotation, set_node_label
from dra_bridge.apiclient.publisher import Publisher
from dra_bridge.pool.shape import Shape, choose_shape
from mdev_manager.host.io import HostIO
from mdev_manager.models import Inventory

log = logging.getLogger(__name__)


class ServerFields:
    """The API server half of the agent (a part of :class:`~.daemon.Daemon`, which holds the state)."""

    cfg: ServeConfig
    io: HostIO
    api_client: Any
    metrics: Metrics
    publisher: Publisher
    kept: KeptFields
    _probed_at: float | None
    _kept_annotated: str | None
    _driver_label: str | None

    def _check_fields(self) -> None:
        """Which DRA fields the server keeps, by a dry-run probe: at start and every ``probe_seconds``
        (a server can be upgraded or have its gates changed under a running agent)."""
        now = time.monotonic()
        if self._probed_at is not None and now - self._probed_at < self.cfg.probe_seconds:
            return
        self._probed_at = now
        try:
            self._note_fields(probe_kept(self.api_client, self.publisher.version, self.cfg.node_name, self.cfg.driver))
        except Exception as exc:  # noqa: BLE001 - no permission or no answer: the writes' answers still tell
            log.info("could not probe which DRA fields the API server keeps (%s); judging by our writes", brief(exc))

    def _note_fields(self, kept: KeptFields) -> None:
        """Log a change, set the metric and the node annotation (one patch per change)."""
        if kept != self.kept:
            bad = False in (kept.counters, kept.compatibility_groups)
            log.log(logging.WARNING if bad else logging.INFO, "the API server keeps: %s", kept.describe())
            if kept.counters is False:
                log.warning("shared counters are dropped: the scheduler cannot keep a GPU and its vGPUs apart; "
                            "enable the DRAPartitionableDevices feature gate (vgpuctl doctor explains)")
            self.kept = kept
        self.metrics.set_fields_kept(kept)
        self.metrics.api_lists.set(self.publisher.mirror.lists)
        text = kept.annotation()
        if text != self._kept_annotated:
            try:
                set_node_annotation(self.api_client, self.cfg.node_name, ANNOTATION_DRA_FIELDS, text)
                self._kept_annotated = text
            except Exception as exc:  # noqa: BLE001 - the annotation is a report; the publish goes on
                log.log(report_level(exc), "could not annotate node %s with %s (%s)", self.cfg.node_name,
                        ANNOTATION_DRA_FIELDS, brief(exc))

    def shape(self) -> Shape:
        """The pool's shape for this server, from what it keeps (:func:`~dra_bridge.pool.shape.choose_shape`,
        the same decision ``vgpuctl slices`` makes from a version's gates)."""
        return choose_shape(self.publisher.version, self.kept,
                            sizes_by_first_allocation=self.cfg.sizes_by_first_allocation)


    def _label_driver_version(self, inv: Inventory) -> None:
        """The node's ``vgpu-host-driver-version.kubevirt.io/nvidia`` label: the host driver's version as
        NVML reads it (never configured), set when it changes (a driver upgrade), so KubeVirt picks
        live-migration targets with the same vGPU manager."""
        if not any(g.vendor_id == "0x10de" for g in inv.gpus):
            return
        try:
            version = self.io.nvml().driver_version()
        except Exception as exc:  # noqa: BLE001 - no NVML (no driver loaded yet): no label, said once
            if self._driver_label != "":
                log.info("no host driver version to label the node with: %s", one_line(exc))
                self._driver_label = ""
            return
        if version == self._driver_label:
            return
        if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", version):
            log.warning("host driver version %r is no label value; %s not set", version, LABEL_VGPU_HOST_DRIVER)
        else:
            try:
                set_node_label(self.api_client, self.cfg.node_name, LABEL_VGPU_HOST_DRIVER, version)
            except Exception as exc:  # noqa: BLE001 - a label is a report: publishing goes on (tried again at a restart
                # or when the version changes, so an idle resync makes no request)
                log.log(report_level(exc), "could not label node %s with %s (%s)", self.cfg.node_name,
                        LABEL_VGPU_HOST_DRIVER, one_line(exc))
        self._driver_label = version
