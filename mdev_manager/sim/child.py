"""Start-up of the simulators' child processes (the kernel model's, the FUSE daemon's).

Each child runs ``python -m mdev_manager.sim.<module>`` from this checkout and is ready once
something appears outside it (a socket, a mount): :func:`wait_started` polls for that and fails
with one message naming the child, what it was to do and (when given) its output, as soon as
the child exits or the deadline passes, so a broken child never leaves its caller waiting.
:func:`reap` ends one that was asked to stop, and does not wait forever on one that does not.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

POLL = 0.02
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def child_env() -> dict[str, str]:
    """This environment with the checkout first on ``PYTHONPATH``: the child imports the same code."""
    env = dict(os.environ)
    project = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [project, env.get("PYTHONPATH")]))
    return env


def wait_started(proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float, what: str, goal: str,
                 output: Callable[[], str] | None = None) -> None:
    """Return once ``ready()``; ``RuntimeError`` if ``proc`` exits first or ``timeout`` seconds pass.

    ``what`` names the child ("the FUSE daemon"), ``goal`` what readiness means, as a verb phrase
    ("mount /mnt"); ``output`` returns the child's output so far, added to the message.
    """
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            problem = f"{what} exited with {proc.returncode} before it could {goal}"
        elif time.monotonic() > deadline:
            problem = f"{what} did not {goal} within {timeout:g}s"
        else:
            time.sleep(POLL)
            continue
        raise RuntimeError(f"{problem}:\n{output()}" if output is not None else problem)


def reap(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``proc``, asked to stop, to exit; then SIGTERM it, and SIGKILL it
    :data:`TERM_GRACE` seconds later."""
    try:
        proc.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
