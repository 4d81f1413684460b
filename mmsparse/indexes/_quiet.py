"""Silence native libraries (PISA's spdlog, progress bars printed from C++) at the fd level.

PISA writes to file descriptors 1 and 2 directly, so redirecting sys.stdout is not enough.
`quiet_fds()` points fds 1 and 2 at a temporary log while active; on an exception the log's
tail is attached to the error so nothing useful is lost. Progress bars drawn by the command line
survive this: `mmsparse.cli_ui.RichReporter` writes to a duplicate of the real stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_fds(keep: list[str] | None = None) -> Iterator[list[str] | None]:
    """Redirect fds 1 and 2 to a temporary file for the duration of the block; with `keep`, the
    text written there is appended to it on exit."""
    if os.environ.get("MMSPARSE_DEBUG") == "1":  # debugging: keep the engine's own logs
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield keep
        except BaseException as e:
            _restore(saved)
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace").strip()
            if tail and hasattr(e, "add_note"):
                e.add_note(f"engine log (tail):\n{tail}")
            raise
        else:
            _restore(saved)
            if keep is not None:
                log.seek(0)
                keep.append(log.read().decode("utf-8", "replace"))


def _restore(saved: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, dup in zip((1, 2), saved):
        if dup >= 0:
            os.dup2(dup, fd)
            os.close(dup)
    saved[:] = [-1, -1]


@contextlib.contextmanager
def captured_fds() -> Iterator[list[str]]:
    """Like quiet_fds, but the text written to fds 1 and 2 is appended to the yielded list on exit
    (engines that report figures on stderr, e.g. BMP's own search timer)."""
    out: list[str] = []
    with quiet_fds(keep=out):
        yield out
