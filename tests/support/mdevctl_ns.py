"""Run Debian's mdevctl against a simulated host, in a private mount namespace.

mdevctl 1.2.0 reads fixed paths (``/sys/class/mdev_bus``, ``/sys/bus/mdev/devices``,
``/etc/mdevctl.d``, and refuses to run without ``/etc/mdevctl.d/scripts.d/callouts``), so
``run_mdevctl`` bind-mounts the (FUSE-mounted) simulated ``sys/`` over ``/sys`` and the
host's ``etc/mdevctl.d`` over ``/etc/mdevctl.d`` inside ``unshare -m``, after making every
mount private: nothing is visible outside the namespace, which dies with mdevctl.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

MDEVCTL = "/usr/bin/mdevctl"
TIMEOUT = 30.0

_SCRIPT = (
    'mount --make-rprivate / && mount --bind "$1" /sys && mount --bind "$2" /etc/mdevctl.d '
    '&& shift 2 && exec mdevctl "$@"'
)


def missing_facilities() -> list[str]:
    """Why mdevctl cannot run here in a namespace (empty when it can)."""
    why = []
    if os.geteuid() != 0:
        why.append("not root (mount namespaces and bind mounts need CAP_SYS_ADMIN)")
    if shutil.which("unshare") is None:
        why.append("no unshare (util-linux)")
    if not os.access(MDEVCTL, os.X_OK):
        why.append(f"no {MDEVCTL} (apt-get install mdevctl)")
    if not os.path.isdir("/etc/mdevctl.d"):
        why.append("no /etc/mdevctl.d to bind over (the mdevctl package creates it)")
    return why


def run_mdevctl(mounted_sys: Path, etc_dir: Path, *args: str, timeout: float = TIMEOUT,
                check: bool = False) -> subprocess.CompletedProcess:
    """``mdevctl ARGS`` with ``/sys`` = ``mounted_sys`` and ``/etc/mdevctl.d`` = ``etc_dir``."""
    cmd = ["unshare", "-m", "sh", "-c", _SCRIPT, "sh", str(mounted_sys), str(etc_dir), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RUST_BACKTRACE": "0"})
    if check and proc.returncode != 0:
        raise AssertionError(f"mdevctl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def mdevctl_json(mounted_sys: Path, etc_dir: Path, *args: str, timeout: float = TIMEOUT):
    """Run a ``--dumpjson`` command; mdevctl prints nothing at all when the list is empty."""
    out = run_mdevctl(mounted_sys, etc_dir, *args, "--dumpjson", timeout=timeout, check=True).stdout
    return json.loads(out) if out.strip() else []
