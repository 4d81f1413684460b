"""The Faiss jobs of the search benchmark: `faiss-flat` (exact inner product, the dense reference)
and `faiss-hnsw` (HNSW at every efSearch)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from .harness import Rows, Scale, _cached_index, _dense_ids, _read_exact, _save, _save_exact, index_bytes, \
    load_queries


def _faiss_build(sc: Scale, name: str, src: Path, **kw) -> tuple[Path, dict, float | None]:
    from ...indexes.faiss_index import build_faiss_index

    return _cached_index(sc, name, build_faiss_index, [src], dict(threads=sc.settings["build_threads"], **kw))


def flat_build(sc: Scale, kind: str, src: Path) -> tuple[Path, dict, float | None]:
    """The Flat index of dense documents `src` (kind: real or a synthetic kind), built or reused."""
    return _faiss_build(sc, f"flat-{kind}", src)


def hnsw_build(sc: Scale, kind: str, src: Path) -> tuple[Path, dict, float | None]:
    """The HNSW index (--hnsw-m, --ef-construction) of dense documents `src`, built or reused."""
    st = sc.settings
    return _faiss_build(sc, f"hnsw{st['hnsw_m']}-efc{st['ef_construction']}-{kind}", src, hnsw=True,
                        hnsw_m=st["hnsw_m"], ef_construction=st["ef_construction"])


def _dense_sources(sc: Scale) -> dict:
    return sc.dense_kinds if sc.synthetic else {"real": sc.dense_docs}


def job_faiss_flat(sc: Scale) -> dict:
    import faiss

    from ...indexes.faiss_index import FaissSearcher

    q = load_queries(sc)
    rows_all, metas = [], {}
    for kind, src in _dense_sources(sc).items():
        tag = "" if kind == "real" else f" [{kind}]"
        d, meta, brss = flat_build(sc, kind, src)
        metas[kind] = meta
        fs = FaissSearcher(d, threads=2)
        kmax = min(max(sc.ks), fs.index.ntotal)
        _, ex = fs.index.search(q["dq"], kmax)  # exact, untimed
        exact = [r[r >= 0].astype(np.int64) for r in ex]
        _save_exact(sc, f"dense-{kind}", exact, kmax)
        faiss.omp_set_num_threads(1)
        rows = Rows(sc, q, None if sc.synthetic else _dense_ids(src), fs.index.ntotal, exact)
        dq, dw = q["dq"], q["dq_warm"]

        def batch(k):
            faiss.omp_set_num_threads(2)
            fs.index.search(dq, min(k, fs.index.ntotal))
            faiss.omp_set_num_threads(1)
        for k in sc.ks:
            rows.run("faiss-flat", "exact" + tag, k, lambda j, k: fs.search_one(dq[j], k)[0],
                     lambda k: [fs.search_one(v, k) for v in dw], batch, build_s=meta["build_seconds"],
                     build_rss_mb=brss, bytes_per_doc=round(index_bytes(d, "faiss") / fs.index.ntotal, 1))
        rows_all += rows.rows
        del fs
        gc.collect()
    return _save(sc, "faiss-flat", rows_all, {"indexes": metas})


def job_faiss_hnsw(sc: Scale) -> dict:
    import faiss

    from ...indexes.faiss_index import FaissSearcher

    st = sc.settings
    q = load_queries(sc)
    rows_all, metas = [], {}
    for kind, src in _dense_sources(sc).items():
        if kind == "random" and st["hnsw_max_random"] and len(_dense_ids(src)) > st["hnsw_max_random"]:
            continue
        tag = "" if kind == "real" else f" [{kind}]"
        exact = _read_exact(sc, f"dense-{kind}")
        d, meta, brss = hnsw_build(sc, kind, src)
        metas[kind] = meta
        hs = FaissSearcher(d, threads=1)
        faiss.omp_set_num_threads(1)
        rows = Rows(sc, q, None if sc.synthetic else _dense_ids(src), hs.index.ntotal, exact)
        dq, dw = q["dq"], q["dq_warm"]
        for ef in st["ef_search"]:
            hs.index.hnsw.efSearch = ef
            hs._hnsw_params = None

            def batch(k):
                faiss.omp_set_num_threads(2)
                hs.search(dq, k)
                faiss.omp_set_num_threads(1)
            for k in [k for k in sc.ks if k == min(sc.ks) or ef >= k]:
                rows.run("faiss-hnsw", f"ef={ef}{tag}", k, lambda j, k: hs.search_one(dq[j], k)[0],
                         lambda k: [hs.search_one(v, k) for v in dw], batch, ef_search=max(ef, k),
                         build_s=meta["build_seconds"], build_rss_mb=brss,
                         bytes_per_doc=round(index_bytes(d, "faiss") / hs.index.ntotal, 1))
        rows_all += rows.rows
        del hs
        gc.collect()
    return _save(sc, "faiss-hnsw", rows_all, {"indexes": metas})
