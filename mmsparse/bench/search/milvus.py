"""The Milvus job of the search benchmark: Milvus Lite holding the sparse and the dense vectors of
one collection, sparse rows and dense HNSW rows."""

from __future__ import annotations

import gc

from ...errors import InputError
from .harness import Rows, Scale, _cached_index, _dense_ids, _read_exact, _save, _sparse_docs, load_queries


def job_milvus(sc: Scale) -> dict:
    """Milvus Lite (mmsparse.indexes.milvus): one collection holding the sparse and the dense
    vectors (dense HNSW, M and efConstruction as faiss-hnsw); sparse rows (Lite scores sparse
    queries exhaustively, TAAT_NAIVE) and dense rows at every --ef-search. One query per call at
    1 thread (the Lite engine runs in a server process of its own; latency includes the gRPC
    round trip); qps_2t from the engine's own batch call (64 queries per request)."""
    from ...indexes.milvus import MilvusSearcher, build_milvus_index

    st = sc.settings
    q = load_queries(sc)
    D, doc_ids, _ = _sparse_docs(sc)
    ndocs = D.shape[0]
    del D
    gc.collect()
    d, meta, brss = _cached_index(sc, f"milvus-hnsw{st['hnsw_m']}-efc{st['ef_construction']}", build_milvus_index,
                                  [sc.sparse_docs, sc.dense_docs],
                                  dict(dense=sc.dense_docs, hnsw=True, hnsw_m=st["hnsw_m"],
                                       ef_construction=st["ef_construction"]))
    pos = {x: i for i, x in enumerate(doc_ids)}
    dense_ids = _dense_ids(sc.dense_docs)
    if dense_ids != doc_ids:
        raise InputError(f"{sc.sparse_docs}, {sc.dense_docs}: the sparse and dense collections hold other ids")
    nbytes = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    common = {"build_s": meta["build_seconds"], "build_rss_mb": brss, "index": d.name,
              "bytes_per_doc": round(nbytes / ndocs, 1)}
    exact_s, exact_d = _read_exact(sc, "sparse"), _read_exact(sc, "dense-real")
    nw = len(sc.warm)
    with MilvusSearcher(d) as ms:
        def rows_of(hits):
            return [pos[i] for i, _ in hits]
        qe, dq = q["main"], q["dq"]
        rs = Rows(sc, q, doc_ids, ndocs, exact_s)
        for k in sc.ks:
            rs.run("milvus-sparse", "Lite TAAT_NAIVE (exact)", k, lambda j, k: rows_of(ms.search_sparse(qe[j], k)[0]),
                   lambda k: [ms.search_sparse(q["main_warm"][j], k) for j in range(nw)],
                   lambda k: ms.search_sparse(qe, k), **common)
        rd = Rows(sc, q, doc_ids, ndocs, exact_d)
        for ef in st["ef_search"]:
            ms.ef_search = ef
            for k in [k for k in sc.ks if k == min(sc.ks) or ef >= k]:
                rd.run("milvus-dense", f"Lite HNSW ef={ef}", k, lambda j, k: rows_of(ms.search_dense(dq[j:j + 1], k)[0]),
                       lambda k: ms.search_dense(q["dq_warm"], k), lambda k: ms.search_dense(dq, k),
                       ef_search=max(ef, k), **common)
    return _save(sc, "milvus", rs.rows + rd.rows, {"index": meta})
