"""SIGINT and SIGTERM while a command changes the node: finish the write in flight, then stop.

The node manager's writes are ordered so that the node between any two of them is one the next run
completes (docs/design.md, "Crash safety by ordering"); stopping there, instead of wherever Python
happens to be, leaves nothing half-written. The command then says what was done and what is left
and exits 128 + the signal's number, as a shell reports a process the signal ended (130, 143).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def take_interrupts() -> None:
    """SIGINT ends vgpuctl as Ctrl-C does in a terminal, also when a shell started it in the background.

    A non-interactive shell starts ``cmd &`` with SIGINT ignored, and Python then never raises
    ``KeyboardInterrupt``; :class:`StopSignals` installs its own handler all the same, so a SIGINT was
    lost before a command's first write and taken after it (issue #36.7: once ignored 0.5 s into
    ``sim reset``, taken in 33 other tries). Called first thing by every entry point: from there on a
    SIGINT is taken the same way wherever it lands. One that arrives while the interpreter itself
    starts, before any of vgpuctl runs, is still discarded by the kernel: scripts stop vgpuctl with
    SIGTERM, which nothing ignores."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class StopSignals:
    """While entered, SIGINT and SIGTERM are remembered instead of ending the process; :meth:`pending`
    (the executor's ``stop``) names the first one. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = self.signum or signum

    def pending(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    def __enter__(self) -> StopSignals:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
