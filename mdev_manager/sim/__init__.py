"""A simulated GPU host: a sysfs tree on disk that behaves like the kernel on writes.

Production code never imports this package; it is handed a ``HostEnv`` rooted in the
simulated tree and a ``SimIO`` transport (in-process) or a FUSE mount (real file I/O).
"""

from mdev_manager.sim.hostspec import HostSpec, load_host, preset_names
from mdev_manager.sim.io import SimIO
from mdev_manager.sim.kernel import SimHost

__all__ = ["HostSpec", "SimHost", "SimIO", "load_host", "preset_names"]
