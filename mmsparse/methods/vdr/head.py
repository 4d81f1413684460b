"""Vocabulary Disentangled Retrieval (VDR) head (Zhou et al., VDR paper §3.1).

Two towers (query = caption text, document = image), each a DST head over the backbone's position
states x [B, L, h] (token states of a caption, patch states of an image; the pooled dense vector as
L = 1 where no states are stored). With final layers (the paper trains its encoders), the states are
the per-position outputs of tuned copies of each tower's final layer (methods/towers.py), computed
from the stored final-layer inputs, and the gradient flows back into those layers:

    V(x) = maxpool_l elu1p( W · LN(x_l) + b )          W: [|V|, h]; LN's γ, β folded into W, b
    elu1p(u) = u + 1 (u >= 0), e^u (u < 0)              eq. 3 (always > 0)
    G(x) = top_k(V(x)) ∪ bow(x)                         eq. 4 (images: bow = ∅)
    E(x) = V(x) ⊙ G(x)                                  eq. 2

W is initialised from the vocabulary's input embeddings [|V|, ω] when h = ω (MiniLM token states
are; the hf-dual EfficientNet-Lite0's 1,280 patch channels are not), else N(0, 0.02²). elu1p is
monotone, so max-pooling the pre-activations and applying elu1p once gives the same V(x).
`--vdr-pool mean` (the Figure 3 ablation) averages LN(x_l) over positions before W instead.

The head directory also holds `tokenizer/` (bag of words of texts without stored token ids).
"""

from __future__ import annotations

import math
import warnings
import torch
import torch.nn.functional as F
from torch import nn

from ...checks import warn
from ..head import SparseHead
from ..towers import TunedTowers

SIDES = ("text", "image")
POOLS = ("max", "mean")
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def elu1p(u: torch.Tensor) -> torch.Tensor:
    """Eq. 3: u + 1 where u >= 0, exp(u) elsewhere. Any shape, float; output > 0, C¹ at 0."""
    return torch.where(u >= 0, u + 1.0, torch.exp(torch.clamp(u, max=0.0)))


def topk_mask(v: torch.Tensor, k: int) -> torch.Tensor:
    """top_k of eq. 4: [B, |V|] float -> [B, |V|] float 0/1 with exactly min(k, |V|) ones per row
    (ties broken by torch.topk). k <= 0 gives all zeros."""
    m = torch.zeros_like(v)
    k = min(int(k), v.shape[1])
    if k > 0:
        m.scatter_(1, torch.topk(v, k, dim=1).indices, 1.0)
    return m


def gate(v: torch.Tensor, k: int, bow: torch.Tensor | None = None) -> torch.Tensor:
    """G(x) of eq. 4: top_k(V(x)) OR bow(x). v [B, |V|]; bow [B, |V|] 0/1 or None (images).
    Returns [B, |V|] float 0/1: k ones plus the bag-of-words terms outside the top-k."""
    g = topk_mask(v, k)
    return g if bow is None else torch.maximum(g, bow)


def l2n(x: torch.Tensor) -> torch.Tensor:
    """Row-wise L2 normalisation (App. A: cross-modal VDR normalises both sides); zero rows stay 0."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


# torch's own switch (off by default: the check costs a pass; `with torch.sparse.check_sparse_tensor_invariants():`
# turns it on), passed explicitly so torch does not warn that it is implicitly off
CHECK = torch.sparse.check_sparse_tensor_invariants.is_enabled
MAX_CHUNK_ELEMENTS = 1 << 25   # Wx^T elements per chunk of _MaxPoolLinear (128 MiB in float32)


class _MaxPoolLinear(torch.autograd.Function):
    """u[b, v] = max over the first lengths[b] positions of (x[b, l] · W[v] + bias[v]) -> [B, |V|].

    x [B, L, h] with rows sorted by length (descending) and real positions first. Rows go in
    chunks padded only to the chunk's own longest row (so the costly product skips most padding),
    computed transposed, Wx^T [|V|, n·L_c], so the max over positions runs along contiguous memory
    and yields the arg-max at once. Backward touches only the arg-max position of each (b, v)
    with a non-zero gradient: dW[v] = Σ_b g[b, v] · x[b, arg(b, v)], a CSR x dense product
    (query-side gradients are non-zero only on the gated dimensions), and, when x needs a gradient
    (tuned final layers), dx[b, arg(b, v)] += g[b, v] · W[v], the transposed sparse product: each
    term's gradient goes back to the one position its maximum came from.

    Rows go in chunks of at most `chunk` rows (text) or as one product where every row has the
    same length (image positions), bounded by ~32M elements of Wx^T per chunk. Under bf16 autocast
    the forward product runs in bf16 (addmm); the backward products stay float32.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, lengths, chunk):
        nv, b = weight.shape[0], x.shape[0]
        out = torch.empty(nv, b, device=x.device, dtype=weight.dtype)
        parts, saved = [], []
        fits = max(1, MAX_CHUNK_ELEMENTS // max(1, nv * x.shape[1]))
        same = b > 0 and bool(lengths[0] == lengths[-1])     # images: no padding to skip
        rows = min(b, fits) if same else min(chunk, fits)
        c0 = 0
        while c0 < b:
            c1 = min(b, c0 + rows)
            lc = int(lengths[c0])
            xc = x[c0:c1, :lc].reshape(-1, x.shape[2])
            ut = torch.addmm(bias.unsqueeze(1), weight, xc.t()).view(nv, c1 - c0, lc)
            pad = torch.arange(lc, device=x.device).unsqueeze(0) >= lengths[c0:c1].unsqueeze(1)  # [n, lc]
            if bool(pad.any()):
                ut.masked_fill_(pad.unsqueeze(0), float("-inf"))
            val, idx = ut.max(-1)
            out[:, c0:c1] = val
            parts.append((c0, c1, lc))
            saved += [xc, idx]
            c0 = c1
        ctx.nv, ctx.parts, ctx.x_shape = nv, parts, x.shape
        # saved through autograd, not on ctx: a second backward (retain_graph=True) sees them again, and
        # without retain_graph torch refuses it instead of returning zeros
        ctx.save_for_backward(weight, *saved)
        return out.t()

    @staticmethod
    def backward(ctx, g):
        nv = ctx.nv
        weight, *saved = ctx.saved_tensors
        want_dx = ctx.needs_input_grad[0]
        gt = g.t().float()
        gw = None
        dx = torch.zeros(ctx.x_shape, device=g.device, dtype=torch.float32) if want_dx else None
        for (c0, c1, lc), xc, idx in zip(ctx.parts, saved[0::2], saved[1::2]):
            gc = gt[:, c0:c1]
            v_i, b_i = torch.nonzero(gc, as_tuple=True)     # sorted by v: CSR order
            if v_i.numel() == 0:
                continue
            crow = torch.zeros(nv + 1, dtype=torch.int64, device=gc.device)
            crow[1:] = torch.cumsum(torch.bincount(v_i, minlength=nv), 0)
            pos = b_i * lc + idx[v_i, b_i]                  # row of xc each (v, b) maximum came from
            # a valid CSR (torch's check_invariants=True accepts it): within row v the columns b·lc + idx rise with b
            s = torch.sparse_csr_tensor(crow, pos, gc[v_i, b_i], (nv, xc.shape[0]), check_invariants=CHECK())
            part = s @ xc.float()
            gw = part if gw is None else gw.add_(part)
            if want_dx:                                     # the same entries transposed: [n·lc, |V|] @ W
                # stable: each row's columns v stay in the rising order nonzero gave them (CSR requires it)
                order = torch.argsort(pos, stable=True)
                rcrow = torch.zeros(xc.shape[0] + 1, dtype=torch.int64, device=gc.device)
                rcrow[1:] = torch.cumsum(torch.bincount(pos, minlength=xc.shape[0]), 0)
                st = torch.sparse_csr_tensor(rcrow, v_i[order], gc[v_i, b_i][order], (xc.shape[0], nv),
                                             check_invariants=CHECK())
                dx[c0:c1, :lc] = (st @ weight.float()).view(c1 - c0, lc, -1)
        return dx, gw, g.sum(0), None, None      # gw None = no gradient reached W


def sort_positions(x: torch.Tensor, mask: torch.Tensor | None):
    """x [B, L, h], mask [B, L] (1 = real) -> (x' [B, L, h] rows sorted by number of real
    positions, descending, real positions first; lengths [B] int64 of x' rows; order [B]: the
    original row of each x' row). A row whose mask is all zero counts as all real."""
    b, l_, _ = x.shape
    if mask is None:
        return x, torch.full((b,), l_, dtype=torch.int64, device=x.device), torch.arange(b, device=x.device)
    keep = mask.bool()
    keep = keep | ~keep.any(1, keepdim=True)
    lens = keep.sum(1)
    order = torch.argsort(lens, descending=True, stable=True)
    xs, ks = x[order], keep[order]
    prefix = bool((ks == (torch.arange(l_, device=x.device).unsqueeze(0) < lens[order].unsqueeze(1))).all())
    if not prefix:  # move real positions to the front (encode-dense pads on the right: rare)
        front = torch.argsort((~ks).to(torch.int8), dim=1, stable=True)
        xs = torch.gather(xs, 1, front.unsqueeze(-1).expand(-1, -1, x.shape[2]))
    return xs, lens[order], order


class DSTHead(nn.Module):
    """One tower's disentanglement head: LN(h) -> Linear(h, |V|) -> max over positions -> elu1p
    (pool "mean": the mean of LN(h) over real positions, then Linear, then elu1p).

    The LayerNorm has no affine parameters of its own: W(γ⊙n + β) + b = (W diag γ)n + (Wβ + b),
    so γ, β would only re-parametrise W and b (same function family).
    """

    def __init__(self, hidden: int, vocab_size: int, eps: float = 1e-5, pool: str = "max"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool {pool!r}: expected one of {POOLS}")
        self.eps = float(eps)
        self.pool = pool
        self.chunk = 64   # rows per padded block in _MaxPoolLinear
        self.proj = nn.Linear(hidden, vocab_size, bias=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, h] or [B, h] float (any float dtype); mask [B, L] (1 = real position) or None
        -> V(x) [B, |V|] float32, every value > 0. Gradients reach x when it requires them."""
        if x.dim() == 2:
            x = x.unsqueeze(1)
        x = F.layer_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.pool == "mean":
            w = torch.ones(x.shape[:2], device=x.device) if mask is None else mask.float()
            w = w / w.sum(1, keepdim=True).clamp_min(1.0)
            return elu1p(F.linear(torch.einsum("bl,blh->bh", w, x), self.proj.weight, self.proj.bias).float())
        xs, lengths, order = sort_positions(x, mask)
        u = _MaxPoolLinear.apply(xs, self.proj.weight, self.proj.bias, lengths, self.chunk)
        return elu1p(u.index_select(0, torch.argsort(order)))


class VDRHead(TunedTowers, SparseHead):
    """config: dim (pooled d), vocab_size (|V|), omega (ω), text_input / image_input
    ("final_input" | "token_states" | "patch_states" | "vectors"), text_hidden / image_hidden (h of
    each tower's position states), k_query / k_doc (top-k of queries and documents at validation and
    sparsify), k_train (top-k of the queries' training gate), all read at call time, so a FLOPs
    controller may change them between epochs; tau (initial
    temperature), pool ("max" | "mean"), vocab_source, special_ids (tokenizer ids never in a bag of
    words), `training` provenance; with final layers also final_layers, final_layers_source,
    final_layers_tuned (methods/towers.py), image_skip_cls (the image head pools the patches, not the
    ViT's [CLS]; absent: every position).
    Buffer token_ids [|V|] int64: the tokenizer id of each output term.

    forward(x, mask=None, side="image") -> V(x) [B, |V|] float32 (> 0, ungated). Gate with `gate`.
    x: the stored input named by `{side}_input`: final-layer inputs (text [B, L, h] + mask, image
    [B, C, H, W]) run through the head's copies of the final layers first; position states
    [B, L, h]; or pooled vectors [B, h].
    """

    method = "vdr"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        v = int(config["vocab_size"])
        pool = str(config.get("pool", "max"))
        self.text = DSTHead(int(config["text_hidden"]), v, pool=pool)
        self.image = DSTHead(int(config["image_hidden"]), v, pool=pool)
        # CLIP-style learnable temperature: logits = exp(logit_scale) * cos, τ = exp(-logit_scale)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / float(config.get("tau", 0.07)))))
        self.register_buffer("token_ids", torch.arange(v, dtype=torch.int64))
        if config.get("final_layers"):
            self._build_final_layers()

    @classmethod
    def from_vocab(cls, vocab, dim: int, text_hidden: int, image_hidden: int, text_input: str,
                   image_input: str, k_query: int = 512, k_doc: int = 512, tau: float = 0.07,
                   training: dict | None = None, pool: str = "max", k_train: int = 512) -> "VDRHead":
        """A fresh head over `vocab` (mmsparse.vocab.Vocab). Each tower's W <- vocab.embeddings when
        its input width equals ω, else N(0, 0.02²); b = 0; LN γ = 1, β = 0. Seed torch first.
        config text_init records which the text head got; "random" also warns on stderr (one line)."""
        emb = torch.as_tensor(vocab.embeddings, dtype=torch.float32)
        tok = vocab.tokenizer
        special = sorted(int(i) for i in (getattr(tok, "all_special_ids", None) or []))
        cfg = {"dim": int(dim), "vocab_size": int(emb.shape[0]), "omega": int(emb.shape[1]),
               "text_hidden": int(text_hidden), "image_hidden": int(image_hidden),
               "text_input": text_input, "image_input": image_input, "k_query": int(k_query),
               "k_doc": int(k_doc), "k_train": int(k_train), "tau": float(tau), "pool": pool,
               "vocab_source": vocab.source, "special_ids": special, "training": dict(training or {})}
        head = cls(cfg, vocab.terms)
        with torch.no_grad():
            for tower in (head.text, head.image):
                if tower.proj.weight.shape[1] == emb.shape[1]:
                    tower.proj.weight.copy_(emb)
                else:
                    tower.proj.weight.normal_(0.0, 0.02)
                tower.proj.bias.zero_()
            head.token_ids.copy_(torch.as_tensor(vocab.token_ids, dtype=torch.int64))
        head.config["text_init"] = "embeddings" if int(text_hidden) == emb.shape[1] else "random"
        if head.config["text_init"] == "random":   # App. C: without the MLM init the paper's VDR does not converge
            warn(f"vdr: the text head starts from random weights, not the vocabulary's embeddings: its inputs are "
                 f"h={int(text_hidden)} wide, the embeddings of {vocab.source or 'the vocabulary model'} ω="
                 f"{emb.shape[1]}; pass --vocab-model with a {int(text_hidden)}-wide model (the paper, App. C: VDR "
                 f"fails without this init)")
        head.tokenizer = tok
        return head

    def tower(self, side: str) -> DSTHead:
        if side not in SIDES:
            raise ValueError(f"side {side!r}: expected one of {SIDES}")
        return self.text if side == "text" else self.image

    def positions(self, x: torch.Tensor, side: str, mask: torch.Tensor | None = None):
        """TunedTowers.positions, less the image tower's [CLS] position (the first) where the config
        says `image_skip_cls` (VDRConfig.vdr_image_cls off on a ViT with [CLS]): [B, P - 1, h]."""
        h, m = super().positions(x, side, mask)
        if side == "image" and self.config.get("image_skip_cls"):
            h = h[:, 1:]
        return h, m

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, side: str = "image") -> torch.Tensor:
        h, m = self.positions(x, side, mask)
        return self.tower(side)(h, m)

    @property
    def scale(self) -> torch.Tensor:
        """1/τ, clamped to <= 100 as in CLIP."""
        return self.logit_scale.exp().clamp(max=100.0)
