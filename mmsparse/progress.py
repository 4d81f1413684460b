"""How long library calls report progress to whoever called them.

Every API function that runs for more than a moment takes `progress: Reporter | None`. The
library only calls the methods below; it never draws anything itself. The default `Reporter`
does nothing, `LogReporter` writes to the `logging` module, and the command line passes one that
draws rich progress bars on stderr (`mmsparse.cli_ui.RichReporter`).

    with progress.task("sparsify", total=n_rows) as t:
        for ...:
            t.advance(len(batch))
    progress.log("sparsify: 1000 rows -> out.h5")
"""

from __future__ import annotations

import logging


class Task:
    """One progress bar. `total` None = unknown length (a spinner). A context manager: the bar
    closes on exit."""

    def advance(self, n: int = 1) -> None:
        """`n` more units done."""

    def update(self, completed: int | None = None, total: int | None = None,
               description: str | None = None, info: str | None = None) -> None:
        """Set the units done, the length, the label, or the text shown after the bar."""

    def close(self) -> None:
        """The task is over (called by __exit__)."""

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Reporter:
    """Receives progress and messages from library calls; the base class ignores both."""

    def task(self, description: str, total: int | None = None) -> Task:
        """Start a progress bar of `total` units (None: unknown)."""
        return Task()

    def log(self, message: str) -> None:
        """A line worth showing a person (an epoch's figures, a summary)."""


class LogReporter(Reporter):
    """Reporter for Python users and services: messages go to `logging` (logger "mmsparse"),
    progress to DEBUG every 10 % of a task."""

    def __init__(self, logger: logging.Logger | None = None):
        self.logger = logger or logging.getLogger("mmsparse")

    def task(self, description: str, total: int | None = None) -> Task:
        return _LogTask(self.logger, description, total)

    def log(self, message: str) -> None:
        self.logger.info(message)


class _LogTask(Task):
    def __init__(self, logger, description, total):
        self.logger, self.description, self.total, self.done, self.shown = logger, description, total, 0, -1

    def advance(self, n: int = 1) -> None:
        self.update(completed=self.done + n)

    def update(self, completed=None, total=None, description=None, info=None) -> None:
        self.total = total if total is not None else self.total
        self.description = description or self.description
        if completed is not None:
            self.done = completed
        if self.total:
            tenth = int(10 * self.done / self.total)
            if tenth != self.shown:
                self.shown = tenth
                self.logger.debug("%s: %d/%d %s", self.description, self.done, self.total, info or "")


def reporter(progress: Reporter | None) -> Reporter:
    """`progress` itself, or the silent default when None."""
    return progress if progress is not None else Reporter()
