"""What the command line shows: rich progress bars and messages on stderr.

`RichReporter` implements `mmsparse.progress.Reporter` for the commands. It writes to a
duplicate of file descriptor 2, so bars keep drawing while an engine (PISA) has the real fds
redirected (`mmsparse.indexes._quiet.quiet_fds`).
"""

from __future__ import annotations

import os
import sys

from .progress import Reporter, Task


def stderr_console():
    """A rich Console on a duplicate of the current stderr (survives fd redirection)."""
    from rich.console import Console

    return Console(file=os.fdopen(os.dup(2), "w", buffering=1), stderr=True,
                   force_terminal=sys.stderr.isatty() or None, highlight=False, soft_wrap=True)


class RichReporter(Reporter):
    """Progress bars (description, bar, done/total, elapsed, info text) and log lines on stderr.
    Bars are transient: when a task closes its bar disappears and log lines stay."""

    def __init__(self, console=None):
        self.console = console or stderr_console()
        self._progress = None
        self._open = 0

    def _bars(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._progress is None:
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                                      console=self.console, transient=True)
            self._progress.start()
        return self._progress

    def task(self, description: str, total: int | None = None) -> Task:
        if not self.console.is_terminal:  # logs and pipes get the log lines, not bar redraws
            return Task()
        bars = self._bars()
        self._open += 1
        return _RichTask(self, bars, bars.add_task(description, total=total, info=""))

    def log(self, message: str) -> None:
        (self._progress.console if self._progress is not None else self.console).print(message, markup=False)

    def _closed(self, task_id) -> None:
        self._progress.remove_task(task_id)
        self._open -= 1
        if self._open == 0:
            self._progress.stop()
            self._progress = None


class _RichTask(Task):
    def __init__(self, owner: RichReporter, bars, task_id):
        self.owner, self.bars, self.id, self.closed = owner, bars, task_id, False

    def advance(self, n: int = 1) -> None:
        self.bars.advance(self.id, n)

    def update(self, completed=None, total=None, description=None, info=None) -> None:
        kw = {k: v for k, v in (("completed", completed), ("total", total), ("description", description),
                                ("info", info)) if v is not None}
        self.bars.update(self.id, **kw)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner._closed(self.id)
