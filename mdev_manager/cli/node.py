"""``vgpuctl discover | plan | apply | restore``: the node manager's commands.

Two things make a hand-run ``apply`` or ``restore`` as safe as the agent's own reconcile:

* the devices prepared DRA claims hold count as in use: they are read from the kubelet
  plugin's checkpoint (``<kubelet-root>/plugins/<driver>/checkpoint.json``, where ``serve``
  keeps it), read-only. No checkpoint: no claims. One that cannot be trusted: which devices
  claims hold cannot be told, so every existing vGPU (and every GPU on vfio-pci) counts as in
  use, and the layout can only add;
* writers take the node lock (:mod:`mdev_manager.host.lock`), so the agent's reconcile, its
  kubelet plugin and a second ``apply`` never write at the same time; the checkpoint is read
  under it.

``apply`` exits 0 when the node matches the layout, 1 when steps failed, 3 when devices in use
keep it from the layout (converging: it names them, their holders and what they block),
75 (EX_TEMPFAIL) when ``--no-wait`` finds the node lock held.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator

from mdev_manager.cli.common import KUBELET_ROOT_HELP, check_sys_root, dump, kubelet_root, node_name, open_host
from mdev_manager.cli.output import blocked_text, inventory_table, plan_text, report_text
from mdev_manager.config import load_config
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import HostIO
from mdev_manager.host.lock import NodeLock, NodeLockBusy
from mdev_manager.models import Usage
from mdev_manager.reconcile import plan_once, reconcile
from mdev_manager.restore import restore

from dra_bridge.api.names import DEFAULT_DRIVER

OUTPUTS = ["table", "json", "yaml"]
EXIT_FAILED, EXIT_CONVERGING, EXIT_LOCK_BUSY = 1, 3, 75


def add_discover(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default %(default)s)")
    p.add_argument("--types", action="store_true", help="list every vGPU type of every GPU")
    p.set_defaults(func=run_discover)


def _add_claims_arguments(p: argparse.ArgumentParser, *, writes: bool = True) -> None:
    p.add_argument("--kubelet-root", default=None, help=KUBELET_ROOT_HELP)
    p.add_argument("--driver", default=DEFAULT_DRIVER,
                   help="DRA driver name whose prepared claims count as in use (default %(default)s)")
    if writes:
        p.add_argument("--no-wait", action="store_true",
                       help=f"fail at once (exit {EXIT_LOCK_BUSY}) when another writer holds the node lock, "
                            "instead of waiting for it")


def _add_layout_arguments(p: argparse.ArgumentParser, *, writes: bool = True) -> None:
    p.add_argument("-f", "--file", required=True, help="layout file (vgpuctl/v1 or vgpu-device-manager v1)")
    p.add_argument("--layout", "--config-name", default="default",
                   help="named layout / vgpu-config to apply (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the steps without touching anything")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default %(default)s)")
    _add_claims_arguments(p, writes=writes)


def add_apply(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p)
    p.epilog = ("exit status: 0 the node matches the layout; 1 steps failed; 2 bad input; 3 converging "
                f"(devices in use keep the node from the layout); {EXIT_LOCK_BUSY} the node lock is held "
                "(--no-wait)")
    p.set_defaults(func=run_apply)


def add_plan(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p, writes=False)
    p.set_defaults(func=lambda args: run_apply(args, dry_run=True))


def add_restore(p: argparse.ArgumentParser) -> None:
    _add_claims_arguments(p)
    p.set_defaults(func=run_restore)


# ------------------------------------------------------------------ prepared claims, the lock

def _claims_usage(args, env: HostEnv, io: HostIO) -> Usage:
    """Devices the kubelet plugin's prepared claims hold (its checkpoint, read-only)."""
    from dra_bridge.kubeletplugin.checkpoint import CheckpointCorrupt, CheckpointStore
    from dra_bridge.kubeletplugin.paths import PluginPaths

    path = PluginPaths(driver=args.driver, kubelet_root=kubelet_root(args)).checkpoint
    try:
        cp = CheckpointStore(path, io).load()
    except CheckpointCorrupt as exc:
        return _cannot_tell(env, io, f"the prepared-claims checkpoint {path} cannot be read ({exc}): which devices "
                                     "DRA claims hold cannot be told, so no existing vGPU or passed-through GPU is "
                                     "removed or changed; the agent (vgpuctl serve) rebuilds it at its next start")
    return cp.usage()


def _cannot_tell(env: HostEnv, io: HostIO, warning: str) -> Usage:
    """Every device a plan could remove or change counts as in use."""
    inv = discover(env, io)
    who = ["an unreadable prepared-claims checkpoint (may be a DRA claim)"]
    mdevs = {v.id: who for v in inv.all_vgpus() if v.framework == "mdev"}
    pci = {v.id: who for v in inv.all_vgpus() if v.framework != "mdev"}
    pci |= {g.address: who for g in inv.gpus if g.driver == "vfio-pci"}
    return Usage(mdevs=mdevs, pci=pci, warnings=[warning])


def _command(args) -> str:
    return f"vgpuctl {args.cmd}" + (f" -f {args.file}" if getattr(args, "file", None) else "")


@contextmanager
def _writer(args, env: HostEnv) -> Iterator[None]:
    """Hold the node lock; waiting, say so on stderr once."""
    lock = NodeLock(env, _command(args))
    with lock.hold(wait=not args.no_wait, on_wait=lambda msg: print(msg, file=sys.stderr, flush=True)):
        yield


# ------------------------------------------------------------------ commands

def run_discover(args) -> int:
    env, io = open_host(args)
    check_sys_root(args, env, io)
    inv = discover(env, io, node=node_name(args, env))
    print(inventory_table(inv, types=args.types) if args.output == "table" else dump(inv, args.output))
    return 0


def run_apply(args, dry_run: bool = False) -> int:
    layouts = load_config(args.file, args.layout)  # bad input touches nothing, not even a simulated host
    env, io = open_host(args)
    check_sys_root(args, env, io)
    dry_run = dry_run or args.dry_run
    if not dry_run:
        # a layout the node rejects is bad input: rejected before the lock file is made (nothing written)
        plan_once(env, io, layouts, _claims_usage(args, env, io), node_name(args, env))
    try:
        with (_writer(args, env) if not dry_run else _nothing()):
            out = reconcile(env, io, layouts, dry_run=dry_run, node=node_name(args, env),
                            usage_extra=_claims_usage(args, env, io), final_inventory=args.output != "table")
    except NodeLockBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCK_BUSY
    code = 0 if dry_run and out.ok else (EXIT_FAILED if not out.ok else EXIT_CONVERGING if out.blocked else 0)
    if args.output != "table":
        print(dump(out, args.output))
        return code
    for w in out.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for i, r in enumerate(out.rounds):
        title = "Plan" if r.report is None else f"Round {i + 1}"
        print(f"{title}:\n{plan_text(r.plan)}")
        if r.report is not None and r.report.results:
            print(report_text(r.report))
    if out.blocked:
        print(blocked_text(out.blocked))
    if not dry_run:
        verdict = ("some steps failed" if not out.ok else
                   f"converging: {len(out.blocked)} device(s) in use keep the node from the layout; "
                   "apply again once they are released" if out.blocked else "node matches the layout")
        print(f"{out.changed} changes; {verdict}")
    return code


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def run_restore(args) -> int:
    env, io = open_host(args)
    check_sys_root(args, env, io)
    try:
        with _writer(args, env):
            usage = _claims_usage(args, env, io)
            for w in usage.warnings:
                print(f"warning: {w}", file=sys.stderr)
            before = len(discover(env, io).all_vgpus())
            reports = restore(env, io, usage)
            after = len(discover(env, io).all_vgpus())
    except NodeLockBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCK_BUSY
    for r in reports:
        print(report_text(r))
    # count vGPUs, not steps: enabling a GPU's VFs is a step but no device
    print(f"{after - before} devices restored")
    return 0 if all(not r.failed for r in reports) else 1
