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
from .errors import InputError

app = typer.Typer(
    name="mmsparse",
    help="Multimodal learned sparse retrieval: dense VLM vectors -> sparse terms -> inverted index. "
         "Exit codes: 0 success, 2 bad input or usage, 1 internal error; errors are one line on stderr "
         "(add --debug anywhere for the traceback).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Path parameters that name outputs, not inputs (so do names ending in _out); every other
# existing Path argument is recorded as an input.
OUTPUT_PARAMS = {"out", "per_query", "plot", "html_out", "png"}


_ENTRY: dict = {"argv": None}  # set by main(): the process's own command line is the one to record


def _recorded(func):
    """Wrap a command so its existing input paths (and --seed) are registered for provenance
    before it runs (provenance.begin) and forgotten after; typer sees the original signature."""
    @functools.wraps(func)
    def run(*args, **kwargs):
        from . import provenance

        inputs = []
        for name, v in kwargs.items():
            if name in OUTPUT_PARAMS or name.endswith("_out"):
                continue
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, Path):
                    inputs.append(x)
        # argv is the user's command line only under main(); else rebuild it from click's context
        argv = _ENTRY["argv"]
        command = (" ".join(shlex.quote(a) for a in ["mmsparse", *argv]) if argv is not None
                   else provenance.click_command_line())
        provenance.begin(inputs, seed=kwargs.get("seed"), command=command)
        try:
            return func(*args, **kwargs)
        finally:
            provenance.begin()
    return run


app.command("encode-dense", no_args_is_help=True)(_recorded(encode_dense.main))
app.command("train-head", no_args_is_help=True)(_recorded(train_head.main))
app.command("sparsify", no_args_is_help=True)(_recorded(sparsify.main))
app.command("index", no_args_is_help=True)(_recorded(index.main))
app.command("search", no_args_is_help=True)(_recorded(search.main))
app.command("eval", no_args_is_help=True)(_recorded(eval_cmd.main))
app.command("inspect", no_args_is_help=True)(_recorded(inspect.main))


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
