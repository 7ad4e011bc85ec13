"""Node manager: discovery and apply against mdevctl on the same FUSE-mounted host (issue #2).

Both sides read and write through the same FUSE mount of a simulated host, so the kernel
model's cost is shared. Discovery: 16 GPUs with 32 VFs each, every VF an mdev parent with
every type listed; ours is ``discover()`` in-process, the peer one ``mdevctl types
--dumpjson`` (its process start and namespace set-up are measured separately and
reported, not subtracted). Apply: 256 vGPUs, ours one ``vgpuctl apply`` process (which also persists
256 definitions), the peer 256 ``mdevctl start -p PARENT -t TYPE`` + ``mdevctl define -u UUID`` pairs, on 16 Tesla T4
(mdev on the PF, 16 x T4-1Q each), each run on a fresh host; runs alternate and the
fastest of each side is reported, and again with the namespace harness's own cost (one
``mdevctl --version`` in it) taken out of the peer's 256 calls. Wall time means little on a loaded
machine: the CPU seconds (user + system) of the whole processes, from the children's rusage, are
reported beside it the same ways.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import RealIO
from mdev_manager.sim.fuse import mounted
from mdev_manager.sim.hostspec import GpuGroup, HostSpec
from mdev_manager.sim.node import sim_node
from tests.support.mdevctl_ns import missing_facilities, run_mdevctl

from .common import HEADER, best_of, row

T4_DOC = {"version": "vgpuctl/v1", "layouts": {"default": [{"all": True, "mode": "vgpu", "vgpus": {"T4-1Q": 16}}]}}
T4_1Q = "nvidia-230"
REPO = Path(__file__).resolve().parents[1]
APPLY_RUNS = 3
HARNESS_CALLS = 3  # the namespace harness alone, run this many times per peer run


def _fuse_env(root: Path, mnt: Path) -> HostEnv:
    return HostEnv(sys_root=mnt, dev_root=root / "dev", mdevctl_root=root / "etc/mdevctl.d",
                   state_root=root / "var/lib/vgpuctl", libvirt_uri=None)


def run() -> list[str]:
    why = missing_facilities()
    if why:
        return ["Node manager", f"skipped: mdevctl cannot run here ({'; '.join(why)})"]
    lines = ["Node manager (16 GPUs x 32 VFs, FUSE-mounted simulated host)", HEADER]
    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix="vgnode") as d:
        root, mnt = Path(d) / "host", Path(d) / "mnt"
        host = sim_node(root, "bench-large").host
        with mounted(host, mnt):
            env = _fuse_env(root, mnt)
            etc = root / "etc/mdevctl.d"
            inv = discover(env, RealIO())
            n_types = sum(len(p.types) for g in inv.gpus for p in g.parents)
            ours = best_of(lambda: discover(env, RealIO()), 1)
            peer = best_of(lambda: run_mdevctl(mnt, etc, "types", "--dumpjson", check=True, timeout=600), 1)
            start = best_of(lambda: run_mdevctl(mnt, etc, "--version"))
            lines.append(row(f"discovery ({len(inv.gpus)} GPUs, {n_types} parent types)", f"{ours * 1000:.0f} ms",
                             f"{peer * 1000:.0f} ms", ours / peer,
                             f"peer: mdevctl types; its process+namespace start alone {start * 1000:.0f} ms"))
    # apply: 16 Tesla T4 (mdev on the PF), 16 x T4-1Q each = 256 vGPUs, on a fresh host per run
    spec = HostSpec(name="bench-t4", node="bench-t4", gpus=[GpuGroup(board="T4", count=16)])
    cpu: dict[str, list[float]] = {"ours": [], "peer": [], "harness": []}

    def children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def apply_ours(env: HostEnv, root: Path, mnt: Path) -> float:
        """``vgpuctl apply`` as an admin runs it: a process of its own (it also saves 256 definitions)."""
        layout = root / "layout.json"
        layout.write_text(json.dumps(T4_DOC))
        cmd = [sys.executable, "-m", "vgpuctl", "--sys-root", str(mnt), "--dev-root", str(root / "dev"),
               "--mdevctl-root", str(root / "etc/mdevctl.d"), "--state-root", str(root / "var/lib/vgpuctl"),
               "apply", "-f", str(layout)]
        t0, c0 = time.perf_counter(), children_cpu()
        subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=REPO)
        cpu["ours"].append(children_cpu() - c0)
        return time.perf_counter() - t0

    harness: list[float] = []

    def apply_peer(env: HostEnv, root: Path, mnt: Path) -> float:
        parents = [g.address for g in discover(env, RealIO()).gpus]
        # the namespace harness alone (unshare, two bind mounts, exec of mdevctl --version)
        c0 = children_cpu()
        harness.append(best_of(lambda: run_mdevctl(mnt, root / "etc/mdevctl.d", "--version", check=True), HARNESS_CALLS))
        cpu["harness"].append(children_cpu() - c0)
        t0, c0 = time.perf_counter(), children_cpu()
        for p in parents:
            for _ in range(16):  # start, then define the running device: created and persisted, as apply does
                uuid = run_mdevctl(mnt, root / "etc/mdevctl.d", "start", "-p", p, "-t", T4_1Q, check=True).stdout.strip()
                run_mdevctl(mnt, root / "etc/mdevctl.d", "define", "-u", uuid, check=True)
        cpu["peer"].append(children_cpu() - c0)
        return time.perf_counter() - t0

    def fresh_run(fn) -> float:
        with tempfile.TemporaryDirectory(dir=base, prefix="vgnode") as d:
            root, mnt = Path(d) / "host", Path(d) / "mnt"
            host = sim_node(root, spec).host
            with mounted(host, mnt):
                env = _fuse_env(root, mnt)
                took = fn(env, root, mnt)
                assert len(discover(env, RealIO()).all_vgpus()) == 256
                return took

    # interleaved, fastest of three each: the figures least disturbed by the rest of the machine
    runs = [(fresh_run(apply_ours), fresh_run(apply_peer)) for _ in range(APPLY_RUNS)]
    ours_apply, peer_apply = min(r[0] for r in runs), min(r[1] for r in runs)
    lines.append(row("apply 256 vGPUs, whole processes, wall", f"{ours_apply:.2f} s", f"{peer_apply:.2f} s",
                     peer_apply / ours_apply, f"ratio = how many times faster (fastest of {APPLY_RUNS}); ours: one "
                     "vgpuctl apply; peer: 256 x (mdevctl start + mdevctl define); target (#25) >= 1x"))
    net = peer_apply - 512 * min(harness)
    lines.append(row("apply 256 vGPUs, peer without its harness", f"{ours_apply:.2f} s", f"{net:.2f} s", net / ours_apply,
                     f"the namespace harness alone: {min(harness) * 1000:.1f} ms per call, x 512 subtracted"))
    ours_cpu, peer_cpu = min(cpu["ours"]), min(cpu["peer"])
    lines.append(row("apply 256 vGPUs, CPU of the whole processes", f"{ours_cpu:.2f} s", f"{peer_cpu:.2f} s",
                     peer_cpu / ours_cpu, "user + system from the children's rusage, least of each side"))
    per_call = min(cpu["harness"]) / HARNESS_CALLS
    net_cpu = peer_cpu - 512 * per_call
    lines.append(row("apply 256 vGPUs, CPU, peer without its harness", f"{ours_cpu:.2f} s", f"{net_cpu:.2f} s",
                     net_cpu / ours_cpu, f"the harness's CPU: {per_call * 1000:.1f} ms per call, x 512 subtracted"))
    return lines
