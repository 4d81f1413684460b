"""The inference-free head: D2S's image head plus a term-weight table for text queries.

    s_I = log(1 + ReLU(W2 · LN(W1 · z_I) + b))      documents (images): D2S eq. 4-5, unchanged
    q_C = max(0, w) ⊙ 1[t ∈ tokens(C)]              queries (captions): no model, a table lookup

config.json as D2S's (method "inference-free"); model.safetensors adds `query_weight` [|V|]
float32, read without torch by queries.TermWeightQueryEncoder.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ...errors import InputError
from ..d2s.head import D2SHead


class InferenceFreeHead(D2SHead):
    """D2SHead (images) + `query_weight` nn.Parameter [|V|] (captions, through encode_queries)."""

    method = "inference-free"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        self.query_weight = nn.Parameter(torch.ones(int(config["vocab_size"])))

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None, side: str = "image",
                gate: bool = True) -> torch.Tensor:
        """Images only: z [B, d] float32 -> s [B, |V|] >= 0 (D2S eq. 4-5). Captions have no dense
        path: encode their text with `query_vectors` or queries.TermWeightQueryEncoder."""
        if side != "image":
            raise InputError("an inference-free head encodes captions from their text, not from dense vectors: "
                             "sparsify the caption texts (a text file or the captions' `texts`)")
        return super().forward(z, mask, side, gate)

    def query_vectors(self, terms: torch.Tensor) -> torch.Tensor:
        """terms [B, L] int64 head columns padded with |V| -> q [B, |V|] float32 = max(0, w) on each
        caption's terms (the training-time twin of TermWeightQueryEncoder.encode)."""
        from ...vocab import indicator

        return indicator(terms, self.query_weight.shape[0]).to(self.query_weight.device) * self.query_weight.clamp(min=0)

    def set_query_weights(self, weights: np.ndarray) -> None:
        """Set the table from float [|V|] initial weights (e.g. IDF)."""
        with torch.no_grad():
            self.query_weight.copy_(torch.as_tensor(np.asarray(weights), dtype=torch.float32))


def idf(token_columns: list[np.ndarray], vocab_size: int) -> np.ndarray:
    """IDF of each head column over N captions: log(N / df_t), with df_t the number of captions
    holding term t; a term in no caption gets log(N) (as rare as one caption). float32 [|V|]."""
    n = max(len(token_columns), 1)
    df = np.bincount(np.concatenate(token_columns).astype(np.int64), minlength=vocab_size)[:vocab_size] \
        if token_columns else np.zeros(vocab_size)
    return np.log(n / np.maximum(df, 1)).astype(np.float32)
