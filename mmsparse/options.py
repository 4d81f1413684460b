"""Options as dataclass fields that a command line turns into flags (the methods' configs,
EncodeOptions): `option()` makes a field carrying its help, bounds, choices, the paper's setting and
its --help panel; `check_options` checks an instance against them. No third-party import."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

from .errors import InputError


def option(default: Any, help: str, *, flag: str | None = None, aliases: tuple = (), min: float | None = None,
           max: float | None = None, choices: tuple | None = None, paper: str | None = None,
           panel: str | None = None, envvar: str | None = None, secret: bool = False, text: bool = False):
    """A config field with what the command line needs: `help` (units, meaning), `flag` (default
    --name-with-dashes; "--on/--off" for booleans), other spellings `aliases`, numeric
    `min`/`max`, `choices`, `paper`: the paper's setting this default is (shown in --help), and
    `panel`: the --help panel it is listed in (commands whose options are one dataclass), `envvar`:
    an environment variable the command line reads it from, `secret`: never shown or recorded
    (a token), `text`: the command line passes the value as written (a list such as
    --target-flops 12,9.4,6), for the API to parse."""
    meta = {"help": help, "flag": flag, "aliases": tuple(aliases), "min": min, "max": max, "choices": choices,
            "paper": paper, "panel": panel, "envvar": envvar, "secret": secret, "text": text}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_options(obj) -> None:
    """InputError naming the first `option()` field of dataclass `obj` outside its bounds or
    choices (None values pass: "not given")."""
    for f in fields(obj):
        m, v = f.metadata, getattr(obj, f.name)
        if v is None or not m:
            continue
        flag = m.get("flag") or "--" + f.name.replace("_", "-")
        if m.get("choices") and v not in m["choices"]:
            raise InputError(f"{flag.split('/')[0]} {v!r}: choose one of {', '.join(map(str, m['choices']))}")
        if m.get("min") is not None and v < m["min"] or m.get("max") is not None and v > m["max"]:
            raise InputError(f"{flag} {v!r}: must be in [{m.get('min')}, {m.get('max')}]")


def split_argv(args: list[str], valued: tuple[str, ...]) -> tuple[dict[str, str | None], list[str]]:
    """({flag: value} for each flag of `valued` in args, taking the next argument (None at the end),
    the remaining arguments in order): the small `python -m mmsparse.methods.X` tools' parsing."""
    opts, rest, it = {}, [], iter(args)
    for x in it:
        if x in valued:
            opts[x] = next(it, None)
        else:
            rest.append(x)
    return opts, rest
