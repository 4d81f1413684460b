"""Options of inference-free training: D2S's head, teacher and sparsity fields (D2SLossConfig), and
the query side's term-weight table. No torch here: `train-head --help` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import option
from ..d2s.config import D2SLossConfig


@dataclass
class InferenceFreeConfig(D2SLossConfig):
    """D2S's head and eq. 7 (documents only in the sparsity term), plus the term-weight table. Defaults:
    what works best on validation (docs/search-your-images.md); PAPER: `--preset paper`, D2S's paper
    schedule with Geng et al. 2024's inference-free settings (IDF query table)."""

    # sparsity_loss: D2S's paper uses L1 (D2SLossConfig.PAPER), Geng et al.'s inference-free head the
    # FLOPs regulariser on the document side, which this option's own paper note names
    PAPER: ClassVar[dict] = {**D2SLossConfig.PAPER, "query_init": "idf", "eta_query_flops": 0.0,
                             "select_metric": "R@1", "image_dropout": 0.0, "sparsity_loss": "flops"}

    epochs: int = option(20, "Passes over the training captions (validation R@10 stops rising by 20 on Flickr8k).",
                         min=1, paper="200 (D2S §5.1)")
    eta: float = option(0.01, "η, weight of the image-side sparsity term: lighter than D2S's, the queries are "
                        "short already.", min=0.0, paper="1e-3 (D2S Table 1)")
    image_dropout: float = option(0.3, "Dropout on the image vectors the head sees in training (the teacher sees "
                                  "them whole): the image side over-fits the training captions' words (validation "
                                  "R@10 0.536 -> 0.559 at 0.3). 0 = off.", min=0.0, max=0.9, paper="0 (off)")
    doc_top_k: int = option(0, "Keep only each image vector's k largest weights, in training and in sparsify; "
                            "0 = every positive weight (--target-flops sets it when the budget needs it).", min=0,
                            paper="0 (no gate)")
    select_metric: str = option("R@10", "Validation metric that picks the saved epoch (R@1 moves by noise between "
                                "epochs, ±0.005).", choices=("R@1", "R@5", "R@10", "MRR@10"), paper="R@1")

    sparsity_loss: str = option("flops", "Sparsity term on the image vectors only (queries are their captions' "
                                "tokens): flops = Σ_t (mean_i s_it)² (SPLADE-doc / Geng et al. 2024: with "
                                "IDF-weighted queries it prunes low-IDF terms first); l1 = mean ‖s_I‖₁.",
                                choices=("l1", "flops"), paper="flops (Geng et al. 2024, doc side only)")
    query_init: str = option("ones", "Initial term weights of the query table: idf = log(N / df_t) over the N "
                             "training captions (terms in no training caption get log N); ones = 1 (IDF lets rare caption tokens the "
                             "image cannot predict dominate the score).",
                             choices=("idf", "ones"), paper="idf (Geng et al. 2024)")
    query_lr: float = option(1e-3, "AdamW peak learning rate of the term-weight table (0 = keep the initial "
                             "weights fixed, as a frozen IDF table).", min=0.0,
                             paper="learned, as sentence-transformers' SparseStaticEmbedding")
    eta_query_flops: float = option(0.3, "η_q, weight of a second document-side term, the expected FLOPs of the "
                                    "training captions' queries: Σ_t p_q(t)·mean_i s_it, p_q(t) = fraction of "
                                    "training captions holding term t. It penalises a document term by how often "
                                    "queries hit it, so the posting lists every query walks (\".\", \"a\") "
                                    "shorten first; added as λ·η_q·(that sum): validation FLOPs 2.3 -> 1.1 at the same R@10. 0 = off.", min=0.0,
                                    paper="0 (off; cf. DF-FLOPS, Porco et al. 2025)")
