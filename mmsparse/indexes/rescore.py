"""Query-side pruning and exact second-stage re-scoring for sparse retrieval.

Two-stage search (issue 5): a cheap first stage (PISA over the caption's own terms) proposes
candidates; the second stage scores each candidate exactly with the full expanded query,
score(q, d) = sum_t q_t * d_t over the float32 document vectors kept in the index
(forward.h5), with no quantisation.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..formats.sparse import to_csr


def prune_rows(m: sp.csr_matrix, top_n: int = 0, min_weight: float = 0.0) -> sp.csr_matrix:
    """Drop weights < min_weight, then keep each row's top_n largest (0 = no limit).

    m: CSR [N, |V|] float32. Ties at the top_n cut keep the smaller term id. Returns CSR.
    """
    m = to_csr(m)
    data, indices, indptr = [], [], [0]
    for i in range(m.shape[0]):
        s, e = m.indptr[i], m.indptr[i + 1]
        w, t = m.data[s:e], m.indices[s:e]
        keep = w >= min_weight
        w, t = w[keep], t[keep]
        if top_n and len(w) > top_n:
            order = np.lexsort((t, -w))[:top_n]
            order.sort()  # back to increasing term id
            w, t = w[order], t[order]
        data.append(w)
        indices.append(t)
        indptr.append(indptr[-1] + len(w))
    out = sp.csr_matrix((np.concatenate(data) if data else np.zeros(0, np.float32),
                         np.concatenate(indices) if indices else np.zeros(0, np.int32),
                         np.asarray(indptr, dtype=np.int64)), shape=m.shape)
    return to_csr(out)


def rescore(queries: sp.csr_matrix, docs: sp.csr_matrix, candidates: list[list[tuple[int, float]]],
            k: int) -> list[list[tuple[int, float]]]:
    """Exact re-scoring of candidate documents.

    queries: CSR [nq, |V|] float32 (full vectors); docs: CSR [N, |V|] float32;
    candidates: nq lists of (doc row, first-stage score). Returns nq lists of at most k
    (doc row, <q, d>) by decreasing score, ties by increasing doc row.
    """
    q = to_csr(queries)
    out = []
    for i, cand in enumerate(candidates):
        if not cand:
            out.append([])
            continue
        rows = np.fromiter((d for d, _ in cand), dtype=np.int64, count=len(cand))
        s, e = q.indptr[i], q.indptr[i + 1]
        qv = np.zeros(docs.shape[1], dtype=np.float32)
        qv[q.indices[s:e]] = q.data[s:e]
        scores = docs[rows] @ qv
        order = np.lexsort((rows, -scores))[:k]
        out.append([(int(rows[j]), float(scores[j])) for j in order])
    return out


def rescore_one(indices: np.ndarray, weights: np.ndarray, docs: sp.csr_matrix, rows: np.ndarray,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact re-scoring of one query's candidates.

    indices/weights: the full query's term ids [n] int and weights [n] float32; docs: CSR
    [N, |V|] float32; rows: candidate doc rows [c] int. Returns (doc rows int64, <q, d>
    float32), at most k, by decreasing score, ties by increasing row.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return rows, np.zeros(0, dtype=np.float32)
    qv = np.zeros(docs.shape[1], dtype=np.float32)
    qv[indices] = weights
    scores = docs[rows] @ qv
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]
