"""Efficiency and sparsity of sparse collections: FLOPs (D2S eq. 1), terms per row, posting lists."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp


def term_df(matrix: sp.csr_matrix) -> np.ndarray:
    """Document frequency per term: int64 [|V|], the number of rows whose weight for t is non-zero.

    Counts each stored non-zero once; rows hold each term at most once (the sparse format
    guarantees strictly increasing indices per row). This is also the posting-list length of t.
    """
    m = sp.csr_matrix(matrix)
    return np.bincount(m.indices[m.data != 0], minlength=m.shape[1]).astype(np.int64)


def max_df(matrix: sp.csr_matrix, vocab: Sequence[str]) -> tuple[float, str | None, int]:
    """The most common term of a collection: (share of rows holding it = max_t df_t / N, the
    term, its df). Ties go to the lower term id; an empty collection (or one with no non-zero
    weight) gives (0.0, None, 0). For the documents this is `doc_max_df`: 1.0 means some term is
    in every image, so it separates nothing and its posting list is the whole collection."""
    df = term_df(matrix)
    n = matrix.shape[0]
    if n == 0 or not df.size or df.max() == 0:
        return 0.0, None, 0
    t = int(np.argmax(df))
    return float(df[t] / n), vocab[t], int(df[t])


def flops(queries: sp.csr_matrix, docs: sp.csr_matrix) -> float:
    """FLOPs (D2S eq. 1): the mean, over all |Q| x |D| query-document pairs, of the number of
    terms both activate: sum_t q_t * d_t / (|Q| |D|), q_t / d_t = rows of `queries` / `docs`
    with term t non-zero. O(nnz + |V|). Both matrices: CSR with the same number of columns.
    Returns 0.0 when either side has no rows.
    """
    if queries.shape[1] != docs.shape[1]:
        raise ValueError(f"vocab sizes differ: {queries.shape[1]} vs {docs.shape[1]}")
    nq, nd = queries.shape[0], docs.shape[0]
    if nq == 0 or nd == 0:
        return 0.0
    q, d = term_df(queries).astype(np.float64), term_df(docs).astype(np.float64)
    return float(q @ d / (nq * nd))


def flops_brute_force(queries: sp.csr_matrix, docs: sp.csr_matrix) -> float:
    """Eq. 1 computed literally (binarise, multiply every pair): O(|Q||D|), for tests only."""
    qb = (sp.csr_matrix(queries) != 0).astype(np.float64)
    db = (sp.csr_matrix(docs) != 0).astype(np.float64)
    return float((qb @ db.T).sum() / (qb.shape[0] * db.shape[0]))


def row_nnz(matrix: sp.csr_matrix) -> np.ndarray:
    """Non-zero terms per row: int64 [N]."""
    m = sp.csr_matrix(matrix, copy=True)
    m.eliminate_zeros()
    return np.diff(m.indptr).astype(np.int64)


def posting_lengths(matrix: sp.csr_matrix) -> np.ndarray:
    """Lengths of the non-empty posting lists an index of `matrix` would hold: int64 [active terms]."""
    df = term_df(matrix)
    return df[df > 0]


def sparsity_stats(matrix: sp.csr_matrix, prefix: str) -> dict[str, float]:
    """Flat sparsity figures of one collection, keys prefixed by `prefix` ('query' or 'doc'):

    {prefix}_terms          mean non-zeros per row
    {prefix}_terms_median   median non-zeros per row
    {prefix}_terms_max      largest row
    {prefix}_active_terms   vocabulary terms used by at least one row
    {prefix}_postings_mean / _median / _p90 / _p99 / _max
                            distribution of posting-list lengths (rows per active term)
    Empty collections give zeros.
    """
    nnz = row_nnz(matrix)
    post = posting_lengths(matrix)
    out = {f"{prefix}_terms": float(nnz.mean()) if nnz.size else 0.0,
           f"{prefix}_terms_median": float(np.median(nnz)) if nnz.size else 0.0,
           f"{prefix}_terms_max": float(nnz.max()) if nnz.size else 0.0,
           f"{prefix}_active_terms": float(post.size)}
    pct = (("mean", None), ("median", 50), ("p90", 90), ("p99", 99), ("max", 100))
    for name, p in pct:
        if not post.size:
            v = 0.0
        elif p is None:
            v = float(post.mean())
        else:
            v = float(np.percentile(post, p))
        out[f"{prefix}_postings_{name}"] = v
    return out
