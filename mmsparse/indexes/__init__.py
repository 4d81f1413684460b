"""Indexes over sparse (PISA, Seismic, BMP, kANNolo), dense (Faiss) and sparse + dense (Milvus) collections.

Every index is a directory holding the engine's files (Milvus with a server: only the
connection) plus `mmsparse.json` (see meta.py). `open_index(dir)` returns a searcher for it
whatever its kind.
"""

from __future__ import annotations

from pathlib import Path

from .meta import read_meta


def open_index(index_dir: str | Path, threads: int = 1, **options):
    """A searcher for INDEX_DIR chosen by `mmsparse.json` kind (pisa | seismic | bmp | kannolo | faiss | milvus);
    `options` are the engine's search settings (see each searcher). A Milvus searcher holds a
    connection: close it (`with open_index(...) as s:` or `s.close()`).

    Raises InputError if the directory or its metadata is missing or unknown.
    """
    meta = read_meta(index_dir)
    kind = meta["kind"]
    if kind == "pisa":
        from .pisa import PisaSearcher
        return PisaSearcher(index_dir, threads=threads, **options)
    if kind == "seismic":
        from .seismic import SeismicSearcher
        return SeismicSearcher(index_dir, threads=threads, **options)
    if kind == "bmp":
        from .bmp import BmpSearcher
        return BmpSearcher(index_dir, threads=threads, **options)
    if kind == "kannolo":
        from .kannolo import KannoloSearcher
        return KannoloSearcher(index_dir, threads=threads, **options)
    if kind == "milvus":
        from .milvus import MilvusSearcher
        return MilvusSearcher(index_dir, threads=threads, **options)
    from .faiss_index import FaissSearcher
    return FaissSearcher(index_dir, threads=threads, **options)
