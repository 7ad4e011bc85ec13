"""``vgpuctl discover | plan | apply | restore``: the node manager's commands."""

from __future__ import annotations

import argparse
import sys

from mdev_manager.cli.common import check_sys_root, dump, node_name, open_host
from mdev_manager.cli.output import inventory_table, plan_text, report_text
from mdev_manager.config import load_config
from mdev_manager.discovery import discover
from mdev_manager.reconcile import reconcile
from mdev_manager.restore import restore

OUTPUTS = ["table", "json", "yaml"]


def add_discover(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default %(default)s)")
    p.add_argument("--types", action="store_true", help="list every vGPU type of every GPU")
    p.set_defaults(func=run_discover)


def _add_layout_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", required=True, help="layout file (vgpuctl/v1 or vgpu-device-manager v1)")
    p.add_argument("--layout", "--config-name", default="default",
                   help="named layout / vgpu-config to apply (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the steps without touching anything")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default %(default)s)")


def add_apply(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p)
    p.set_defaults(func=run_apply)


def add_plan(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p)
    p.set_defaults(func=lambda args: run_apply(args, dry_run=True))


def add_restore(p: argparse.ArgumentParser) -> None:
    p.set_defaults(func=run_restore)


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
    out = reconcile(env, io, layouts, dry_run=dry_run or args.dry_run, node=node_name(args, env),
                    final_inventory=args.output != "table")
    if args.output != "table":
        print(dump(out, args.output))
        return 0 if out.ok else 1
    for w in out.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for i, r in enumerate(out.rounds):
        title = "Plan" if r.report is None else f"Round {i + 1}"
        print(f"{title}:\n{plan_text(r.plan)}")
        if r.report is not None and r.report.results:
            print(report_text(r.report))
    if not (dry_run or args.dry_run):
        print(f"{out.changed} changes; " + ("node matches the layout" if out.ok else "some steps failed"))
    return 0 if out.ok else 1


def run_restore(args) -> int:
    env, io = open_host(args)
    check_sys_root(args, env, io)
    before = len(discover(env, io).all_vgpus())
    reports = restore(env, io)
    for r in reports:
        print(report_text(r))
    # count vGPUs, not steps: enabling a GPU's VFs is a step but no device
    print(f"{len(discover(env, io).all_vgpus()) - before} devices restored")
    return 0 if all(not r.failed for r in reports) else 1
