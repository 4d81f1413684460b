"""The `mmsparse` console script: one Typer subcommand per stage.

Exit codes: 0 success, 2 bad input or usage (one line on stderr), 1 internal error.
Set MMSPARSE_DEBUG=1 (or pass --debug before the subcommand) for the full traceback.
"""

from __future__ import annotations

import os
import sys

import typer

from .commands import encode_dense, eval as eval_cmd, index, inspect, search, sparsify, train_head
from .errors import InputError

app = typer.Typer(
    name="mmsparse",
    help="Multimodal learned sparse retrieval: dense VLM vectors -> sparse terms -> inverted index.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("encode-dense", no_args_is_help=True)(encode_dense.main)
app.command("train-head", no_args_is_help=True)(train_head.main)
app.command("sparsify", no_args_is_help=True)(sparsify.main)
app.command("index", no_args_is_help=True)(index.main)
app.command("search", no_args_is_help=True)(search.main)
app.command("eval", no_args_is_help=True)(eval_cmd.main)
app.command("inspect", no_args_is_help=True)(inspect.main)


def main() -> None:
    """Entry point: run the app, turning errors into one line on stderr and an exit code."""
    argv = sys.argv[1:]
    debug = os.environ.get("MMSPARSE_DEBUG") == "1"
    if argv[:1] == ["--debug"]:
        debug, argv = True, argv[1:]
    try:
        app(args=argv, prog_name="mmsparse", standalone_mode=True)
    except SystemExit as e:
        raise
    except InputError as e:
        if debug:
            raise
        print(f"mmsparse: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("mmsparse: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # internal error: one line unless debugging
        if debug:
            raise
        print(f"mmsparse: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
