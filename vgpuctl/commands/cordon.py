"""``vgpuctl cordon | drain | uncordon``: take a GPU (or every GPU of a node) out of service for a
driver upgrade or a re-layout while the node's other GPUs keep serving, and put it back.

``cordon`` records the GPUs in the node's cordon annotation, which the node agent reads through a
watch: where the API server keeps device taints (KEP-5055) it taints every device of the GPU,
elsewhere it withdraws the GPU's free devices; a device a claim holds stays published. A whole node
also gets a DeviceTaintRule (driver and pool) where the server serves one, which holds even while
the agent is down. Either way the scheduler allocates nothing new there, and the command waits
(``--wait``) until the published slices show it: exit 0, or 3 while the agent has not republished.

``drain`` cordons, then lists the GPU's holders (claims, pods, VMs with their live-migration state)
and waits for them to go (``--timeout``, progress on a terminal, else the holders once as it starts to
wait; with no wait the report alone lists them). It evicts pods only when asked (``--evict``:
policy/v1 Evictions, so PodDisruptionBudgets decide; a VM's virt-launcher pod only when the VM can
live-migrate, which KubeVirt answers with a migration) or through ``--effect NoExecute`` (the
cluster's device-taint controller evicts, VMs included). It never touches a device on the node: a
vGPU in use stays. Exit 0 once nothing holds the GPUs, 3 when holders remain.
``--migrate`` creates a VirtualMachineInstanceMigration per LiveMigratable VM and reports each; a whole
node's drain counts its device-plugin pods as holders too, and is refused before anything is cordoned
when a VM there has no node to go to (:mod:`dra_bridge.scheduling.classic` says why per node).

``uncordon`` removes the GPUs from the annotation (and the node's rule): they take allocations again.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vgpuctl.cli import options
from vgpuctl.output.tables import fit_lines

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from rich.status import Status

    from dra_bridge.apiclient.maintenance import ClusterState
    from dra_bridge.scheduling.gpuview import GpuView, MigrationOutcome
    from vgpuctl.cli.gpus import Session
    from vgpuctl.output.terminal import Terminal

EXIT_PENDING = 3
RULE_PREFIX = "vgpuctl-cordon-"


def _common(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("gpus", nargs="*", metavar="GPU",
                   help=f"the GPU to {verb}: NODE/INDEX or NODE/PCI-ADDRESS (INDEX or PCI-ADDRESS with --node)")
    p.add_argument("--node", metavar="NODE", help=f"the node; without a GPU: {verb} every GPU of it")
    options.add_kubeconfig(p)
    options.add_driver(p)
    p.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the node agent to republish the GPUs (0: do not wait)")
    options.add_output(p, wide=True)


def add_cordon(p: argparse.ArgumentParser) -> None:
    from dra_bridge.api.compat import TAINT_EFFECTS

    _common(p, "cordon")
    p.add_argument("--effect", choices=TAINT_EFFECTS, default=TAINT_EFFECTS[0],
                   help="NoSchedule: no new allocation; NoExecute (where the server keeps taints): the "
                        "cluster's device-taint controller also evicts the pods using the GPU, VMs included")
    p.add_argument("--reason", help="why (shown by kubectl vgpu and in the annotation)")
    p.set_defaults(func=run_cordon)


def add_uncordon(p: argparse.ArgumentParser) -> None:
    _common(p, "uncordon")
    p.set_defaults(func=run_uncordon)


def add_drain(p: argparse.ArgumentParser) -> None:
    from dra_bridge.api.compat import TAINT_EFFECTS

    _common(p, "drain")
    p.add_argument("--effect", choices=TAINT_EFFECTS, default=TAINT_EFFECTS[0],
                   help="the cordon's taint effect (NoExecute: the cluster evicts, VMs included)")
    p.add_argument("--reason", help="why (shown by kubectl vgpu and in the annotation)")
    p.add_argument("--evict", action="store_true",
                   help="evict the pods holding the GPUs (policy/v1 Eviction); a VM's pod only when it can "
                        "live-migrate (KubeVirt migrates it); other VMs are waited for")
    p.add_argument("--migrate", action="store_true",
                   help="live-migrate each VM on the GPUs that KubeVirt reports LiveMigratable (a "
                        "VirtualMachineInstanceMigration each; KubeVirt picks the target) and report per VM: "
                        "migrated to node X, failed (reason), not migratable (reason); pods only with --evict")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long to wait for the holders to go")
    p.set_defaults(func=run_drain)


# ------------------------------------------------------------------ the cordon record

def _rule(node: str, pool: str, driver: str, effect: str, since: str) -> dict:
    from dra_bridge.api.names import TAINT_KEY_CORDON

    return {"apiVersion": "", "kind": "DeviceTaintRule",
            "metadata": {"name": f"{RULE_PREFIX}{node}" + ("" if pool == node else f"-{pool}"),
                         "labels": {"app.kubernetes.io/managed-by": "vgpuctl", "vgpu.kubevirt.io/node": node}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool},
                     "taint": {"key": TAINT_KEY_CORDON, "effect": effect, "timeAdded": since}}}


def _pools(s: Session, node: str) -> list[str]:
    st = s.last or s.maintenance.state()
    names = ((x["spec"].get("pool") or {}).get("name") for x in st.slices
             if x["spec"].get("nodeName") == node and x["spec"].get("driver") == s.driver)
    return sorted({n for n in names if isinstance(n, str)}) or [node]


def cordon(s: Session, targets: dict, effect: str, reason: str | None) -> list[str]:
    """Write the cordon; a whole node's also as DeviceTaintRules where served. Returns notes."""
    from dra_bridge.pool.cordon import NODE, CordonEntry, format_cordon, parse_cordon

    m = s.maintenance
    notes = []
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for node, gpus in targets.items():
        current = parse_cordon(m.node_cordon(node))
        for addr, index in gpus.items():
            current[addr] = CordonEntry(effect=effect, since=since, reason=reason, index=index)
        m.set_cordon(node, format_cordon(current))
        if NODE in gpus:
            for pool in _pools(s, node):
                rule = _rule(node, pool, s.driver, effect, since)
                rule["apiVersion"] = m.rule_api_version
                if m.rules_served(rule):
                    m.put_rule(rule)
                    notes.append(f"DeviceTaintRule {rule['metadata']['name']} taints pool {pool} "
                                 f"({m.rule_api_version})")
    return notes


def uncordon(s: Session, targets: dict) -> None:
    from dra_bridge.pool.cordon import NODE, format_cordon, parse_cordon

    m = s.maintenance
    for node, gpus in targets.items():
        current = parse_cordon(m.node_cordon(node))
        if NODE in current and NODE not in gpus:
            raise ValueError(f"node {node} is cordoned as a whole: vgpuctl uncordon --node {node}")
        left = {} if NODE in gpus else {a: e for a, e in current.items() if a not in gpus}
        m.set_cordon(node, format_cordon(left))
        if NODE in gpus:
            for r in m.taint_rules():
                if r["metadata"]["name"].startswith(RULE_PREFIX) and \
                        (r["metadata"].get("labels") or {}).get("vgpu.kubevirt.io/node") == node:
                    m.delete_rule(r["metadata"]["name"])


def _last(s: Session) -> ClusterState:
    """The cluster's state the session's last views came from (``s.views()`` reads it)."""
    if s.last is None:
        raise RuntimeError("no views read yet: Session.views() first")
    return s.last


def _targets(args: argparse.Namespace, s: Session) -> dict[str, dict[str, int | None]]:
    from vgpuctl.cli.gpus import resolve

    views = s.views()
    st = _last(s)
    return resolve(args.gpus, args.node, views, st.cordons, st.nodes)


def _effective(s: Session, targets: dict, *, cordoned: bool) -> tuple[bool, list[GpuView]]:
    """Whether the change took effect: every target node's agent published the cordon as written
    (``cordon.applied``), or, cordoning, a DeviceTaintRule covers the GPU already."""
    from vgpuctl.cli.gpus import selected

    views = selected(s.views(list(targets)), targets)
    st = _last(s)
    acted = all(st.applied.get(n) == st.cordons.get(n) for n in targets)
    if cordoned:
        ok = all(v.cordon_how == "rule" or (acted and v.cordon_how in ("taint", "withdrawn")) for v in views)
    else:
        ok = acted and all(v.cordon is None for v in views)
    return ok, views


def _await(s: Session, targets: dict, seconds: float, term: Terminal, *,
           cordoned: bool) -> tuple[bool, list[GpuView]]:
    from vgpuctl.cli.gpus import wait_until

    last: tuple[bool, list[GpuView]] = (False, [])  # wait_until asks done() at least once

    def done() -> bool:
        nonlocal last
        last = _effective(s, targets, cordoned=cordoned)
        return last[0]

    with term.status("waiting for the node agent to republish the GPUs"):
        wait_until(done, seconds)
    return last


def _verdict(ok: bool, cordoned: bool, seconds: float, views=()) -> str:
    from dra_bridge.pool.cordon import NO_EXECUTE

    if ok:
        # a NoExecute taint (the agent's, or a DeviceTaintRule) is what kube-controller-manager evicts for;
        # a withdrawal (the server keeps no taints) only holds back the free devices
        evicts = any(v.cordon == NO_EXECUTE and v.cordon_how in ("taint", "rule") for v in views)
        return ("cordoned: no new allocation on these GPUs; the cluster evicts the pods and VMs whose claims "
                "use them and do not tolerate the NoExecute taint" if cordoned and evicts else
                "cordoned: no new allocation on these GPUs; what runs there keeps running" if cordoned else
                "uncordoned: the GPUs take allocations again")
    if cordoned:
        return (f"recorded, but the node agent has not republished the GPUs within {seconds:g}s (is vgpuctl serve "
                "running there?); they take allocations until it does")
    return (f"recorded; the GPUs take allocations again once the node agent republishes them (not within "
            f"{seconds:g}s)")


def run_cordon(args) -> int:
    from vgpuctl.cli.gpus import Session
    from vgpuctl.output.terminal import Terminal

    s = Session.open(args)
    targets = _targets(args, s)
    notes = cordon(s, targets, args.effect, args.reason)
    ok, views = _await(s, targets, args.wait, Terminal(), cordoned=True)
    _report(args, views, notes, _verdict(ok, True, args.wait, views), ok)
    return 0 if ok else EXIT_PENDING


def run_uncordon(args) -> int:
    from vgpuctl.cli.gpus import Session
    from vgpuctl.output.terminal import Terminal

    s = Session.open(args)
    targets = _targets(args, s)
    uncordon(s, targets)
    ok, views = _await(s, targets, args.wait, Terminal(), cordoned=False)
    _report(args, views, [], _verdict(ok, False, args.wait), ok)
    return 0 if ok else EXIT_PENDING


def _report(args, views, notes: list[str], verdict: str, ok: bool) -> None:
    import yaml
    from rich.text import Text

    from vgpuctl.cli.gpus import gpu_table
    from vgpuctl.output.terminal import Terminal

    if args.output in ("json", "yaml"):
        data = {"done": ok, "gpus": [v.to_dict() for v in views], "notes": notes, "verdict": verdict}
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
        return
    term = Terminal()
    if views:
        term.print(Text(gpu_table(views, wide=args.output == "wide")))
    for n in notes:
        term.print(Text(fit_lines(f"note: {n}")))
    term.print(Text(fit_lines(verdict)))


def run_drain(args) -> int:
    from dra_bridge.pool.cordon import NODE
    from dra_bridge.scheduling.classic import classic_views
    from dra_bridge.scheduling.gpuview import plan_drain
    from vgpuctl.cli.gpus import Session, selected, wait_until
    from vgpuctl.output.terminal import Terminal

    s = Session.open(args)
    targets = _targets(args, s)
    # a whole node's drain takes its device-plugin holders too (not attributed to a GPU from the API)
    whole = [n for n, gpus in targets.items() if NODE in gpus]
    if args.migrate:
        stuck = _without_target(s, whole, list(targets))  # before anything is written
        if stuck:
            return _refusal_report(args, stuck)
    term = Terminal()
    notes = cordon(s, targets, args.effect, args.reason)
    ok, _ = _await(s, targets, args.wait, term, cordoned=True)
    if not ok:
        notes.append(_verdict(False, True, args.wait))
    notes += _unattributed(s, [n for n in targets if n not in whole])

    def views_now():
        views = selected(s.views(list(targets)), targets)
        return views + classic_views(s.classic(), whole)

    first = views_now()
    evicted: dict[str, str | None] = {}
    state = {"views": first}
    migrations = Migrations(s) if args.migrate else None

    def drained() -> bool:
        views = views_now()
        if migrations is not None:
            migrations.step(views)
        plan = plan_drain(views, evict=args.evict, migrate=args.migrate)
        for pod in plan.evict:
            if pod not in evicted:
                ns, name = pod.split("/", 1)
                evicted[pod] = s.maintenance.evict(ns, name)
        state["views"], state["plan"] = views, plan
        return plan.done

    def progress() -> None:
        vms = [h for v in state["views"] for h in v.holders if h.vm]
        moving = migrations.text() if migrations is not None else ""
        status.update(f"draining: {sum(len(v.holders) for v in state['views'])} holder(s) left"
                      + (f"; {moving}" if moving else
                         f"; VMs: {', '.join(f'{h.vm} ({h.migration})' for h in vms[:3])}" if vms else ""))

    if not term.tty and args.timeout > 0:  # no live status line: say at the start what the wait is for
        _waiting_for(args, first)  # (stderr beside -o json); with no wait, the report alone lists them
    with _Status(term) as status:
        done = wait_until(drained, args.timeout, progress, every=1.0)
    outcomes = migrations.finish(done) if migrations is not None else []
    return _drain_report(args, first, state["views"], evicted, notes, done, outcomes)


def _without_target(s: Session, whole: list[str], nodes: list[str]) -> list:
    """The LiveMigratable VMs holding device-plugin vGPUs on the nodes drained whole that no other node
    can take, the VMs leaving together (:func:`~dra_bridge.scheduling.classic.drain_targets`): a drain
    that would strand them is refused before anything is cordoned or migrated."""
    from dra_bridge.scheduling.classic import drain_targets

    s.views(nodes)  # the cluster's state as it is now
    return [t for t in drain_targets(s.classic(), whole) if not t.possible]


def _unattributed(s: Session, nodes: list[str]) -> list[str]:
    """A GPU's drain on a node whose pods also hold device-plugin vGPUs: which GPU those are on is the
    kubelet's to know, not the API's, so they are not waited for; said, with the way to include them."""
    from dra_bridge.scheduling.classic import classic_views

    return [f"{v.node}: {len(v.holders)} pod(s) hold device-plugin devices not attributed to a GPU; not waited "
            f"for (vgpuctl drain --node {v.node} includes them)" for v in classic_views(s.classic(), nodes)]


def _refusal_report(args, stuck: list) -> int:
    import yaml

    from vgpuctl.output.terminal import Terminal

    verdict = (f"not drained: {len(stuck)} VM(s) could not live-migrate to any node; nothing was cordoned or "
               "migrated (kubectl vgpu shows each node's reason)")
    if args.output in ("json", "yaml"):
        data = {"drained": False, "refused": {t.vm: t.to_dict() for t in stuck}, "verdict": verdict}
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
        return EXIT_PENDING
    from rich.text import Text

    term = Terminal()
    for t in stuck:
        term.print(Text(fit_lines(t.text()), style="yellow"))
    term.print(Text(fit_lines(verdict), style="yellow"))
    return EXIT_PENDING


class Migrations:
    """``drain --migrate``: one VirtualMachineInstanceMigration per migratable VM on the GPUs, created
    once, followed to its end; a VM that cannot migrate is said so, with KubeVirt's reason."""

    def __init__(self, s: Session):
        self.m = s.maintenance  # drain opens the session to write
        self.started: dict[str, str] = {}  # VM (ns/name) -> its migration's name
        self.outcomes: dict[str, MigrationOutcome] = {}

    def step(self, views) -> None:
        from dra_bridge.scheduling.gpuview import MigrationOutcome, migration_outcome

        for h in (h for v in views for h in v.holders if h.vm):
            vm = h.vm
            if vm in self.outcomes and self.outcomes[vm].result != "running":
                continue
            ns, name = vm.split("/", 1)
            if vm not in self.started:
                if h.migration != "migratable":
                    why = (h.migration or "").removeprefix("not migratable").strip(" ()") or h.migration
                    self.outcomes[vm] = MigrationOutcome(vm, "not-migratable", reason=why)
                    continue
                made, refused = self.m.migrate(ns, name)
                if made is None:
                    self.outcomes[vm] = MigrationOutcome(vm, "failed", reason=f"not created: {refused}")
                    continue
                self.started[vm] = made
            self.outcomes[vm] = migration_outcome(vm, self.m.migration(ns, self.started[vm]), self.m.vmi(ns, name))
        for vm, made in self.started.items():  # a VM gone from the GPUs: its migration's last word
            if self.outcomes[vm].result == "running":
                ns, name = vm.split("/", 1)
                self.outcomes[vm] = migration_outcome(vm, self.m.migration(ns, made), self.m.vmi(ns, name))

    def text(self) -> str:
        running = [o for o in self.outcomes.values() if o.result == "running"]
        return ", ".join(f"{o.vm} migrating ({o.reason})" for o in running[:3])

    def finish(self, done: bool) -> list[MigrationOutcome]:
        from dra_bridge.scheduling.gpuview import MigrationOutcome

        out = []
        for vm in sorted(self.outcomes):
            o = self.outcomes[vm]
            out.append(MigrationOutcome(vm, "timed-out", o.node, o.reason) if o.result == "running" else o)
        return out


def _waiting_for(args, first) -> None:
    """Where no status line shows progress (a pipe, a CI log): the holders the drain waits for, once,
    before it waits (the report follows at the end)."""
    from vgpuctl.cli.gpus import holder_rows

    n = sum(len(v.holders) for v in first)
    if not n:
        return
    block = (fit_lines(f"waiting up to {args.timeout:g}s for {n} holder(s) to leave"
                       + (" (evicting their pods)" if args.evict else "") + ":")
             + "\n" + holder_rows(first, wide=args.output == "wide"))
    print(block, file=sys.stderr if args.output in ("json", "yaml") else sys.stdout, flush=True)


class _Status:
    """A live status line on a terminal; nothing in a pipe."""

    def __init__(self, term: Terminal):
        self.term = term
        self._status: Status | None = None

    def __enter__(self):
        if self.term.tty:
            self._status = self.term.console.status("draining")
            self._status.__enter__()
        return self

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(text)

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)


def _drain_report(args, first, last, evicted: dict, notes: list[str], done: bool,
                  migrations: list[MigrationOutcome] | None = None) -> int:
    import yaml
    from rich.text import Text

    from vgpuctl.cli.gpus import gpu_table, holder_rows
    from vgpuctl.output.terminal import Terminal

    migrations = migrations or []
    if args.output in ("json", "yaml"):
        data = {"drained": done, "gpus": [v.to_dict() for v in last],
                "heldBefore": [asdict(h) for v in first for h in v.holders],
                "evicted": {p: (r or "accepted") for p, r in evicted.items()}, "notes": notes}
        if args.migrate:
            data["migrations"] = {o.vm: o.to_dict() for o in migrations}
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
        return 0 if done else EXIT_PENDING
    term = Terminal()
    wide = args.output == "wide"
    if last:  # a node drained for its device-plugin pods alone has no DRA GPU to show
        term.print(Text(gpu_table(last, wide=wide) + "\n"))
    if any(v.holders for v in first):
        term.print(Text("Holders:\n" + holder_rows(first, last, evicted, wide=wide)))
    for pod, refusal in evicted.items():
        term.print(Text(fit_lines(f"evicted pod {pod} (policy/v1 Eviction)" if refusal is None
                                  else f"eviction of {pod} refused: {refusal}")))
    for o in migrations:
        term.print(Text(fit_lines(o.text()), style="green" if o.result == "migrated" else "yellow"))
    for n in notes:
        term.print(Text(fit_lines(f"note: {n}")))
    left = sum(len(v.holders) for v in last)
    if done:
        term.print(Text(fit_lines("drained: nothing holds these GPUs; they stay cordoned (vgpuctl uncordon puts "
                                  "them back)"), style="green"))
        return 0
    if not args.evict and any(h.pods and not h.vm for v in last for h in v.holders):
        print("hint: --evict evicts the pods (policy/v1 Eviction)", file=sys.stderr)
    term.print(Text(fit_lines(f"not drained: {left} holder(s) still hold these GPUs after {args.timeout:g}s; "
                              "drain again to wait more"), style="yellow"))
    return EXIT_PENDING
