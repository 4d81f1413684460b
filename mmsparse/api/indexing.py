"""`build_index`: an HDF5 collection -> an index directory (PISA, Seismic, BMP, kANNolo, Faiss or Milvus)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter

ENGINES = {"pisa": ("sparse",), "seismic": ("sparse",), "bmp": ("sparse",), "kannolo": ("sparse",), "faiss": ("dense",),
           "milvus": ("sparse", "dense")}


@provenance.recorded("input", "dense")
def build_index(input: str | Path, *, out: str | Path, engine: str = "auto", threads: int = 1,
                dense: str | Path | None = None, engine_options: tuple = (), progress: Reporter | None = None,
                **values) -> Path:
    """Index the sparse or dense HDF5 collection `input` into the directory `out`; returns `out`.

    engine: auto (PISA for a sparse file, Faiss for a dense one), pisa | seismic | bmp | kannolo
    (sparse), faiss (dense), milvus (sparse and/or dense; `dense` adds the dense vectors of the same
    documents to a sparse collection for dense and hybrid search). threads: indexing threads
    (PISA, Seismic, kANNolo, Faiss; BMP builds on one).

    The engine's settings are the fields of its options dataclass, each in its own module of
    mmsparse/indexes/options/ (PisaOptions, SeismicOptions, BmpOptions, KannoloOptions, HnswOptions
    for Faiss / Milvus dense / kANNolo graphs, MilvusOptions, Bm25Options for weighting="bm25"):
    pass instances in `engine_options` and/or their fields as keywords (`values`, e.g.
    bmp_block_size=16, seismic_knn=10). The index's mmsparse.json records them under `options`.

    The directory appears (or is replaced) only when the build succeeds; a Milvus rebuild swaps
    the collection the same way (new collection, then the alias). Raises InputError for bad
    input or options (an unknown keyword, a value outside its bounds).
    """
    from ..atomic import kill_point
    from ..indexes import bm25
    from ..indexes.meta import hdf5_format

    from ..indexes.options import (Bm25Options, BmpOptions, HnswOptions, KannoloOptions, MilvusOptions, PisaOptions,
                                   SeismicOptions, make_options, recorded)

    opts = make_options(engine_options, **values)
    pi, se, bo, ko, hn, mi, bw = (opts[c] for c in (PisaOptions, SeismicOptions, BmpOptions, KannoloOptions,
                                                     HnswOptions, MilvusOptions, Bm25Options))
    weighting = bw.weighting
    rep = reporter(progress)
    out = Path(out)
    fmt = hdf5_format(input, "collection HDF5")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is a file; --out must be a directory path")
    if engine == "auto":
        engine = "pisa" if fmt == "sparse" else "faiss"
    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r} unknown; choose auto, pisa, seismic, bmp, kannolo, faiss or milvus")
    if fmt not in ENGINES[engine]:
        raise InputError(f"{input}: is a {fmt} file but --engine {engine} indexes {ENGINES[engine][0]} files")
    if dense is not None and engine != "milvus":
        raise InputError("--dense stores dense vectors beside sparse ones in one collection; it needs --engine milvus")
    if weighting == "bm25" and fmt != "sparse":
        raise InputError(f"--weighting {weighting!r}: choose none or bm25 (bm25 needs a sparse collection)")

    source = Path(input)
    with contextlib.ExitStack() as stack:
        src = source
        if weighting == "bm25":  # the engine indexes BM25 weights; mmsparse.json keeps the tf source
            src, bm25_info = stack.enter_context(bm25.bm25_source(source, bw.bm25_k1, bw.bm25_b))
        task = stack.enter_context(rep.task(f"indexing ({engine})", total=_count(src)))

        def done(n: int) -> None:
            task.update(completed=n)
            kill_point()  # tests (MMSPARSE_TEST_KILL_AFTER): interrupt the build here

        if engine == "pisa":
            from ..indexes.pisa import build_pisa_index
            meta = build_pisa_index(src, out, quant_bits=pi.quant_bits, threads=threads,
                                    index_encoding=pi.index_encoding, block_size=pi.block_size,
                                    query_algorithm=pi.query_algorithm, progress=done)
        elif engine == "seismic":
            from ..indexes.seismic import build_seismic_index
            meta = build_seismic_index(src, out, n_postings=se.seismic_postings,
                                       postings_share=se.seismic_postings_share,
                                       max_fraction=se.seismic_max_fraction,
                                       centroid_fraction=se.seismic_centroid_fraction,
                                       summary_energy=se.seismic_summary_energy, knn=se.seismic_knn,
                                       n_knn=se.seismic_n_knn, threads=threads, progress=done)
        elif engine == "bmp":
            from ..indexes.bmp import build_bmp_index
            meta = build_bmp_index(src, out, quant_bits=bo.bmp_bits, block_size=bo.bmp_block_size,
                                   compress_range=bo.bmp_compress_range, progress=done)
        elif engine == "kannolo":
            from ..indexes.kannolo import build_kannolo_index
            meta = build_kannolo_index(src, out, index_type=ko.kannolo_index, m=hn.hnsw_m,
                                       ef_construction=hn.ef_construction, ef_search=hn.ef_search,
                                       early_exit_threshold=ko.early_exit_threshold, threads=threads, progress=done)
        elif engine == "milvus":
            from ..indexes.milvus import build_milvus_index
            meta = build_milvus_index(src, out, dense=dense, uri=mi.uri, token=mi.token, collection=mi.collection,
                                      algorithm=mi.milvus_algorithm, drop_ratio_build=mi.milvus_drop_ratio_build,
                                      hnsw=hn.hnsw, hnsw_m=hn.hnsw_m, ef_construction=hn.ef_construction,
                                      ef_search=hn.ef_search, batch_size=mi.batch_size, timeout=mi.timeout,
                                      progress=done)
        else:
            from ..indexes.faiss_index import build_faiss_index
            meta = build_faiss_index(src, out, hnsw=hn.hnsw, hnsw_m=hn.hnsw_m, ef_construction=hn.ef_construction,
                                     ef_search=hn.ef_search, threads=threads, progress=done)
        if weighting == "bm25":
            meta = bm25.annotate_index(out, source, bm25_info)
        meta = record_options(out, recorded(engine, opts))
    rep.log(summary(meta, out))
    return out


def record_options(index_dir: Path, options: dict) -> dict:
    """Add `options` ({options class name: fields}) to INDEX_DIR/mmsparse.json; the new metadata."""
    import json

    from ..atomic import write_text_atomic
    from ..indexes.meta import META_NAME

    p = Path(index_dir) / META_NAME
    meta = {**json.loads(p.read_text(encoding="utf-8")), "options": options}
    write_text_atomic(p, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def summary(meta: dict, out: Path) -> str:
    """The one line `mmsparse index` prints: documents, directory, engine details, build time."""
    extra = ""
    if meta["kind"] in ("pisa", "bmp"):
        extra = f", {meta['postings']} postings, scale {meta['quantization']['scale']:.4g}"
        if meta["dropped_postings"]:
            extra += f", {meta['dropped_postings']} weights rounded to 0 and dropped"
    elif meta["kind"] == "kannolo":
        st = meta["settings"]
        extra = f" {st['index_type']}" + (f", M={st['hnsw_m']} efConstruction={st['ef_construction']}"
                                          if st["index_type"] == "hnsw" else "")
    elif meta["kind"] == "milvus":
        m = meta["milvus"]
        extra = (f" {'+'.join(meta['fields'])}, collection {m['collection']} (alias {m['alias']}) on "
                 f"{m['uri'] or 'Milvus Lite'}")
    return (f"indexed {meta['num_docs']} documents -> {out} ({meta['kind']}{extra}, "
            f"{meta['build_seconds']:.1f} s)")


def _count(path: Path) -> int:
    from ..formats.sharded import open_read  # a file or a sharded directory

    with open_read(path) as f:
        return int(f["ids"].shape[0]) if "ids" in f else 0
