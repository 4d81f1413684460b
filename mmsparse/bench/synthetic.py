"""Synthetic sparse document collections that scale a real one (for the search benchmark).

A trained head's real document vectors D0 (N0 rows over vocabulary V) fix, per term t,
  p_t       = df_t / N0, the fraction of documents holding t (df_t: its posting-list length),
  W_t       = the multiset of t's real weights (the non-zeros of column t),
and per document its relative length l_i = |d_i| / mean |d| (non-zeros per row).

`synthesize(D0, N)` draws N documents:
  1. each synthetic document i gets a length propensity lam_i, a bootstrap sample of the real
     l's, grouped into `bins` quantile bins (lam_b = the bin's mean propensity, n_b its size);
  2. each term t is put into each document of bin b independently with probability
     min(1, a_t p_t lam_b), a_t >= 1 chosen (bisection) so that sum_b n_b min(1, a_t p_t lam_b)
     = N p_t: the expected document frequency is N p_t, i.e. the real df scaled to N, and a
     document's expected length is about lam_i mean|d| (the real length distribution);
  3. each posting's weight is drawn uniformly from W_t (the term's own real weights).
So the per-term df (posting-list length) distribution and per-term weight distributions are
the real ones scaled to N, and FLOPs (D2S eq. 1, sum_t p_q(t) p_d(t)) against real queries is
preserved in expectation. What it does not keep: co-occurrence between terms (terms are placed
independently, so no topical clusters) and any correlation of weight with document length.
Terms absent from D0 never appear. `collection_stats` reports both collections' FLOPs and
length figures so the match can be checked.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..formats.sparse import to_csr
from ..metrics.efficiency import flops, row_nnz, sparsity_stats, term_df


def _clip_correction(p: np.ndarray, lam: np.ndarray, n_b: np.ndarray, iters: int = 40) -> np.ndarray:
    """a_t >= 1 per term with sum_b n_b min(1, a_t p_t lam_b) = N p_t (bisection, vectorised).

    p: [T] in (0, 1]; lam: [B] > 0; n_b: [B] bin sizes. Returns [T] float64. Where even
    a_t -> inf cannot reach N p_t (p_t = 1) the result is the upper bracket (all documents).
    """
    n = n_b.sum()

    def expected(a):
        return (n_b[None, :] * np.minimum(1.0, (a * p)[:, None] * lam[None, :])).sum(axis=1)

    lo = np.ones_like(p)
    hi = np.full_like(p, 1.0 / lam.min() / np.maximum(p, 1e-12))  # every bin saturated
    target = n * p
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        low = expected(mid) < target
        lo = np.where(low, mid, lo)
        hi = np.where(low, hi, mid)
    return hi


def synthesize(real: sp.csr_matrix, n_docs: int, seed: int = 0, bins: int = 16) -> sp.csr_matrix:
    """N synthetic documents whose per-term df and weights follow `real` (see module docstring).

    real: CSR [N0, |V|] float32 >= 0 (a head's real document vectors); n_docs: N;
    bins: quantile bins of the length propensity. Returns CSR [N, |V|] float32, rows sorted.
    Memory: O(nnz of the result); time O(nnz + active terms x bins).
    """
    real = to_csr(real)
    n0, v = real.shape
    rng = np.random.default_rng(seed)
    csc = real.tocsc()
    df = np.diff(csc.indptr)
    lens = np.diff(real.indptr).astype(np.float64)
    if n0 == 0 or lens.sum() == 0:
        raise ValueError("the real collection has no non-zero weight to sample from")
    lam = lens[rng.integers(0, n0, n_docs)] / lens.mean()
    edges = np.quantile(lam, np.linspace(0, 1, bins + 1)[1:-1])
    bin_of = np.searchsorted(edges, lam, side="right")
    members = np.argsort(bin_of, kind="stable").astype(np.int32)  # doc ids grouped by bin
    n_b = np.bincount(bin_of, minlength=bins)
    starts = np.concatenate(([0], np.cumsum(n_b)))
    lam_b = np.array([lam[bin_of == b].mean() if n_b[b] else 1.0 for b in range(bins)])
    active = np.flatnonzero(df)
    p = df[active] / n0
    a = _clip_correction(p, np.maximum(lam_b, 1e-9), n_b)
    rows, cols, vals = [], [], []
    for t, pt, at in zip(active, p, a):
        w_t = csc.data[csc.indptr[t]:csc.indptr[t + 1]]
        for b in range(bins):
            if not n_b[b]:
                continue
            prob = min(1.0, at * pt * lam_b[b])
            if prob > 0.02:  # dense enough: one Bernoulli per document is cheapest
                pick = np.flatnonzero(rng.random(n_b[b]) < prob)
            else:  # sparse: how many, then which (O(count))
                c = rng.binomial(n_b[b], prob)
                if not c:
                    continue
                pick = rng.choice(n_b[b], c, replace=False)
            if not len(pick):
                continue
            rows.append(members[starts[b] + pick])
            cols.append(np.full(len(pick), t, dtype=np.int32))
            vals.append(w_t[rng.integers(0, len(w_t), len(pick))])
    r = np.concatenate(rows)
    del rows
    c = np.concatenate(cols)
    del cols
    d = np.concatenate(vals).astype(np.float32)
    del vals
    # COO -> CSR keeps each row's entries in insertion order, i.e. increasing term id
    out = sp.csr_matrix((d, (r, c)), shape=(n_docs, v))
    del r, c, d
    out.sort_indices()
    return out


def random_unit(n: int, dim: int, seed: int = 0, chunk: int = 65536):
    """Yield chunks of n random unit vectors [m, dim] float32 (uniform on the sphere)."""
    rng = np.random.default_rng(seed)
    for s in range(0, n, chunk):
        x = rng.standard_normal((min(chunk, n - s), dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield x


def collection_stats(docs: sp.csr_matrix, queries: sp.csr_matrix | None = None) -> dict:
    """Length and posting figures of a document collection, plus FLOPs against `queries`.

    Keys: docs, nnz, doc_terms (mean non-zeros per row), doc_terms_median/_p10/_p90/_max,
    doc_active_terms, doc_postings_mean/_median/_p90/_p99/_max (posting-list lengths),
    df_fraction_p99 (99th percentile of df/N over active terms), weight_mean, weight_p99;
    with queries: flops (D2S eq. 1) and postings_per_query (mean sum of df over a query's
    terms = the postings an exhaustive scorer touches = flops x N).
    """
    docs = sp.csr_matrix(docs)
    lens = row_nnz(docs)
    out = {"docs": int(docs.shape[0]), "nnz": int(docs.nnz)}
    out.update(sparsity_stats(docs, "doc"))
    out["doc_terms_p10"] = float(np.percentile(lens, 10)) if lens.size else 0.0
    out["doc_terms_p90"] = float(np.percentile(lens, 90)) if lens.size else 0.0
    df = term_df(docs)
    act = df[df > 0]
    out["df_fraction_p99"] = float(np.percentile(act / docs.shape[0], 99)) if act.size else 0.0
    out["weight_mean"] = float(docs.data.mean()) if docs.nnz else 0.0
    out["weight_p99"] = float(np.percentile(docs.data, 99)) if docs.nnz else 0.0
    if queries is not None:
        f = flops(queries, docs)
        out["flops"] = f
        out["postings_per_query"] = f * docs.shape[0]
    return out
