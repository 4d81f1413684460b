"""Caption -> image retrieval measured by scoring every query against every document.

What a rank-safe inverted index returns, without building one: the trainers' validation and
the ablation use it. Ranks count documents scoring strictly higher than the gold one.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .efficiency import flops


def rank_metrics(scores: np.ndarray, gold: np.ndarray) -> dict:
    """scores [Nq, Nd] float, gold [Nq] int column of each query's one relevant document ->
    {"R@1", "R@5", "R@10", "MRR@10"} (fractions). Rank = 1 + documents scoring strictly higher;
    a gold document scoring 0 counts as not retrieved (an inverted index never returns it)."""
    g = scores[np.arange(len(gold)), gold]
    rank = 1 + (scores > g[:, None]).sum(1)
    rank = np.where(g > 0, rank, np.iinfo(np.int64).max)
    return {"R@1": float((rank <= 1).mean()), "R@5": float((rank <= 5).mean()),
            "R@10": float((rank <= 10).mean()),
            "MRR@10": float(np.where(rank <= 10, 1.0 / np.minimum(rank, 10**9), 0.0).mean())}


def sparse_retrieval_metrics(q: sp.csr_matrix, d: sp.csr_matrix, gold: np.ndarray, chunk: int = 2048) -> dict:
    """rank_metrics of sparse dot products q [Nq, |V|] · d [Nd, |V|]ᵀ (in chunks of queries), plus
    FLOPs (D2S eq. 1), the mean non-zeros per query (q_nnz) and per document (d_nnz), and q_empty:
    the share of queries sharing no term with any document (an index returns nothing for them)."""
    acc = {"R@1": 0.0, "R@5": 0.0, "R@10": 0.0, "MRR@10": 0.0}
    empty = 0
    dt = d.T.tocsc()
    for s in range(0, q.shape[0], chunk):
        sc = (q[s:s + chunk] @ dt).toarray()
        m = rank_metrics(sc, gold[s:s + chunk])
        for k in acc:
            acc[k] += m[k] * sc.shape[0]
        empty += int((~(sc > 0).any(1)).sum())
    out = {k: v / max(q.shape[0], 1) for k, v in acc.items()}
    out["q_empty"] = empty / max(q.shape[0], 1)
    out.update(FLOPs=flops(q, d), q_nnz=float(np.diff(q.indptr).mean()) if q.shape[0] else 0.0,
               d_nnz=float(np.diff(d.indptr).mean()) if d.shape[0] else 0.0)
    return out


def dense_retrieval_metrics(q: np.ndarray, d: np.ndarray, gold: np.ndarray) -> dict:
    """rank_metrics of dense inner products q [Nq, dim] · d [Nd, dim]ᵀ (every document retrieved)."""
    sc = q @ d.T
    return rank_metrics(sc - sc.min() + 1.0, gold)  # shifted: rank_metrics treats a gold score of 0 as missing
