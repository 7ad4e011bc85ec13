"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager of one Kubernetes minor in one Go process (tests/controlplane/k8s-X.Y), for
the newest and the oldest supported minor (:data:`MINORS`, each with its own default gates).

``.ci/run`` builds each program into ``build/controlplane/``; :func:`binary` builds the newest here
when it is missing and Go is installed (Go's build cache makes that quick after the first time); an
older minor not built is skipped, saying how to build it (a cold build takes many minutes). Where Go
is absent the tests that need it skip, saying so; under ``CI=true`` they fail instead. Tests run on
every minor through a fixture parametrized with :data:`MINOR_PARAMS`.

:class:`RealControlPlane` offers the part of :class:`~dra_bridge.sim.apiserver.LocalApiServer`
the tests use (``api_client()``, ``kubeconfig(path)``, ``objects()``, ``add()``, ...), so helpers
written for the local server (``pool_slices``, the agent's ``Daemon``) take either.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from dra_bridge.sim.kubelet import KubeletClient

ROOT = Path(__file__).resolve().parents[2]
#: The minors with a control-plane program: the newest supported and the oldest (issue #39.2)
MINORS = ("1.37", "1.34")
K8S_VERSION = MINORS[0]  # the default: the newest
#: ``params=`` for a fixture that runs its tests on every minor (ids ``k8s-1.37``, ``k8s-1.34``)
MINOR_PARAMS = [pytest.param(m, id=f"k8s-{m}") for m in MINORS]


def source(minor: str = K8S_VERSION) -> Path:
    return ROOT / "tests" / "controlplane" / f"k8s-{minor}"


def binary_path(minor: str = K8S_VERSION) -> Path:
    return ROOT / "build" / "controlplane" / f"k8s-{minor}" / "controlplane"


SOURCE = source()
BINARY = binary_path()
START_TIMEOUT = 180.0  # a cold etcd + apiserver start takes seconds; a loaded CI machine, more


def go_missing() -> str | None:
    """Why the control plane cannot be built here, or None."""
    if shutil.which("go") is None:
        return "Go is not installed (the real control plane is built from k8s.io/kubernetes with Go)"
    return None


def unavailable(reason: str) -> None:
    """Skip, or fail under CI=true (CI must run these tests)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"real control plane unavailable under CI=true: {reason}")
    pytest.skip(reason)


def build(minor: str = K8S_VERSION) -> Path:
    """``tests/controlplane/build.sh``: ``go build -p 2`` with the version stamped (CI is shared)."""
    subprocess.run([str(ROOT / "tests" / "controlplane" / "build.sh"), minor], check=True)
    return binary_path(minor)


def binary(minor: str = K8S_VERSION) -> Path:
    """The built program of ``minor``; the newest built now when missing. Skips (fails under
    CI=true) without Go, and for an older minor not built (its cold build takes many minutes: not
    something a test run starts unasked; ``.ci/run`` builds it)."""
    exe = binary_path(minor)
    if exe.exists():
        return exe
    why = go_missing()
    if why:
        unavailable(why)
    if minor != K8S_VERSION:
        unavailable(f"the Kubernetes {minor} control plane is not built ({exe.relative_to(ROOT)}): "
                    f"tests/controlplane/build.sh {minor} builds it (.ci/run does)")
    try:
        return build(minor)
    except subprocess.CalledProcessError as exc:  # a build failure is a failure, not a skip
        pytest.fail(f"building {source(minor)} failed: {exc}")


class RealControlPlane:
    """The Go program of Kubernetes ``minor`` started with ``feature_gates``;
    ``with RealControlPlane() as cp: ...``."""

    def __init__(self, feature_gates: Mapping[str, bool] | None = None, *, extra: list[str] | None = None,
                 minor: str = K8S_VERSION):
        self.minor = minor
        self.feature_gates = dict(feature_gates or {})
        self.extra = list(extra or [])
        self.proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self.url = ""
        self.started_in = 0.0
        self._paths: dict[str, tuple[str, bool]] | None = None
        self._client = None

    @property
    def version(self) -> tuple[int, int]:
        """``(1, 34)``: the minor this control plane runs."""
        major, minor = self.minor.split(".")
        return int(major), int(minor)

    def kept(self):
        """What this server keeps of the DRA fields vgpuctl publishes, with its default gates (given
        ``feature_gates`` applied): :func:`dra_bridge.api.compat.kept_by_gates`."""
        from dra_bridge.api import compat

        return compat.kept_by_gates(self.version, compat.resolve(self.version, self.feature_gates))

    # ------------------------------------------------------------------ life cycle

    @property
    def dir(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name)

    @property
    def kubeconfig_path(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def log_path(self) -> Path:
        return self.dir / "controlplane.log"

    def start(self, exe: Path | None = None) -> RealControlPlane:
        exe = exe or binary(self.minor)
        self._dir = tempfile.TemporaryDirectory(prefix="cp-")
        args = [str(exe), "--kubeconfig-out", str(self.kubeconfig_path), "--data-dir", str(self.dir / "data")]
        if self.feature_gates:
            args += ["--feature-gates", ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]
        args += self.extra
        (self.dir / "data").mkdir()
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _wait_ready(self) -> str:
        """Block on the program's stdout until it prints ``ready URL`` (it has written the
        kubeconfig by then) or exits; no polling."""
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT
        buf = b""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"control plane not ready within {START_TIMEOUT}s; log: {self.log_tail()}")
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    rc = self.proc.wait(10)
                    raise RuntimeError(f"control plane exited ({rc}) before it was ready: {self.log_tail()}")
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if line.startswith("ready "):
                        assert self.kubeconfig_path.exists()
                        return line.split(None, 1)[1].strip()
        finally:
            sel.close()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def rss_kib(self) -> int:
        """Resident memory of the control-plane process (VmRSS), KiB."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RealControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients

    def env(self) -> dict[str, str]:
        """The environment for kubectl and ``vgpuctl --kubeconfig``: KUBECONFIG set."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig_path)}

    def kubeconfig(self, path: str | Path, **_: object) -> Path:
        path = Path(path)
        shutil.copyfile(self.kubeconfig_path, path)
        return path

    def api_client(self):
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path))

    @property
    def client(self):
        if self._client is None:
            self._client = self.api_client()
        return self._client

    def rest(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request; the decoded JSON answer (a non-2xx answer raises kubernetes' ApiException)."""
        from kubernetes.client.exceptions import ApiException

        m, url, headers, data, _ = self.client.param_serialize(
            method, path, header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        r = self.client.call_api(m, url, headers, data)
        payload = r.read()
        if not 200 <= r.status < 300:
            raise ApiException(status=r.status, reason=r.reason, body=payload)
        return json.loads(payload) if payload else {}

    def _resource_paths(self) -> dict[str, tuple[str, bool]]:
        """plural -> (collection path prefix, namespaced), the preferred version of each group."""
        if self._paths is None:
            paths: dict[str, tuple[str, bool]] = {}
            groups = [("/api/v1", "v1")] + [
                (f"/apis/{g['preferredVersion']['groupVersion']}", g["name"])
                for g in self.rest("GET", "/apis")["groups"]]
            for prefix, _ in reversed(groups):
                for r in self.rest("GET", prefix)["resources"]:
                    if "/" not in r["name"]:
                        paths[r["name"]] = (prefix, r["namespaced"])
            self._paths = paths
        return self._paths

    def path(self, resource: str, name: str | None = None, namespace: str | None = None) -> str:
        prefix, namespaced = self._resource_paths()[resource]
        p = prefix
        if namespaced and namespace:
            p += f"/namespaces/{namespace}"
        p += f"/{resource}"
        return p + (f"/{name}" if name else "")

    def objects(self, resource: str, namespace: str | None = None) -> list[dict]:
        return self.rest("GET", self.path(resource, namespace=namespace)).get("items") or []

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.rest("GET", self.path(resource, name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def add(self, obj: dict, **_: object) -> dict:
        """Create ``obj``; the stored object (status written too where the object has one, as the
        local server's ``add`` keeps it)."""
        resource = plural(obj["kind"])
        ns = obj["metadata"].get("namespace") or ("default" if self._resource_paths()[resource][1] else None)
        stored = self.rest("POST", self.path(resource, namespace=ns), obj)
        if resource == "nodes" and stored["spec"].get("taints") != obj.get("spec", {}).get("taints"):
            # the TaintNodesByCondition admission plugin taints a new Node not-ready; upstream's node
            # lifecycle controller lifts that once the kubelet reports Ready. Not run here (it would
            # find no kubelet heartbeat and evict): its part, for a Node given as Ready, is this
            stored = self.rest("PUT", self.path("nodes", stored["metadata"]["name"]),
                               {**stored, "spec": {**stored["spec"], "taints": obj.get("spec", {}).get("taints")}})
        if obj.get("status") and resource in ("nodes", "resourceclaims", "pods"):
            body = {**stored, "status": obj["status"]}
            stored = self.rest("PUT", self.path(resource, stored["metadata"]["name"], ns) + "/status", body)
        return stored

    def remove(self, resource: str, name: str, namespace: str | None = None) -> dict:
        return self.rest("DELETE", self.path(resource, name, namespace))


def plural(kind: str) -> str:
    k = kind.lower()
    if k.endswith("class"):
        return k + "es"
    if k.endswith("y"):
        return k[:-1] + "ies"
    return k + "s"


def start_or_skip(feature_gates: Mapping[str, bool] | None = None) -> RealControlPlane:
    """A started control plane (skips without Go; fails under CI=true)."""
    return RealControlPlane(feature_gates).start()


@pytest.fixture(scope="module")
def controlplane():
    """One real control plane (default 1.37 gates) for the test module."""
    with RealControlPlane() as cp:
        yield cp


def poll(pred, what: str, timeout: float = 60.0, every: float = 0.1):
    """``pred()``'s first truthy value, asked every ``every`` seconds (what the real servers do has no
    event these tests can wait on: a pod's phase, a condition the scheduler writes); an AssertionError
    naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(every)



@pytest.fixture(autouse=True, scope="module")
def openssl_needed():
    """The node side (tests/controlplane/nodeside.py) makes its kubelet's serving certificate with the
    openssl command: a module that runs it imports this autouse fixture."""
    if shutil.which("openssl") is None:
        unavailable("openssl not installed: the node side makes its kubelet certificate with it (apt install openssl)")


def prepare_claims(cp: RealControlPlane, kubelet: KubeletClient, pod: dict) -> dict:
    """The kubelet's prepare for a pod bound to its node: each of its claims through ``kubelet``
    (:class:`~dra_bridge.sim.kubelet.KubeletClient`), every answer without an error."""
    ns = pod["metadata"]["namespace"]
    refs = []
    for st in pod["status"]["resourceClaimStatuses"]:
        claim = cp.get_object("resourceclaims", st["resourceClaimName"], ns)
        refs.append((ns, claim["metadata"]["uid"], claim["metadata"]["name"]))
    answers = kubelet.prepare(refs)
    assert {u: a["error"] for u, a in answers.items()} == {r[1]: "" for r in refs}
    return answers
