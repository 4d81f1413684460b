"""`mmsparse export`: a head as a sentence-transformers SparseEncoder directory, or a sparse HDF5
file as JSON lines of term maps for search engines (mmsparse.api.exporting; docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

_ST = "sentence-transformers (a head)"
_JSONL = "jsonl (a sparse HDF5 file)"


def main(
    source: str = typer.Argument(..., help="A head directory or hub id (--format sentence-transformers), or a "
                                 "sparse HDF5 file from `mmsparse sparsify` (--format jsonl)."),
    out: Path = typer.Option(..., "-o", "--out", help="Directory (sentence-transformers) or .jsonl file to write; "
                             "an existing one is replaced atomically."),
    format: Optional[str] = typer.Option(None, "--format", help="sentence-transformers or jsonl (default: jsonl "
                                         "when OUT ends in .jsonl, else sentence-transformers)."),
    route: str = typer.Option("all", "--route", rich_help_panel=_ST, help="all: queries (text) and documents "
                              "(images); query: the text route alone (an inference-free head's is a plain "
                              "SparseStaticEmbedding that needs only sentence-transformers)."),
    model: Optional[str] = typer.Option(None, "--model", rich_help_panel=_ST, help="Dual encoder model directory "
                                        "or hub id of the image/text routes (default: the head's training record)."),
    backbone: Optional[str] = typer.Option(None, "--backbone", rich_help_panel=_ST, help="Its backbone name "
                                           "(hf-dual, clip, siglip, ...) (default: the head's training record)."),
    precision: Optional[str] = typer.Option(None, "--precision", rich_help_panel=_ST, help="fp32 only (the "
                                            "default): an export is sentence-transformers' own modules in float32."),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=1, rich_help_panel=_ST, help="Caption "
                                             "truncation of the text route, in tokens (default: the head's training "
                                             "captions', else the backbone's)."),
    query_mode: str = typer.Option("expand", "--query-mode", rich_help_panel=_ST, help="What encode_query gives "
                                   "for a d2s / joint head: expand (the head's top-k terms) or caption-terms (the "
                                   "caption's own tokens); encode(texts, task=\"caption-terms\" | \"expand\") "
                                   "picks either per call."),
    seismic: bool = typer.Option(False, "--seismic", rich_help_panel=_JSONL, help="Write Seismic's JSON lines: "
                                 "{\"id\": row number, \"vector\": {term: weight}}, and OUT's ids (line n = "
                                 "row n) to OUT with .ids.txt for .jsonl."),
    escape_dots: bool = typer.Option(False, "--escape-dots", rich_help_panel=_JSONL, help="Write '.' in terms as "
                                     "'%2E' and '%' as '%25' (Elasticsearch rank_features / sparse_vector refuse '.' "
                                     "in feature names); import with the same flag."),
    batch_size: int = typer.Option(2048, "--batch-size", min=1, rich_help_panel=_JSONL, help="Rows read at a "
                                   "time (memory O(batch))."),
) -> None:
    """Export a head to sentence-transformers, or sparse vectors to JSON lines of term maps.

    A sentence-transformers export loads with `SparseEncoder(OUT, trust_remote_code=True)` where
    mmsparse is not installed (an inference-free head's --route query with `SparseEncoder(OUT)`):
    outputs span the tokenizer's ids, each head term at its id. A .jsonl export has one line
    {"id": ..., "terms": {term: weight}} per row, the format docs/export.md shows each search engine
    ingesting.
    """
    from ..api.exporting import export
    from ..cli_ui import RichReporter

    export(source, out=out, format=format, route=route, model=model, backbone=backbone, precision=precision,
           max_length=max_length, query_mode=query_mode, seismic=seismic, escape_dots=escape_dots,
           batch_size=batch_size, progress=RichReporter())
