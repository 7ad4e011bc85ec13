"""``vgpuctl doctor``: is this cluster ready for the DRA bridge? One line per check, with the fix."""

from __future__ import annotations

import argparse
import json

from vgpuctl.cli import options
from vgpuctl.output.tables import fit_lines

STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    options.add_kubeconfig(p, "the cluster to check")
    options.add_driver(p)
    options.add_output(p)


def run(args) -> int:
    # the kubernetes client is loaded here, not at the top: `vgpuctl doctor -h` stays fast
    import yaml
    from rich.text import Text

    from dra_bridge.apiclient.clusterfacts import gather
    from dra_bridge.doctor.checks import diagnose, exit_code
    from vgpuctl.output.terminal import Terminal

    findings = diagnose(gather(options.connect(args), args.driver))
    if args.output in ("json", "yaml"):
        data = [f.model_dump() for f in findings]
        print(json.dumps(data, indent=2) if args.output == "json" else yaml.safe_dump(data, sort_keys=False).rstrip())
        return exit_code(findings)
    term = Terminal()
    width = max(len(f.check) for f in findings)
    for f in findings:  # each check a paragraph in 80 columns, its detail and fix beside the names
        line = Text(fit_lines(f"{f.status:4}  {f.check:{width}}  {f.detail}", indent=" " * (width + 8)))
        if term.tty:
            line.stylize(STYLE[f.status], 0, 4)
        term.print(line)
        if f.fix and f.status != "PASS":
            term.print(Text(fit_lines(f"      {'':{width}}  fix: {f.fix}", indent=" " * (width + 13))))
    counts = {s: sum(1 for f in findings if f.status == s) for s in STYLE}
    warns = counts["WARN"]
    term.print(Text(f"{counts['PASS']} passed, {warns} warning{'' if warns == 1 else 's'}, {counts['FAIL']} failed"))
    return exit_code(findings)
