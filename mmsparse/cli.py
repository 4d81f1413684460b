"""The `mmsparse` console script: one Typer subcommand per stage.

Exit codes: 0 success, 2 bad input or usage (one line on stderr), 1 internal error.
Set MMSPARSE_DEBUG=1 (or pass --debug anywhere on the command line) for the full traceback.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path

import typer

from .commands import encode_dense, eval as eval_cmd, index, inspect, search, sparsify, train_head
from .commands import query as query_cmd, serve as serve_cmd
from .commands import export as export_cmd, import_terms
from .errors import BudgetMissed, InputError

app = typer.Typer(
    name="mmsparse",
    help="Multimodal learned sparse retrieval: dense VLM vectors -> sparse terms -> inverted index. "
         "Exit codes: 0 success, 2 bad input or usage, 1 internal error; errors are one line on stderr "
         "(add --debug anywhere for the traceback).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        from ._version import __version__

        typer.echo(f"mmsparse {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                          help="Print the mmsparse version and exit.")) -> None:
    """Multimodal learned sparse retrieval (see `mmsparse COMMAND --help`)."""


_ENTRY: dict = {"argv": None}  # set by main(): the process's own command line is the one to record


def _recorded(func):
    """Run a command inside a provenance recording whose command is the user's shell line; the
    API function the command calls registers its own inputs (provenance.recorded)."""
    @functools.wraps(func)
    def run(*args, **kwargs):
        from . import provenance

        argv = _ENTRY["argv"]
        command = (" ".join(shlex.quote(a) for a in ["mmsparse", *argv]) if argv is not None
                   else _click_command_line())
        # inputs: the API function the command calls adds its own (provenance.recorded)
        with provenance.recording([], seed=kwargs.get("seed"), command=command):
            return func(*args, **kwargs)
    return run


app.command("encode-dense", no_args_is_help=True)(_recorded(encode_dense.main))
app.command("train-head", no_args_is_help=True)(_recorded(train_head.main))
app.command("sparsify", no_args_is_help=True)(_recorded(sparsify.main))
app.command("index", no_args_is_help=True)(_recorded(index.main))
app.command("search", no_args_is_help=True)(_recorded(search.main))
app.command("eval", no_args_is_help=True)(_recorded(eval_cmd.main))
app.command("inspect", no_args_is_help=True)(_recorded(inspect.main))
app.command("query", no_args_is_help=True)(_recorded(query_cmd.main))
app.command("serve", no_args_is_help=True)(_recorded(serve_cmd.main))
app.command("export", no_args_is_help=True)(_recorded(export_cmd.main))
app.command("import", no_args_is_help=True)(_recorded(import_terms.main))


def _click_command_line() -> str | None:
    """`mmsparse SUBCOMMAND ARGS...` rebuilt from the running click context (arguments, and the
    options that differ from their defaults): the command line under typer's CliRunner, where
    there is no process argv of ours. None outside a context; never raises."""
    try:
        try:  # typer >= 0.16 vendors its own click
            from typer._click.globals import get_current_context
        except ImportError:
            from click import get_current_context
        ctx = get_current_context(silent=True)
        if ctx is None:
            return None
        parts = ["mmsparse", ctx.info_name or ""]
        for p in ctx.command.params:
            v = ctx.params.get(p.name)
            if v is None or v == p.default or (v in ((), []) and not p.default):
                continue
            vals = list(v) if isinstance(v, (list, tuple)) else [v]
            if "argument" in type(p).__name__.lower():
                parts += [str(x) for x in vals]
            elif getattr(p, "is_flag", False):
                parts.append(p.opts[0] if v else (p.secondary_opts or [p.opts[0]])[0])
            else:
                for x in vals:
                    parts += [p.opts[0], str(x)]
        return " ".join(shlex.quote(a) for a in parts)
    except Exception:  # noqa: BLE001 — provenance must never break a command
        return None


def one_line(msg: str) -> str:
    """Error messages go to stderr as one line."""
    return " ".join(str(msg).split())


def main() -> None:
    """Entry point: run the app, turning errors into one line on stderr and an exit code."""
    argv = sys.argv[1:]
    debug = os.environ.get("MMSPARSE_DEBUG") == "1"
    if "--debug" in argv:  # anywhere on the line; no subcommand has an option of that name
        debug, argv = True, [a for a in argv if a != "--debug"]
        os.environ["MMSPARSE_DEBUG"] = "1"
    _ENTRY["argv"] = argv
    try:
        app(args=argv, prog_name="mmsparse", standalone_mode=True)
    except SystemExit:
        raise
    except InputError as e:
        if debug:
            raise
        print(f"mmsparse: error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except BudgetMissed as e:   # the head is written (off_budget recorded); the run did not do what was asked
        print(f"mmsparse: error: {one_line(e)}", file=sys.stderr)
        sys.exit(3)
    except KeyboardInterrupt:
        print("mmsparse: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # internal error: one line unless debugging
        if debug:
            raise
        print(f"mmsparse: internal error: {type(e).__name__}: {one_line(e)} (rerun with --debug for the traceback)",
              file=sys.stderr)
        sys.exit(1)
    finally:
        _ENTRY["argv"] = None


if __name__ == "__main__":
    main()
