"""``vgpuctl conformance``: the KAR-0003 / KAR-0004 checks; the report as a table, JSON or JUnit XML."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from dra_bridge.api.compat import parse_gates
from vgpuctl.cli import options
from vgpuctl.cli.extras import require_sim
from vgpuctl.output.tables import fit, fit_lines

if TYPE_CHECKING:  # loaded where used: a command's -h stays light
    from datetime import datetime

    from dra_bridge.conformance.report import ConformanceReport


def add_arguments(c: argparse.ArgumentParser) -> None:
    from dra_bridge.api.names import PASSTHROUGH_CLASS, VGPU_CLASS
    from dra_bridge.conformance import DEFAULT_IMAGE

    options.add_kubeconfig(c, "run against a real cluster (so does a set $KUBECONFIG alone)")
    c.add_argument("--junit", default="", metavar="FILE",
                   help="also write the report as JUnit XML to FILE (default: none)")
    options.add_output(c)
    c.add_argument("--json-events", metavar="FILE",
                   help="also write the run as Go's test2json events (what `go test -json` prints, the JSON "
                        "kubernetes-sigs/ai-conformance's harness produces), one check per subtest")
    c.add_argument("--profile", help="the vGPU profile to share (default: the GPU/profile needing the fewest workloads)")
    c.add_argument("--node", help="only GPUs of this node")
    c.add_argument("--max-workloads", type=int, default=8, help="at most this many workloads on one GPU (check 2)")
    c.add_argument("--namespace", help="namespace to create (default vgpuctl-conformance-<random>)")
    c.add_argument("--image", default=DEFAULT_IMAGE, help="workload image, needs sh (default %(default)s)")
    options.add_driver(c)
    c.add_argument("--vgpu-class", help=f"DeviceClass of vGPUs (default {VGPU_CLASS})")
    c.add_argument("--passthrough-class", help=f"DeviceClass of whole GPUs (default {PASSTHROUGH_CLASS})")
    c.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each workload")
    c.add_argument("--settle", type=float, default=15.0, help="seconds a blocked workload must stay Pending")
    options.add_server_version(c, "the simulated cluster's API server")
    options.add_feature_gates(c)
    c.add_argument("--print-healthcheck", action="store_true", help="print the health-check script and exit")


def run(args) -> int:
    from dra_bridge.conformance import healthcheck
    from dra_bridge.conformance.backend import KubeBackend
    from dra_bridge.conformance.checks import run_conformance

    if args.print_healthcheck:
        print(healthcheck.SCRIPT, end="")
        return 0
    for flag, path in (("--junit", args.junit), ("--json-events", args.json_events)):
        _writable(flag, path)  # before the checks run (minutes, namespaces made), not after
    kw = dict(profile=args.profile, node=args.node, max_workloads=args.max_workloads)
    if options.reads_cluster(args, env=True):  # $KUBECONFIG set: its cluster, as kubectl reads it
        from dra_bridge.scheduling.selectors import default_selectors

        backend = KubeBackend(options.connect(args), namespace=args.namespace, image=args.image,
                              driver=args.driver, vgpu_class=args.vgpu_class, passthrough_class=args.passthrough_class,
                              timeout=args.timeout, settle=args.settle, selectors=default_selectors(),
                              label=f"cluster ({args.kubeconfig or os.environ.get('KUBECONFIG') or 'default kubeconfig'})")
        rep = run_conformance(backend, **kw)
    else:
        require_sim("vgpuctl conformance on the simulated cluster (give --kubeconfig for a real one)")
        from dra_bridge.sim.scenarios import run_conformance_simulated  # the [sim] extra
        from kubevirt_templates.render import render

        rep = run_conformance_simulated(render=render, version=args.server_version, feature_gates=parse_gates(args.feature_gates),
                                        **kw)
    return report(args, rep)


def report(args: argparse.Namespace, rep: ConformanceReport) -> int:
    """The report written where asked (``--junit``, ``--json-events``: nowhere else) and printed as
    ``--output`` says; the exit code (1: not conformant)."""
    import yaml

    if args.junit:
        with open(args.junit, "w") as f:
            f.write(junit(rep))
    if args.json_events:
        with open(args.json_events, "w") as f:
            f.write(test2json(rep))
    machine = args.output in ("json", "yaml")
    if args.output == "yaml":
        print(yaml.safe_dump(rep.to_dict(), sort_keys=False).rstrip())
    else:
        print(json.dumps(rep.to_dict(), indent=2) if machine else table(rep))
    if args.junit and not machine:
        print(f"JUnit XML: {args.junit}")
    return 0 if rep.ok else 1


def _writable(flag: str, path: str | None) -> None:
    """A report file that could not be written is bad input, said before anything runs."""
    if not path:
        return
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory: name a file to write the report to")
    if not os.path.isdir(where):
        raise ValueError(f"{flag} {path}: directory {where} does not exist: create it, or name a file in one that does")
    if not os.access(where, os.W_OK):
        raise ValueError(f"{flag} {path}: directory {where} is not writable: name a file in one you can write")


def table(rep: ConformanceReport) -> str:
    """The checks in 80 columns: titles fold, each detail a paragraph."""
    lines = [fit_lines(f"vgpuctl conformance on {rep.cluster}, namespace {rep.namespace}"), ""]
    rows = [(str(c.number), c.title, c.status.upper(), f"{c.seconds:.1f}") for c in rep.checks]
    lines.append(fit(["#", "CHECK", "RESULT", "SECONDS"], rows, fold=("CHECK",)))
    lines.append("")
    for c in rep.checks:
        lines.append(fit_lines(f"{c.number}. {c.status.upper()}: {c.detail}", indent="   "))
    if rep.cleanup:
        lines.append(fit_lines("cleanup problems: " + "; ".join(rep.cleanup)))
    passed = sum(c.status == "passed" for c in rep.checks)
    lines.append(f"{passed} of {len(rep.checks)} checks passed in {rep.seconds:.1f} s" +
                 ("" if rep.ok else "; NOT CONFORMANT"))
    return "\n".join(lines)


PACKAGE = "vgpuctl/conformance"
PARENT = "TestVgpuctlConformance"


def test2json(rep: ConformanceReport, now: datetime | None = None) -> str:
    """The run as Go's ``cmd/test2json`` events (one JSON object per line: Time, Action, Package,
    Test, Elapsed, Output), one subtest per check, so tooling built for ``go test -json`` reads it."""
    from datetime import UTC, datetime

    t = now or datetime.now(UTC)
    stamp = t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    events: list[dict] = [{"Time": stamp, "Action": "start", "Package": PACKAGE},
                          {"Time": stamp, "Action": "run", "Package": PACKAGE, "Test": PARENT}]

    def out(test: str, text: str) -> None:
        events.append({"Time": stamp, "Action": "output", "Package": PACKAGE, "Test": test, "Output": text})

    out(PARENT, f"=== RUN   {PARENT}\n")
    verdict = {"passed": ("pass", "PASS"), "skipped": ("skip", "SKIP")}
    for c in rep.checks:
        name = f"{PARENT}/{c.number}_" + "".join(ch if ch.isalnum() else "_" for ch in c.title).strip("_")[:60]
        events.append({"Time": stamp, "Action": "run", "Package": PACKAGE, "Test": name})
        out(name, f"=== RUN   {name}\n")
        for line in [c.detail, *c.evidence]:
            if line:
                out(name, f"    {line}\n")
        action, word = verdict.get(c.status, ("fail", "FAIL"))
        out(name, f"    --- {word}: {name} ({c.seconds:.2f}s)\n")
        events.append({"Time": stamp, "Action": action, "Package": PACKAGE, "Test": name,
                       "Elapsed": round(c.seconds, 2)})
    action = "pass" if rep.ok else "fail"
    out(PARENT, f"--- {action.upper()}: {PARENT} ({rep.seconds:.2f}s)\n")
    events.append({"Time": stamp, "Action": action, "Package": PACKAGE, "Test": PARENT, "Elapsed": round(rep.seconds, 2)})
    events.append({"Time": stamp, "Action": action, "Package": PACKAGE, "Elapsed": round(rep.seconds, 2)})
    return "".join(json.dumps(e) + "\n" for e in events)


def junit(rep: ConformanceReport) -> str:
    """JUnit XML (one testsuite, one testcase per check; failed -> <failure>, error -> <error>,
    skipped -> <skipped>; the evidence as <system-out>)."""
    import socket
    from datetime import UTC, datetime
    from xml.sax.saxutils import escape, quoteattr  # loads urllib and email: not at -h

    n = len(rep.checks)
    fails = sum(c.status == "failed" for c in rep.checks)
    errors = sum(c.status == "error" for c in rep.checks)
    skipped = sum(c.status == "skipped" for c in rep.checks)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites name="vgpuctl-conformance" tests="{n}" failures="{fails}" errors="{errors}" '
           f'skipped="{skipped}" time="{rep.seconds:.3f}">',
           f'  <testsuite name="vgpuctl-conformance" tests="{n}" failures="{fails}" errors="{errors}" '
           f'skipped="{skipped}" time="{rep.seconds:.3f}" timestamp="{stamp}" hostname={quoteattr(socket.gethostname())}>',
           "    <properties>",
           f"      <property name=\"cluster\" value={quoteattr(rep.cluster)}/>",
           f"      <property name=\"namespace\" value={quoteattr(rep.namespace)}/>",
           "    </properties>"]
    for c in rep.checks:
        out.append(f'    <testcase classname="vgpuctl.conformance" name={quoteattr(f"{c.number}. {c.title}")} '
                   f'time="{c.seconds:.3f}">')
        if c.status == "failed":
            out.append(f"      <failure message={quoteattr(c.detail[:500])} type=\"PropertyViolated\">"
                       f"{escape(c.detail)}</failure>")
        elif c.status == "error":
            out.append(f"      <error message={quoteattr(c.detail[:500])} type=\"Error\">{escape(c.detail)}</error>")
        elif c.status == "skipped":
            out.append(f"      <skipped message={quoteattr(c.detail)}/>")
        body = "\n".join([c.detail] + c.evidence) if c.status == "passed" else "\n".join(c.evidence)
        if body:
            out.append(f"      <system-out>{escape(body)}</system-out>")
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>"]
    return "\n".join(out) + "\n"
