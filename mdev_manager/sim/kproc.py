"""The simulated kernel in a process of its own, as a real kernel is no part of the agent's process.

In-process (:class:`~.io.SimIO`), every ``create`` the agent writes runs the kernel model's Python in
the agent's own process, under the agent's GIL: a benchmark then charges the simulator's work to
the agent. Here the model runs in a child process (``python -m mdev_manager.sim.kproc ROOT SOCKET``)
and :class:`ProcIO` hands it each kernel write over a unix socket, waiting for its answer as a
``write(2)`` to sysfs waits for the kernel. Reads stay plain reads of the tree (a sysfs read costs
the reader a syscall and no Python of the kernel's). NVML stays in the caller's process, as NVIDIA's
library is loaded into its caller (:class:`~.nvml.SimNvml` reads the state file).

The child serves each connection on its own thread (one connection per writer thread of the
client), so writes to different GPUs reach the model at once and the model's own locks order them
(:meth:`.kernel.SimHost.write`). A refused write comes back as the same ``OSError`` (errno and
message) the in-process model raises.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TypeVar

from mdev_manager.sim.child import child_env, reap, wait_started
from mdev_manager.sim.io import SimIO
from mdev_manager.sim.kernel import SimHost

START_TIMEOUT = 30.0
_P = TypeVar("_P", bound="ProcIO")


def serve(root: Path, address: str) -> None:
    """Answer kernel writes on ``address`` until a client sends ``("stop",)``."""
    SimHost.remember_attrs = True  # this process writes the capacity files: it may remember them
    host = SimHost(root)
    listener = Listener(address, family="AF_UNIX")
    stopping = threading.Event()

    def handle(conn: Connection) -> None:
        with conn:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    return
                if msg[0] == "write":
                    try:
                        host.write(Path(msg[1]), msg[2])
                        conn.send(None)
                    except OSError as exc:
                        conn.send(("oserror", exc.errno, exc.strerror))
                    except Exception as exc:  # a bug in the model: the caller sees it, as in-process
                        conn.send(("error", f"{type(exc).__name__}: {exc}"))
                elif msg[0] == "cpu":  # the kernel model's own CPU seconds so far (user + system)
                    conn.send(time.process_time())
                elif msg[0] == "stop":
                    stopping.set()
                    conn.send(None)
                    with contextlib.suppress(OSError):
                        Client(address, family="AF_UNIX").close()  # wake accept()
                    return

    while not stopping.is_set():
        try:
            conn = listener.accept()
        except OSError:
            break
        if stopping.is_set():
            conn.close()
            break
        threading.Thread(target=handle, args=(conn,), daemon=True).start()
    listener.close()


class ProcIO(SimIO):
    """:class:`SimIO` whose kernel writes go to the model in another process (:func:`kernel_process`)."""

    def __init__(self, host: SimHost, address: str):
        super().__init__(host)
        self.address = address
        self._conns = threading.local()
        self._all: list[Connection] = []
        self._all_lock = threading.Lock()

    def _conn(self) -> Connection:
        conn = getattr(self._conns, "conn", None)
        if conn is None:
            conn = self._conns.conn = Client(self.address, family="AF_UNIX")
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _call(self, *msg: object) -> object:
        conn = self._conn()
        conn.send(msg)
        return conn.recv()

    def write(self, path: Path, data: str) -> None:
        real = os.path.realpath(path)
        if not (real == self._sys or real.startswith(self._sys + os.sep)):
            return super().write(path, data)
        answer = self._call("write", real, data)
        if answer is None:
            return
        assert isinstance(answer, tuple)
        if answer[0] == "oserror":
            raise OSError(answer[1], answer[2])
        raise RuntimeError(f"the simulated kernel failed on a write to {real}: {answer[1]}")

    def kernel_cpu(self) -> float | None:
        """The kernel process's own CPU seconds so far."""
        out = self._call("cpu")
        assert isinstance(out, float)
        return out

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()


@contextlib.contextmanager
def kernel_process(host: SimHost, io_class: type[_P] = ProcIO) -> Iterator[_P]:  # type: ignore[assignment]
    """Run ``host``'s kernel model in a child process; yield the transport into it, stop it on exit."""
    with tempfile.TemporaryDirectory(prefix="vgk", dir="/tmp") as d:  # unix socket paths must stay short
        address = os.path.join(d, "k")
        proc = subprocess.Popen([sys.executable, "-m", "mdev_manager.sim.kproc", str(host.root), address],
                                stdin=subprocess.DEVNULL, env=child_env())
        io = io_class(host, address)
        try:
            wait_started(proc, lambda: os.path.exists(address), START_TIMEOUT, "the simulated kernel's process",
                         f"listen on {address}")
            yield io
        finally:
            with contextlib.suppress(OSError, EOFError):
                if proc.poll() is None:
                    stopper = Client(address, family="AF_UNIX")
                    stopper.send(("stop",))
                    stopper.recv()
                    stopper.close()
            io.close()
            reap(proc, 10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdev_manager.sim.kproc",
                                 description="Serve a simulated host's kernel writes on a unix socket.")
    ap.add_argument("root", type=Path, help="simulated host root (holds sys/ and .sim/)")
    ap.add_argument("socket", help="the unix socket to listen on")
    args = ap.parse_args(argv)
    serve(args.root, args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
