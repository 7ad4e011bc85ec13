"""One command: the real control plane with a simulated GPU node joined to it, until Ctrl-C.

    python -m tests.controlplane.up [--preset mig-node] [--kubernetes 1.34]

starts Kubernetes 1.37's (or ``--kubernetes``'s: 1.34, the oldest supported minor) etcd,
kube-apiserver, kube-scheduler and kube-controller-manager (``build/controlplane/``, built by
``.ci/run``, or here when Go is installed), then for the node:
the node side (:mod:`tests.controlplane.nodeside`: the Node registered with its name and
allocatable, Ready, no not-ready taint left, pods bound to it prepared through the plugin and their
logs served) and the agent as a user runs it, ``vgpuctl --simulate PRESET serve`` with the
preset's ``dra`` layout. Once the node's ResourceSlices are published it prints the kubeconfig and
``ready``; Ctrl-C (SIGINT) or SIGTERM stops the agent, the node side and the control plane, and
removes their files.

:class:`SimulatedNode` is the node half, for tests that share one control plane between nodes.
``--node-side 'PROGRAM ARGS'`` runs another node side in place of ours (it gets the same flags
appended and must print a line starting ``node-side ready`` once the Node and the plugin are registered).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# the presets with an example of their own: its "dra" layout (MIG, mixed sizes, Blackwell's uses)
LAYOUTS = {"mig-node": "mig-layout.yaml", "mixed-node": "mixed-size-layout.yaml", "rtxpro-node": "rtxpro-layout.yaml",
           "b200-node": "b200-layout.yaml"}
# every other preset: every GPU handed to DRA, its vGPU sizes and the whole GPU offered
DRA_LAYOUT = """\
version: vgpuctl/v1
layouts:
  dra:
    - all: true
      mode: dra
      passthrough: true
"""
NODE_SIDE = [PYTHON, "-m", "tests.controlplane.nodeside"]
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 20.0


def layout_file(preset: str, base: Path) -> Path:
    """The preset's example with a ``dra`` layout, else :data:`DRA_LAYOUT` written under ``base``."""
    if preset in LAYOUTS:
        return ROOT / "examples" / LAYOUTS[preset]
    path = base / "layout.yaml"
    path.write_text(DRA_LAYOUT)
    return path


#: a Ctrl-C taken while a process is being spawned, raised once it is (:func:`spawning`)
_spawn = {"depth": 0, "pending": False}


@contextmanager
def spawning():
    """Spawn a process and keep it in hand before a Ctrl-C may interrupt: a KeyboardInterrupt raised
    inside ``subprocess.Popen`` (after the fork, waiting for the exec) leaves the child running with
    nobody to stop it (test_up found such a node side alive after ``up`` exited 130). :func:`main`'s
    handler defers the interrupt meanwhile; it is raised here once the caller holds the process."""
    _spawn["depth"] += 1
    try:
        yield
    finally:
        _spawn["depth"] -= 1
    if _spawn["pending"] and not _spawn["depth"]:
        _spawn["pending"] = False
        raise KeyboardInterrupt


def wait_line(proc: subprocess.Popen, prefix: str, timeout: float, what: str, log: Path) -> str:
    """Block on ``proc``'s stdout until a line starts with ``prefix``; the line (no polling)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"{what} not ready within {timeout:.0f}s; its log {log}: {tail(log)}")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"{what} exited ({proc.wait(10)}) before it was ready; its log {log}: {tail(log)}")
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line
    finally:
        sel.close()


def tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT; reaped either way."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


class SimulatedNode:
    """A simulated GPU node of ``preset`` joined to the cluster of ``kubeconfig``: the node side
    and ``vgpuctl serve`` as processes, their files under ``base``. ``with SimulatedNode(...) as n``."""

    def __init__(self, kubeconfig: Path, preset: str = "default", base: Path | None = None, *,
                 node_side: list[str] | None = None, resync: float = 30.0, layout: str = "dra",
                 node_name: str | None = None):
        from mdev_manager.sim import load_host

        self.kubeconfig = Path(kubeconfig)
        self.preset = preset
        self.node = node_name or load_host(preset).node
        self._tmp = None if base else tempfile.mkdtemp(prefix="vgpuctl-up-")  # short: unix socket paths
        self.base = Path(base) if base else Path(str(self._tmp))
        self.node_side_cmd = list(node_side or NODE_SIDE)
        self.resync = resync
        self.layout = layout
        self.node_side: subprocess.Popen | None = None
        self.serve: subprocess.Popen | None = None

    @property
    def host_dir(self) -> Path:
        return self.base / "host"

    @property
    def kubelet_root(self) -> Path:
        return self.host_dir / "kubelet"  # where `vgpuctl --simulate serve` keeps it

    @property
    def cdi_root(self) -> Path:
        return self.base / "cdi"

    @property
    def serve_log(self) -> Path:
        return self.base / "serve.log"

    @property
    def node_side_log(self) -> Path:
        return self.base / "node-side.log"

    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return {**os.environ, "PYTHONPATH": path, "KUBECONFIG": str(self.kubeconfig)}

    def vgpuctl(self, *args: str) -> list[str]:
        """A ``vgpuctl`` command line on this node's simulated host."""
        return [PYTHON, "-m", "vgpuctl", "--simulate", self.preset, "--sim-dir", str(self.host_dir), *args]

    def start(self) -> SimulatedNode:
        self.base.mkdir(parents=True, exist_ok=True)
        self.cdi_root.mkdir(exist_ok=True)
        self.layout_path = layout_file(self.preset, self.base)
        ns_args = ["--kubeconfig", str(self.kubeconfig), "--node-name", self.node, "--kubelet-root",
                   str(self.kubelet_root), "--cdi-root", str(self.cdi_root), "--sys-root", str(self.host_dir / "sys"),
                   "--state-dir", str(self.base / "node-side")]
        serve = self.vgpuctl("serve", "--kubeconfig", str(self.kubeconfig), "--node-name", self.node,
                             "-f", str(self.layout_path), "--layout", self.layout, "--cdi-root",
                             str(self.cdi_root), "--metrics-port", "0", "--plain-logs", "--resync", str(self.resync),
                             # as deploy/base/daemonset.yaml runs it: the node label picks the layout, the
                             # agent reports the layout's state (doctor warns on a node left unlabelled)
                             "--layout-label", "vgpu.kubevirt.io/config",
                             "--state-label", "vgpu.kubevirt.io/config.state")
        try:  # from the first spawn on: whatever stops the start (Ctrl-C included) stops what it started
            with open(self.node_side_log, "wb") as log, spawning():
                self.node_side = subprocess.Popen([*self.node_side_cmd, *ns_args], stdout=subprocess.PIPE,
                                                  stderr=log, cwd=ROOT, env=self.env(), start_new_session=True)
            with open(self.serve_log, "wb") as log, spawning():
                self.serve = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env(),
                                              start_new_session=True)
            wait_line(self.node_side, "node-side ready", READY_TIMEOUT, "the node side", self.node_side_log)
            self._wait_published()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_published(self) -> None:
        """Until the agent's ResourceSlices for the node are there (or the agent exits)."""
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        deadline = time.monotonic() + READY_TIMEOUT
        path = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{self.node}"
        try:
            while True:
                m, url, headers, data, _ = api.param_serialize("GET", path, header_params={"Accept": "application/json"},
                                                               auth_settings=["BearerToken"])
                r = api.call_api(m, url, headers, data)
                if r.status == 200 and json.loads(r.read()).get("items"):
                    return
                assert self.serve is not None
                if self.serve.poll() is not None:
                    raise RuntimeError(f"vgpuctl serve exited ({self.serve.returncode}); its log {self.serve_log}: "
                                       f"{tail(self.serve_log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no ResourceSlices of node {self.node} within {READY_TIMEOUT:.0f}s; "
                                       f"vgpuctl serve's log {self.serve_log}: {tail(self.serve_log)}")
                time.sleep(0.2)
        finally:
            api.close()

    def pids(self) -> list[int]:
        return [p.pid for p in (self.serve, self.node_side) if p is not None]

    def stop(self) -> None:
        stop_process(self.serve)
        stop_process(self.node_side)
        self.serve = self.node_side = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> SimulatedNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    from mdev_manager.sim.hostspec import preset_names

    ap = argparse.ArgumentParser(prog="python -m tests.controlplane.up", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="default", choices=preset_names(), help="the simulated host (default %(default)s)")
    ap.add_argument("--node-side", help="another node side's command line, in place of tests.controlplane.nodeside")
    ap.add_argument("--feature-gates", default="", help="the control plane's, e.g. DRADeviceCompatibilityGroups=true")
    from tests.support import controlplane as cpmod

    ap.add_argument("--kubernetes", default=cpmod.K8S_VERSION, choices=cpmod.MINORS,
                    help="the control plane's Kubernetes minor (default %(default)s)")
    args = ap.parse_args(argv)

    exe = cpmod.binary_path(args.kubernetes)
    if not exe.exists():
        why = cpmod.go_missing()
        if why:
            print(f"error: {exe} is not built and cannot be: {why}", file=sys.stderr)
            return 2
        print(f"building {exe} (Go; minutes the first time)", flush=True)
        cpmod.build(args.kubernetes)
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        """Before ``ready``: interrupt the start (its clean-up runs); after: end the wait."""
        if not ready.is_set():
            if _spawn["depth"]:  # a process is being spawned: raised once it is held (spawning)
                _spawn["pending"] = True
                return
            raise KeyboardInterrupt
        stop.set()

    ready = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    gates = dict((k, v.lower() == "true") for k, _, v in (g.partition("=") for g in args.feature_gates.split(",") if g))
    cp = cpmod.RealControlPlane(gates, minor=args.kubernetes)
    node: SimulatedNode | None = None
    try:
        cp.start()
        print(f"control plane: Kubernetes {cp.minor} at {cp.url} (pid {cp.proc.pid if cp.proc else '?'}, "
              f"ready in {cp.started_in:.1f}s)", flush=True)
        node = SimulatedNode(cp.kubeconfig_path, args.preset,
                             node_side=shlex.split(args.node_side) if args.node_side else None).start()
        print(f"node {node.node} (preset {args.preset}, layout dra of {node.layout_path}): vgpuctl serve "
              f"pid {node.serve.pid if node.serve else '?'}, node side pid "
              f"{node.node_side.pid if node.node_side else '?'}; logs in {node.base}", flush=True)
        print(f"kubeconfig: {cp.kubeconfig_path}", flush=True)
        print(f"ready: export KUBECONFIG={cp.kubeconfig_path}; Ctrl-C stops it all", flush=True)
        ready.set()
        while not stop.wait(0.5):
            for what, p, log in (("control plane", cp.proc, cp.log_path), ("vgpuctl serve", node.serve, node.serve_log),
                                 ("node side", node.node_side, node.node_side_log)):
                if p is not None and p.poll() is not None:
                    print(f"error: {what} exited ({p.returncode}); stopping. Its log: {tail(log)}", file=sys.stderr)
                    return 1
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted while starting; stopping", file=sys.stderr)
        return 130
    finally:
        ready.set()  # a second Ctrl-C no longer interrupts the clean-up
        if node is not None:
            node.stop()
        cp.stop()
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
