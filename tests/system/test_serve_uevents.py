"""``vgpuctl --simulate serve`` hears the simulated kernel's uevents as a user runs it (#37.1): a GPU that
another command takes off the bus (``sim unplug``) or brings back (``sim replug``) leaves or rejoins the
published pool at once, not at the next periodic resync (an hour away here). The wiring is the simulated
host's environment (``HostEnv.uevent_socket``); the agent only listens where its environment says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dra_bridge.sim.apiserver import LocalApiServer
from dra_bridge.sim.kubelet import node_object
from mdev_manager.sim.uevents import RELAY
from tests.support.dra import gpu_addresses, pool_slices, short_tmp

REPO = Path(__file__).resolve().parents[2]
NODE = "sim-node-1"
T4B = "0000:13:00.0"
WAIT = 60.0  # a bound for a loaded machine, not a timing: the wait ends on the server's next write


def wait_for_pool(srv: LocalApiServer, proc: subprocess.Popen, pred, what: str, log: Path) -> None:
    """Wait on the API server's writes (its store's condition) until the published pool satisfies ``pred``."""
    with srv.store.cond:
        ok = srv.store.cond.wait_for(lambda: proc.poll() is not None or pred(gpu_addresses(pool_slices(srv, node=NODE))),
                                     WAIT)
    assert ok and proc.poll() is None, f"{what}: not seen\n{log.read_text()[-3000:]}"


def vgpuctl(env: dict, *argv: str) -> None:
    out = subprocess.run([sys.executable, "-m", "vgpuctl.main", "--simulate", *argv], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_simulated_serve_hears_an_unplug_and_a_replug_by_their_uevents():
    with short_tmp("su") as d, LocalApiServer(version="1.35") as srv:
        srv.add(node_object(NODE, kubelet_version=srv.git_version))
        kc = srv.kubeconfig(d / "kubeconfig")
        env = {**os.environ, "VGPUCTL_SIM_DIR": str(d / "sim"), "NODE_NAME": NODE}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        relay = d / "sim/default" / RELAY
        cmd = [sys.executable, "-m", "vgpuctl.main", "--simulate", "serve", "--kubeconfig", str(kc),
               "--kubelet-root", str(d / "kl"), "--cdi-root", str(d / "cdi"), "--metrics-port", "0",
               "--resync", "3600"]  # the periodic resync never comes within the test
        log = d / "serve.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_pool(srv, proc, lambda gpus: T4B in gpus, "the first pool", log)
            # the agent listens before its first read, so before the pool is published
            assert relay.is_socket(), f"serve does not listen at {relay}\n{log.read_text()[-3000:]}"

            vgpuctl(env, "sim", "unplug", T4B)
            wait_for_pool(srv, proc, lambda gpus: gpus and T4B not in gpus, "the unplugged GPU leaving the pool", log)
            vgpuctl(env, "sim", "replug", T4B)
            wait_for_pool(srv, proc, lambda gpus: T4B in gpus, "the replugged GPU back in the pool", log)

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
            assert not relay.exists(), "the relay socket outlived serve"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
