"""The plain JSON reader of ``kubectl vgpu`` (:mod:`dra_bridge.apiclient.reader`) over TLS, as a kubeconfig
names it: the CA and client certificate inline or in files (relative to the kubeconfig), a bearer token,
``insecure-skip-tls-verify``; the one-line errors of the client for a server that refuses the credentials
or whose certificate is not trusted; anything else (an exec plugin, a proxy) left to the client's loader."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from dra_bridge.apiclient.errors import ApiAnswer
from dra_bridge.apiclient.kubeconfig import ApiUnreachable
from dra_bridge.apiclient.reader import JsonReader, _plain, open_reader
from tests.support.controlplane import unavailable

TOKEN = "s3cret"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, the server's certificate for 127.0.0.1 and a client certificate, made with openssl."""
    if shutil.which("openssl") is None:
        unavailable("openssl not installed: the test makes its certificates with it (apt install openssl)")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=test-ca", "-days", "2", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        cert = self.connection.getpeercert()
        auth = self.headers.get("Authorization")
        if not cert and auth != f"Bearer {TOKEN}":
            return self._answer(401, {"kind": "Status", "reason": "Unauthorized"})
        answers = {"/version": {"major": "1", "minor": "37+"}, "/api/v1/nodes": {"items": [{"metadata": {"name": "n"}}]},
                   "/api/v1/pods": None}
        if self.path not in answers:
            return self._answer(404, {"kind": "Status", "message": "not found"})
        if answers[self.path] is None:
            return self._answer(403, {"kind": "Status", "message": "pods is forbidden"})
        return self._answer(200, answers[self.path])

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(pki):
    """An HTTPS server that takes a client certificate of the CA, or the bearer token."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    ctx.load_verify_locations(pki / "ca.crt")
    ctx.verify_mode = ssl.CERT_OPTIONAL
    httpd = HTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _kubeconfig(path: Path, server: str, cluster: dict, user: dict) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return str(path)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_client_certificate_and_ca_inline(pki, server, tmp_path):
    kc = _kubeconfig(tmp_path / "kc", server, {"certificate-authority-data": _b64(pki / "ca.crt")},
                     {"client-certificate-data": _b64(pki / "client.crt"), "client-key-data": _b64(pki / "client.key")})
    r = open_reader(kc)
    assert isinstance(r, JsonReader) and r.version() == (1, 37)
    assert r.get("/api/v1/nodes") == {"items": [{"metadata": {"name": "n"}}]}
    assert r.get("/apis/kubevirt.io/v1/virtualmachineinstances", (403, 404)) is None
    with pytest.raises(ApiAnswer) as err:
        r.get("/api/v1/pods")
    assert err.value.status == 403 and "forbidden" in err.value.body
    r.close()


def test_files_relative_to_the_kubeconfig_and_a_token(pki, server, tmp_path):
    for name in ("ca.crt", "client.crt", "client.key"):
        shutil.copy(pki / name, tmp_path / name)
    kc = _kubeconfig(tmp_path / "kc", server, {"certificate-authority": "ca.crt"},
                     {"client-certificate": "client.crt", "client-key": "client.key"})
    assert open_reader(kc).get("/api/v1/nodes") is not None
    token = _kubeconfig(tmp_path / "kt", server, {"insecure-skip-tls-verify": True}, {"token": TOKEN})
    assert open_reader(token).version() == (1, 37)


def test_refused_credentials_and_an_untrusted_server_are_one_line(pki, server, tmp_path):
    wrong = _kubeconfig(tmp_path / "kw", server, {"certificate-authority-data": _b64(pki / "ca.crt")}, {"token": "no"})
    with pytest.raises(ApiUnreachable, match=r"refused the credentials \(401 Unauthorized\)"):
        open_reader(wrong)
    untrusted = _kubeconfig(tmp_path / "ku", server, {}, {"token": TOKEN})
    with pytest.raises(ApiUnreachable, match="does not answer .*certificate verify failed"):
        open_reader(untrusted)


def test_what_the_reader_does_not_do_is_left_to_the_clients_loader(pki, server, tmp_path):
    ca = {"certificate-authority-data": _b64(pki / "ca.crt")}
    assert _plain(_kubeconfig(tmp_path / "k1", server, ca, {"token": TOKEN}), None) is not None
    for cluster, user in (({}, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}),
                          ({}, {"auth-provider": {"name": "oidc"}}), ({}, {"tokenFile": "t"}),
                          ({"tls-server-name": "x"}, {}), ({"proxy-url": "http://p:1"}, {}),
                          ({}, {"client-certificate-data": _b64(pki / "client.crt")})):  # a certificate without its key
        assert _plain(_kubeconfig(tmp_path / "k2", server, {**ca, **cluster}, user), None) is None, (cluster, user)


def test_the_clients_reader_reads_the_same():
    """Where the client's loader is needed, :class:`ClientReader` reads the same plain JSON through it."""
    from dra_bridge.apiclient.client import plain_http_client
    from dra_bridge.apiclient.reader import ClientReader
    from dra_bridge.sim.apiserver import LocalApiServer

    srv = LocalApiServer(version="1.37").start()
    try:
        r = ClientReader(plain_http_client(srv.url))
        assert r.version() == (1, 37)
        names = [n["metadata"]["name"] for n in r.get("/api/v1/namespaces")["items"]]
        assert "default" in names
        assert r.get("/apis/kubevirt.io/v1/virtualmachineinstances", (404,)) is None
        with pytest.raises(ApiAnswer) as err:
            r.get("/api/v1/namespaces/nope")
        assert err.value.status == 404
        r.close()
    finally:
        srv.stop()
