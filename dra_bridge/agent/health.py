"""The agent's health watch of each GPU (issue #33): asks NVML, keeps the hysteresis, says each change.

Per GPU on NVIDIA's driver, at each resync and each periodic check: the critical Xid events since the
last look and ECC page retirement pending a reset (``xid``), the GPU lost (``gpu-lost``: NVML answers
NVML_ERROR_GPU_IS_LOST), a GPU whose NVML calls fail otherwise (``unmonitored``). The pure
:class:`~dra_bridge.pool.health.HealthTracker` decides what is published; each change is an Event on the
Node (``GpuUnhealthy`` Warning, ``GpuHealthy`` Normal) and the node annotation ``vgpu.kubevirt.io/health``
(``kubectl vgpu`` shows it); the kubelet's health service (KEP-4680) says the same per device.

A GPU bound to vfio-pci (passed through) NVML does not see: for it the watch reads what the kernel shows
in sysfs (:func:`read_pci`: PCI config space, AER counters, link width and speed, reset methods) and
:func:`~dra_bridge.pool.pcihealth.pci_problems` decides (``gpu-lost``, ``aer``, ``pci-link``,
``pci-reset``, ``unmonitored``), through the same tracker, Events and annotation. A GPU that leaves the
bus is withdrawn by discovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from dra_bridge.api.names import ANNOTATION_HEALTH
from dra_bridge.apiclient.errors import brief, report_level
from dra_bridge.apiclient.events import record_node_event
from dra_bridge.apiclient.nodes import set_node_annotation
from dra_bridge.pool.health import GPU_LOST, NO_SCHEDULE, UNMONITORED, XID, Change, HealthTracker, Problem, problems_text
from dra_bridge.pool.pcihealth import CONFIG_HEAD, TEXT_FILES, PciReading, PciSeen, pci_problems
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.host.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NvmlError,
)
from mdev_manager.models import Inventory

log = logging.getLogger(__name__)

UNHEALTHY, HEALTHY = "GpuUnhealthy", "GpuHealthy"
#: NVML not on this node at all: nothing is monitored, and nothing is said per GPU
_NO_NVML = (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_UNINITIALIZED)
#: the Xid NVIDIA gives ECC page retirement (63: a page retired, pending a reset)
XID_PAGE_RETIREMENT = "63"


def read_problems(io: HostIO, address: str) -> list[Problem] | None:
    """What NVML shows wrong on the GPU now; None where no NVML answers on this node."""
    nvml = io.nvml()
    try:
        found = [Problem(XID, f"critical Xid {x} reported by the driver", str(x)) for x in nvml.critical_xids(address)]
        try:
            if nvml.retired_pages_pending(address):
                found.append(Problem(XID, "ECC errors retired pages, pending a GPU reset", XID_PAGE_RETIREMENT))
        except NvmlError as e:
            if e.code != NVML_ERROR_NOT_SUPPORTED:  # boards without ECC page retirement
                raise
        return found
    except NvmlError as e:
        if e.code in _NO_NVML:
            return None
        if e.code == NVML_ERROR_GPU_IS_LOST:
            return [Problem(GPU_LOST, "NVML: the GPU is lost (fallen off the bus or hung; a reset is needed)")]
        return [Problem(UNMONITORED, f"its health cannot be read ({e})")]


def read_pci(io: HostIO, env: HostEnv, address: str) -> PciReading:
    """The sysfs files the kernel keeps on the GPU's PCI function (None for each missing or unreadable)."""
    directory = env.pci(address)
    try:
        config: bytes | None = io.read_bytes(directory / "config", CONFIG_HEAD)
    except OSError:
        config = None
    text = io.read_attrs(directory, list(TEXT_FILES))
    return PciReading(config or None, *(text.get(n) for n in TEXT_FILES))


class GpuHealthWatch:
    def __init__(self, io: HostIO, api_client: Any, node: str, quiet: float, env: HostEnv | None = None,
                 lost_effect: str = NO_SCHEDULE):
        # api_client: the kubernetes ApiClient, or None; env: the host's paths (None: the real host's);
        # lost_effect: the gpu-lost taint's effect (serve --gpu-lost-effect)
        self.io = io
        self.env = env or HostEnv()
        self.api_client = api_client
        self.node = node
        self.tracker = HealthTracker(quiet, lost_effect)
        self.clock: Callable[[], float] = time.monotonic  # tests swap it, to step over the quiet period
        self._annotated: str | None = ""  # as on the node; "": not known yet (a restart clears a stale one)
        self._pci: dict[str, PciSeen] = {}  # GPU on vfio-pci -> what its last reads showed (AER counters, link)

    def poll(self, inv: Inventory | None, now: float | None = None) -> list[Change]:
        """Look at each GPU on NVIDIA's driver (NVML) or on vfio-pci (sysfs) once; the changes of published
        health, each said once."""
        if inv is None:
            return []
        now = self.clock() if now is None else now
        changes = []
        self.tracker.forget(set(dict(self.tracker.unhealthy())) - {g.address for g in inv.gpus})
        passed = {g.address for g in inv.gpus if g.driver == "vfio-pci"}
        self._pci = {a: s for a, s in self._pci.items() if a in passed}  # rebound or gone: seen afresh
        problems: list[Problem] | None
        for gpu in inv.gpus:
            if gpu.driver == "vfio-pci":
                problems, self._pci[gpu.address] = pci_problems(read_pci(self.io, self.env, gpu.address),
                                                                self._pci.get(gpu.address))
            elif gpu.vendor_id == "0x10de" and gpu.driver == "nvidia":
                problems = read_problems(self.io, gpu.address)
            else:
                continue
            if problems is None:
                continue
            change = self.tracker.observe(gpu.address, problems, now)
            if change is not None:
                changes.append(change)
        self._say(changes)
        return changes

    def messages(self) -> dict[str, str]:
        """GPU -> why it is unhealthy (the kubelet's health service, per device)."""
        return {g: "; ".join(p.describe() for p in ps) for g, ps in self.tracker.unhealthy().items()}

    def _say(self, changes: Iterable[Change]) -> None:
        for c in changes:
            (log.info if c.healthy else log.warning)("%s", c.message())
            if self.api_client is None:
                continue
            try:
                record_node_event(self.api_client, self.node, HEALTHY if c.healthy else UNHEALTHY, c.message(),
                                  warning=not c.healthy)
            except Exception as exc:  # noqa: BLE001 - an Event is a report: the publish does not wait on it
                log.log(report_level(exc), "could not record a health event on node %s (%s)", self.node,
                        brief(exc))
        text = problems_text(self.tracker.unhealthy())
        if self.api_client is not None and text != self._annotated:
            self._annotated = text  # tried once per change: an idle poll makes no request
            try:
                set_node_annotation(self.api_client, self.node, ANNOTATION_HEALTH, text)
            except Exception as exc:  # noqa: BLE001 - a report: the taints are what the scheduler acts on
                log.log(report_level(exc), "could not annotate node %s with its GPUs' health (%s)", self.node,
                        brief(exc))
