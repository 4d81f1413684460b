"""`mmsparse query`: type a query, see the images. The text (or an image) is encoded with the
backbone and head the index was built from (an inference-free head: its term-weight table, no
model) and searched; the work is done by mmsparse.api.querying; this module parses and prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

_MODEL = "Model (default: the index's provenance)"
_EDIT = "Edit the query's terms"


def main(
    index: Path = typer.Argument(..., help="Index directory made by `mmsparse index` (PISA, Seismic, Faiss or Milvus)."),
    queries: Optional[List[str]] = typer.Argument(None, help="Query texts, e.g. \"a dog running on the beach\" "
                                                  "(several: one search each)."),
    k: int = typer.Option(10, "--k", min=1, max=10_000, help="Results per query."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout (all shared terms, raw "
                                 "vocabulary terms) instead of tables."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read queries from this file, one per line "
                                        "(- = stdin); without QUERIES, --file or --image, queries are read from "
                                        "stdin when it is not a terminal."),
    image: Optional[List[Path]] = typer.Option(None, "--image", help="Query by image (image -> image search; "
                                               "repeatable)."),
    n_terms: int = typer.Option(6, "--terms", min=0, help="Shared terms shown per result in the table."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Also write the results as JSON to this file."),
    head: Optional[str] = typer.Option(None, "--head", rich_help_panel=_MODEL, help="Head directory or Hugging "
                                       "Face hub id (default: the head the index's sparse file records)."),
    backbone: Optional[str] = typer.Option(None, "--backbone", rich_help_panel=_MODEL, help="Backbone name "
                                           "(default: the one that encoded the indexed documents)."),
    model: Optional[str] = typer.Option(None, "--model", rich_help_panel=_MODEL, help="Model directory or hub id "
                                        "of the backbone (default: the documents')."),
    query_mode: Optional[str] = typer.Option(None, "--query-mode", rich_help_panel=_MODEL, help="The head's "
                                             "caption query mode (d2s/joint: expand | caption-terms; vdr: vdr | bow; "
                                             "default: the method's first)."),
    device: str = typer.Option("cpu", "--device", rich_help_panel=_MODEL, help="cpu, cuda, cuda:N or auto."),
    runtime: str = typer.Option("auto", "--runtime", rich_help_panel=_MODEL, help="What runs the towers: torch, "
                                "onnx (ONNX Runtime on the CPU; the graphs are exported once per model and cached, "
                                "as encode-dense --runtime) or auto (onnx on the CPU where it exports, else torch)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, rich_help_panel=_MODEL, help="torch CPU threads "
                                          "while encoding (default: torch's, all cores; 1 is faster on a busy "
                                          "machine)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, rich_help_panel=_MODEL, help="Query texts per forward "
                                   "pass (64 as encode-dense: a file of captions then ranks exactly as encode-dense + "
                                   "sparsify + search of that file)."),
    force: bool = typer.Option(False, "--force", rich_help_panel=_MODEL, help="Use a --head/--model other than the "
                               "one the head was trained with (a warning instead of an error)."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", rich_help_panel=_EDIT, help="Drop this term "
                                                "from every sparse query before searching (repeatable)."),
    add: Optional[List[str]] = typer.Option(None, "--add", rich_help_panel=_EDIT, help="Add this word's terms to "
                                            "every sparse query at the query's largest weight (repeatable)."),
) -> None:
    """Search INDEX with free text (or --image): encode the query with the backbone and head the
    index was built from (read from its provenance), search, and print rank, image id, score and
    the terms query and image share with their contributions q_t x d_t.

    Loading the backbone, head and index takes about 10 s (the Flickr8k dual encoder and D2S
    head on a shared 2-core CPU, no GPU), then about 0.3 s per text query; for many queries
    use one call (QUERIES, --file or stdin) or `mmsparse serve`. An inference-free head's index
    loads no model: a text query is its tokens weighted by the head's term-weight table, and
    the whole command answers in under a second (it takes no --image).
    """
    from ..api.querying import query
    from ..cli_ui import RichReporter
    from ..errors import InputError

    texts = list(queries or [])
    if file is not None:
        texts += _lines(sys.stdin if str(file) == "-" else _open(file))
    elif not texts and not image and not sys.stdin.isatty():
        texts += _lines(sys.stdin)
    if not texts and not image:
        raise InputError("no queries: give query texts, --file FILE (one per line, - for stdin) or --image PATH")
    res = query(index, texts, out=out, k=k, image=list(image or []), head=head, backbone=backbone, model=model,
                query_mode=query_mode, device=device, force=force, exclude=list(exclude or []),
                add=list(add or []), batch_size=batch_size, threads=threads, runtime=runtime,
                progress=RichReporter())
    if as_json:
        typer.echo(json.dumps(res, indent=2, ensure_ascii=False))
    else:
        _print(res, n_terms)


def _open(path: Path):
    from ..errors import require_file

    return open(require_file(path, "queries file"), encoding="utf-8")


def _lines(f) -> list[str]:
    import contextlib

    with contextlib.nullcontext(f) if f is sys.stdin else f as fh:
        return [ln.strip() for ln in fh if ln.strip()]


def _print(res: list[dict], n_terms: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..metrics import display_term

    con = Console()
    for r in res:
        terms = ", ".join(f"{display_term(t['term'])} {t['weight']:.2f}" for t in r["terms"][:12])
        more = f" (+{len(r['terms']) - 12} more)" if len(r["terms"]) > 12 else ""
        title = f"{r['query']}" + (f"\nquery terms: {terms}{more}" if terms else "")
        t = Table(title=title, title_justify="left")
        t.add_column("rank", justify="right")
        t.add_column("image id")
        t.add_column("score", justify="right")
        if r["terms"]:
            t.add_column("shared terms (q×d)")
        for x in r["results"]:
            shared = ", ".join(f"{display_term(s['term'])} {s['contribution']:.2f}" for s in x["shared"][:n_terms])
            if len(x["shared"]) > n_terms:
                shared += f" (+{len(x['shared']) - n_terms})"
            t.add_row(str(x["rank"]), x["id"], f"{x['score']:.4f}", *([shared] if r["terms"] else []))
        if not r["results"]:
            t.caption = "no results (the query shares no term with any image)"
        con.print(t)
