"""Discovery beside ``mdevctl types`` and beside a bare walk, on one simulated host (issue #15).

The host is the largest preset (16 GPUs x 32 VFs, every VF an mdev parent listing every type).
Three readers of the same tree, interleaved, fastest of ``RUNS`` each:

* ours: ``discover()`` in-process (PCI functions, VFs, IOMMU groups, types, vGPUs);
* peer: Debian's ``mdevctl types --dumpjson`` (only the parents' types), run in a private mount
  namespace with the tree bound over ``/sys``; the namespace harness alone (``mdevctl --version``
  in it) is measured and reported, and subtracted for the "net" figure;
* bound: a bare walk in Python reading exactly the files ``mdevctl types`` reads plus each PCI
  function's ids: the least any discovery in Python can do.

Whole process against whole process (what an admin runs): ``vgpuctl --sys-root T discover -o json``
beside ``mdevctl types --dumpjson``, CPU time of each process tree (user + system, from the
children's rusage), the peer's namespace harness subtracted.

On the plain tree (the simulated host's files themselves, no FUSE, no kernel model: what sysfs
reads cost minus the kernel's attribute code) wall time and user-space instruction counts
(callgrind; a process that only imports is subtracted on both sides) are reported; through the
FUSE mount, wall time and FUSE requests (what each reader asks of the "kernel").
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.host.io import RealIO
from mdev_manager.sim.fuse import mounted
from mdev_manager.sim.node import sim_node
from tests.support.mdevctl_ns import missing_facilities

from .common import HEADER, row

PRESET = "bench-large"
RUNS = int(os.environ.get("VGPUCTL_BENCH_RUNS", "5"))
_NS = ('mount --make-rprivate / && mount --bind "$1" /sys && mount --bind "$2" /etc/mdevctl.d '
       '&& shift 2 && exec "$@"')


def _read_at(dfd: int, name: str) -> bool:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    except FileNotFoundError:
        return False
    try:
        os.read(fd, 4096)
    finally:
        os.close(fd)
    return True


def bare_walk(sys_root: Path) -> int:
    """Read what ``mdevctl types`` reads (each parent's types: name, available_instances,
    description, device_api) plus vendor/device/class of each PCI function, each file opened
    relative to its directory's descriptor (no path resolved twice); returns the files read."""
    n = 0
    flags = os.O_RDONLY | os.O_DIRECTORY
    pci = os.open(sys_root / "bus/pci/devices", flags)
    try:
        for addr in os.listdir(pci):
            dfd = os.open(addr, flags, dir_fd=pci)
            try:
                n += sum(_read_at(dfd, a) for a in ("vendor", "device", "class"))
            finally:
                os.close(dfd)
    finally:
        os.close(pci)
    if not (sys_root / "class/mdev_bus").is_dir():
        return n
    bus = os.open(sys_root / "class/mdev_bus", flags)
    try:
        for parent in os.listdir(bus):
            types = os.open(f"{parent}/mdev_supported_types", flags, dir_fd=bus)
            try:
                for tid in os.listdir(types):
                    tfd = os.open(tid, flags, dir_fd=types)
                    try:
                        n += sum(_read_at(tfd, a) for a in ("name", "available_instances", "description", "device_api"))
                    finally:
                        os.close(tfd)
            finally:
                os.close(types)
    finally:
        os.close(bus)
    return n


def in_namespace(sys_dir: Path, etc_dir: Path, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", _NS, "sh", str(sys_dir), str(etc_dir), *cmd],
                          capture_output=True, text=True, timeout=1800, check=True)


def _env(sys_root: Path, root: Path) -> HostEnv:
    return HostEnv(sys_root=sys_root, dev_root=root / "dev", mdevctl_root=root / "etc/mdevctl.d",
                   state_root=root / "var/lib/vgpuctl", libvirt_uri=None)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu(fn) -> float:
    """CPU seconds (user + system) of the processes ``fn`` runs and waits for."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    fn()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def vgpuctl_discover(sys_dir: Path, root: Path) -> subprocess.CompletedProcess:
    """The CLI as an admin runs it, in a process of its own (from this checkout)."""
    cmd = [sys.executable, "-m", "vgpuctl", "--sys-root", str(sys_dir), "--dev-root", str(root / "dev"),
           "--mdevctl-root", str(root / "etc/mdevctl.d"), "--state-root", str(root / "var/lib/vgpuctl"),
           "discover", "-o", "json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True,
                          cwd=Path(__file__).resolve().parents[1])


def interleaved(sides: dict[str, Callable[[], object]], runs: int = RUNS) -> dict[str, float]:
    """Fastest of ``runs`` per side, the sides alternating (rotated each round)."""
    best = {k: float("inf") for k in sides}
    names = list(sides)
    for i in range(runs):
        for k in names[i % len(names):] + names[:i % len(names)]:
            best[k] = min(best[k], _timed(sides[k]))
    return best


_COLLECTED = re.compile(r"Collected : (\d+)")


def callgrind(cmd: list[str], *, wrap=None) -> int:
    """User-space instructions a command executes (valgrind's callgrind)."""
    vg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
    proc = wrap(*vg) if wrap else subprocess.run(vg, capture_output=True, text=True, timeout=1800, check=True)
    m = _COLLECTED.search(proc.stderr)
    if not m:
        raise RuntimeError(f"callgrind printed no count for {cmd[:3]}: {proc.stderr[-500:]}")
    return int(m.group(1))


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run() -> list[str]:
    why = missing_facilities()
    lines = [f"Discovery ({PRESET}: 16 GPUs x 32 VFs), fastest of {RUNS}, interleaved", HEADER]
    if why:
        return lines + [f"skipped: mdevctl cannot run here ({'; '.join(why)})"]
    base = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
    with tempfile.TemporaryDirectory(dir=base, prefix="vgdisc") as d:
        root = Path(d) / "host"
        sim_node(root, PRESET)
        sys_dir, etc = root / "sys", root / "etc/mdevctl.d"
        env = _env(sys_dir, root)
        inv = discover(env, RealIO())
        n_types = sum(len(p.types) for g in inv.gpus for p in g.parents)
        ns = lambda *c: in_namespace(sys_dir, etc, *c)  # noqa: E731
        t = interleaved({"ours": lambda: discover(env, RealIO()),
                         "mdevctl": lambda: ns("mdevctl", "types", "--dumpjson"),
                         "harness": lambda: ns("mdevctl", "--version"),
                         "bare": lambda: bare_walk(sys_dir)})
        net = t["mdevctl"] - t["harness"]
        lines += [
            row(f"plain tree, wall ({n_types} parent types)", f"{t['ours'] * 1000:.0f} ms", f"{net * 1000:.0f} ms",
                t["ours"] / net, f"peer: mdevctl types minus its namespace harness ({t['harness'] * 1000:.0f} ms); "
                                 f"ratio < 1: ours is faster"),
            row("plain tree, wall vs the bound", f"{t['ours'] * 1000:.0f} ms", f"{t['bare'] * 1000:.0f} ms",
                t["ours"] / t["bare"], "peer: bare walk of the same files (target: within 2x)"),
        ]
        cpu = {k: float("inf") for k in ("ours", "mdevctl", "harness")}
        for _ in range(RUNS):  # whole processes, interleaved: the least CPU of each
            cpu["ours"] = min(cpu["ours"], _cpu(lambda: vgpuctl_discover(sys_dir, root)))
            cpu["mdevctl"] = min(cpu["mdevctl"], _cpu(lambda: ns("mdevctl", "types", "--dumpjson")))
            cpu["harness"] = min(cpu["harness"], _cpu(lambda: ns("mdevctl", "--version")))
        net_cpu = cpu["mdevctl"] - cpu["harness"]
        lines.append(row("whole process, CPU", f"{cpu['ours'] * 1000:.0f} ms", f"{net_cpu * 1000:.0f} ms",
                         cpu["ours"] / net_cpu, "vgpuctl discover -o json vs mdevctl types --dumpjson minus its "
                                                f"harness ({cpu['harness'] * 1000:.0f} ms); target (#25): <= 1.0x"))
        setup = "from pathlib import Path; from mdev_manager.discovery import discover; " \
                "from mdev_manager.host.io import RealIO; from benchmarks.bench_discovery import _env, bare_walk; " \
                f"s = Path({str(sys_dir)!r}); r = Path({str(root)!r})"
        try:
            imports = callgrind(_py(setup))
            ours_i = callgrind(_py(setup + "; discover(_env(s, r), RealIO())")) - imports
            bare_i = callgrind(_py(setup + "; bare_walk(s)")) - imports
            peer_i = callgrind(["mdevctl", "types", "--dumpjson"], wrap=ns) - callgrind(["mdevctl", "--version"], wrap=ns)
            lines += [
                row("plain tree, instructions (callgrind)", f"{ours_i / 1e6:.0f} M", f"{peer_i / 1e6:.0f} M",
                    ours_i / peer_i, "peer: mdevctl types minus mdevctl --version; user space only"),
                row("plain tree, instructions vs the bound", f"{ours_i / 1e6:.0f} M", f"{bare_i / 1e6:.0f} M",
                    ours_i / bare_i, "peer: the bare walk; both minus a Python that only imports"),
            ]
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            lines.append(f"instruction counts skipped: {exc}")
        # through FUSE: wall time and the requests each reader makes of the simulated kernel
        counts = {}
        walls = {}
        for side in ("ours", "mdevctl", "bare"):
            mnt, stats = Path(d) / f"mnt-{side}", Path(d) / f"stats-{side}.json"
            with mounted(root, mnt, stats=stats):
                fenv = _env(mnt, root)
                fn = {"ours": lambda fenv=fenv: discover(fenv, RealIO()),
                      "mdevctl": lambda mnt=mnt: in_namespace(mnt, etc, "mdevctl", "types", "--dumpjson"),
                      "bare": lambda mnt=mnt: bare_walk(mnt)}[side]
                walls[side] = _timed(fn)
            counts[side] = sum(json.loads(stats.read_text()).values())
        lines += [
            row("FUSE, requests", f"{counts['ours']}", f"{counts['mdevctl']}", counts["ours"] / counts["mdevctl"],
                "peer: mdevctl types; each side once on a fresh mount"),
            row("FUSE, requests vs the bound", f"{counts['ours']}", f"{counts['bare']}", counts["ours"] / counts["bare"],
                "peer: the bare walk"),
            row("FUSE, wall (one run each)", f"{walls['ours'] * 1000:.0f} ms", f"{walls['mdevctl'] * 1000:.0f} ms",
                walls["ours"] / walls["mdevctl"], "peer: mdevctl types incl. its harness"),
        ]
    return lines
