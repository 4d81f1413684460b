"""`mmsparse import`: JSON lines of term maps (export --format jsonl) back to a sparse HDF5 file
(mmsparse.api.exporting.import_terms)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def main(
    jsonl: Path = typer.Argument(..., help="JSON lines {\"id\": ..., \"terms\": {term: weight}}, as `mmsparse "
                                 "export --format jsonl` writes them."),
    out: Path = typer.Option(..., "-o", "--out", help="Sparse HDF5 file to write (atomically)."),
    vocab: Path = typer.Option(..., "--vocab", help="The vocabulary the terms are columns of: a head directory, a "
                               "sparse HDF5 file (its attributes are kept) or a text file of terms, one per line."),
    escape_dots: bool = typer.Option(False, "--escape-dots", help="The lines were exported with --escape-dots "
                                     "('%2E' is '.', '%25' is '%')."),
    modality: Optional[str] = typer.Option(None, "--modality", help="image or text (default: the --vocab sparse "
                                           "file's, else image)."),
    batch_size: int = typer.Option(8192, "--batch-size", min=1, help="Lines read at a time."),
) -> None:
    """Read term maps back into a sparse HDF5 file (export of it gives the same bytes)."""
    from ..api.exporting import import_terms
    from ..cli_ui import RichReporter

    import_terms(jsonl, out=out, vocab=vocab, escape_dots=escape_dots, modality=modality, batch_size=batch_size,
                 progress=RichReporter())
