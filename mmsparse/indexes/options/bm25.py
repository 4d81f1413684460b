"""BM25 re-weighting of a sparse collection at index time (indexes/bm25.py), any sparse engine."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "BM25 weighting"


@dataclass
class Bm25Options:
    """Index Okapi BM25 weights of the stored term frequencies instead of the weights."""

    weighting: str = option("none", "Sparse: none (index the weights as stored) or bm25 (replace them by Okapi BM25 "
                            "term weights, IDF from the indexed documents, |d| = L1 norm; queries then count as "
                            "binary terms; BM25-V, eq. 1/2/9).", choices=("none", "bm25"), panel=PANEL)
    bm25_k1: float = option(1.5, "Term-frequency saturation k1.", min=0.0, panel=PANEL)
    bm25_b: float = option(0.75, "Length normalisation b (0 = none, 1 = full).", min=0.0, max=1.0, panel=PANEL)
