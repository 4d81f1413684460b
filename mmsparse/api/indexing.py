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
def build_index(input: str | Path, *, out: str | Path, engine: str = "auto", threads: int = 1, quant_bits: int = 8,
                index_encoding: str = "block_simdbp", block_size: int = 64,
                query_algorithm: str = "block_max_wand", hnsw: bool = False, hnsw_m: int = 32,
                ef_construction: int = 200, ef_search: int = 128, seismic_postings: int = 4000,
                seismic_centroid_fraction: float = 0.1, seismic_summary_energy: float = 0.4,
                bmp_bits: int = 8, bmp_block_size: int = 32, bmp_compress_range: bool = False,
                kannolo_index: str = "hnsw", weighting: str = "none", bm25_k1: float = 1.5, bm25_b: float = 0.75,
                dense: str | Path | None = None, uri: str = "", token: str = "", collection: str = "",
                milvus_algorithm: str = "auto", milvus_drop_ratio_build: float = 0.0, batch_size: int = 1000,
                timeout: float = 30.0, progress: Reporter | None = None) -> Path:
    """Index the sparse or dense HDF5 collection `input` into the directory `out`; returns `out`.

    engine: auto (PISA for a sparse file, Faiss for a dense one), pisa | seismic | bmp | kannolo
    (sparse), faiss (dense), milvus (sparse and/or dense; `dense` adds the dense vectors of the same
    documents to a sparse collection for dense and hybrid search).
    PISA: document weights w are stored as integers rint(w * s), s = (2^quant_bits - 1) / max w;
    index_encoding / block_size / query_algorithm as PISA's own options.
    Faiss (and Milvus' dense field): exact inner product, or with `hnsw` an HNSW graph of degree
    hnsw_m built with beam ef_construction, queried with beam ef_search.
    Seismic: seismic_postings per term, seismic_centroid_fraction blocks per list length,
    seismic_summary_energy of a block's L1 mass in its summary.
    BMP: document weights as integers of bmp_bits (1..8) bits, blocks of bmp_block_size documents
    (1..256), bmp_compress_range stores the block maxima sparsely (mmsparse/indexes/bmp.py).
    kANNolo: kannolo_index hnsw (a graph over the sparse vectors: hnsw_m neighbours per node,
    built with beam ef_construction) or flat (exhaustive, exact).
    weighting="bm25" (sparse): the engine indexes Okapi BM25 weights of the stored term
    frequencies (BM25-V eq. 1/2/9, k1=bm25_k1, b=bm25_b); queries then count as binary terms.
    Milvus: uri/token of a server (empty: Milvus Lite under out/milvus.db), collection (the
    alias; default from out's name), milvus_algorithm (auto | TAAT_NAIVE | DAAT_MAXSCORE |
    DAAT_WAND), milvus_drop_ratio_build (fraction of each document's smallest weights not
    indexed), batch_size documents per insert call, timeout seconds to connect and for each
    Milvus call (a server that does not answer within it is an InputError). See docs/milvus.md.
    threads: indexing threads (PISA, Seismic, kANNolo, Faiss; BMP builds on one).

    The directory appears (or is replaced) only when the build succeeds; a Milvus rebuild swaps
    the collection the same way (new collection, then the alias). Raises InputError for bad
    input or options.
    """
    from ..atomic import kill_point
    from ..indexes import bm25
    from ..indexes.meta import hdf5_format

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
    if weighting not in bm25.WEIGHTINGS or (weighting == "bm25" and fmt != "sparse"):
        raise InputError(f"--weighting {weighting!r}: choose none or bm25 (bm25 needs a sparse collection)")

    source = Path(input)
    with contextlib.ExitStack() as stack:
        src = source
        if weighting == "bm25":  # the engine indexes BM25 weights; mmsparse.json keeps the tf source
            src, bm25_info = stack.enter_context(bm25.bm25_source(source, bm25_k1, bm25_b))
        task = stack.enter_context(rep.task(f"indexing ({engine})", total=_count(src)))

        def done(n: int) -> None:
            task.update(completed=n)
            kill_point()  # tests (MMSPARSE_TEST_KILL_AFTER): interrupt the build here

        if engine == "pisa":
            from ..indexes.pisa import build_pisa_index
            meta = build_pisa_index(src, out, quant_bits=quant_bits, threads=threads,
                                    index_encoding=index_encoding, block_size=block_size,
                                    query_algorithm=query_algorithm, progress=done)
        elif engine == "seismic":
            from ..indexes.seismic import build_seismic_index
            meta = build_seismic_index(src, out, n_postings=seismic_postings,
                                       centroid_fraction=seismic_centroid_fraction,
                                       summary_energy=seismic_summary_energy, threads=threads, progress=done)
        elif engine == "bmp":
            from ..indexes.bmp import build_bmp_index
            meta = build_bmp_index(src, out, quant_bits=bmp_bits, block_size=bmp_block_size,
                                   compress_range=bmp_compress_range, progress=done)
        elif engine == "kannolo":
            from ..indexes.kannolo import build_kannolo_index
            meta = build_kannolo_index(src, out, index_type=kannolo_index, m=hnsw_m, ef_construction=ef_construction,
                                       ef_search=ef_search, threads=threads, progress=done)
        elif engine == "milvus":
            from ..indexes.milvus import build_milvus_index
            meta = build_milvus_index(src, out, dense=dense, uri=uri, token=token, collection=collection,
                                      algorithm=milvus_algorithm, drop_ratio_build=milvus_drop_ratio_build,
                                      hnsw=hnsw, hnsw_m=hnsw_m, ef_construction=ef_construction,
                                      ef_search=ef_search, batch_size=batch_size, timeout=timeout,
                                      progress=done)
        else:
            from ..indexes.faiss_index import build_faiss_index
            meta = build_faiss_index(src, out, hnsw=hnsw, hnsw_m=hnsw_m, ef_construction=ef_construction,
                                     ef_search=ef_search, threads=threads, progress=done)
        if weighting == "bm25":
            meta = bm25.annotate_index(out, source, bm25_info)
    rep.log(summary(meta, out))
    return out


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
