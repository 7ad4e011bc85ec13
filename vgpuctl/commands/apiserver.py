"""``vgpuctl sim apiserver``: the local Kubernetes API server in the foreground, until SIGTERM.

A stable command-line surface for tools and people: it serves the DRA resources and the core
objects vgpuctl uses on 127.0.0.1, keeps and drops fields as kube-apiserver of ``--version``
does with ``--feature-gates`` (defaults: that version's own), writes a kubeconfig once the
server answers ``/version`` and prints one line saying where it listens. SIGTERM or SIGINT
stop it with exit status 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from dra_bridge.api.compat import DEFAULT_VERSION, VERSION_CHOICES, format_version
from vgpuctl.cli import options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig-out", required=True, metavar="FILE",
                   help="where to write a kubeconfig for the server (written atomically once it answers; "
                        "required)")
    p.add_argument("--version", dest="server_version", choices=VERSION_CHOICES, default=format_version(DEFAULT_VERSION),
                   help="Kubernetes version to serve: /version, OpenAPI schemas, validation, feature gates "
                        "(default %(default)s)")
    options.add_feature_gates(p)
    p.add_argument("--port", type=int, default=0,
                   help="port on 127.0.0.1 to listen on (default %(default)s: any free port)")


def _wait_until_answering(url: str, timeout: float = 10.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/version", timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the local API server at {url} did not answer /version in {timeout:.0f} s")
        time.sleep(0.05)


def run(args) -> int:
    from dra_bridge.api.compat import describe, parse_gates
    from dra_bridge.sim.apiserver import LocalApiServer

    srv = LocalApiServer(version=args.server_version, feature_gates=parse_gates(args.feature_gates),
                         port=args.port)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            srv.start()
        except OSError as exc:
            raise ValueError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
        _wait_until_answering(srv.url)
        kubeconfig = srv.kubeconfig(Path(args.kubeconfig_out))
        changed = describe(srv.feature_gates, srv.version)
        print(f"Kubernetes {srv.version} API server listening on {srv.url} "
              f"(kubeconfig {kubeconfig}; feature gates: {changed or 'the version defaults'})", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        srv.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":  # until `vgpuctl sim apiserver` is wired: python3 -m vgpuctl.commands.apiserver
    parser = argparse.ArgumentParser(prog="vgpuctl sim apiserver", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    try:
        sys.exit(run(parser.parse_args()))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
