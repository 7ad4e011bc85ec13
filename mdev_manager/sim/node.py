"""The one builder of a simulated node: a simulated host, the ``HostEnv`` rooted in it and the
``SimIO`` transport into its kernel model — all the node manager needs to run unchanged on it.

The CLI (``--simulate``), the simulated cluster, the tests and the benchmarks all build their
nodes here, so a change to how a simulated node is put together is made once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mdev_manager.host.env import HostEnv
from mdev_manager.sim.hostspec import HostSpec, load_host
from mdev_manager.sim.io import SimIO
from mdev_manager.sim.kernel import SimHost
from mdev_manager.sim.uevents import RELAY


@dataclass(frozen=True)
class SimNode:
    """A simulated host seen through one environment."""

    root: Path
    host: SimHost
    env: HostEnv
    io: SimIO

    @property
    def spec(self) -> HostSpec:
        """The description the host was built from (kept in its state)."""
        return HostSpec.model_validate(self.host.state["spec"])

    @property
    def node(self) -> str:
        """The node name the simulated host stands for."""
        return self.spec.node

    def with_env(self, *, libvirt_uri: str | None = None, proc_root: Path | None = None) -> SimNode:
        """The same host (and transport) seen through another environment, e.g. a libvirt URI (the
        uevent relay kept as it was)."""
        env = HostEnv.under(self.root, libvirt_uri=libvirt_uri, proc_root=proc_root)
        return SimNode(self.root, self.host, env.with_(uevent_socket=self.env.uevent_socket), self.io)


def sim_node(root: Path | str, preset: str | Path | HostSpec | None = "default", *, reuse: bool = False,
             on_gpu: Callable[[], None] | None = None, libvirt_uri: str | None = None,
             proc_root: Path | None = None, relay_uevents: bool = False) -> SimNode:
    """A simulated node under ``root``.

    ``preset`` is a preset name, a host YAML file or a :class:`HostSpec`: a fresh host is built
    from it (``FileExistsError`` if ``root`` holds one already), unless ``reuse`` is set, which
    opens the host found there and builds one only when there is none (state that persists
    between commands, as ``vgpuctl --simulate`` keeps it). ``preset=None`` opens the existing
    host. ``libvirt_uri`` and ``proc_root`` go to :meth:`HostEnv.under`. ``relay_uevents``: the
    environment names the socket the host's kernel relays its uevents to (``HostEnv.uevent_socket``),
    so an agent on it hears them as a real one hears udev's; off by default, as an agent listening
    there also hears its own changes (what ``vgpuctl --simulate serve`` wants, not every test).
    """
    root = Path(root)
    if preset is None:
        host = SimHost(root)
    else:
        spec = preset if isinstance(preset, HostSpec) else load_host(preset)
        host = SimHost.open_or_create(root, spec) if reuse else SimHost.create(root, spec, on_gpu)
    env = HostEnv.under(root, libvirt_uri=libvirt_uri, proc_root=proc_root)
    if relay_uevents:
        env = env.with_(uevent_socket=root / RELAY)
    return SimNode(root, host, env, SimIO(host))


__all__ = ["SimNode", "sim_node"]
