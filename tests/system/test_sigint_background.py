"""SIGINT is taken the same way wherever it lands, also when a shell started vgpuctl in the background.

A non-interactive shell starts ``vgpuctl ... &`` with SIGINT ignored; Python then raises no
``KeyboardInterrupt``, while a command that writes installs its own handler. A SIGINT before that
handler was lost and one after it taken: issue #36.7 saw one ignored 0.5 s into ``sim reset`` (it ran
on and exited 0) and 33 others taken. Here the SIGINT lands in the window before the command's
handler, while ``apply`` waits for the node lock, in a process started with SIGINT ignored.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from mdev_manager.host.lock import NodeLock
from tests.support.dra import make_node

ROOT = Path(__file__).resolve().parents[2]
T4 = "0000:10:00.0"


def _ignore_sigint() -> None:  # what `cmd &` in a non-interactive shell leaves the process
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_sigint_while_apply_waits_for_the_lock_stops_it_in_a_background_start(tmp_path):
    node = make_node(tmp_path)
    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump({"version": "vgpuctl/v1", "layouts": {"default": [
        {"pciAddress": T4, "mode": "vgpu", "vgpus": {"T4-2Q": 8}}]}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with NodeLock(node.env, "test-holder apply").hold():
        proc = subprocess.Popen(
            [sys.executable, "-m", "vgpuctl", "--simulate", "--sim-dir", str(node.root), "apply", "-f", str(layout)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
            preexec_fn=_ignore_sigint)
        try:
            assert proc.stderr is not None
            said = proc.stderr.readline()  # the event: it waits, before any write and any handler of its own
            assert "waiting for the node lock held by" in said, said
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)  # ignored, it would wait for the lock as long as we hold it
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 130, (code, proc.stderr.read())
    assert node.inventory().gpu(T4).vgpus == []  # nothing was written
