"""Options of inference-free training: D2S's head, teacher and sparsity fields (D2SLossConfig), and
the query side's term-weight table. No torch here: `train-head --help` reads it."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import option
from ..d2s.config import D2SLossConfig


@dataclass
class InferenceFreeConfig(D2SLossConfig):
    """D2S's head and eq. 7 (documents only in the sparsity term), plus the term-weight table."""

    sparsity_loss: str = option("flops", "Sparsity term on the image vectors only (queries are their captions' "
                                "tokens): flops = Σ_t (mean_i s_it)² (SPLADE-doc / Geng et al. 2024: with "
                                "IDF-weighted queries it prunes low-IDF terms first); l1 = mean ‖s_I‖₁.",
                                choices=("l1", "flops"), paper="flops (Geng et al. 2024, doc side only)")
    query_init: str = option("idf", "Initial term weights of the query table: idf = log(N / df_t) over the N "
                             "training captions (terms in no training caption get log N); ones = 1.",
                             choices=("idf", "ones"), paper="idf (Geng et al. 2024)")
    query_lr: float = option(1e-3, "AdamW peak learning rate of the term-weight table (0 = keep the initial "
                             "weights fixed, as a frozen IDF table).", min=0.0,
                             paper="learned, as sentence-transformers' SparseStaticEmbedding")
    eta_query_flops: float = option(0.0, "η_q, weight of a second document-side term, the expected FLOPs of the "
                                    "training captions' queries: Σ_t p_q(t)·mean_i s_it, p_q(t) = fraction of "
                                    "training captions holding term t. It penalises a document term by how often "
                                    "queries hit it, so the posting lists every query walks (\".\", \"a\") "
                                    "shorten first; added as λ·η_q·(that sum). 0 = off.", min=0.0,
                                    paper="0 (off; cf. DF-FLOPS, Porco et al. 2025)")
