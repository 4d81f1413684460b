"""What every output records about how it was made."""

from __future__ import annotations

import shlex
import sys

from . import __version__


def command_line() -> str:
    """The command line of this process, shell-quoted (as a user could paste it)."""
    return " ".join(shlex.quote(a) for a in ["mmsparse", *sys.argv[1:]]) if sys.argv else ""


def stamp() -> dict[str, str]:
    """Attributes every output file carries: `mmsparse_version` and `command`."""
    return {"mmsparse_version": __version__, "command": command_line()}
