"""SIGINT and SIGTERM while a command changes the node: finish the write in flight, then stop.

The node manager's writes are ordered so that the node between any two of them is one the next run
completes (docs/design.md, "Crash safety by ordering"); stopping there, instead of wherever Python
happens to be, leaves nothing half-written. The command then says what was done and what is left
and exits 128 + the signal's number, as a shell reports a process the signal ended (130, 143).
"""

from __future__ import annotations

import signal
from types import FrameType


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
