"""The one simulated-node builder of the tests: simulated hosts (sysfs tree + kernel write model).

``sim`` is the default preset; ``make_sim(preset_or_spec)`` builds any other one, each in
its own directory. A ``Sim`` bundles the host, the ``HostEnv`` rooted in it and the
``SimIO`` transport, which is all the manager needs to run unchanged against it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from mdev_manager import persist
from mdev_manager.config import parse_config
from mdev_manager.discovery import discover
from mdev_manager.host.env import HostEnv
from mdev_manager.models import Inventory, MdevDefinition
from mdev_manager.sim import HostSpec, SimHost, SimIO
from mdev_manager.sim.node import SimNode, sim_node

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_LAYOUT = REPO / "examples" / "layout.yaml"


@dataclass
class Sim:
    root: Path
    host: SimHost
    env: HostEnv
    io: SimIO

    def discover(self) -> Inventory:
        return discover(self.env, self.io, node="test-node")

    def with_env(self, **changes) -> Sim:
        """The same host seen through another environment (e.g. a libvirt URI)."""
        return Sim(self.root, self.host, HostEnv.under(self.root, **changes), self.io)

    def with_real_proc(self) -> Sim:
        """The same host whose processes are the real /proc's (to see real child processes)."""
        return self.with_env(proc_root=Path("/proc"))

    def definitions(self) -> list[MdevDefinition]:
        defs, problems = persist.load_definitions(self.env, self.io)
        assert problems == []
        return defs

    def records(self) -> dict[str, str]:
        return persist.load_vendor_vfio(self.env, self.io)


def _from(node: SimNode) -> Sim:
    return Sim(node.root, node.host, node.env, node.io)


def build_sim(root: Path, preset: str | HostSpec = "default", **env_changes) -> Sim:
    return _from(sim_node(root, preset, **env_changes))


def open_sim(root: Path) -> Sim:
    """An existing simulated host (e.g. a copy of another one)."""
    return _from(sim_node(root, None))


def copy_sim(src: Sim | Path, dst: Path) -> Sim:
    """A copy of a simulated host's tree and state; its processes are not copied (none runs in the copy)."""
    src_root = Path(src.root if isinstance(src, Sim) else src)
    procs = str(src_root / "proc")
    shutil.copytree(src_root, dst, symlinks=True, ignore=lambda d, names: names if d == procs else [])
    return open_sim(dst)


def layout(*entries: dict, name: str = "default") -> list:
    """Parsed vgpuctl/v1 layout entries."""
    return parse_config({"version": "vgpuctl/v1", "layouts": {name: list(entries)}}, name)


# --- a process that holds files open (a VM holding /dev/vfio/<group>) ------------------

class Holder:
    """A real child process holding files open. The simulated kernel sees it (EBUSY); the
    manager sees it through ``sim.with_real_proc()`` (``view``), since a simulated host's
    processes are otherwise its own (``SimHolder``)."""

    def __init__(self, paths: list[Path], tmp: Path):
        ready = tmp / f"holder-ready-{time.monotonic_ns()}"
        code = (
            "import sys, time\n"
            "files = [open(p) for p in sys.argv[2:]]\n"
            "open(sys.argv[1], 'w').close()\n"
            "time.sleep(120)\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(ready), *map(str, paths)])
        end = time.monotonic() + 20
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"holder exited with {self.proc.returncode}")
            if time.monotonic() > end:
                self.proc.kill()
                raise RuntimeError("holder never opened its files")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    @staticmethod
    def view(sim: Sim) -> Sim:
        """``sim`` as the manager must see it to find this holder."""
        return sim.with_real_proc()


class SimHolder:
    """A simulated process of ``sim``'s host holding files open (``SimHost.spawn_holder``)."""

    def __init__(self, sim: Sim, paths: list[Path], comm: str = "qemu-kvm"):
        self.host = sim.host
        self.pid = sim.host.spawn_holder(paths, comm=comm)

    def release(self) -> None:
        try:
            self.host.kill(self.pid)
        except ProcessLookupError:
            pass  # released already

    @staticmethod
    def view(sim: Sim) -> Sim:
        return sim


def libvirt_node_xml(domains: dict[str, tuple[list[str], list[str]]]) -> str:
    """A libvirt ``test:///`` node file: domain name -> (mdev UUIDs, PCI addresses) it holds."""
    out = ["<node>"]
    for name, (mdevs, pcis) in domains.items():
        devs = [f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{u}'/></source></hostdev>"
                for u in mdevs]
        for addr in pcis:
            dom, bus, rest = addr.split(":")
            slot, fn = rest.split(".")
            devs.append("<hostdev mode='subsystem' type='pci' managed='yes'><source>"
                        f"<address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/>"
                        "</source></hostdev>")
        out.append(f"<domain type='test'><name>{name}</name><memory>1048576</memory>"
                   f"<os><type>hvm</type></os><devices>{''.join(devs)}</devices></domain>")
    out.append("</node>")
    return "\n".join(out)


def libvirt_missing() -> str | None:
    try:
        import libvirt  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the machine
        return f"libvirt-python not importable: {e}"
    return None


needs_libvirt = pytest.mark.skipif(libvirt_missing() is not None, reason=str(libvirt_missing()))


def file_tree(root: Path, *, with_sim_state: bool = False) -> dict[str, str]:
    """Every file, link and directory under ``root`` with its content or link target: what a test
    compares before and after to show nothing was written. The simulator's own bookkeeping
    (``.sim*`` at any depth) is left out unless ``with_sim_state``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if not with_sim_state and any(part.startswith(".sim") for part in Path(rel).parts):
                continue
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                with open(p, "rb") as f:
                    out[rel] = f.read().decode(errors="replace")
    return out
