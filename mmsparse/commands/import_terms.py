"""`mmsparse import`: JSON lines of term maps (export --format jsonl) back to a sparse HDF5 file
(mmsparse.api.exporting.import_terms), or a sentence-transformers export, fine-tuned or not, back to
a head directory (mmsparse.api.exporting.import_head)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError


def main(
    source: Path = typer.Argument(..., help="JSON lines {\"id\": ..., \"terms\": {term: weight}} as `mmsparse export "
                                  "--format jsonl` writes them (also its --seismic form), or a sentence-transformers "
                                  "model folder `mmsparse export` wrote (a head comes back)."),
    out: Path = typer.Option(..., "-o", "--out", help="Sparse HDF5 file (from JSON lines) or head directory (from a "
                             "model folder) to write (atomically)."),
    vocab: Optional[Path] = typer.Option(None, "--vocab", help="JSON lines only, required: the vocabulary the terms "
                                         "are columns of: a head directory, a sparse HDF5 file (its attributes are "
                                         "kept) or a text file of terms, one per line."),
    escape_dots: bool = typer.Option(False, "--escape-dots", help="JSON lines only: the lines were exported with "
                                     "--escape-dots ('%2E' is '.', '%25' is '%')."),
    modality: Optional[str] = typer.Option(None, "--modality", help="JSON lines only: image or text (default: the "
                                           "--vocab sparse file's, else image)."),
    batch_size: int = typer.Option(8192, "--batch-size", min=1, help="JSON lines only: lines read at a time."),
) -> None:
    """Read term maps back into a sparse HDF5 file (export of it gives the same bytes), or an exported
    sentence-transformers model, fine-tuned or not, back into a head that sparsify and search use."""
    from ..api.exporting import import_head, import_terms
    from ..cli_ui import RichReporter

    if source.is_dir():
        if vocab is not None or escape_dots or modality is not None:
            raise InputError(f"{source}: a model folder; --vocab, --escape-dots and --modality apply to JSON lines")
        import_head(source, out=out, progress=RichReporter())
        return
    if vocab is None:
        raise InputError(f"{source}: JSON lines need --vocab (the head directory, sparse HDF5 file or vocab.txt "
                         "their terms come from)")
    import_terms(source, out=out, vocab=vocab, escape_dots=escape_dots, modality=modality, batch_size=batch_size,
                 progress=RichReporter())
