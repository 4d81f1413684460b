"""Errors that the CLI turns into one line on stderr and an exit code.

`InputError` (exit 2) is bad input or usage: a missing file, a wrong kind of file, a
mismatch between files. `BudgetMissed` (exit 3): a head written outside its FLOPs budget. Anything else escaping a command is an internal error (exit 1).
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input or usage; the message names the file, the field and the fix (exit code 2)."""


class BudgetMissed(Exception):
    """A head was trained and written, but its saved epoch's validation FLOPs lie outside its
    --target-flops band (recorded as off_budget in its config.json); the message names the head,
    the FLOPs reached and what to change (exit code 3)."""


def require_file(path: str | Path, what: str) -> Path:
    """Return `path` as a Path if it is an existing file, else raise InputError naming `what`."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: {what} not found")
    if not p.is_file():
        raise InputError(f"{p}: expected a {what} file, found a directory")
    return p


def require_dir(path: str | Path, what: str) -> Path:
    """Return `path` as a Path if it is an existing directory, else raise InputError."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: {what} not found")
    if not p.is_dir():
        raise InputError(f"{p}: expected a {what} directory, found a file")
    return p
