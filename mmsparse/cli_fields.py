"""Typer parameters made from `option()` dataclass fields (mmsparse/options.py): commands whose
options are dataclasses (encode-dense: EncodeOptions; index: the engines' options) build their
flags and --help from the fields, so a new option is one field."""

from __future__ import annotations

import dataclasses
import inspect
from typing import List, Optional

import typer

TYPES = (("list", List[str]), ("bool", bool), ("int", int), ("float", float), ("str", str))


def param(f: dataclasses.Field) -> inspect.Parameter:
    """The keyword parameter of a typer command for dataclass field `f`: its flag (default
    --name-with-dashes; a switch on by default gets --no-...), help, panel, bounds, env var."""
    meta = f.metadata
    kind = next(t for k, t in TYPES if k in str(f.type))
    flag = meta.get("flag") or "--" + f.name.replace("_", "-")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if kind is bool and default and "/" not in flag:   # a switch that is on by default can be turned off
        flag = f"{flag}/--no-{flag[2:]}"
    opt = typer.Option(default, flag, *meta.get("aliases", ()), help=meta["help"], rich_help_panel=meta.get("panel"),
                       min=meta.get("min"), max=meta.get("max"), envvar=meta.get("envvar"),
                       show_default=default is not None and not meta.get("secret"))
    optional = "None" in str(f.type)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                             annotation=Optional[kind] if optional else kind)
