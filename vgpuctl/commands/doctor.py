"""``vgpuctl doctor``: is this cluster ready for the DRA bridge? One line per check, with the fix."""

from __future__ import annotations

import argparse
import json

from rich.text import Text

from vgpuctl.output.terminal import Terminal

STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
    p.add_argument("--driver", default="vgpu.kubevirt.io", help="DRA driver name (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")


def run(args) -> int:
    from dra_bridge.apiclient.client import connect
    from dra_bridge.apiclient.clusterfacts import gather
    from dra_bridge.doctor.checks import diagnose, exit_code

    findings = diagnose(gather(connect(args.kubeconfig), args.driver))
    if args.json:
        print(json.dumps([f.model_dump() for f in findings], indent=2))
        return exit_code(findings)
    term = Terminal()
    width = max(len(f.check) for f in findings)
    for f in findings:
        line = Text()
        line.append(f"{f.status:4}", style=STYLE[f.status] if term.tty else None)
        line.append(f"  {f.check:{width}}  {f.detail}")
        term.print(line)
        if f.fix and f.status != "PASS":
            term.print(Text(f"      {'':{width}}  fix: {f.fix}"))
    counts = {s: sum(1 for f in findings if f.status == s) for s in STYLE}
    term.print(Text(f"{counts['PASS']} passed, {counts['WARN']} warnings, {counts['FAIL']} failed"))
    return exit_code(findings)
