"""The dense baseline's head: copies of the towers' final layers and projections and a learnable
temperature (methods/towers.py), no vocabulary. Its output is dense vectors

    h = normalize(W_side · final_side(x))          [B, d] float32

so `sparsify` of a dense head writes a dense HDF5 file (the tuned vectors) that `index` serves
with Faiss.
"""

from __future__ import annotations

import torch

from ..head import SparseHead
from ..towers import TunedTowers


class DenseHead(TunedTowers, SparseHead):
    """config: dim (d), vocab_size 0, final_layers / final_layers_source / final_layers_tuned,
    image_dim, text_dim, proj_bias, tau_init (TunedTowers), `training` provenance.

    forward(x, mask=None, side="image") -> h [B, d] float32, L2-normalised (`dense`)."""

    method = "dense"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        if "image_dim" in config:          # absent only inside from_backbone
            self._build_projections()
        if config.get("final_layers"):
            self._build_final_layers()

    @classmethod
    def from_backbone(cls, proj: dict, text, image, source: dict, tuned: bool, tau_init: float = 0.07,
                      training: dict | None = None) -> "DenseHead":
        """A fresh head: the backbone's projections (TunedTowers.set_projections: proj
        {"image_proj_weight" [d, h_img], "text_proj_weight" [d, h_txt], ...}) and copies of its final
        layers `text`, `image` (FinalLayer with weights; source {"model", "model_fingerprint"})."""
        d = int(torch.as_tensor(proj["image_proj_weight"]).shape[0])
        head = cls({"dim": d, "vocab_size": 0, "training": dict(training or {})}, [])
        head.set_projections(proj, tau_init)
        head.set_final_layers(text, image, source, tuned)
        return head

    def forward(self, x, mask=None, side: str = "image"):
        return self.dense(x, side, mask)
