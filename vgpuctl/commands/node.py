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

``plan`` and ``apply`` print one row per GPU (what is created, removed, kept, blocked; type names,
ids with ``--show-ids``), what is blocked and why, and the verdict as the last line; every step
only with ``-v``; ``-o json|yaml`` the whole outcome for machines (:mod:`vgpuctl.output.summary`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

from vgpuctl.cli import options

if TYPE_CHECKING:  # the rest loads in the functions that use it, so `vgpuctl apply -h` stays light
    from rich.text import Text

    from mdev_manager.config import GpuLayout
    from mdev_manager.host.env import HostEnv
    from mdev_manager.models import Inventory, Usage
    from mdev_manager.reconcile import Outcome
    from vgpuctl.cli.host import Host
    from vgpuctl.output.terminal import Terminal

EXIT_FAILED, EXIT_CONVERGING, EXIT_LOCK_BUSY = 1, 3, 75


def add_discover(p: argparse.ArgumentParser) -> None:
    options.add_output(p, wide=True)
    p.add_argument("--types", action="store_true", help="list every vGPU type of every GPU, with its id")
    p.set_defaults(func=run_discover)


def _add_claims_arguments(p: argparse.ArgumentParser, *, writes: bool = True) -> None:
    options.add_kubelet_root(p, "the prepared DRA claims it holds count as in use")
    options.add_driver(p, "DRA driver name whose prepared claims count as in use")
    if writes:
        p.add_argument("--no-wait", action="store_true",
                       help=f"fail at once (exit {EXIT_LOCK_BUSY}) when another writer holds the node lock, "
                            "instead of waiting for it")


def _add_layout_arguments(p: argparse.ArgumentParser, *, writes: bool = True) -> None:
    p.add_argument("-f", "--file", required=True, help="layout file (vgpuctl/v1 or vgpu-device-manager v1)")
    p.add_argument("--layout", "--config-name", default="default",
                   help="named layout / vgpu-config to apply (default %(default)s)")
    options.add_output(p, wide=True, what="; json and yaml hold every step and result")
    p.add_argument("-v", "--verbose", dest="steps", action="store_true",
                   help="list every step" + (" with its result" if writes else "") + " before the per-GPU summary")
    p.add_argument("--show-ids", action="store_true",
                   help="show the kernel's type ids (nvidia-231, 1152) beside the type names (T4-2Q)")
    p.add_argument("--gpu", metavar="INDEX|ADDRESS",
                   help="only this GPU's entry of the layout: every other GPU is left exactly as it is")
    _add_claims_arguments(p, writes=writes)


class _NotForPlan(argparse.Action):
    """``plan --dry-run``: plan never writes, so the flag can only be a mistake; say which command has it."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is apply's option: plan never changes the node "
                     "(vgpuctl apply --dry-run prints the same plan)")


def add_apply(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan without touching anything (as plan)")
    p.epilog = ("exit status: 0 the node matches the layout; 1 steps failed, or the node read back lacks an "
                "effect; 2 bad input; 3 converging (devices in use keep the node from the layout); "
                f"{EXIT_LOCK_BUSY} the node lock is held (--no-wait); 130/143 stopped by SIGINT/SIGTERM between "
                "two writes (run it again to converge)")
    p.set_defaults(func=run_apply)


def add_plan(p: argparse.ArgumentParser) -> None:
    _add_layout_arguments(p, writes=False)
    p.add_argument("--dry-run", nargs=0, action=_NotForPlan, help=argparse.SUPPRESS)
    p.set_defaults(func=run_apply, dry_run=True, no_wait=False)


def add_restore(p: argparse.ArgumentParser) -> None:
    _add_claims_arguments(p)
    options.add_output(p, wide=True, what="; json and yaml hold every step and result")
    p.epilog = ("exit status: 0 everything saved is back (or left to the prepared claims holding it); 1 steps "
                "failed; 3 saved devices not restored, each said with why (a GPU off the bus, a GPU in use); "
                f"{EXIT_LOCK_BUSY} the node lock is held (--no-wait); 130/143 stopped by SIGINT/SIGTERM")
    p.set_defaults(func=run_restore)


# ------------------------------------------------------------------ prepared claims, the lock

def _claims_usage(args, host: Host) -> Usage:
    from vgpuctl.cli.host import prepared_usage

    return prepared_usage(host, args.driver)


def _command(args) -> str:
    return f"vgpuctl {args.cmd}" + (f" -f {args.file}" if getattr(args, "file", None) else "")


@contextmanager
def _writer(args, env: HostEnv) -> Iterator[None]:
    """Hold the node lock; waiting, say so on stderr once."""
    from mdev_manager.host.lock import NodeLock

    lock = NodeLock(env, _command(args))
    with lock.hold(wait=not args.no_wait, on_wait=lambda msg: print(msg, file=sys.stderr, flush=True)):
        yield


# ------------------------------------------------------------------ commands

def no_gpu_message(inv: Inventory, env: HostEnv) -> str | None:
    """On a host with nothing to manage (a laptop, a CI runner), say so and how to try vgpuctl anyway."""
    from mdev_manager.names import NVIDIA  # not the planner: discover loads no planning code

    if any(g.vendor_id == NVIDIA or g.types for g in inv.gpus):
        return None
    return f"no NVIDIA GPU found under {env.pci_devices}; to try vgpuctl without one, add --simulate"


def run_discover(args) -> int:
    from dra_bridge.api.names import DEFAULT_DRIVER
    from mdev_manager.discovery import discover
    from vgpuctl.cli.host import dump, number_gpus, open_host

    host = open_host(args)
    number_gpus(host, getattr(args, "driver", DEFAULT_DRIVER), writes=False)
    inv = discover(host.env, host.io, node=host.node)
    hint = None if host.simulated else no_gpu_message(inv, host.env)
    if args.output in ("json", "yaml"):
        print(dump(inv, args.output))
        if hint:
            print(f"note: {hint}", file=sys.stderr)
    elif hint and not inv.gpus:
        print(hint)
    else:
        from vgpuctl.output.text import inventory_table  # the table's code (and the planner's offers): tables only

        print(inventory_table(inv, types=args.types, wide=args.output == "wide") + (f"\nnote: {hint}" if hint else ""))
    return 0


def _no_gpu_guard(host: Host, plan):
    """Run ``plan()``; on a host without a GPU to manage, end with the plain reason instead of
    a layout's complaints about indices (or an empty plan)."""
    from mdev_manager.config import ConfigError
    from mdev_manager.discovery import discover
    from mdev_manager.reconcile import Outcome

    try:
        result = plan()
    except ConfigError:
        hint = None if host.simulated else no_gpu_message(discover(host.env, host.io), host.env)
        if hint:
            raise ValueError(hint) from None
        raise
    inv = result.inventory if isinstance(result, Outcome) else result[0]
    hint = None if host.simulated or inv is None else no_gpu_message(inv, host.env)
    if hint:
        raise ValueError(hint)
    return result


def run_apply(args) -> int:
    from mdev_manager import applied
    from mdev_manager.config import load_config
    from mdev_manager.discovery import discover
    from mdev_manager.gpurefresh import still_current
    from mdev_manager.host.fingerprint import settled_print
    from mdev_manager.host.lock import NodeLockBusy
    from mdev_manager.reconcile import plan_once, reconcile
    from vgpuctl.cli.host import dump, number_gpus, open_host
    from vgpuctl.cli.scope import scoped
    from vgpuctl.cli.signals import StopSignals
    from vgpuctl.output.terminal import Terminal

    layouts = load_config(args.file, args.layout)  # bad input touches nothing, not even a simulated host
    host = open_host(args)
    number_gpus(host, args.driver, writes=not args.dry_run)  # before any index is read
    env, io, node = host.env, host.io, host.node
    if args.gpu is not None:  # one GPU's re-layout (vgpuctl drain first): the others are not planned at all
        layouts = scoped(discover(env, io, node=node), layouts, args.gpu)
    dry_run, table = args.dry_run, args.output not in ("json", "yaml")
    term = Terminal()
    if dry_run:
        with term.status("reading the node and planning") if table else nullcontext():
            out = _no_gpu_guard(host, lambda: reconcile(
                env, io, layouts, dry_run=True, node=node, usage_extra=_claims_usage(args, host)))
        before = out.inventory
    else:
        # a layout the node rejects is bad input: rejected before the lock file is made (nothing written);
        # no users are looked for: this plan is never run (the one run is made on users scanned under the lock)
        with term.status("reading the node and planning") if table else nullcontext():
            seen = settled_print(env, io)
            looked, first, _ = _no_gpu_guard(host, lambda: plan_once(env, io, layouts, _claims_usage(args, host),
                                                                     node, scan=False))
        try:
            with _writer(args, env), StopSignals() as signals:
                # under the lock: another writer (or mdevctl, a rebind by hand) may have changed the node
                # while this one waited; what was read before is planned on again only if nothing shows so
                before = still_current(env, io, looked, seen) or discover(env, io, node=node)
                if args.gpu is None:  # one GPU's entry is not what the node is for
                    applied.record(env, io, layouts, name=args.layout, source=str(args.file), by="vgpuctl apply")
                with term.progress("applying", len(first.actions)) as on_step:
                    out = reconcile(env, io, layouts, node=node, usage_extra=_claims_usage(args, host),
                                    on_step=on_step, stop=signals.pending, read_back=True, inventory=before)
        except NodeLockBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_LOCK_BUSY
        if out.stopped:
            return _stopped(args, out, signals.signum)
    code = 0 if dry_run and out.ok else (EXIT_FAILED if not out.ok else EXIT_CONVERGING if out.blocked else 0)
    if not table:
        print(dump(out, args.output))
        return code
    for w in out.warnings:
        print(f"warning: {w}", file=sys.stderr)
    _print_outcome(args, term, layouts, before, out, node)
    return code


def _stopped(args, out: Outcome, signum: int) -> int:
    """A signal ended the apply before its next write: one line with what was done and what is left."""
    from vgpuctl.cli.host import dump

    if args.output in ("json", "yaml"):
        print(dump(out, args.output))
    half = out.interrupted
    left = out.left - (1 if half else 0)
    print(f"{out.stopped}: stopped after {out.changed} change(s), {left} step(s) not started"
          + (f", one stopped between two of its writes ({half})" if half else "")
          + f"; the node is as a stop between any two writes leaves it, so `{_command(args)}` again converges",
          file=sys.stderr)
    return 128 + signum


def _print_outcome(args, term: Terminal, layouts: list[GpuLayout], before: Inventory, out: Outcome,
                   node: str) -> None:
    """Every step with ``-v``; then one row per GPU, what is blocked and why; the verdict last."""
    from rich.text import Text

    from vgpuctl.output.summary import summary
    from vgpuctl.output.text import TypeNames, results_text, steps_text

    names = TypeNames([before, out.inventory], show_ids=args.show_ids)
    verbose = args.steps or args.verbose
    if verbose:
        for i, r in enumerate(out.rounds):
            text = (f"Steps:\n{steps_text(r.plan, names)}" if r.report is None
                    else f"Round {i + 1}:\n{results_text(r.plan, r.report, names)}")
            term.print(Text(text))
    where = f"layout {args.layout} of {args.file}" + (f" on node {node}" if node else "")
    term.print(Text(f"{'Plan' if args.dry_run else 'Applied'}: {where}", style="bold"),
               *summary(before, layouts, out.rounds, out.blocked, names, after=out.inventory, verbose=verbose,
                        wide=args.output == "wide"))
    rounds = _rounds(out)
    if rounds:
        term.print(Text(rounds))
    term.print(_verdict(args.dry_run, out, verbose))


def _rounds(out: Outcome) -> str:
    """Where apply took steps in more than one round: how many in each, so its count of changes (steps
    taken) reads against plan's (the first round's steps: later ones are planned once the GPUs are
    read again)."""
    taken = [r.report.changed for r in out.rounds if r.report]
    if sum(1 for n in taken if n) < 2:
        return ""
    from vgpuctl.output.tables import fit_lines

    return fit_lines("steps taken: " + ", ".join(f"{n} in round {i}" + (" (the steps plan counts)" if i == 1 else "")
                                                 for i, n in enumerate(taken, 1) if n))


def _converging(blocked) -> str:
    """What keeps the node from the layout, devices in use and GPUs off the bus apart, and when to apply again."""
    used = sum(1 for b in blocked if not b.gone)
    gone = len(blocked) - used
    what = [f"{used} device{'s' if used != 1 else ''} in use" if used else "",
            f"{gone} GPU{'s' if gone != 1 else ''} off the bus" if gone else ""]
    when = ["the device is released" if used == 1 else "they are released" if used else "",
            "the GPU is back" if gone == 1 else "the GPUs are back" if gone else ""]
    keep = "keeps" if used + gone == 1 else "keep"
    return (f"converging: {' and '.join(w for w in what if w)} {keep} the node from the layout; apply again once "
            f"{' and '.join(w for w in when if w)}")


def _verdict(dry_run: bool, out: Outcome, verbose: bool) -> Text:
    """The last line, which scripts and the tests read: what was done, whether the node matches."""
    from rich.text import Text

    converging = _converging(out.blocked)
    if dry_run:
        steps = sum(len(r.plan.actions) for r in out.rounds)
        if steps:
            return Text(f"{steps} steps to take; nothing was changed (apply takes them"
                        + ("" if verbose else "; -v lists them") + ")")
        return Text("nothing to change; " + (converging if out.blocked else "node matches the layout"),
                    style="yellow" if out.blocked else "green")
    results = [x for r in out.rounds if r.report for x in r.report.results]
    changes = f"{out.changed} change{'' if out.changed == 1 else 's'}"
    failed = sum(1 for x in results if not x.ok and not x.skipped)
    skipped = sum(1 for x in results if x.skipped)
    if failed or skipped:  # what the read-back still wants includes their work: never called "reported done"
        return Text(f"{changes}; {failed} step(s) failed" + (f", {skipped} skipped after them" if skipped
                    else "") + "; apply again once the cause is fixed", style="bold red")
    if out.unapplied:
        return Text(f"{changes}; read back, the node still needs {len(out.unapplied)} step(s) the "
                    f"apply reported done: {'; '.join(out.unapplied[:3])}" + (" ..." if len(out.unapplied) > 3 else ""),
                    style="bold red")
    if not out.ok:
        return Text(f"{changes}; some steps failed", style="bold red")
    if out.blocked:
        return Text(f"{changes}; {converging}", style="bold yellow")
    return Text(f"{changes}; node matches the layout", style="bold green")


def run_restore(args) -> int:
    import yaml

    from mdev_manager.discovery import discover
    from mdev_manager.host.lock import NodeLockBusy
    from mdev_manager.restore import restore, unrestored
    from vgpuctl.cli.host import number_gpus, open_host
    from vgpuctl.cli.signals import StopSignals
    from vgpuctl.output.tables import fit_text
    from vgpuctl.output.terminal import Terminal
    from vgpuctl.output.text import report_text

    host = open_host(args)
    number_gpus(host, args.driver, writes=True)
    env, io = host.env, host.io
    try:
        with _writer(args, env), StopSignals() as signals:
            usage = _claims_usage(args, host)
            for w in usage.warnings:
                print(f"warning: {w}", file=sys.stderr)
            before = len(discover(env, io).all_vgpus())
            with Terminal().progress("restoring", 0) as on_step:  # a bar on a terminal once it takes a while
                reports = restore(env, io, usage, stop=signals.pending, on_step=on_step)
            after = len(discover(env, io).all_vgpus())
            left = [] if signals.signum else unrestored(env, io, usage)
    except NodeLockBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCK_BUSY
    if signals.signum:
        print(f"{signals.pending()}: stopped after restoring {after - before} device(s); `vgpuctl restore` again "
              "finishes it", file=sys.stderr)
        return 128 + signals.signum
    code = EXIT_FAILED if any(r.failed for r in reports) else EXIT_CONVERGING if left else 0
    if args.output in ("json", "yaml"):
        data = {"restored": after - before, "ok": code == 0, "notRestored": left,
                "rounds": [r.model_dump(mode="json") for r in reports]}
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
        return code
    for r in reports:
        print(fit_text(report_text(r)) if args.output == "table" else report_text(r))  # -o wide: whole lines
    for line in left:
        print(fit_text(line) if args.output == "table" else line)
    # count vGPUs, not steps: enabling a GPU's VFs is a step but no device
    n = after - before
    print(f"{n} device{'' if n == 1 else 's'} restored" + ("; some saved ones are not (above)" if left else ""))
    return code
