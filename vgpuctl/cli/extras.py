"""What an optional part of vgpuctl needs installed, and the one line that says how to get it."""

from __future__ import annotations

from importlib.util import find_spec

#: The [sim] extra: the simulated host (FUSE) and cluster (the API schemas the local server checks).
SIM_MODULES = ("mfusepy", "kubernetes_validate")


class MissingExtra(ValueError):
    """A command needs an extra that is not installed (bad input: exit 2, one line)."""


def require_sim(what: str) -> None:
    """Raise :class:`MissingExtra` naming the pip command when the [sim] extra is missing."""
    missing = [m for m in SIM_MODULES if find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{what} needs the simulators, which are not installed ({', '.join(missing)} missing): "
                           "pip install 'vgpuctl[sim]'")
