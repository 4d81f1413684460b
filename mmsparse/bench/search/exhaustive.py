"""The exhaustive job of the search benchmark: exact float <q, d> by scipy over the head's primary
queries (D2S: expanded; inference-free: the term-weight table's), the sparse reference every
sparse engine's overlap is measured against."""

from __future__ import annotations

import time

import numpy as np

from .harness import (Rows, Scale, _save, _save_exact, _sparse_docs, _top, _warm_fn, exact_sparse, load_queries,
                      mode_label, pool_batch, postings_per_query)


def job_exhaustive(sc: Scale) -> dict:
    """Exact sparse top-k of the sample (saved as the reference), collection figures, timed rows."""
    from ..collection import collection_stats

    q = load_queries(sc)
    D, doc_ids, vocab = _sparse_docs(sc)
    kmax = max(sc.ks)
    t0 = time.time()
    inv = D.T.tocsr()
    exact = exact_sparse(D, q["main"], kmax, inv=inv)
    _save_exact(sc, "sparse", exact, kmax)
    info = {"exact_s": round(time.time() - t0, 1), "stats": collection_stats(D, q["main"], vocab),
            "stats_modes": {m: collection_stats(D, q["q"][m], vocab) for m in q["modes"][1:]}}
    df = np.bincount(D.indices, minlength=D.shape[1])
    rows = Rows(sc, q, doc_ids, D.shape[0], exact)

    def make(qm):
        def f(j, k):
            sc_ = (qm[j] @ inv).tocsr()
            return _top(sc_.indices, sc_.data, k)
        return f

    fn = make(q["main"])
    warm = _warm_fn(make, q["main_warm"], len(sc.warm))
    for k in sc.ks:
        rows.run("exhaustive", f"{mode_label(sc.primary)} (scipy)", k, fn, warm, pool_batch(fn, len(sc.sample)),
                 postings_per_query=postings_per_query(df, q["main"]), build_s=None, bytes_per_doc=None)
    return _save(sc, "exhaustive", rows.rows, info)
