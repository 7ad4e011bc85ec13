"""deploy/monitoring's Grafana dashboard asks only for metrics a running agent exports, and the
agent's metrics behind it say what happened: counters used by a prepared claim, vGPUs per type,
resync durations, API errors by status."""

from __future__ import annotations

import json
import re

from prometheus_client.parser import text_string_to_metric_families

from dra_bridge.sim.apiserver import LocalApiServer
from tests.support.deploy import DEPLOY
from tests.support.dra import add_claim, make_node, pool_slices, short_tmp
from tests.system.test_serve import http_get, make_daemon, register, running, wait_until

DASHBOARD = DEPLOY / "monitoring" / "grafana-dashboard.json"
_METRIC = re.compile(r"\b(vgpuctl_[a-z0-9_]+)\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
             "summary": ("_count", "_sum", "")}


def dashboard_metrics() -> dict[str, list[str]]:
    """Metric name -> the panels whose queries use it."""
    doc = json.loads(DASHBOARD.read_text())
    out: dict[str, list[str]] = {}
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            for name in _METRIC.findall(target["expr"]):
                out.setdefault(name, []).append(panel["title"])
    for var in doc["templating"]["list"]:
        for name in _METRIC.findall(json.dumps(var.get("query", ""))):
            out.setdefault(name, []).append(f"variable {var['name']}")
    return out


def exported(text: str) -> dict[str, list[dict]]:
    """Every sample name /metrics can carry (families without samples yet included) -> its samples' labels."""
    out: dict[str, list[dict]] = {}
    for fam in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(fam.type, ("",)):
            out.setdefault(fam.name + suffix, [])
        for s in fam.samples:
            out.setdefault(s.name, []).append(s.labels)
    return out


def test_dashboard_panels_use_only_metrics_a_running_agent_exports():
    wanted = dashboard_metrics()
    assert {"vgpuctl_gpu_counter_used", "vgpuctl_gpu_counter_capacity", "vgpuctl_vgpus_by_type",
            "vgpuctl_prepare_seconds_bucket", "vgpuctl_resync_seconds_bucket", "vgpuctl_api_errors_total"} <= set(wanted)
    with short_tmp("db") as base, LocalApiServer(version="1.35") as srv:
        node = make_node(base, "default")
        with running(make_daemon(node, srv, base)) as r:
            d = r.daemon
            kubelet, reg = register(base / "kl")
            device = next(x for x in d._pool.devices if x.kind == "vgpu" and x.consumes)
            claim = add_claim(srv, "vm", [("vgpu", device.name)], node=node.node)
            with reg.client("v1") as c:
                assert c.prepare([(claim.namespace, claim.uid, claim.name)])[claim.uid]["error"] == ""
            # a slice gone from the server is created again at the next resync, after one 500
            victim = pool_slices(srv, node=node.node)[0]["metadata"]["name"]
            srv.inject("create", "resourceslices", 500, times=1)
            srv.remove("resourceslices", victim)
            wait_until(lambda: victim not in d.publisher.known(), what="the watch to see the slice go")
            d.resync()
            assert victim in {x["metadata"]["name"] for x in pool_slices(srv, node=node.node)}
            code, text = http_get(d.probes.port, "/metrics")
    assert code == 200
    have = exported(text)
    missing = {name: panels for name, panels in wanted.items() if name not in have}
    assert not missing, f"panels ask for metrics the agent does not export: {missing}"
    # the series behind the panels: the prepared vGPU's GPU uses what its device consumes
    used = {(s["gpu"], s["counter_set"], s["counter"]): v for s, v in _values(text, "vgpuctl_gpu_counter_used")}
    capacity = {(s["gpu"], s["counter_set"], s["counter"]): v
                for s, v in _values(text, "vgpuctl_gpu_counter_capacity")}
    assert set(used) == set(capacity) and all(used[k] <= capacity[k] for k in used)
    consumed = {(device.gpu, c.counter_set, k) for c in device.consumes for k in c.counters}
    assert {k for k, v in used.items() if v > 0} == consumed
    types = {s["type"]: v for s, v in _values(text, "vgpuctl_vgpus_by_type")}
    assert sum(types.values()) == len(d.inventory.all_vgpus()) >= 1
    ((_, timed),) = _values(text, "vgpuctl_resync_seconds_count")
    assert timed >= 2  # the resyncs that ran are timed
    assert {s["code"]: v for s, v in _values(text, "vgpuctl_api_errors_total")} == {"500": 1}


def _values(text: str, name: str) -> list[tuple[dict, float]]:
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]
