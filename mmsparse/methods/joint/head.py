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

import torch

from ..d2s.head import D2SHead
from ..towers import TunedTowers


class JointHead(TunedTowers, D2SHead):
    """config: the D2S fields (dim d = projection output, vocab_size, omega, vocab_source, training)
    plus image_dim (h_img), text_dim (h_txt), proj_bias (bool), tau_init (float), and with final
    layers final_layers / final_layers_source / final_layers_tuned (methods/towers.py).

    Parameters: w1, norm, w2 (D2S), image_proj [d, h_img], text_proj [d, h_txt] (nn.Linear),
    log_tau (scalar; τ = exp(log_tau), clamped to >= 0.01 as CLIP clamps its logit scale),
    text_final / image_final (FinalLayer copies, with final layers). `pool`, `project`, `dense`
    and `tau` come from TunedTowers.
    """

    method = "joint"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        if "image_dim" in config:          # absent only inside D2SHead.from_vocab (see from_backbone)
            self._build_projections()
        if config.get("final_layers"):     # {"text": spec, "image": spec} (backbones/final_layer.py)
            self._build_final_layers()

    @classmethod
    def from_backbone(cls, vocab, proj: dict, training: dict | None = None, init_bias: float = 0.0,
                      tau_init: float = 0.05, **sparse) -> "JointHead":
        """A fresh joint head: D2S part as D2SHead.from_vocab (W2 <- vocab.embeddings; `sparse`: its
        doc_top_k, query_top_k, doc_max_share), projections copied from the backbone's. proj:
        {"image_proj_weight" [d, h_img], "text_proj_weight" [d, h_txt], optional
        "image_proj_bias"/"text_proj_bias" [d]} (numpy or torch)."""
        d = int(torch.as_tensor(proj["image_proj_weight"]).shape[0])
        head = cls.from_vocab(d, vocab, training, init_bias=init_bias, **sparse)
        head.set_projections(proj, tau_init)
        return head

    def encode(self, pre: torch.Tensor, modality: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(h [B, d] dense, z [B, |V|] sparse >= 0) of pre-projection states."""
        h = self.project(pre, modality)
        return h, self(h)
