"""Joint sparse-dense head (Song et al., CIKM 2025, "Sparse and Dense Retrievers Learn Better
Together", §2.2-2.3): the D2S sparse head plus trainable copies of the backbone's two final
projection layers and a learnable temperature.

    h_i = normalize(W_img p_i (+ b_img))     p_i [h_img]: pooled image state before the projection
    h_t = normalize(W_txt p_t (+ b_txt))     p_t [h_txt]: pooled caption ([CLS]) state
    z   = log(1 + ReLU(f(h)))                 eq. 1, f = the D2S head (W1, LN, W2 <- word embeddings)
    s_dense = <h_t, h_i> / τ,   s_sparse = <z_t, z_i>,   s_inter = w1 s_dense + w2 s_sparse

With final layers (the paper's setting, config "final_layers"), p itself is computed by a tuned
copy of each tower's final layer (mmsparse.backbones.final_layer.FinalLayer) from what enters that
layer (`final_input` of `encode-dense --final-layer-inputs`): p = final(x), h = normalize(W p).

`forward(h)` is the D2S forward on already projected vectors, so the head is a drop-in SparseHead;
`project(p, modality)` applies the tuned projections to pre-projection states (the
`pre_projection` dataset of `encode-dense --pre-projection`); `dense(x, modality, mask)` runs
the final layer (if the head has one) and the projection.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..d2s.head import D2SHead

MODALITIES = ("image", "text")


class JointHead(D2SHead):
    """config: the D2S fields (dim d = projection output, vocab_size, omega, vocab_source, training)
    plus image_dim (h_img), text_dim (h_txt), proj_bias (bool), tau_init (float).

    Parameters: w1, norm, w2 (D2S), image_proj [d, h_img], text_proj [d, h_txt] (nn.Linear),
    log_tau (scalar; τ = exp(log_tau), clamped to >= 0.01 as CLIP clamps its logit scale).
    """

    method = "joint"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        if "image_dim" in config:          # absent only inside D2SHead.from_vocab (see from_backbone)
            self._build_projections()
        if config.get("final_layers"):     # {"text": spec, "image": spec} (backbones/final_layer.py)
            self._build_final_layers()

    def _build_final_layers(self) -> None:
        from ...backbones.final_layer import FinalLayer
        spec = self.config["final_layers"]
        self.text_final, self.image_final = FinalLayer(spec["text"]), FinalLayer(spec["image"])

    @property
    def has_final(self) -> bool:
        """Whether the dense vectors are computed through tuned final layers (final_input files)."""
        return bool(self.config.get("final_layers"))

    def set_final_layers(self, text, image, source: dict, tuned: bool) -> None:
        """Attach copies of the towers' final layers (FinalLayer with weights) and record them in
        the config: final_layers {"text": spec, "image": spec} (spec["modules"] names the backbone
        modules), final_layers_source {"model", "model_fingerprint"}, final_layers_tuned."""
        self.config.update(final_layers={"text": text.spec, "image": image.spec}, final_layers_source=dict(source),
                           final_layers_tuned=bool(tuned))
        self.text_final, self.image_final = text, image

    def pool(self, x: torch.Tensor, modality: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final-layer input x (text [B, L, h] with mask [B, L]; image [B, C, H, W]; any float
        dtype) -> pre-projection state p [B, h_txt or h_img] float32 through the tuned final layer."""
        return (self.text_final(x, mask) if modality == "text" else self.image_final(x)) if self.has_final else x

    def dense(self, x: torch.Tensor, modality: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """h [B, d] float32, L2-normalised: project(pool(x)) (final-layer heads) or project(x)."""
        return self.project(self.pool(x, modality, mask), modality)

    def _build_projections(self) -> None:
        c = self.config
        bias = bool(c.get("proj_bias", False))
        self.image_proj = nn.Linear(int(c["image_dim"]), self.dim, bias=bias)
        self.text_proj = nn.Linear(int(c["text_dim"]), self.dim, bias=bias)
        self.log_tau = nn.Parameter(torch.tensor(math.log(float(c.get("tau_init", 0.05)))))

    @classmethod
    def from_backbone(cls, vocab, proj: dict, training: dict | None = None, init_bias: float = 0.0,
                      tau_init: float = 0.05, **sparse) -> "JointHead":
        """A fresh joint head: D2S part as D2SHead.from_vocab (W2 <- vocab.embeddings; `sparse`: its
        doc_top_k, query_top_k, doc_max_share), projections copied from the backbone's. proj:
        {"image_proj_weight" [d, h_img], "text_proj_weight" [d, h_txt], optional
        "image_proj_bias"/"text_proj_bias" [d]} (numpy or torch)."""
        w_img = torch.as_tensor(np.asarray(proj["image_proj_weight"]), dtype=torch.float32)
        w_txt = torch.as_tensor(np.asarray(proj["text_proj_weight"]), dtype=torch.float32)
        if w_img.shape[0] != w_txt.shape[0]:
            raise ValueError(f"projection outputs differ: image {tuple(w_img.shape)}, text {tuple(w_txt.shape)}")
        head = cls.from_vocab(int(w_img.shape[0]), vocab, training, init_bias=init_bias, **sparse)
        bias = "image_proj_bias" in proj and "text_proj_bias" in proj
        head.config.update(image_dim=int(w_img.shape[1]), text_dim=int(w_txt.shape[1]), proj_bias=bias,
                           tau_init=float(tau_init))
        head._build_projections()
        with torch.no_grad():
            head.image_proj.weight.copy_(w_img)
            head.text_proj.weight.copy_(w_txt)
            if bias:
                head.image_proj.bias.copy_(torch.as_tensor(np.asarray(proj["image_proj_bias"])))
                head.text_proj.bias.copy_(torch.as_tensor(np.asarray(proj["text_proj_bias"])))
        return head

    @property
    def tau(self) -> torch.Tensor:
        """Dense temperature τ (scalar tensor, >= 0.01)."""
        return self.log_tau.exp().clamp(min=0.01)

    def project(self, pre: torch.Tensor, modality: str) -> torch.Tensor:
        """pre [B, h_img or h_txt] float32 -> h [B, d] float32, L2-normalised (the tuned dense vectors)."""
        if modality not in MODALITIES:
            raise ValueError(f"modality {modality!r} not in {MODALITIES}")
        lin = self.image_proj if modality == "image" else self.text_proj
        return F.normalize(lin(pre), dim=-1)

    def encode(self, pre: torch.Tensor, modality: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(h [B, d] dense, z [B, |V|] sparse >= 0) of pre-projection states."""
        h = self.project(pre, modality)
        return h, self(h)
