"""The node side of a simulated node joined to a real control plane: the kubelet's part, as a process.

``python -m tests.controlplane.nodeside --kubeconfig K --node-name N --kubelet-root DIR --cdi-root DIR
--sys-root DIR`` registers the Node (name, allocatable, Ready, the kubelet endpoint the API server
proxies pod logs to), then runs the pods kube-scheduler binds to it: it prepares their claims through
the DRA plugin's real sockets (the plugin found through ``<kubelet-root>/plugins_registry``, as the
kubelet's plugin watcher finds it), writes their status (the node side alone sets a pod's phase),
unprepares a deleted pod's claims and confirms a graceful deletion as the kubelet does. It prints
``node-side ready NODE`` once the Node is registered and the plugin is.

What a kubelet has and this does not, stood in for: no container runtime (a container "runs" once
its claims are prepared; one whose command names ``healthcheck.sh`` runs the shipped health check on
the device nodes of the CDI ids the plugin answered, with the simulated host's sysfs, and that output
is its log); no node lifecycle controller runs in the test control plane, so the not-ready taint the
API server's admission puts on a new Node is lifted here once the Node reports Ready. Another node
side (a program on the kubelet's own DRA manager) can take this one's place: ``tests.controlplane.up
--node-side``.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dra_bridge.api.names import DEFAULT_DRIVER
from dra_bridge.api.nodepaths import NodePaths
from dra_bridge.apiclient.errors import api_exception
from dra_bridge.conformance import healthcheck
from dra_bridge.sim.kubelet import GPU_NODE_LABELS, KubeletClient, resolve_cdi

log = logging.getLogger("nodeside")

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
ALLOCATABLE = {"cpu": "16", "memory": "64Gi", "pods": "110"}
POLL = 0.2  # seconds between looks at the node's pods
RETRY = 1.0  # seconds before a failed prepare or unprepare is tried again


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class PodState:
    namespace: str
    name: str
    refs: list[tuple[str, str, str]] = field(default_factory=list)  # prepared claims (namespace, uid, name)
    running: bool = False
    tried: float = -1e9  # the last failed prepare
    unprepare_failed: float = -1e9
    last_error: str = ""


class LogServer:
    """The kubelet's HTTPS endpoint, as much of it as the API server's ``pods/log`` proxies to:
    ``GET /containerLogs/NAMESPACE/POD/CONTAINER``. A self-signed certificate: kube-apiserver
    without ``--kubelet-certificate-authority`` does not verify the kubelet's."""

    def __init__(self, cert_dir: Path):
        self.logs: dict[tuple[str, str], str] = {}
        logs = self.logs

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = self.path.split("?", 1)[0].strip("/").split("/")
                if parts[0] == "healthz":
                    self._send(200, "ok")
                elif parts[0] == "containerLogs" and len(parts) >= 3 and (parts[1], parts[2]) in logs:
                    self._send(200, logs[(parts[1], parts[2])])
                else:
                    self._send(404, f"{self.path}: not found\n")

            def _send(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        cert, key = cert_dir / "kubelet.crt", cert_dir / "kubelet.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=vgpuctl-node-side", "-addext",
                        "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-endpoint", daemon=True)

    def start(self) -> LogServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class NodeSide:
    """The kubelet's part for one node (see the module docstring); ``step()`` once per look."""

    def __init__(self, api, node: str, *, kubelet_root: Path, cdi_root: Path, sys_root: Path, state_dir: Path,
                 driver: str = DEFAULT_DRIVER, kubelet_version: str = "v1.37.2"):
        self.api = api
        self.node = node
        self.driver = driver
        self.cdi_root = Path(cdi_root)
        self.sys_root = Path(sys_root)
        self.state_dir = Path(state_dir)
        self.kubelet_version = kubelet_version
        self.registration = NodePaths(driver=driver, kubelet_root=Path(kubelet_root)).registration_socket
        self.kubelet = KubeletClient(Path(kubelet_root), driver)
        self.registered = False
        self.pods: dict[str, PodState] = {}
        self.logs = LogServer(self.state_dir)

    # ------------------------------------------------------------------ the API
    def rest(self, method: str, path: str, body: object = None, ctype: str = "application/json") -> dict:
        m, url, headers, data, _ = self.api.param_serialize(
            method, path, header_params={"Content-Type": ctype, "Accept": "application/json"}, body=body,
            auth_settings=["BearerToken"])
        r = self.api.call_api(m, url, headers, data)
        payload = r.read()
        if not 200 <= r.status < 300:
            raise api_exception()(status=r.status, reason=r.reason, body=payload)
        return json.loads(payload) if payload else {}

    def patch_status(self, ns: str, name: str, status: dict) -> None:
        self.rest("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status},
                  "application/strategic-merge-patch+json")

    def event(self, ns: str, pod: dict, reason: str, message: str) -> None:
        meta = pod["metadata"]
        t = now()
        self.rest("POST", f"/api/v1/namespaces/{ns}/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": ns,
                               "uid": meta["uid"]},
            "reason": reason, "message": message, "type": "Warning", "count": 1,
            "firstTimestamp": t, "lastTimestamp": t, "source": {"component": "kubelet", "host": self.node}})

    # ------------------------------------------------------------------ the Node
    def register_node(self) -> dict:
        """Create (or take over) the Node as the kubelet registers it, Ready, then lift the not-ready
        taint admission added (the node lifecycle controller's part, not run here)."""
        self.logs.start()
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": {
                    "kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    **GPU_NODE_LABELS}},
                "spec": {}}
        try:
            stored = self.rest("POST", "/api/v1/nodes", body)
        except api_exception() as exc:
            if exc.status != 409:
                raise
            stored = self.rest("GET", f"/api/v1/nodes/{self.node}")
        t = now()
        status = {
            "capacity": dict(ALLOCATABLE), "allocatable": dict(ALLOCATABLE),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": t,
                            "lastTransitionTime": t, "message": "kubelet is posting ready status (vgpuctl node side)"}],
            # the API server proxies pods/log to the preferred address: one it can reach, loopback
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port}},
            "nodeInfo": {"kubeletVersion": self.kubelet_version, "osImage": "vgpuctl simulated host",
                         "kernelVersion": "simulated", "containerRuntimeVersion": "none://vgpuctl-node-side",
                         "operatingSystem": "linux", "architecture": "amd64", "machineID": "", "systemUUID": "",
                         "bootID": "", "kubeProxyVersion": ""}}
        stored = self.rest("PUT", f"/api/v1/nodes/{self.node}/status", {**stored, "status": status})
        taints = [t for t in stored["spec"].get("taints") or [] if t.get("key") != NOT_READY_TAINT]
        if taints != (stored["spec"].get("taints") or []):
            stored = self.rest("PUT", f"/api/v1/nodes/{self.node}", {**stored, "spec": {**stored["spec"],
                                                                                        "taints": taints or None}})
        return stored

    def register_plugin(self) -> bool:
        """The plugin watcher: a registration socket found is registered once."""
        if not self.registered and self.registration.exists():
            try:
                self.kubelet.register()
            except Exception as exc:  # noqa: BLE001 - the plugin is still starting: tried again
                log.info("plugin not registered yet: %s", exc)
                return False
            self.registered = True
            log.info("plugin %s registered at %s", self.driver, self.kubelet.endpoint)
        return self.registered

    # ------------------------------------------------------------------ pods
    def step(self) -> None:
        self.register_plugin()
        pods = self.rest("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}")["items"]
        seen = set()
        for p in pods:
            uid = p["metadata"]["uid"]
            seen.add(uid)
            st = self.pods.setdefault(uid, PodState(p["metadata"]["namespace"], p["metadata"]["name"]))
            if p["metadata"].get("deletionTimestamp"):
                if self.release(st):  # as the kubelet, once the pod's resources are reclaimed
                    self.confirm_deletion(p)
            elif not st.running and time.monotonic() - st.tried >= RETRY:
                self.start(p, st)
        for uid in [u for u in self.pods if u not in seen]:  # deleted outright (grace period 0)
            if self.release(self.pods[uid]):
                del self.pods[uid]

    def claim_refs(self, p: dict) -> tuple[list[tuple[str, str, str]], str]:
        """The pod's claims that hold this driver's devices, or why they cannot be prepared yet."""
        ns = p["metadata"]["namespace"]
        status = p.get("status") or {}
        names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]
        ext = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if ext:
            names.append(ext)
        if len(names) < len(p["spec"].get("resourceClaims") or []):
            return [], "the pod's claims are not made yet"
        refs = []
        for name in names:
            claim = self.rest("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
            cs = claim.get("status") or {}
            if p["metadata"]["uid"] not in {r.get("uid") for r in cs.get("reservedFor") or []}:
                return [], f"claim {name} is not reserved for the pod"
            results = ((cs.get("allocation") or {}).get("devices") or {}).get("results") or []
            if any(r["driver"] == self.driver for r in results):
                refs.append((ns, claim["metadata"]["uid"], name))
        return refs, ""

    def start(self, p: dict, st: PodState) -> None:
        ns, name = st.namespace, st.name
        st.tried = time.monotonic()
        refs, why = self.claim_refs(p)
        devices: list[str] = []
        if refs:
            if not self.registered:
                why = f"DRA driver {self.driver} is not registered"
            else:
                answers = self.kubelet.prepare(refs)
                st.refs = refs  # an answer with an error may still have prepared part: unprepared on deletion
                errors = [f"{n}: {answers.get(uid, {}).get('error') or 'no answer'}" for _, uid, n in refs
                          if answers.get(uid, {}).get("error") or uid not in answers]
                if errors:
                    why = "; ".join(errors)
                else:
                    for a in answers.values():
                        for d in a["devices"]:
                            devices += [n["hostPath"] for n in resolve_cdi(self.cdi_root, d["cdi_device_ids"]).device_nodes]
        if why:
            if why != st.last_error:
                st.last_error = why
                reason = "FailedPrepareDynamicResources" if refs else "ClaimsNotReady"
                log.info("pod %s/%s: %s", ns, name, why)
                self.event(ns, p, reason, f"Failed to prepare dynamic resources: {why}")
            return
        self.logs.logs[(ns, name)] = self.container_log(p, list(dict.fromkeys(devices)))
        t = now()
        self.patch_status(ns, name, {
            "phase": "Running", "startTime": t, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": c, "status": "True", "lastTransitionTime": t} for c in
                           ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True, "state": {"running": {"startedAt": t}}}
                                  for c in p["spec"]["containers"]]})
        st.running = True
        log.info("pod %s/%s running with %d device nodes", ns, name, len(devices))

    def container_log(self, p: dict, devices: list[str]) -> str:
        """What the container prints: the shipped health check where its command runs it (on the
        device nodes it was given; none: empty device directories), else nothing."""
        command = " ".join(str(x) for c in p["spec"]["containers"] for x in (c.get("command") or []) + (c.get("args") or []))
        if "healthcheck.sh" not in command:
            return ""
        env = {}
        if not devices:
            empty = self.state_dir / "empty-dev"
            empty.mkdir(exist_ok=True)
            env = {"VGPUCTL_HC_VFIO": str(empty), "VGPUCTL_HC_DEV": str(empty)}
        return healthcheck.run(devices, sys_root=self.sys_root, env=env).output

    def release(self, st: PodState) -> bool:
        """Unprepare the pod's claims; True once nothing is left prepared."""
        if st.refs:
            if time.monotonic() - st.unprepare_failed < RETRY:
                return False
            errors = {uid: e for uid, e in self.kubelet.unprepare(st.refs).items() if e}
            if errors:
                st.unprepare_failed = time.monotonic()
                log.warning("unprepare of %s/%s failed: %s", st.namespace, st.name, errors)
                return False
            log.info("pod %s/%s: claims unprepared", st.namespace, st.name)
            st.refs = []
        self.logs.logs.pop((st.namespace, st.name), None)
        return True

    def confirm_deletion(self, p: dict) -> None:
        meta = p["metadata"]
        try:
            self.rest("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                      {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except api_exception() as exc:
            if exc.status not in (404, 409):
                raise
        self.pods.pop(meta["uid"], None)

    def close(self) -> None:
        self.kubelet.close()
        self.logs.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.controlplane.nodeside", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--node-name", required=True)
    ap.add_argument("--kubelet-root", required=True, type=Path)
    ap.add_argument("--cdi-root", required=True, type=Path)
    ap.add_argument("--sys-root", required=True, type=Path, help="the simulated host's sysfs (the health check's /sys)")
    ap.add_argument("--state-dir", required=True, type=Path, help="the node side's own files (its certificate)")
    ap.add_argument("--driver", default=DEFAULT_DRIVER)
    ap.add_argument("--kubelet-version", help="the Node's kubeletVersion (default: the API server's own version)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="node-side %(levelname)s %(message)s", stream=sys.stderr)
    from dra_bridge.apiclient.client import connect

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    args.state_dir.mkdir(parents=True, exist_ok=True)
    ns = NodeSide(connect(args.kubeconfig), args.node_name, kubelet_root=args.kubelet_root, cdi_root=args.cdi_root,
                  sys_root=args.sys_root, state_dir=args.state_dir, driver=args.driver)
    try:
        # a kubelet no newer than its API server (the version skew policy): the server's own, as kubeadm pairs them
        ns.kubelet_version = args.kubelet_version or ns.rest("GET", "/version")["gitVersion"]
        ns.register_node()
        announced = False
        while not stop.is_set():
            try:
                ns.step()
            except Exception as exc:  # noqa: BLE001 - a kubelet keeps going; said in its log
                log.warning("step failed: %s: %s", type(exc).__name__, exc)
            if ns.registered and not announced:
                print(f"node-side ready {args.node_name} kubelet-endpoint 127.0.0.1:{ns.logs.port}", flush=True)
                announced = True
            stop.wait(POLL)
    finally:
        ns.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
