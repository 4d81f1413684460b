"""`mmsparse index`: build a PISA, Seismic, BMP, kANNolo, Faiss or Milvus index from an HDF5 collection.

A thin layer over mmsparse.api.indexing: the engines' options are not written out here but made
from the fields of their dataclasses (mmsparse/indexes/options/), so a new build setting is one
field there and the code that reads it.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Optional

import typer

from ..indexes.options import ALL
from ..indexes.options.milvus import PANEL as MILVUS
from ..cli_fields import param


def _build():
    kw = inspect.Parameter.KEYWORD_ONLY
    base = [
        inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Path, default=typer.Argument(
            ..., help="Sparse or dense HDF5 collection (usually the images).")),
        inspect.Parameter("out", kw, annotation=Path, default=typer.Option(
            ..., "-o", "--out", help="Index directory to create (replaced if it exists).")),
        inspect.Parameter("engine", kw, annotation=str, default=typer.Option(
            "auto", help="auto: PISA for sparse input, Faiss for dense; or pisa | seismic | bmp | kannolo (sparse) | "
            "faiss (dense) | milvus (sparse and/or dense); docs/search-benchmark.md compares them.")),
        inspect.Parameter("threads", kw, annotation=int, default=typer.Option(
            1, min=1, help="Indexing threads (PISA, Seismic, kANNolo, Faiss; BMP builds on one).")),
        inspect.Parameter("dense", kw, annotation=Optional[Path], default=typer.Option(
            None, "--dense", help="Dense HDF5 of the same documents, stored beside the sparse vectors of INPUT for "
            "dense and hybrid search.", rich_help_panel=MILVUS)),
    ]
    params = base + [param(f) for cls in ALL for f in dataclasses.fields(cls)]

    def main(**kw) -> None:
        """Index a collection: sparse HDF5 -> PISA inverted index, dense HDF5 -> Faiss; or Seismic, BMP
        (block-max pruning), kANNolo (a graph over the sparse vectors), or Milvus (sparse and/or dense in one
        collection, Milvus Lite or a server; see docs/milvus.md).

        Writes OUT/ with the engine's files and mmsparse.json (kind, source file and its attributes,
        number of documents, quantisation scale, the engine's options and package version, build time).
        The directory appears only when the build succeeds; a Milvus rebuild builds a new collection,
        then swaps the alias.
        """
        from ..api.indexing import build_index
        from ..cli_ui import RichReporter

        build_index(kw.pop("input"), out=kw.pop("out"), progress=RichReporter(), **kw)

    main.__signature__ = inspect.Signature(params)
    return main


main = _build()
