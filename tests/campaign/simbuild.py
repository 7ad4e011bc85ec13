"""The campaign's interrupted simulator build (issue #36.5): the simulated node is rebuilt with
``vgpuctl --simulate <host> sim reset`` (a machine re-imaged: the kernel's devices, the saved state,
the kubelet's directory and libvirt's domains are gone) and SIGINT or SIGTERM arrives while the build
is half done, as a user's Ctrl-C or a CI runner's timeout does.

What must hold (design: :mod:`mdev_manager.sim.tree`, a host is whole only after its build's last
write): the interrupted reset exits 128 + the signal's number saying the host is incomplete and how to
rebuild it; every command on the half-built host is refused in one line naming that fix (exit 2,
nothing on stdout: never a host read as having fewer GPUs, or none); the reset it names rebuilds the
host; the agent then starts on it, the kubelet prepares its pods' claims again, and the invariants
hold after the agent's resync.

The signal is real (``os.kill`` of this process, taken by ``sim reset``'s own handlers); where it lands
is the step's draw: at the build's GPU number ``after`` (counted from 0), the last one being after the
build's last check (the host is whole: sim reset says so, exit 128 + the signal's number, and commands
work on it).
"""

from __future__ import annotations

import contextlib
import io as iolib
import os
import shutil
import signal
from dataclasses import dataclass

import yaml
from hypothesis import strategies as st

from mdev_manager.sim.node import sim_node
from mdev_manager.sim.tree import SysfsTree
from tests.campaign.faults import Disk
from tests.campaign.steps import Checks, _resynced
from tests.campaign.world import HOST, World
from vgpuctl.main import main as vgpuctl


@contextlib.contextmanager
def signal_during_build(signum: int, after: int):
    """While entered, a simulated host's build sends this process ``signum`` once GPU ``after`` is built."""
    populate = SysfsTree._populate

    def signalled(self, spec, on_gpu):
        built = [0]

        def one() -> None:
            built[0] += 1
            last = built[0] == len(spec.gpus)
            if built[0] == after + 1 and not last:
                os.kill(os.getpid(), signum)  # handled before the next bytecode, by sim reset's handler
            on_gpu()  # sim reset stops at this GPU
            if built[0] == after + 1 and last:
                os.kill(os.getpid(), signum)  # after the last GPU's check: the build ends whole

        populate(self, spec, one)

    SysfsTree._populate = signalled  # type: ignore[method-assign]
    try:
        yield
    finally:
        SysfsTree._populate = populate  # type: ignore[method-assign]


def _vgpuctl(*argv: str) -> tuple[int, str, str]:
    out, err = iolib.StringIO(), iolib.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = vgpuctl(list(argv))
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class SimRebuild:
    """The node's simulated host is rebuilt and the build is interrupted by ``signal`` after GPU
    ``after``; the commands run on it then, the reset again, the agent and the kubelet after it."""

    signal: str  # SIGINT | SIGTERM
    after: int

    def run(self, world: World) -> Checks:
        spec = world.base / "host.yaml"  # the admin's host file, gone with the step (not the tool's)
        spec.write_text(yaml.safe_dump(HOST.model_dump(mode="json")))
        try:
            return self._run(world, ["--simulate", str(spec), "--sim-dir", str(world.node.root)])
        finally:
            spec.unlink()

    def _run(self, world: World, sim: list[str]) -> Checks:
        world.stop_daemon()  # the machine is re-imaged: nothing of it runs
        for pid in list(world.vms):
            world.node.host.kill(pid)
        world.vms.clear()
        signum = int(getattr(signal, self.signal))
        after = self.after % len(HOST.gpus)
        whole = after == len(HOST.gpus) - 1  # the signal came after the last GPU's check: nothing is left to do
        with signal_during_build(signum, after):
            code, out, err = _vgpuctl(*sim, "sim", "reset")
        world.log.append(f"sim reset, {self.signal} at GPU {after}: exit {code}\n{out}{err}")
        problems = []
        said = "is whole" if whole else "incomplete"
        if code != 128 + signum or len(err.splitlines()) != 1 or said not in err or ("sim reset" in err) == whole:
            problems.append(f"sim reset interrupted by {self.signal} at GPU {after} of {len(HOST.gpus)} exited {code}: "
                            f"{(out + err).strip()[-300:]!r}")
        if whole:
            return _rebuilt(world, problems)
        for argv in (["discover"], ["apply", "-f", str(world.base / "layouts.yaml"), "--layout", world.selected]):
            code, out, err = _vgpuctl(*sim, *argv)
            world.log.append(f"vgpuctl {argv[0]} on the half-built host: exit {code}\n{out[-300:]}{err}")
            if (code, out) != (2, "") or len(err.splitlines()) != 1 or "sim reset" not in err:
                problems.append(f"vgpuctl {argv[0]} on a half-built host: exit {code}, "
                                f"{(out + err).strip()[-300:]!r} (one line naming sim reset, exit 2 expected)")
        code, out, err = _vgpuctl(*sim, "sim", "reset")
        world.log.append(f"sim reset again: exit {code} {out}{err}")
        if code != 0:
            return Checks(problems=[*problems, f"sim reset after an interrupted one exited {code}: {err[-300:]}"])
        return _rebuilt(world, problems)


def _rebuilt(world: World, problems: list[str]) -> Checks:
    """The world on the rebuilt host (booted once, no page cache, no domains, no health faults, tmpfs
    empty), the agent started, the pods bound to the node back (their claims prepared again)."""
    world.node = sim_node(world.node.root, None, libvirt_uri=world.libvirt_uri)
    world.node.host.reboot()  # a boot id, as every real host has
    world.disk = Disk()
    world.domains.clear()
    world.write_domains()
    world.health.clear()
    shutil.rmtree(world.paths.cdi_root, ignore_errors=True)
    world.start_daemon()
    failed = world.kubelet_reprepare()
    checks = _resynced(world, "resync on the rebuilt host", world.selected)
    checks.problems += problems + [f"after the rebuild: {f}" for f in failed]
    return checks


def kinds() -> list[tuple[int, st.SearchStrategy]]:
    """The step with its weight, appended to :func:`tests.campaign.steps.steps`'s kinds."""
    return [(1, st.builds(SimRebuild, st.sampled_from(["SIGINT", "SIGTERM"]), st.integers(0, 2)))]
