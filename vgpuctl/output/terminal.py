"""Where human output goes: ``rich`` on a terminal, plain text everywhere else.

On a terminal (stdout is a tty) tables and verdicts get colour, and long work a transient
progress bar. In a pipe, a file or CI the same renderables come out as plain text, without
colour, animation, trailing blanks or wrapping, so scripts and golden files see stable lines
(``FORCE_COLOR`` and friends do not turn a pipe into a terminal). Writes to a pipe go through
``sys.stdout`` itself, so a reader that went away ends the command with 141 in ``main``, not with
rich's own broken-pipe exit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, RenderableType

# Long work gets a progress bar: many steps, or steps that have run a while (the first round's
# count is all that is known up front; a later round may hold the many vGPUs). Short work shows none.
LONG_WORK_STEPS = 50
LONG_WORK_SECONDS = 0.5
PLAIN_WIDTH = 10_000  # no wrapping in pipes: one record, one line


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Terminal:
    """Prints renderables to stdout; ``tty`` tells whether anything may be fancy."""

    def __init__(self, file=None):
        self.file = file if file is not None else sys.stdout
        self.tty = _isatty(self.file)
        self.console = Console(file=self.file, force_terminal=self.tty, markup=False, highlight=False,
                               emoji=False, width=None if self.tty else PLAIN_WIDTH,
                               color_system="auto" if self.tty else None)

    def print(self, *items: RenderableType) -> None:
        if self.tty:
            for item in items:
                self.console.print(item)
            return
        with self.console.capture() as cap:
            for item in items:
                self.console.print(item)
        text = "\n".join(line.rstrip() for line in cap.get().splitlines())
        self.file.write(text + "\n" if text or items else "")

    @contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A spinner while the node is read (terminals only; it leaves no trace)."""
        if not self.tty:
            yield
            return
        with self.console.status(message):
            yield

    @contextmanager
    def progress(self, label: str, total: int, after: float = LONG_WORK_SECONDS
                 ) -> Iterator[Callable[[object], None]]:
        """Yields the per-step callback. On a terminal a transient bar over ``total`` steps appears
        at once for many steps, else once the work has run ``after`` seconds; steps past ``total``
        (a later round, planned on the node the first one made) grow it."""
        if not self.tty:
            yield lambda _step: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        start, done = time.monotonic(), 0
        bar: Progress | None = None

        def step(_step: object) -> None:
            nonlocal bar, done
            done += 1
            if bar is None:
                if total < LONG_WORK_STEPS and time.monotonic() - start < after:
                    return
                bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeElapsedColumn(), console=self.console, transient=True)
                bar.add_task(label, total=max(total, done), completed=done)
                bar.start()
                return
            task = bar.tasks[0]
            if task.total is not None and done > task.total:
                bar.update(task.id, total=done)
            bar.update(task.id, completed=done)

        try:
            yield step
        finally:
            if bar is not None:
                bar.stop()
