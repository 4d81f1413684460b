"""D2S training loss (paper eq. 7) and the L1 warm-up schedule.

    L = (1 - λ) [ℓ(I→C) + ℓ(C→I)] + λ η [L1(s_I) + L1(s_C)]
    ℓ(A→B) = CE( softmax_B(z_Aᵀ z_B / τ),  softmax_B(s_Aᵀ s_B) )   (dense teacher, no gradient)
    L1(s)  = mean over the batch of ‖s‖₁

The paper writes log2; we use the natural log (a constant factor 1/ln 2 absorbed by λ, η, lr).

In-batch candidates are the batch's *distinct* images: a batch of captions may hold two captions
of the same image, and that image appears once as a C→I candidate and once as an I→C query
(its row then spreads the teacher's mass over its captions). Duplicated columns would give the
same teacher and student scores and so the same loss up to splitting mass between copies, but
they also cost a wasted B×ω×|V| projection each.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from .head import CHECK   # torch's invariant check, on where check_sparse_tensor_invariants is (the tests)


def soft_ce(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -Σ_j softmax(teacher)_j log softmax(student)_j. Both [R, K]."""
    p = F.softmax(teacher_logits, dim=1)
    return -(p * F.log_softmax(student_logits, dim=1)).sum(1).mean()


def teacher_logits(z_cap: torch.Tensor, z_img: torch.Tensor, tau: float) -> torch.Tensor:
    """[B, U] dense teacher logits z_Cᵀ z_I / τ (eq. 7), no gradient, in float32 whatever autocast
    says: at τ = 1e-3 a bf16 product's rounding (~0.4 % of each similarity) would move the logits
    by whole units and the teacher's softmax with them."""
    with torch.no_grad(), torch.autocast(z_cap.device.type, enabled=False):
        return (z_cap.float() @ z_img.float().T) / tau


def sparse_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [B, |V|] @ b [U, |V|]ᵀ over only the columns where both have a non-zero (exact, since
    the weights are >= 0 and other columns add 0); falls back to the dense product when most are."""
    with torch.no_grad():
        cols = torch.nonzero((a > 0).any(0) & (b > 0).any(0)).squeeze(1)
    if cols.numel() > 0.5 * a.shape[1]:
        return a @ b.T
    return a.index_select(1, cols) @ b.index_select(1, cols).T


def sparsity(s: torch.Tensor, kind: str = "l1") -> torch.Tensor:
    """The sparsity term of one side, s [B, |V|] >= 0: l1 = mean over rows of ‖s‖₁ (eq. 7);
    flops = Σ_t (mean_b s_bt)², SPLADE's FLOPs regulariser (Paria et al. 2020), a smooth
    count of the postings a term adds, largest for terms present in every row."""
    if kind == "flops":
        return s.mean(0).pow(2).sum()
    return s.sum(1).mean()


def d2s_loss(s_cap: torch.Tensor, s_img: torch.Tensor, z_cap: torch.Tensor, z_img: torch.Tensor,
             tau: float = 1e-3, lam: float = 0.5, eta: float = 1e-3,
             s_cap_l1: torch.Tensor | None = None, kind: str = "l1") -> tuple[torch.Tensor, dict]:
    """Eq. 7 on one batch.

    s_cap [B, |V|] (already expansion-masked: s̄_C), s_img [U, |V|] (the U distinct images),
    z_cap [B, d], z_img [U, d] dense vectors; tau: teacher temperature; lam: λ; eta: η (after
    warm-up); s_cap_l1: the caption vectors the sparsity term sees (default s_cap, the masked
    vectors as Algorithm 1; --l1-caption raw passes the unmasked s_C); kind: l1 | flops (`sparsity`).
    Returns (loss, {"ci", "ic", "l1_img", "l1_cap"} floats: the sparsity terms, whichever kind).
    """
    t = teacher_logits(z_cap, z_img, tau)               # [B, U]
    s = sparse_scores(s_cap, s_img)                      # [B, U] student logits
    ci = soft_ce(t, s)
    ic = soft_ce(t.T, s.T)
    l1_img = sparsity(s_img, kind)
    l1_cap = sparsity(s_cap if s_cap_l1 is None else s_cap_l1, kind)
    loss = (1.0 - lam) * (ci + ic) + lam * eta * (l1_img + l1_cap)
    return loss, {k: float(x.detach()) for k, x in (("ci", ci), ("ic", ic), ("l1_img", l1_img), ("l1_cap", l1_cap))}


def drop_coordinates(z: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Inverted dropout on z [B, d]: each coordinate zeroed with probability p, the rest scaled by
    1/(1-p). The mask is drawn on the CPU from `generator` (the trainer's), so a run repeats and
    resumes exactly on any device. p = 0 returns z."""
    if p <= 0:
        return z
    keep = torch.rand(z.shape, generator=generator) >= p
    return z * keep.to(z.device) / (1.0 - p)


def eta_at(step: int, eta: float, warmup_steps: int) -> float:
    """L1 weight at optimizer step `step` (0-based): quadratic ramp η·min(1, (step/N)²) over the
    first N = warmup_steps steps (as SPLADE does for its FLOPS regulariser); N = 0: constant η."""
    if warmup_steps <= 0:
        return float(eta)
    return float(eta) * min(1.0, (step / warmup_steps) ** 2)


def doc_words_loss(s_img: torch.Tensor, vocab_size: int, target: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """Image-side word loss of --doc-words-weight: mean over images with a target of
    -Σ_t p_t log softmax(s_I / τ_w)_t, the softmax over the whole vocabulary (τ_w = `temperature`).

    s_img: [U, K] image weights on the batch's K live columns (the other |V| - K columns
    are exactly 0, so they enter the softmax's normaliser as (|V| - K)·e⁰ without being built);
    target: [U, K] non-negative word weights (image_words: IDF or 1); rows are
    normalised to p; rows summing to 0 are left out (0.0 when none is left). A listwise
    (softmax) multi-label loss, as in caption-word prediction; not in the D2S paper."""
    mass = target.sum(1)
    keep = mass > 0
    if not bool(keep.any()):
        return s_img.sum() * 0.0
    s, p = s_img[keep] / temperature, target[keep] / mass[keep, None]
    rest = vocab_size - s.shape[1]
    if rest > 0:   # the zero columns: log((|V| - K)·e⁰) beside the live ones
        s_all = torch.cat([s, torch.full((s.shape[0], 1), math.log(rest), dtype=s.dtype, device=s.device)], 1)
    else:
        s_all = s
    return -(p * (s - torch.logsumexp(s_all, dim=1, keepdim=True))).sum(1).mean()


# -- the same terms on gathered entries (a head gated on both sides: forward_gated) ---------------
# A row is given by its weights at listed columns, vals [N, k] at cols [N, k] int64 (columns distinct
# within a row; the pad column |V| may appear with weight 0); every other entry of the row is 0.

def gathered_scores(a: torch.Tensor, a_cols: torch.Tensor, b: "ScoreSide") -> torch.Tensor:
    """[Na, Nb] dot products of the rows of a and b as |V|-vectors (sparse_scores of the dense rows).
    b is a ScoreSide: written densely into the n columns it lists, reusable against several a; a,
    whose rows list fewer columns, stays sparse (CSR over those n columns, its other columns adding
    0): the product, and in the backward its sampled transpose product and Aᵀ·G, cost O(nnz(a)·Nb),
    not O(Na·Nb·n)."""
    with torch.no_grad():
        n = b.dense_t.shape[0]
        p = b.pos[a_cols].flatten()
        keep = torch.nonzero(p >= 0).squeeze(1)
        rows = torch.div(keep, a_cols.shape[1], rounding_mode="floor")
        order = torch.argsort(rows * max(n, 1) + p[keep])
        rows, col, take = rows[order], p[keep][order], keep[order]
        crow = torch.zeros(a.shape[0] + 1, dtype=torch.int64, device=a.device)
        crow[1:] = torch.cumsum(torch.bincount(rows, minlength=a.shape[0]), 0)
    return _CsrScores.apply(a.flatten()[take], crow, col, b.dense_t)


class ScoreSide:
    """The b side of gathered_scores: b [Nb, k] at b_cols [Nb, k] (each row's own columns) or at
    b_cols [k] (distinct columns shared by every row, e.g. the live ones) written into the n columns
    listed, dense_t [n, Nb] (differentiable in b), and pos [|V| + 1] (each column's row there, -1 if
    none)."""

    def __init__(self, b: torch.Tensor, b_cols: torch.Tensor, vocab_size: int):
        self.pos = torch.full((vocab_size + 1,), -1, dtype=torch.int64, device=b.device)
        if b_cols.dim() == 1:
            self.pos[b_cols] = torch.arange(b_cols.numel(), device=b.device)
            self.dense_t = b.T.contiguous()
            return
        with torch.no_grad():
            seen = torch.zeros(vocab_size + 1, dtype=torch.bool, device=b.device)
            seen[b_cols.flatten()] = True
            seen[vocab_size] = False
            n = int(seen.sum())
            self.pos = torch.where(seen, torch.cumsum(seen, 0) - 1, -1)
        idx = self.pos[b_cols].clamp(min=0).T
        self.dense_t = torch.zeros(n, b.shape[0], dtype=b.dtype, device=b.device).scatter_add(0, idx, b.T)


# torch marks its CSR tensors "beta"; the kernels used here (CSR @ dense, sampled_addmm) are stable since 2.0
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")


class _CsrScores(torch.autograd.Function):
    """S = A B with A [Na, n] a CSR matrix (values a_vals in CSR order, crow, col: column-sorted
    rows) and B [n, Nb] dense; gradients dA (at A's entries only, a sampled product) and dB = Aᵀ G.
    float32 whatever autocast says (the sparse kernels take float32; the operands are small)."""

    @staticmethod
    def forward(ctx, a_vals, crow, col, b):
        with torch.autocast(b.device.type, enabled=False):
            a = torch.sparse_csr_tensor(crow, col, a_vals.float(), (crow.numel() - 1, b.shape[0]),
                                        check_invariants=CHECK())
            out = a @ b.float()
        ctx.save_for_backward(a_vals, crow, col, b)
        return out

    @staticmethod
    def backward(ctx, g):
        a_vals, crow, col, b = ctx.saved_tensors
        with torch.autocast(b.device.type, enabled=False):
            a = torch.sparse_csr_tensor(crow, col, a_vals.float(), (crow.numel() - 1, b.shape[0]),
                                        check_invariants=CHECK())
            g = g.float().contiguous()
            ga = torch.sparse.sampled_addmm(a, g, b.float().T, beta=0.0).values() if a_vals.numel() else a_vals
            gb = a.t() @ g
        return ga.to(a_vals.dtype), None, None, gb.to(b.dtype)


def gathered_sparsity(vals: torch.Tensor, cols: torch.Tensor, vocab_size: int, kind: str = "l1") -> torch.Tensor:
    """`sparsity` of the dense rows: l1 = mean ‖s‖₁; flops = Σ_t (mean_b s_bt)², the column sums
    added up from the listed entries."""
    if kind == "flops":
        col = torch.zeros(vocab_size + 1, dtype=vals.dtype, device=vals.device).index_add(0, cols.flatten(),
                                                                                        vals.flatten())
        return (col[:vocab_size] / vals.shape[0]).pow(2).sum()
    return vals.sum(1).mean()


def gathered_doc_words_loss(s_img: torch.Tensor, img_cols: torch.Tensor, vocab_size: int, words: torch.Tensor,
                            word_weight: torch.Tensor, live: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """doc_words_loss of the dense rows: s_img [U, k] at img_cols [U, k] (every other weight 0);
    words [U, W] each image's words (pad |V|), word_weight [|V| + 1] (0 at the pad); live [|V|]: the
    batch's live columns, the only words the dense loss's target holds. Over all |V| columns, the
    k listed ones and |V| - k zeros: log Σ_t e^{s_t/τ} = logsumexp(s/τ, log(|V| - k))."""
    tw = word_weight[words] * torch.cat([live, live.new_zeros(1)])[words].to(word_weight.dtype)   # [U, W]
    mass = tw.sum(1)
    keep = mass > 0
    if not bool(keep.any()):
        return s_img.sum() * 0.0
    s, tw, mass = s_img[keep] / temperature, tw[keep], mass[keep]
    p = ((img_cols[keep].unsqueeze(2) == words[keep].unsqueeze(1)) * tw.unsqueeze(1)).sum(2) / mass[:, None]
    rest = vocab_size - s.shape[1]
    s_all = torch.cat([s, torch.full((s.shape[0], 1), math.log(rest), dtype=s.dtype, device=s.device)], 1) \
        if rest > 0 else s
    return (torch.logsumexp(s_all, dim=1) - (p * s).sum(1)).mean()
