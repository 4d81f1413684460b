"""Term-level views of sparse vectors: readable word pieces, score explanations, df tables."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def display_term(term: str) -> str:
    """Readable form of a vocabulary term: a WordPiece continuation '##oot' becomes '-oot'
    (a piece glued to the previous one); other terms are unchanged. JSON output keeps raw terms."""
    return "-" + term[2:] if term.startswith("##") and len(term) > 2 else term


def explain_pair(q_idx: np.ndarray, q_w: np.ndarray, d_idx: np.ndarray, d_w: np.ndarray,
                 vocab: Sequence[str]) -> tuple[float, list[dict]]:
    """Why a document scores what it does for a query under the dot product.

    q_idx/d_idx: term ids (int), q_w/d_w: weights (float) of one query / one document row.
    Returns (score, terms): score = sum of contributions = q·d (float64); terms = one dict per
    shared term {term, query_weight, doc_weight, contribution = q_t * d_t}, by decreasing
    contribution (ties by term id).
    """
    q = dict(zip(np.asarray(q_idx).tolist(), np.asarray(q_w, dtype=np.float64).tolist()))
    d = dict(zip(np.asarray(d_idx).tolist(), np.asarray(d_w, dtype=np.float64).tolist()))
    shared = sorted(set(q) & set(d), key=lambda t: (-q[t] * d[t], t))
    rows = [{"term": vocab[t], "query_weight": q[t], "doc_weight": d[t], "contribution": q[t] * d[t]}
            for t in shared]
    return float(sum(r["contribution"] for r in rows)), rows


def df_table(df: np.ndarray, vocab: Sequence[str], top: int) -> list[dict]:
    """The `top` non-zero terms by document frequency `df` [|V|]: [{rank, term, df}], ties by term id."""
    order = np.lexsort((np.arange(len(df)), -np.asarray(df)))[:top]
    return [{"rank": r + 1, "term": vocab[i], "df": int(df[i])} for r, i in enumerate(order) if df[i] > 0]
