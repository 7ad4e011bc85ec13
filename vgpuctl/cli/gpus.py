"""The cluster's GPUs for the maintenance commands (``cordon``, ``drain``, ``uncordon``) and the
kubectl plugin: one connection, the views (:mod:`dra_bridge.scheduling.gpuview`), naming a GPU,
the table that fits 80 columns.

A GPU is named by its node and its index (the ``gpuIndex`` its devices publish) or PCI address:
``NODE/0``, ``NODE/0000:3b:00.0`` (``3b:00.0`` is read as domain 0000), or the index or address
alone with ``--node NODE``; ``--node NODE`` alone is every GPU of the node.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dra_bridge.api.compat import taint_rule_api
from dra_bridge.apiclient.maintenance import ClusterState, MaintenanceApi, read_state
from dra_bridge.pool.cordon import NODE, parse_cordon
from dra_bridge.scheduling.classic import ClassicNode, VmTargets, classic_nodes, short
from dra_bridge.scheduling.gpuview import GpuView, build_views
from vgpuctl.cli import options
from vgpuctl.output.tables import fit, fit_lines, short_model

if TYPE_CHECKING:
    from dra_bridge.apiclient.reader import Reader

_SHORT_PCI = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass
class Session:
    """A connection to the cluster for one command: ``m`` makes the calls of cordon and drain;
    a read-only session (``kubectl vgpu``) has a plain JSON ``reader`` instead (no Kubernetes client)."""

    api: object
    version: tuple[int, int]
    m: MaintenanceApi | None
    driver: str
    namespace: str | None = None
    last: ClusterState | None = None  # the ClusterState the last views came from
    reader: Reader | None = None

    @classmethod
    def open(cls, args, *, write: bool = True) -> Session:
        namespace = getattr(args, "namespace", None)
        if not write:
            from dra_bridge.apiclient.kubeconfig import PROBE_TIMEOUT
            from dra_bridge.apiclient.reader import open_reader

            reader = open_reader(args.kubeconfig or None, args.context, PROBE_TIMEOUT)
            return cls(None, reader.version(), None, args.driver, namespace, reader=reader)
        from dra_bridge.apiclient.publisher import server_version

        api = options.connect(args)
        version = server_version(api)
        return cls(api, version, MaintenanceApi(api, version), args.driver, namespace)

    @property
    def maintenance(self) -> MaintenanceApi:
        """The calls of cordon and drain, which open the session to write (a read-only one has none)."""
        if self.m is None:
            raise RuntimeError("a read-only session makes no cordon or drain calls: Session.open(args, write=True)")
        return self.m

    def state(self) -> ClusterState:
        """What the cluster holds now: one LIST of each kind."""
        if self.reader is not None:
            return read_state(self.reader, taint_rule_api(self.version))
        assert self.m is not None
        return self.m.state()

    def views(self, nodes: list[str] | None = None) -> list[GpuView]:
        """The GPUs (of ``nodes``); with a namespace, only its holders are listed (all count)."""
        st = self.last = self.state()
        views = build_views(st.slices, st.claims, st.pods, st.vmis, st.rules, st.cordons, st.applied,
                            driver=self.driver, nodes=nodes, healths=st.healths)
        if self.namespace:
            for v in views:
                v.holders = [h for h in v.holders if h.claim.startswith(f"{self.namespace}/")]
        return views

    def classic(self, nodes: list[str] | None = None) -> list[ClassicNode]:
        """The device-plugin side of the state the last views came from (``nodes``: only theirs)."""
        st = self.last or self.state()
        out = classic_nodes(st.node_objects, st.pods, st.vmis)
        return [c for c in out if not nodes or c.node in nodes]


def pci(ref: str) -> str:
    ref = ref.strip().lower()
    return f"0000:{ref}" if _SHORT_PCI.match(ref) else ref


def resolve(refs: list[str], node: str | None, views: list[GpuView], cordons: dict[str, str],
            nodes: list[str]) -> dict[str, dict[str, int | None]]:
    """node -> {PCI address (or ``*``): index} for the GPUs ``refs`` and ``--node`` name. Unknown
    names are bad input, listing what the node has."""
    if not refs:
        if node is None:
            raise ValueError("name a GPU (NODE/INDEX, NODE/PCI-ADDRESS) or a node (--node NODE)")
        if node not in nodes and not any(v.node == node for v in views):
            raise ValueError(f"node {node!r} not found")
        return {node: {NODE: None}}
    out: dict[str, dict[str, int | None]] = {}
    for ref in refs:
        where, sep, gpu = ref.partition("/")
        if not sep:
            where, gpu = node or "", ref
        if not where:
            raise ValueError(f"GPU {ref!r}: which node? write NODE/{ref} or add --node NODE")
        mine = [v for v in views if v.node == where]
        known = {pci(a): e.index for a, e in _entries(cordons.get(where)).items() if a != NODE}
        known |= {v.address: v.index for v in mine if v.address}
        addr = next((a for a, i in known.items() if gpu.isdigit() and i == int(gpu)), None) or \
            (pci(gpu) if pci(gpu) in known else None)
        if addr is None:
            have = ", ".join(f"{i} ({a})" for a, i in sorted(known.items(), key=lambda kv: (kv[1] is None, kv[1] or 0)))
            raise ValueError(f"GPU {ref!r}: node {where!r} publishes no such GPU" +
                             (f"; its GPUs: {have}" if have else " (no GPU of this driver there)"))
        out.setdefault(where, {})[addr] = known[addr]
    return out


def _entries(text: str | None):
    try:
        return parse_cordon(text)
    except ValueError:
        return {}


def selected(views: list[GpuView], targets: dict[str, dict[str, int | None]]) -> list[GpuView]:
    return [v for v in views if v.node in targets and (NODE in targets[v.node] or v.address in targets[v.node])]


def wait_until(done: Callable[[], bool], seconds: float, on_wait: Callable[[], None] = lambda: None,
               every: float = 0.5) -> bool:
    """Call ``done`` until it is true or ``seconds`` passed; ``on_wait`` between tries (progress)."""
    deadline = time.monotonic() + seconds
    pause = threading.Event()
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        on_wait()
        pause.wait(min(every, max(0.0, deadline - time.monotonic())))


def holders_text(v: GpuView) -> str:
    vms = sum(1 for h in v.holders if h.vm)
    pods = len({p for h in v.holders for p in h.pods if not h.vm})
    parts = ([f"{vms} VM"] if vms else []) + ([f"{pods} pod"] if pods else [])
    claims = len({h.claim for h in v.holders})
    return ", ".join(parts) or (f"{claims} claim" if claims else "-")


def cordon_text(v: GpuView) -> str:
    return f"{v.cordon} ({v.cordon_how})" if v.cordon else "-"


def free_text(v: GpuView, limit: int | None = 3) -> str:
    """``T4-8Q 2, whole GPU 1``: the profiles that still fit, most useful first."""
    fits = [f"{p.profile} {p.fits}" for p in sorted(v.profiles, key=lambda p: (-(p.memory or 0), p.profile))
            if p.fits]
    if limit is not None and len(fits) > limit:
        fits = fits[:limit] + [f"+{len(fits) - limit}"]
    return ", ".join(fits) or "-"


_KIND = {"passthrough": "whole", "vgpu": "vgpu", "mig": "mig"}


def gpu_table(views: list[GpuView], *, wide: bool = False) -> str:
    """One row per GPU: fits 80 columns (NODE/GPU in one column, models shortened, lists folded, the
    CORDON column only when a GPU is cordoned); ``wide``: node, PCI model name, how each cordon is
    enforced, every free profile."""
    # what the GPU offers through DRA (every GPU shown is a dra GPU: the layout's MODE would say dra)
    mode = lambda v: "+".join(_KIND.get(k, k) for k in v.kinds) or "-"  # noqa: E731
    if wide:
        header = ["NODE", "GPU", "ADDRESS", "MODEL", "OFFERS", "CORDON", "HEALTH", "HOLDERS", "FREE"]
        rows = [[v.node or "-", _index(v), v.address or "?", v.product or "?", mode(v), cordon_text(v),
                 v.health or "ok", holders_text(v), free_text(v, None)] for v in views]
        return fit(header, rows, wide=True)
    cordoned = any(v.cordon for v in views)
    sick = any(v.health for v in views)  # the HEALTH column only while a GPU is unhealthy
    header = (["GPU", "ADDRESS", "MODEL", "OFFERS"] + (["CORDON"] if cordoned else []) + (["HEALTH"] if sick else [])
              + ["HOLDERS", "FREE"])
    rows = [[v.name(), v.address or "?", short_model(v.product), mode(v)] + ([v.cordon or "-"] if cordoned else [])
            + ([v.health or "ok"] if sick else []) + [holders_text(v), free_text(v, 2)] for v in views]
    return fit(header, rows, fold=("GPU", "MODEL", "OFFERS", "HEALTH", "HOLDERS", "FREE"))


def vgpu_rows(views: list[GpuView], *, wide: bool = False) -> str:
    """One row per vGPU or whole GPU a claim holds: its profile and placement, its claim, pod or VM."""
    rows = []
    for v in views:
        for h in v.holders:
            vgpu = h.profile + (f" @{h.placement}" if h.placement else "")
            who = f"VM {h.vm}" if h.vm else ("pod " + ", ".join(h.pods) if h.pods else "(no pod)")
            rows.append([v.name(), h.device, vgpu, h.claim, who, h.migration or h.phase or "allocated"] if wide
                        else [v.name(), vgpu, who, h.claim])
    header = (["GPU", "DEVICE", "VGPU", "CLAIM", "HOLDER", "STATE"] if wide else ["GPU", "VGPU", "HOLDER", "CLAIM"])
    return fit(header, rows, wide=wide, fold=("GPU", "VGPU", "HOLDER", "CLAIM"))


def _index(v: GpuView) -> str:
    return "-" if v.index is None else str(v.index)


def _key(h) -> tuple:
    """A holder as drain follows it: its claim and device; a classic holder (no claim) by its pods."""
    return (h.claim, h.device) + (tuple(h.pods) if h.claim == "-" else ())


def holder_rows(first: list[GpuView], last: list[GpuView] | None = None, evicted: dict | None = None, *,
                wide: bool = False) -> str:
    """One row per holder of ``first`` (its claim, pod or VM, what became of it by ``last``: still
    holding with its phase or the VM's migration state, evicted, or gone)."""
    now = {_key(h): h for v in (last if last is not None else first) for h in v.holders}
    evicted = evicted or {}
    rows = []
    for v in first:
        for h in v.holders:
            ns = h.claim.split("/", 1)[0]
            who = f"VM {h.vm}" if h.vm else ("pod " + ", ".join(h.pods) if h.pods else "(no pod)")
            cur = now.get(_key(h))
            out = [p for p in h.pods if p in evicted]
            if cur is None:
                state = "evicted, gone" if out and all(evicted[p] is None for p in out) else "gone"
            else:
                state = cur.migration or cur.phase or "allocated"
                if any(evicted.get(p) for p in out):
                    state += "; eviction refused"
            claim = h.claim if wide else h.claim.removeprefix(f"{ns}/")
            rows.append([v.name(), h.profile + (f" @{h.placement}" if h.placement else ""), claim, who, state] if wide
                        else [v.name(), who, claim, state])
    header = ["GPU", "PROFILE", "CLAIM", "HOLDER", "STATE"] if wide else ["GPU", "HOLDER", "CLAIM", "STATE"]
    return fit(header, rows, wide=wide, fold=("GPU", "HOLDER", "CLAIM", "STATE"))


def classic_table(cnodes: list[ClassicNode]) -> str:
    """One row per node and classic resource: the host driver the node's agent labelled, the kubelet's
    allocatable, what pods ask of it, what is free (the scheduler's sums) and who holds it."""
    rows = []
    for c in cnodes:
        for r in c.resources.values() or [None]:
            if r is None:
                rows.append([c.node, c.driver_version or "?", "-", "0", "0", "0", "-"])
                continue
            vms = sum(1 for h in r.holders if h.vm)
            pods = len(r.holders) - vms
            who = ", ".join(([f"{vms} VM"] if vms else []) + ([f"{pods} pod"] if pods else [])) or "-"
            rows.append([c.node + (" (cordoned)" if c.unschedulable else ""), c.driver_version or "?", short(r.name),
                         str(r.allocatable), str(r.used), str(r.free), who])
    return fit(["NODE", "DRIVER", "DEVICE PLUGIN", "TOTAL", "USED", "FREE", "HOLDERS"], rows,
               fold=("NODE", "DEVICE PLUGIN", "HOLDERS"))


def migration_lines(targets: list[VmTargets]) -> str:
    """Per VM holding a device-plugin vGPU: the nodes it can live-migrate to, and why not the others."""
    return "\n".join(fit_lines(t.text() + ("" if t.migration in (None, "migratable") else f" [{t.migration}]"))
                     for t in targets)
