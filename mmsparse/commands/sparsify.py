"""`mmsparse sparsify`: dense HDF5 -> sparse HDF5 through a trained head (mmsparse.api.sparsification);
query text -> sparse HDF5 through an inference-free head's term-weight table.

The head's method decides how rows become terms; each method's own options (its config's
`sparsify_options`) appear in their own --help panel.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer

from ..methods import get_config_class, method_names

RAY = "Ray (docs/ray.md)"


def _method_params() -> list[inspect.Parameter]:
    params, seen = [], set()
    for m in method_names():
        for name, (default, help_, *kind) in get_config_class(m).sparsify_options.items():
            if name in seen:
                continue
            seen.add(name)
            flag = "--" + name.replace("_", "-")
            kind = kind[0] if kind else type(default)
            if kind is bool:
                flag = f"{flag}/--no-{flag[2:]}"
            opt = typer.Option(None, flag, help=help_ + (f" (default {default})" if default is not None else ""), show_default=False,
                               rich_help_panel=f"{m.upper()} options")
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                                            annotation=Optional[kind]))
    return params


def _build():
    base = [
        ("head_dir", Path, typer.Argument(..., help="Head directory written by `mmsparse train-head`.")),
        ("dense", Path, typer.Argument(..., help="Dense HDF5 of images or captions (from `mmsparse encode-dense`). "
                                       "An inference-free head also reads query text, with no model: a .tsv "
                                       "(id<TAB>text per line), a .txt (one query per line, ids = line numbers) or "
                                       "a captions HDF5 (only its ids and texts are read).")),
        ("out", Path, typer.Option(..., "-o", "--out", help="Sparse HDF5 to write (atomically).")),
        ("query_mode", Optional[str], typer.Option(None, "--query-mode", help="Captions only. d2s/joint heads: expand "
                                                   "(default; the full head output) or caption-terms (only the "
                                                   "caption's own tokens keep weight; the paper's exp=0 query). vdr "
                                                   "heads: vdr (default; top-k + bag of words) or bow (binary bag of "
                                                   "words, VDR^α). Images always become documents.")),
        ("batch_size", Optional[int], typer.Option(None, "--batch-size", min=1, help="Rows per forward pass, memory "
                                                   "O(batch) [default: d2s/joint 1024, vdr 256, bm25v 128 images].")),
        ("threads", Optional[int], typer.Option(None, "--threads", min=1, help="torch CPU threads (default: every CPU "
                                               "core this process may use).")),
        ("force", bool, typer.Option(False, "--force", help="Apply the head even when the dense file's backbone or "
                                     "model differs from the one its training vectors came from (a warning instead).")),
        ("allow_dense", bool, typer.Option(False, "--allow-dense", help="No warning when the rows hold over 10% of "
                                           "the vocabulary on average (a head not sparse yet).")),
        ("ray", Optional[str], typer.Option(None, "--ray", help="Run as a Ray Data pipeline (needs the "
                                            "'scale' extra; docs/ray.md): local, auto (this machine's cluster) or "
                                            "ray://HOST:10001. OUT becomes a sharded directory (part files + "
                                            "manifest.json) that every stage reads like the file. Default: off.",
                                            rich_help_panel=RAY)),
        ("workers", int, typer.Option(1, "--workers", min=1, help="--ray: head replicas (Ray actors).",
                                      rich_help_panel=RAY)),
        ("num_gpus_per_worker", float, typer.Option(0.0, "--num-gpus-per-worker", min=0, help="--ray: GPUs per "
                                                    "replica (fractions share a GPU; 0 = CPU).", rich_help_panel=RAY)),
        ("cpus_per_worker", float, typer.Option(1.0, "--cpus-per-worker", min=0.01, help="--ray: CPUs reserved per "
                                                "replica; also its torch threads (at least 1).", rich_help_panel=RAY)),
        ("part_rows", Optional[int], typer.Option(None, "--part-rows", min=1, help="--ray: dense rows per part "
                                                  "file [default: 65536].", rich_help_panel=RAY)),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=t)
              for n, t, d in base] + _method_params()

    def main(**kw) -> None:
        """Project dense vectors onto the head's vocabulary and write them as a sparse HDF5 file
        (an inference-free head: query text through its term-weight table, no model)."""
        from ..api.sparsification import sparsify
        from ..cli_ui import RichReporter

        args = {n: kw.pop(n) for n, _, _ in base}
        sparsify(args["head_dir"], args["dense"], out=args["out"], query_mode=args["query_mode"],
                 batch_size=args["batch_size"], threads=args["threads"], force=args["force"],
                 ray=args["ray"], workers=args["workers"], num_gpus_per_worker=args["num_gpus_per_worker"],
                 cpus_per_worker=args["cpus_per_worker"], part_rows=args["part_rows"], allow_dense=args["allow_dense"],
                 progress=RichReporter(), **{k: v for k, v in kw.items() if v is not None})

    main.__signature__ = inspect.Signature(params)
    return main


main = _build()
