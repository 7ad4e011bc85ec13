"""``--simulate``: the simulated host a command runs against (the [sim] extra).

The one CLI module that imports a simulator; ``main`` loads it only when ``--simulate`` is given,
after :func:`vgpuctl.cli.extras.require_sim` has checked the extra is installed.
"""

from __future__ import annotations

from pathlib import Path

from mdev_manager.sim import load_host
from mdev_manager.sim.node import sim_node
from vgpuctl.cli.host import Host, sim_dir_for


def sim_root(args) -> Path:
    """Where the simulated host lives: ``--sim-dir``, else one directory per preset."""
    return Path(args.sim_dir) if args.sim_dir else sim_dir_for(args.simulate)


def open_simulated(args) -> Host:
    """The simulated host of ``--simulate`` (state kept between commands): its kubelet directory
    is ``<sim dir>/kubelet`` unless ``--kubelet-root`` says otherwise, so ``serve --simulate`` and
    ``apply --simulate`` on one simulated node read the same prepared claims."""
    root = sim_root(args)
    sim = sim_node(root, args.simulate, reuse=True, libvirt_uri=args.libvirt_uri)
    kubelet = getattr(args, "kubelet_root", None)
    return Host(env=sim.env, io=sim.io, node=load_host(args.simulate).node,
                kubelet_root=Path(kubelet) if kubelet else root / "kubelet", preset=args.simulate, sim_root=root)
