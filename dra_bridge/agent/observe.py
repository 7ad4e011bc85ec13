"""Structured logs, Prometheus metrics and the probe endpoints of the daemon."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dra_bridge.agent.capacity import counters_in_use

if TYPE_CHECKING:
    from dra_bridge.api.compat import KeptFields
    from dra_bridge.kubeletplugin.state import ClaimRecord
    from dra_bridge.pool.model import Pool
    from mdev_manager.models import Inventory


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for key in ("node", "claim", "gpu", "device"):
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: int = logging.INFO, json_logs: bool = True) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_logs else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # urllib3 logs a "Retrying (...)" warning per attempt; the publisher's own retry says it once, in one line
    logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.ERROR)


LAYOUT_STATES = ("success", "pending", "failed")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.resyncs = Counter("vgpuctl_resyncs_total", "Resyncs run", ["result"], registry=r)
        self.api_writes = Counter("vgpuctl_api_writes_total", "ResourceSlice writes", ["verb"], registry=r)
        self.prepare_seconds = Histogram("vgpuctl_prepare_seconds", "NodePrepareResources latency per claim",
                                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5), registry=r)
        self.prepare_errors = Counter("vgpuctl_prepare_errors_total", "Claims whose prepare failed", registry=r)
        self.devices = Gauge("vgpuctl_published_devices", "Devices in the published pool", ["kind"], registry=r)
        self.gpus = Gauge("vgpuctl_gpus", "GPUs discovered on the node", registry=r)
        self.vgpus = Gauge("vgpuctl_vgpus", "vGPUs present on the node", registry=r)
        self.prepared_claims = Gauge("vgpuctl_prepared_claims", "Claims prepared on this node", registry=r)
        self.gpu_free_vgpus = Gauge(
            "vgpuctl_gpu_free_vgpus", "vGPUs of a profile a new workload can get on a physical GPU now "
            "(vgpu mode: idle vGPUs; dra mode: instances it can still create)", ["gpu", "profile"], registry=r)
        self.layout_state = Gauge("vgpuctl_layout_state", "1 for the layout's state (success, pending: devices "
                                  "in use hold it back, failed), 0 for the others", ["state"], registry=r)
        self.fields_kept = Gauge("vgpuctl_api_fields_kept", "1 when the API server keeps this DRA field family, "
                                 "0 when it drops it (found by effect; absent while unknown)", ["field"], registry=r)
        self.api_lists = Gauge("vgpuctl_api_slice_lists", "LISTs of this node's ResourceSlices since start "
                               "(1 unless the watch was lost)", registry=r)
        self.api_errors = Counter("vgpuctl_api_errors_total", "API requests of the publisher that failed, by HTTP "
                                  "status (timeout, unreachable: no answer); retried ones included", ["code"],
                                  registry=r)
        self.resync_seconds = Histogram("vgpuctl_resync_seconds", "Duration of the resyncs that ran (not skipped)",
                                        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.vgpus_by_type = Gauge("vgpuctl_vgpus_by_type", "vGPUs present on the node, per vGPU type", ["type"],
                                   registry=r)
        self.gpu_counter_capacity = Gauge("vgpuctl_gpu_counter_capacity", "Shared counters a GPU publishes "
                                          "(DRA counter sets)", ["gpu", "counter_set", "counter"], registry=r)
        self.gpu_counter_used = Gauge("vgpuctl_gpu_counter_used", "What the devices of claims prepared on this node "
                                      "consume of a GPU's shared counters", ["gpu", "counter_set", "counter"],
                                      registry=r)

    def set_fields_kept(self, kept: KeptFields) -> None:
        for field in ("counters", "compatibility_groups", "binding_conditions", "taints"):
            value = getattr(kept, field)
            if value is None:
                with contextlib.suppress(KeyError):  # never set: nothing to remove
                    self.fields_kept.remove(field)
            else:
                self.fields_kept.labels(field).set(1 if value else 0)

    def set_free_vgpus(self, free: dict[tuple[str, str], int]) -> None:
        """Replace every series: a profile or GPU that went away must not linger."""
        self.gpu_free_vgpus.clear()
        for (gpu, profile), n in sorted(free.items()):
            self.gpu_free_vgpus.labels(gpu, profile).set(n)

    def set_node(self, inv: Inventory, pool: Pool, claims: dict[str, ClaimRecord]) -> None:
        """What a resync found: GPUs, vGPUs (per type), prepared claims, the shared counters they use.
        Labelled series are replaced: a GPU, type or counter set that went away must not linger."""
        vgpus = inv.all_vgpus()
        self.gpus.set(len(inv.gpus))
        self.vgpus.set(len(vgpus))
        self.prepared_claims.set(len(claims))
        names = [(v.type_name.split() or [v.type_id])[-1] for v in vgpus]
        self.vgpus_by_type.clear()
        for name in sorted(set(names)):
            self.vgpus_by_type.labels(name).set(names.count(name))
        self.gpu_counter_capacity.clear()
        self.gpu_counter_used.clear()
        prepared = {d.device for c in claims.values() for d in c.devices}
        for key, (capacity, used) in sorted(counters_in_use(pool, prepared).items()):
            self.gpu_counter_capacity.labels(*key).set(capacity)
            self.gpu_counter_used.labels(*key).set(used)

    def set_layout_state(self, state: str) -> None:
        for s in LAYOUT_STATES:
            self.layout_state.labels(s).set(1 if s == state else 0)


class ProbeServer:
    """``/metrics``, ``/healthz`` (process alive) and ``/readyz`` (first resync done, plugin up)."""

    def __init__(self, metrics: Metrics, ready: Callable[[], bool], host: str = "0.0.0.0", port: int = 8080) -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                elif self.path == "/healthz":
                    body, ctype, code = b"ok\n", "text/plain", 200
                elif self.path == "/readyz":
                    ok = ready()
                    body, ctype, code = (b"ready\n" if ok else b"not ready\n"), "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="probes")

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> ProbeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
