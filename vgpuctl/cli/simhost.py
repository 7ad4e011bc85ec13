"""``--simulate``: the simulated host a command runs against (the [sim] extra).

The one CLI module that imports a simulator; ``main`` loads it only when ``--simulate`` is given,
after :func:`vgpuctl.cli.extras.require_sim` has checked the extra is installed.
"""

from __future__ import annotations

from pathlib import Path

from mdev_manager.sim import load_host
from mdev_manager.sim.node import SimNode, sim_node
from mdev_manager.sim.tree import IncompleteHost
from vgpuctl.cli.host import Host, sim_dir_for


def sim_root(args) -> Path:
    """Where the simulated host lives: ``--sim-dir``, else one directory per preset."""
    return Path(args.sim_dir) if args.sim_dir else sim_dir_for(args.simulate)


def whole_sim_node(root: Path, ref: str, sim_dir: str | None = None, **kw) -> SimNode:
    """``sim_node(root, ref, reuse=True)``: a host whose build was interrupted is refused in one line
    that says how to rebuild it (bad input, exit 2), never used as a host with fewer GPUs."""
    try:
        return sim_node(root, ref, reuse=True, **kw)
    except IncompleteHost:
        where = f" --sim-dir {sim_dir}" if sim_dir else ""
        raise ValueError(f"{root}: the simulated host {ref} is incomplete (its build or reset was interrupted); rebuild it: "
                         f"vgpuctl --simulate {ref}{where} sim reset") from None


def open_simulated(args) -> Host:
    """The simulated host of ``--simulate`` (state kept between commands): its kubelet directory
    is ``<sim dir>/kubelet`` unless ``--kubelet-root`` says otherwise, so ``serve --simulate`` and
    ``apply --simulate`` on one simulated node read the same prepared claims. Its environment names
    the socket the simulated kernel relays uevents to, so ``serve`` hears a ``sim unplug`` or a VF
    made by another command at once, as it hears udev's on a real host."""
    root = sim_root(args)
    sim = whole_sim_node(root, args.simulate, args.sim_dir, libvirt_uri=args.libvirt_uri, relay_uevents=True)
    kubelet = Path(args.kubelet_root) if getattr(args, "kubelet_root", None) else root / "kubelet"
    node = load_host(args.simulate).node

    return Host(env=sim.env, io=sim.io, node=node, kubelet_root=kubelet, preset=args.simulate, sim_root=root)
