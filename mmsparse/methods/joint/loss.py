"""Joint sparse-dense self-distillation loss (Song et al., CIKM 2025, §2.3, eq. 2-3).

    L_final = λ1 L(s_dense) + λ2 L(s_sparse) + λ3 L(s_inter)                      (eq. 2, contrastive)
            + ½ [CE(p(s_inter), p(s_dense)) + CE(p(s_inter), p(s_sparse))]         (L', teacher without gradient)
            + η_t L1(z_t) + η_i L1(z_i)                                            (eq. 3)

The sparsity terms are D2S's (`--sparsity-loss`: L1 as eq. 3, or SPLADE's FLOPs regulariser), and
with D2S's --caption-terms-weight w the caption vectors cut to their own terms (the no-expansion
query) get the sparse side's two terms too: w·[λ2 L(s_terms) + ½ CE(p(s_inter), p(s_terms))].

L(s) = ½ [L_t→i + L_i→t] (InfoNCE, eq. 2). A batch is captions and their *distinct* images (as
D2S): t→i has one positive per caption; i→t takes every caption of the image as a positive
(-log Σ_pos softmax), which is eq. 2 exactly when each image occurs once. The distillation CE is
averaged over both directions (the paper does not say which it uses).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..d2s.loss import soft_ce, sparse_scores, sparsity


def integrated_score(s_dense: torch.Tensor, s_sparse: torch.Tensor, w1: float, w2: float) -> torch.Tensor:
    """s_inter = w1·s_dense + w2·s_sparse (§2.3), any matching shapes."""
    return w1 * s_dense + w2 * s_sparse


def info_nce(s: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """½ (L_t→i + L_i→t) of eq. 2. s [B, U] caption x distinct-image logits, pos [B] int64 column
    of each caption's image (every column must be some caption's image)."""
    t2i = F.cross_entropy(s, pos)
    m = F.one_hot(pos, s.shape[1]).bool()                         # [B, U] positives
    logp = F.log_softmax(s, dim=0).masked_fill(~m, float("-inf"))  # softmax over captions per image
    i2t = -torch.logsumexp(logp, dim=0).mean()
    return 0.5 * (t2i + i2t)


def distill(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """L_distill(s_inter, s) = -p(s_inter)·log p(s), averaged over the t→i (rows) and i→t (columns)
    softmax; the teacher gets no gradient. Both [B, U]."""
    t = teacher.detach()
    return 0.5 * (soft_ce(t, student) + soft_ce(t.T, student.T))


def joint_loss(h_cap: torch.Tensor, h_img: torch.Tensor, z_cap: torch.Tensor, z_img: torch.Tensor,
               pos: torch.Tensor, tau, cfg, eta_t: float, eta_i: float, z_cap_l1: torch.Tensor | None = None,
               z_terms: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Eq. 3 on one batch. h_cap [B, d], h_img [U, d] normalised projected vectors; z_cap [B, |V|]
    (expansion-masked), z_img [U, |V|]; pos [B] image column of each caption; tau: temperature;
    cfg: a JointConfig (w1, w2, lambda_*, distill, sparsity_loss, caption_terms_weight); z_cap_l1:
    the caption vectors the sparsity term sees (default z_cap; --l1-caption raw: before masking);
    z_terms [B, |V|]: the caption vectors cut to their own terms (with caption_terms_weight > 0).
    Returns (loss, {"dense", "sparse", "inter", "kd_dense", "kd_sparse", "l1_cap", "l1_img"
    [, "caption_terms"]} floats)."""
    s_dense = (h_cap @ h_img.T) / tau
    s_sparse = sparse_scores(z_cap, z_img)
    s_inter = integrated_score(s_dense, s_sparse, cfg.w1, cfg.w2)
    parts = {"dense": info_nce(s_dense, pos), "sparse": info_nce(s_sparse, pos), "inter": info_nce(s_inter, pos)}
    loss = cfg.lambda_dense * parts["dense"] + cfg.lambda_sparse * parts["sparse"] + cfg.lambda_inter * parts["inter"]
    if cfg.distill:
        parts["kd_dense"], parts["kd_sparse"] = distill(s_inter, s_dense), distill(s_inter, s_sparse)
        loss = loss + 0.5 * (parts["kd_dense"] + parts["kd_sparse"])
    if z_terms is not None and getattr(cfg, "caption_terms_weight", 0) > 0:
        s_terms = sparse_scores(z_terms, z_img)
        ct = cfg.lambda_sparse * info_nce(s_terms, pos) + (0.5 * distill(s_inter, s_terms) if cfg.distill else 0.0)
        parts["caption_terms"] = ct
        loss = loss + cfg.caption_terms_weight * ct
    kind = getattr(cfg, "sparsity_loss", "l1")
    parts["l1_cap"] = sparsity(z_cap if z_cap_l1 is None else z_cap_l1, kind)
    parts["l1_img"] = sparsity(z_img, kind)
    loss = loss + eta_t * parts["l1_cap"] + eta_i * parts["l1_img"]
    return loss, {k: float(x.detach()) for k, x in parts.items()}
