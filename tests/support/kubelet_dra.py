"""The kubelet's own DRA manager as the node side of the e2e tests (issue #39.3).

``kubelet-dra`` (tests/kubelet/k8s-1.37/main.go) runs ``k8s.io/kubernetes``' pkg/kubelet/cm/dra
(the DRA manager: its claim info cache, its checkpoint, its gRPC client of the driver) and
pkg/kubelet/pluginmanager (the plugin watcher and registration) for one node; what stands in for
the rest of the kubelet (pod workers, container runtime, status manager) is said in its header.

``.ci/run`` builds it into ``build/kubelet/``; :func:`binary` builds it here when it is missing and
Go is installed. Without Go the tests skip, saying so; under ``CI=true`` they fail instead
(:func:`tests.support.controlplane.unavailable`).

:class:`KubeletDra` starts it and waits on the JSON lines it prints (``{"event": "prepared", ...}``):
blocking reads of its stdout, no polling.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.controlplane import go_missing, unavailable

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.37"
SOURCE = ROOT / "tests" / "kubelet" / f"k8s-{K8S_VERSION}"
BINARY = ROOT / "build" / "kubelet" / f"k8s-{K8S_VERSION}" / "kubelet-dra"
WAIT = 90.0


def binary() -> Path:
    """The built program; built now when missing. Skips (fails under CI=true) without Go."""
    if BINARY.exists():
        return BINARY
    why = go_missing()
    if why:
        unavailable(why.replace("real control plane", "kubelet's DRA manager"))
    try:
        subprocess.run([str(ROOT / "tests" / "kubelet" / "build.sh"), K8S_VERSION], check=True)
    except subprocess.CalledProcessError as exc:  # a build failure is a failure, not a skip
        pytest.fail(f"building {SOURCE} failed: {exc}")
    return BINARY


Event = dict


class KubeletDra:
    """``kubelet-dra`` for ``node`` with ``root`` as its root directory (the agent's --kubelet-root:
    plugins_registry/ is shared, the checkpoint ``dra_manager_state`` is the manager's)."""

    def __init__(self, kubeconfig: Path, node: str, root: Path, log: Path):
        self.kubeconfig, self.node, self.root, self.log_path = kubeconfig, node, root, log
        self.proc: subprocess.Popen | None = None
        self.events: list[Event] = []
        self._buf = b""

    def start(self) -> KubeletDra:
        args = [str(binary()), "--kubeconfig", str(self.kubeconfig), "--node-name", self.node,
                "--root-dir", str(self.root), "-v", "2"]
        self.events, self._buf = [], b""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        return self

    def wait(self, pred: Callable[[Event], bool], what: str, timeout: float = WAIT) -> Event:
        """The first event (of this run, earlier ones included) for which ``pred`` holds."""
        for e in self.events:
            if pred(e):
                return e
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"kubelet-dra: {what}: not within {timeout}s; events {self.events[-8:]}; "
                                         f"log: {self.log_tail()}; its pod worker: {self.worker_stack()}")
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    rc = self.proc.wait(10)
                    raise AssertionError(f"kubelet-dra exited ({rc}) waiting for {what}: {self.log_tail()}")
                self._buf += chunk
                *lines, self._buf = self._buf.split(b"\n")
                new = [json.loads(line) for line in lines]
                self.events += new  # every one kept: a later wait may be for one after the match
                for e in new:
                    if pred(e):
                        return e
        finally:
            sel.close()

    def event(self, kind: str, what: str | None = None, timeout: float = WAIT, **match: object) -> Event:
        """The first ``kind`` event whose fields equal ``match``."""
        return self.wait(lambda e: e["event"] == kind and all(e.get(k) == v for k, v in match.items()),
                         what or f"{kind} {match}", timeout)

    def worker_stack(self) -> str:
        """SIGQUIT (Go prints every goroutine's stack and exits): the stacks of its own code."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return "(exited)"
        size = self.log_path.stat().st_size
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            return "(no dump)"
        with open(self.log_path, "rb") as f:
            f.seek(size)
            dump = f.read().decode(errors="replace")
        return "\n\n".join(g for g in dump.split("\n\n") if "main." in g)[-6000:]

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        """SIGTERM (as a kubelet is stopped); its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> KubeletDra:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
