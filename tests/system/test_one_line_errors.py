"""Every error is one line (issue #23, point 12): an API server's answer as status, reason and
message, a dead connection as where and why, urllib3's own retry warnings silenced, every hardware
problem of a layout listed at once."""

from __future__ import annotations

import json
import logging
import socket

import pytest
import yaml

from vgpuctl.main import error_lines, exit_code, main


def _api_error(status: int, reason: str, message: str):
    from kubernetes.client.exceptions import ApiException

    class Resp:
        def __init__(self):
            self.status, self.reason = status, reason
            self.data = json.dumps({"kind": "Status", "message": message, "code": status}).encode()
            self.headers = {"Content-Type": "application/json", "Audit-Id": "x" * 30, "Date": "today"}

        def getheaders(self):
            return self.headers

    return ApiException(http_resp=Resp())


def test_an_api_answer_is_one_line_without_headers():
    exc = _api_error(404, "Not Found", 'configmaps "vgpuctl-health" not found')
    assert "HTTP response headers" in str(exc)  # what the client itself would print
    (line,) = error_lines(exc)
    assert line == 'error: the API server answered 404 Not Found: configmaps "vgpuctl-health" not found'
    assert exit_code(exc) == 1


def test_a_dead_connection_is_one_line():
    import urllib3

    pool = urllib3.HTTPConnectionPool("127.0.0.1", 9)
    exc = urllib3.exceptions.MaxRetryError(pool, "/version", urllib3.exceptions.NewConnectionError(
        pool, "Failed to establish a new connection: [Errno 111] Connection refused"))
    (line,) = error_lines(exc)
    assert line.startswith("error: the API server at http://127.0.0.1:9 did not answer (")
    assert "Connection refused" in line and "\n" not in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_retry_warnings_before_the_error(tmp_path, capsys, caplog):
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{_free_port()}"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    with caplog.at_level(logging.WARNING):
        code = main(["doctor", "--kubeconfig", str(kc)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "does not answer" in err
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]


@pytest.fixture
def simdir(tmp_path, monkeypatch):
    monkeypatch.setenv("VGPUCTL_SIM_DIR", str(tmp_path / "sims"))


def test_every_hardware_problem_of_a_layout_at_once(tmp_path, simdir, capsys):
    layout = tmp_path / "bad.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"index": 0, "vgpus": {"A100-4C": 2}},  # not a T4 type
        {"model": "H100", "mode": "vgpu"},  # no such GPU
        {"index": 7, "mode": "dra"},  # no such index
        {"index": 1, "vgpus": {"T4-2Q": 9}},  # more than the GPU holds
    ]}}))
    code = main(["--simulate", "plan", "-f", str(layout)])
    err = capsys.readouterr().err
    assert code == 2
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 4, err
    for needle in ("A100-4C", "'H100'", "index 7", "9 is more than"):
        assert any(needle in p for p in problems), needle
