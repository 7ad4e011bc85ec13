"""CLI start-up (issue #32): CPU of ``vgpuctl --version``, ``-h`` and each command's ``-h`` as whole
processes, interleaved with the peer, ``kubectl version --client`` (kubectl 1.37, a Go binary).

Each figure is the median over ``ROUNDS`` runs of the child's user + system CPU time (from
``getrusage(RUSAGE_CHILDREN)``), so a loaded machine's waiting does not count. Bound: 100 ms for
``--version``, ``-h`` and every command's own ``-h`` (issue #37: a command's module imports its work
where it runs, so its help costs its argument definitions alone).

Then a preview (issue #37, point 6): ``slices -f examples/mig-layout.yaml --layout dra`` on a freshly
reset ``a100-node`` that does not match the layout yet, wall and CPU of the whole process; bound 1 s.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import HEADER, row

ROUNDS = 9
BOUND_MS = 100.0
PREVIEW_ROUNDS = 3
PREVIEW_BOUND_S = 1.0
PREVIEW = ["--simulate", "a100-node", "slices", "-f", "examples/mig-layout.yaml", "--layout", "dra"]


def _cpu_ms(argv: list[str], env: dict[str, str] | None = None) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def _vgpuctl() -> list[str]:
    exe = Path(sys.executable).with_name("vgpuctl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vgpuctl"]


def _kubectl() -> list[str] | None:
    exe = Path(sys.executable).with_name("kubectl")
    found = str(exe) if exe.exists() else shutil.which("kubectl")
    return [found, "version", "--client"] if found else None


def run() -> list[str]:
    from vgpuctl.main import COMMANDS

    vg, peer = _vgpuctl(), _kubectl()
    cases = [("--version", ["--version"]), ("-h", ["-h"])] + [(f"{c} -h", [c, "-h"]) for c in COMMANDS]
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    peer_times: list[float] = []
    bare: list[float] = []  # the interpreter alone, with this machine's site-packages (.pth files run at start)
    env_note = f"median of {ROUNDS}, CPU of the whole process; {os.cpu_count()} CPUs"
    for _ in range(ROUNDS):  # interleaved: each round runs every case and the peer once
        for name, args in cases:
            times[name].append(_cpu_ms([*vg, *args]))
        if peer:
            peer_times.append(_cpu_ms(peer))
        bare.append(_cpu_ms([sys.executable, "-c", "pass"]))
    p = statistics.median(peer_times) if peer_times else None
    lines = [f"CLI start-up, CPU ms ({env_note}); peer: kubectl version --client; bound {BOUND_MS:.0f} ms "
             "for --version and every -h", HEADER]
    lines.append(row("python -c pass (interpreter and site: the floor)", f"{statistics.median(bare):.0f} ms", "-",
                     None, ""))
    for name, _ in cases:
        ours = statistics.median(times[name])
        verdict = ("within" if ours <= BOUND_MS else "OVER") + f" the {BOUND_MS:.0f} ms bound"
        lines.append(row(f"vgpuctl {name}", f"{ours:.0f} ms", f"{p:.0f} ms" if p else "-",
                         ours / p if p else None, verdict))
    return lines
    return lines + preview()


def preview() -> list[str]:
    """The slices preview of a node that needs the agent's setup first, on a private, freshly reset node."""
    vg, repo = _vgpuctl(), Path(__file__).resolve().parents[1]
    walls, cpus = [], []
    for _ in range(PREVIEW_ROUNDS):
        with tempfile.TemporaryDirectory(prefix="bench-preview-") as d:
            env = {**os.environ, "VGPUCTL_SIM_DIR": d}
            subprocess.run([*vg, "--simulate", "a100-node", "sim", "reset"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True, env=env, cwd=repo)
            t0 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([*vg, *PREVIEW], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                           env=env, cwd=repo)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            walls.append(time.perf_counter() - t0)
            cpus.append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
    wall = statistics.median(walls)
    user, sys_ = statistics.median(c[0] for c in cpus), statistics.median(c[1] for c in cpus)
    verdict = ("within" if wall <= PREVIEW_BOUND_S else "OVER") + f" the {PREVIEW_BOUND_S:.0f} s bound (wall)"
    return ["", f"preview: vgpuctl {' '.join(PREVIEW)}, fresh node, median of {PREVIEW_ROUNDS}", HEADER,
            row("slices -f ... --layout dra, wall", f"{wall:.2f} s", "-", None, verdict),
            row("  its CPU: user / system", f"{user:.2f} / {sys_:.2f} s", "-", None, "")]
