"""``vgpuctl conformance``: the KAR-0003 / KAR-0004 checks; the report as a table, JSON or JUnit XML."""

from __future__ import annotations

import argparse
import json
import socket
from datetime import datetime, timezone
from xml.sax.saxutils import escape, quoteattr

from dra_bridge.api.names import DEFAULT_DRIVER, PASSTHROUGH_CLASS, VGPU_CLASS
from dra_bridge.conformance import healthcheck
from dra_bridge.conformance.backend import DEFAULT_IMAGE, KubeBackend
from dra_bridge.conformance.checks import run_conformance
from dra_bridge.conformance.report import ConformanceReport
from dra_bridge.sim.scenarios import run_conformance_simulated as run_simulated


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--kubeconfig", nargs="?", const="", metavar="FILE",
                   help="run against a real cluster (FILE, or $KUBECONFIG / ~/.kube/config / in-cluster when omitted)")
    c.add_argument("--junit", default="vgpuctl-conformance.xml", metavar="FILE",
                   help="JUnit XML report (default %(default)s; '' for none)")
    c.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    c.add_argument("--profile", help="the vGPU profile to share (default: the GPU/profile needing the fewest workloads)")
    c.add_argument("--node", help="only GPUs of this node")
    c.add_argument("--max-workloads", type=int, default=8, help="at most this many workloads on one GPU (check 2; default %(default)s)")
    c.add_argument("--namespace", help="namespace to create (default vgpuctl-conformance-<random>)")
    c.add_argument("--image", default=DEFAULT_IMAGE, help="workload image, needs sh (default %(default)s)")
    c.add_argument("--driver", default=DEFAULT_DRIVER, help="DRA driver name (default %(default)s)")
    c.add_argument("--vgpu-class", help=f"DeviceClass of vGPUs (default {VGPU_CLASS})")
    c.add_argument("--passthrough-class", help=f"DeviceClass of whole GPUs (default {PASSTHROUGH_CLASS})")
    c.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each workload (default %(default)s)")
    c.add_argument("--settle", type=float, default=15.0, help="seconds a blocked workload must stay Pending (default %(default)s)")
    c.add_argument("--server-version", default="1.37", choices=["1.34", "1.35", "1.36", "1.37"],
                   help="simulated cluster: Kubernetes version (default %(default)s)")
    c.add_argument("--print-healthcheck", action="store_true", help="print the health-check script and exit")


def run(args) -> int:
    if args.print_healthcheck:
        print(healthcheck.SCRIPT, end="")
        return 0
    kw = dict(profile=args.profile, node=args.node, max_workloads=args.max_workloads)
    if args.kubeconfig is not None:
        from dra_bridge.kube.client import connect
        from dra_bridge.scheduling.selectors import default_selectors

        backend = KubeBackend(connect(args.kubeconfig or None), namespace=args.namespace, image=args.image,
                              driver=args.driver, vgpu_class=args.vgpu_class, passthrough_class=args.passthrough_class,
                              timeout=args.timeout, settle=args.settle, selectors=default_selectors(),
                              label=f"cluster ({args.kubeconfig or 'default kubeconfig'})")
        rep = run_conformance(backend, **kw)
    else:
        rep = run_simulated(version=args.server_version, **kw)
    if args.junit:
        with open(args.junit, "w") as f:
            f.write(junit(rep))
    print(json.dumps(rep.to_dict(), indent=2) if args.json else table(rep))
    if args.junit and not args.json:
        print(f"JUnit XML: {args.junit}")
    return 0 if rep.ok else 1


def table(rep: ConformanceReport) -> str:
    lines = [f"vgpuctl conformance on {rep.cluster}, namespace {rep.namespace}", ""]
    rows = [("#", "CHECK", "RESULT", "SECONDS")]
    for c in rep.checks:
        rows.append((str(c.number), c.title, c.status.upper(), f"{c.seconds:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("")
    for c in rep.checks:
        lines.append(f"{c.number}. {c.status.upper()}: {c.detail}")
    if rep.cleanup:
        lines.append("cleanup problems: " + "; ".join(rep.cleanup))
    passed = sum(c.status == "passed" for c in rep.checks)
    lines.append(f"{passed} of {len(rep.checks)} checks passed in {rep.seconds:.1f} s" +
                 ("" if rep.ok else "; NOT CONFORMANT"))
    return "\n".join(lines)


def junit(rep: ConformanceReport) -> str:
    """JUnit XML (one testsuite, one testcase per check; failed -> <failure>, error -> <error>,
    skipped -> <skipped>; the evidence as <system-out>)."""
    n = len(rep.checks)
    fails = sum(c.status == "failed" for c in rep.checks)
    errors = sum(c.status == "error" for c in rep.checks)
    skipped = sum(c.status == "skipped" for c in rep.checks)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
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
