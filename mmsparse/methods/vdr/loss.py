"""VDR training loss (Zhou et al., §3.2-3.3): symmetric cross-entropy of gated, L2-normalised
caption and image vectors, with the contrastive mask and the nonparametric (bag-of-words) entry.

    G_q = top_k(V_q) ∪ bow(q)                                          (eq. 4, k = --vdr-train-k)
    M   = contrastive mask: the dimensions no G_q of the batch opens, dealt out to the B captions
          (M_j opens them in q_j and closes them in q_j's own image)    (§3.3 c)
    q   = l2n(V_q ⊙ (G_q ∨ M)),  p = l2n(V_p ⊙ ¬M_img)  (documents fully activated, §3.3 a)
    L   = SCE(q, p) + SCE(l2n(bow(q)), p)       parametric + nonparametric entry (eq. 5, §3.2)
    SCE(a, b) = CE_rows(a bᵀ/τ) + CE_cols(a bᵀ/τ), τ learnable, initial 0.07 (App. A)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .head import gate, l2n

def contrastive_mask(g: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """§3.3 (c): the dimensions no row of gate `g` [B, |V|] opens (V \\ T(B)), shuffled and dealt
    round-robin to the B rows. Returns M [B, |V|] float 0/1: rows disjoint, their union exactly
    the unused dimensions, each row ⌊|U|/B⌋ or ⌈|U|/B⌉ of them, M ∧ g = 0."""
    b = g.shape[0]
    unused = torch.nonzero(~(g > 0).any(0)).squeeze(1)
    m = torch.zeros_like(g)
    if unused.numel():
        perm = unused[torch.randperm(unused.numel(), generator=gen).to(g.device)]  # draws on the CPU generator
        m[torch.arange(perm.numel(), device=g.device) % b, perm] = 1.0
    return m


def sce(q: torch.Tensor, p: torch.Tensor, cap_img: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric cross-entropy (eq. 5) of query rows q [B, |V|] against image rows p [U, |V|];
    cap_img [B] int64: the column of each caption's image. q→p: CE to that column; p→q: CE to
    the image's captions (uniform over them when an image has several in the batch)."""
    logits = scale * (q @ p.T)                                   # [B, U]
    qp = F.cross_entropy(logits, cap_img)
    tgt = torch.zeros(p.shape[0], q.shape[0], device=q.device)
    tgt[cap_img, torch.arange(q.shape[0], device=q.device)] = 1.0
    tgt = tgt / tgt.sum(1, keepdim=True).clamp_min(1.0)
    pq = -(tgt * F.log_softmax(logits.T, dim=1)).sum(1).mean()
    return qp + pq


def vdr_loss(v_q: torch.Tensor, v_p: torch.Tensor, bow: torch.Tensor, cap_img: torch.Tensor, k: int,
             scale: torch.Tensor, cts_mask: bool = True, np_entry: bool = True,
             gen: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """VDR loss on one batch (§3.2-3.3). v_q [B, |V|] caption weights, v_p [U, |V|] image weights
    (both > 0), bow [B, |V|] 0/1, cap_img [B] image column of each caption, k: query top-k,
    scale = 1/τ. Returns (loss, {"param", "nonparam", "unused"}: the two entries and |V \\ T(B)|)."""
    g = gate(v_q.detach(), k, bow)
    m = contrastive_mask(g, gen) if cts_mask else torch.zeros_like(g)
    closed = torch.zeros(v_p.shape[0], v_p.shape[1], device=v_p.device).index_add_(0, cap_img, m).clamp_(max=1.0)
    p = l2n(v_p * (1.0 - closed))
    param = sce(l2n(v_q * torch.maximum(g, m)), p, cap_img, scale)
    nonparam = sce(l2n(bow), p, cap_img, scale) if np_entry else torch.zeros((), device=p.device)
    loss = param + nonparam
    return loss, {"param": float(param.detach()), "nonparam": float(nonparam.detach()),
                  "unused": float(m.sum())}


