"""Dense2Sparse (D2S) multimodal sparse projection head (Nguyen et al., D2S paper §4.1, eq. 4-5).

    z1 = W1 z            W1: [ω, d], no bias, as eq. 4 writes it (LayerNorm removes only a
                         constant offset across the ω features, not a general bias)
    z2 = LN(z1)          eq. 5, learnable γ, β
    s  = W2 z2 + b       W2: [|V|, ω] initialised from the vocabulary's input embeddings
    s  = log(1 + ReLU(s))

One head maps both images and captions (eq. 4). ω is the vocabulary embedding width.
The head directory additionally holds `tokenizer/` (the vocabulary's tokenizer) so that
`sparsify --query-mode caption-terms` needs nothing outside the directory.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..head import SparseHead


class _LogReluLinear(torch.autograd.Function):
    """s = log(1 + ReLU(x Wᵀ + b)) with a backward that only touches active vocabulary columns.

    The gradient w.r.t. the pre-activation is g·exp(-s)·[s > 0] (d log(1+u)/du = 1/(1+u) = e^{-s}),
    zero for every term that is inactive (ReLU) or expansion-masked in the whole batch. Once the
    head is sparse only a few thousand of |V| columns are live, so restricting the two backward
    B×ω×|V| matmuls to them is exact and several times faster; dense batches take the plain path.
    Mixed precision: under autocast the matmuls run in its dtype (bf16) and s is float32; the
    backward runs its matmuls in that dtype too and returns each gradient in its input's dtype.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        pre = torch.addmm(bias, x, weight.t())
        s = pre.float().clamp_(min=0).log1p_()
        ctx.save_for_backward(x, weight, s)
        ctx.mm_dtype, ctx.bias_dtype = pre.dtype, bias.dtype
        return s

    @staticmethod
    def backward(ctx, g):
        x, weight, s = ctx.saved_tensors
        gp = g * torch.exp(-s) * (s > 0)
        gb = gp.sum(0)
        cols = torch.nonzero(gb.ne(0) | gp.ne(0).any(0)).squeeze(1)
        gx, gw = _backward_matmuls(gp, x, weight, ctx.mm_dtype, None if cols.numel() > 0.5 * weight.shape[0] else cols)
        return gx, gw, gb.to(ctx.bias_dtype)


def _backward_matmuls(gp, x, weight, mm_dtype, cols=None):
    """(dL/dx, dL/dW) of pre = x Wᵀ + b from gp = dL/dpre [B, |V|] (or [B, |cols|] of columns
    `cols`; dW is zero elsewhere): both products in `mm_dtype` (the forward matmul's, bf16 under
    autocast), each result in its input's dtype."""
    m = gp.to(mm_dtype)
    xm = x.to(mm_dtype)
    if cols is None:
        return (m @ weight.to(mm_dtype)).to(x.dtype), (m.t() @ xm).to(weight.dtype)
    if m.shape[1] != cols.numel():
        m = m.index_select(1, cols)
    gx = (m @ weight.index_select(0, cols).to(mm_dtype)).to(x.dtype)
    gw = torch.zeros_like(weight)
    gw.index_copy_(0, cols, (m.t() @ xm).to(weight.dtype))
    return gx, gw


class _LiveLogReluLinear(torch.autograd.Function):
    """(s_live, cols) with s_live = log(1 + ReLU(x Wᵀ + b))[:, cols] and cols the vocabulary columns
    positive in at least one row. Every other column is 0 in the whole batch and has zero gradient
    (ReLU), so a loss computed on s_live alone is exact while its elementwise work, its score
    matrices and the two backward matmuls shrink from |V| to |cols| columns (a trained head keeps a
    few hundred to a few thousand live columns of 30k). Only the forward x Wᵀ stays full size.
    Mixed precision as _LogReluLinear: matmuls in autocast's dtype, s_live float32.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        pre = torch.addmm(bias, x, weight.t())
        cols = torch.nonzero(pre.amax(0) > 0).squeeze(1)
        s = pre.index_select(1, cols) if cols.numel() < pre.shape[1] else pre
        s = s.float().clamp_(min=0).log1p_()
        ctx.mm_dtype, ctx.bias_dtype = pre.dtype, bias.dtype
        del pre
        ctx.save_for_backward(x, weight, s, cols)
        ctx.mark_non_differentiable(cols)
        return s, cols

    @staticmethod
    def backward(ctx, g, _gcols):
        x, weight, s, cols = ctx.saved_tensors
        gp = s.neg().exp_().mul_(s > 0).mul_(g)        # d log(1+u)/du = e^{-s}, 0 where ReLU cut
        full = cols.numel() == weight.shape[0]
        gx, gw = _backward_matmuls(gp, x, weight, ctx.mm_dtype, None if full else cols)
        if full:
            return gx, gw, gp.sum(0).to(ctx.bias_dtype)
        gb = torch.zeros(weight.shape[0], dtype=ctx.bias_dtype, device=g.device)
        gb.index_copy_(0, cols, gp.sum(0).to(ctx.bias_dtype))
        return gx, gw, gb


class _GatedLogReluLinear(torch.autograd.Function):
    """The training forward of a head with top-k gates on both sides, computed only where the loss
    can see it: of s = log(1 + ReLU(x Wᵀ + b)) [B + U, |V|] (B caption rows, then U image rows) it
    returns s at each caption's k_t largest columns followed by its own term columns (own [B, T],
    pad = |V|, gated or not), and at each image's k_i largest columns, with those columns, and
    `live` [|V|] (columns positive in at least one row: forward_live's cols).

    Every other entry of s is gated to 0 or absent from the loss, so its gradient is 0: the
    backward is a sparse [B + U, |V|] matrix of (B·(k_t + T) + U·k_i) entries times W and xᵀ, about
    1 % of the two dense products (docs/speed.md). Only the forward x Wᵀ and the row-wise top-k stay
    full size. Exact: the loss and gradients equal forward_live's followed by top_k_rows
    (tests/test_d2s.py). Mixed precision as _LogReluLinear (the forward product in autocast's
    dtype; the gathered values and the sparse backward in float32).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, n_cap, k_t, k_i, own):
        pre = torch.addmm(bias, x, weight.t())
        v = pre.shape[1]
        live = pre.amax(0) > 0
        cap_top = pre[:n_cap].topk(min(k_t, v), dim=1, sorted=False).indices
        img_top = pre[n_cap:].topk(min(k_i, v), dim=1, sorted=False).indices
        cap_cols = torch.cat([cap_top, own.clamp(max=v - 1)], 1)
        s_cap = pre[:n_cap].gather(1, cap_cols).float().clamp_(min=0).log1p_()
        s_cap[:, cap_top.shape[1]:].mul_(own < v)          # pads hold 0 (and so get no gradient)
        s_img = pre[n_cap:].gather(1, img_top).float().clamp_(min=0).log1p_()
        del pre
        ctx.save_for_backward(x, weight, s_cap, s_img, cap_cols, img_top)
        ctx.bias_dtype = bias.dtype
        ctx.mark_non_differentiable(cap_top, img_top, live)
        return s_cap, s_img, cap_top, img_top, live

    @staticmethod
    def backward(ctx, g_cap, g_img, *_):
        x, weight, s_cap, s_img, cap_cols, img_top = ctx.saved_tensors
        r, v = x.shape[0], weight.shape[0]
        n_cap, w_cap, w_img = s_cap.shape[0], s_cap.shape[1], s_img.shape[1]
        # d log(1+u)/du = e^{-s}, 0 where ReLU cut (and at pads, whose s is 0)
        gp = torch.cat([(s_cap.neg().exp() * (s_cap > 0) * g_cap).flatten(),
                        (s_img.neg().exp() * (s_img > 0) * g_img).flatten()]).float()
        cols = torch.cat([cap_cols.flatten(), img_top.flatten()])
        dev = x.device
        # entries as built: B caption rows of w_cap, then U image rows of w_img, in top-k order (unsorted),
        # an own term among the top ones listed twice, the pads at column v - 1; merged into one entry
        # per (row, column) with summed gradient, columns rising within each row: a valid CSR both ways
        rows = torch.cat([torch.arange(n_cap, device=dev).repeat_interleave(w_cap),
                          torch.arange(n_cap, r, device=dev).repeat_interleave(w_img)])
        g, gt = csr_pair(rows, cols, gp, r, v)
        with torch.autocast(dev.type, enabled=False):
            gx = (g @ weight.float()).to(x.dtype)
            gw = (gt @ x.float()).to(weight.dtype)
        gb = torch.zeros(v, dtype=torch.float32, device=dev).index_add_(0, cols, gp).to(ctx.bias_dtype)
        return gx, gw, gb, None, None, None, None


# torch's own switch (off by default: the check costs a pass; `with torch.sparse.check_sparse_tensor_invariants():`
# turns it on, as the tests do), passed explicitly so torch does not warn that it is implicitly off
CHECK = torch.sparse.check_sparse_tensor_invariants.is_enabled


def csr_pair(rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_rows: int, n_cols: int):
    """(G [n_rows, n_cols], Gᵀ) float32 CSR matrices of the COO entries (rows, cols, vals) [nnz], any
    order, a (row, column) listed more than once summed: each row's columns sorted and unique, so
    both pass torch's check_invariants (checked when check_sparse_tensor_invariants is on)."""
    key, inv = torch.unique(rows * n_cols + cols, sorted=True, return_inverse=True)
    val = torch.zeros(key.numel(), dtype=torch.float32, device=vals.device).index_add_(0, inv, vals.float())
    r, c = torch.div(key, n_cols, rounding_mode="floor"), key % n_cols
    crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=vals.device)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=n_rows), 0)
    g = torch.sparse_csr_tensor(crow, c, val, (n_rows, n_cols), check_invariants=CHECK())
    order = torch.argsort(c * n_rows + r)           # (column, row) order: the transpose's CSR order
    crow_t = torch.zeros(n_cols + 1, dtype=torch.int64, device=vals.device)
    crow_t[1:] = torch.cumsum(torch.bincount(c, minlength=n_cols), 0)
    gt = torch.sparse_csr_tensor(crow_t, r[order], val[order], (n_cols, n_rows), check_invariants=CHECK())
    return g, gt


def top_k_rows(s: torch.Tensor, k: int | None) -> torch.Tensor:
    """s [B, L] with every entry outside each row's k largest set to 0 (k None/0 or >= L: s as is).
    The gradient flows to the kept entries only, as VDR's top-k gating (a row with fewer than k
    positive weights keeps them all)."""
    if not k or k >= s.shape[1]:
        return s
    keep = torch.zeros_like(s).scatter_(1, s.detach().topk(int(k), dim=1).indices, 1.0)
    return s * keep


class D2SHead(SparseHead):
    """config: dim (d), vocab_size (|V|), omega (ω), vocab_source, plus `training` provenance;
    optional doc_top_k / query_top_k (keep each image / caption vector's k largest weights, 0 = all)
    and doc_max_share (< 1: buffer doc_floor, see `prune_postings`).
    Buffer token_ids [|V|] int64: the tokenizer id of each output term.

    forward: z [B, d] float32 -> s [B, |V|] float32, s >= 0.
    """

    method = "d2s"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        d, omega, v = int(config["dim"]), int(config["omega"]), int(config["vocab_size"])
        self.w1 = nn.Linear(d, omega, bias=False)
        self.norm = nn.LayerNorm(omega, eps=float(config.get("ln_eps", 1e-5)))
        self.w2 = nn.Linear(omega, v, bias=True)
        # tokenizer id of each output term (a sub-vocabulary keeps a subset of the tokenizer's)
        self.register_buffer("token_ids", torch.arange(v, dtype=torch.int64))
        if config.get("center") == "mean":   # the training mean of each modality, subtracted first
            self.register_buffer("center_image", torch.zeros(d))
            self.register_buffer("center_text", torch.zeros(d))
        if float(config.get("doc_max_share", 1.0)) < 1:   # per-term floor of image weights (0 until set)
            self.register_buffer("doc_floor", torch.zeros(v))

    @classmethod
    def from_vocab(cls, dim: int, vocab, training: dict | None = None, init_bias: float = 0.0,
                   center: str = "none", doc_top_k: int = 0, query_top_k: int = 0,
                   doc_max_share: float = 1.0) -> "D2SHead":
        """A fresh head over `vocab` (mmsparse.vocab.Vocab): W2 <- vocab.embeddings [|V|, ω],
        b <- init_bias; W1 and LN use PyTorch's default init (seed torch before calling).
        center "mean" adds the per-modality mean buffers (zero until set); doc_top_k / query_top_k
        (0 = off) keep only each image / caption vector's k largest weights; doc_max_share < 1 adds
        the image-side floor buffer (zero until `prune_postings` sets it)."""
        emb = torch.as_tensor(vocab.embeddings, dtype=torch.float32)
        cfg = {"dim": int(dim), "vocab_size": int(emb.shape[0]), "omega": int(emb.shape[1]),
               "vocab_source": vocab.source, "training": dict(training or {}), "center": center,
               "doc_top_k": int(doc_top_k), "query_top_k": int(query_top_k)}
        if doc_max_share < 1:
            cfg["doc_max_share"] = float(doc_max_share)
        head = cls(cfg, vocab.terms)
        with torch.no_grad():
            head.w2.weight.copy_(emb)
            head.w2.bias.fill_(float(init_bias))
            head.token_ids.copy_(torch.as_tensor(vocab.token_ids, dtype=torch.int64))
        head.tokenizer = vocab.tokenizer
        return head

    def centered(self, z: torch.Tensor, side: str) -> torch.Tensor:
        """z minus the training mean of its modality (`side` image | text) when the head was
        trained with --center mean; z itself otherwise."""
        if not hasattr(self, "center_image"):
            return z
        return z - (self.center_image if side == "image" else self.center_text)

    def top_k(self, side: str) -> int:
        """k of the top-k gate of `side` (image | text); 0 = none (the paper's head)."""
        return int(self.config.get("doc_top_k" if side == "image" else "query_top_k") or 0)

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None, side: str = "image",
                gate: bool = True) -> torch.Tensor:
        """z [B, d] float32 -> s [B, |V|] float32 >= 0 (eq. 4-5); one head for both sides (`side`
        picks the mean a centred head subtracts and the top-k gate, `top_k`; gate=False: no gate,
        as caption-term queries, which keep every own term). Image vectors of a head with a posting
        floor (`prune_postings`) keep only the weights above it."""
        if z.dim() != 2:
            raise ValueError(f"D2S heads take pooled vectors [B, d], got shape {tuple(z.shape)}")
        s = _LogReluLinear.apply(self.norm(self.w1(self.centered(z, side))), self.w2.weight, self.w2.bias)
        if not gate:
            return s
        s = top_k_rows(s, self.top_k(side))
        if side == "image" and hasattr(self, "doc_floor"):
            s = s * (s > self.doc_floor)
        return s

    @torch.no_grad()
    def encode_csr(self, z: torch.Tensor, side: str = "image", gate: bool = True):
        """forward(z, side=side, gate=gate) as a scipy CSR [B, |V|] (float32, int32 sorted columns,
        zeros left out). A gated side never builds the dense output: its k largest pre-activations
        (top-k is order-preserving through log(1 + ReLU)), their weights, the posting floor, then
        the positive ones; other heads go through mmsparse.methods.head.to_csr."""
        import numpy as np
        import scipy.sparse as sp

        from ..head import to_csr
        k, v = self.top_k(side) if gate else 0, int(self.config["vocab_size"])
        if z.dim() != 2 or not k or k >= v:
            return to_csr(self.forward(z, side=side, gate=gate))
        pre = torch.addmm(self.w2.bias, self.norm(self.w1(self.centered(z, side))), self.w2.weight.t())
        cols = pre.topk(k, dim=1).indices.sort(1).values
        s = pre.gather(1, cols).clamp_(min=0).log1p_()
        if side == "image" and hasattr(self, "doc_floor"):
            s = s * (s > self.doc_floor[cols])
        keep = (s > 0).cpu()
        count = keep.sum(1).numpy()
        indptr = np.zeros(len(count) + 1, dtype=np.int32)
        np.cumsum(count, out=indptr[1:])
        return sp.csr_matrix((s.cpu()[keep].numpy(), cols.cpu()[keep].numpy().astype(np.int32), indptr),
                             shape=(z.shape[0], v))

    @torch.no_grad()
    def prune_postings(self, z_images, max_share: float, batch: int = 1024) -> int:
        """Set the image-side floor from image vectors z_images [N, d] (float32 tensor or array; the
        training images): any earlier floor is cleared, the images go through the head, and a term
        positive in more than m = floor(max_share·N) of them gets as floor its (m+1)-th largest
        weight there, so that weights at or below it are zeroed and the term keeps at most m of
        these images (term-centric static index pruning, Carmel et al. 2001, with the cut
        estimated once, on training images, instead of per collection). Other terms get 0.
        Returns the number of terms given a floor. Works on any trained head (one trained without
        --doc-max-share gets the buffer here; save_pretrained keeps it). ValueError unless
        0 < max_share < 1."""
        if not 0 < max_share < 1:
            raise ValueError(f"prune_postings: max_share {max_share} must be in (0, 1)")
        v = int(self.config["vocab_size"])
        if not hasattr(self, "doc_floor"):
            self.register_buffer("doc_floor", torch.zeros(v, device=self.w2.weight.device))
        self.doc_floor.zero_()
        self.config["doc_max_share"] = float(max_share)
        from .method import encode_sparse   # method.py imports this module

        docs = encode_sparse(self, z_images, batch, side="image").tocsc()
        m = int(max_share * docs.shape[0])
        floor = np.zeros(v, dtype=np.float32)
        for j in np.flatnonzero(np.diff(docs.indptr) > m):
            col = docs.data[docs.indptr[j]:docs.indptr[j + 1]]
            floor[j] = np.partition(col, col.size - 1 - m)[col.size - 1 - m]   # (m+1)-th largest
        self.doc_floor.copy_(torch.from_numpy(floor))
        return int((floor > 0).sum())

    def forward_gated(self, z: torch.Tensor, n_cap: int, own: torch.Tensor):
        """Training forward of already centred vectors z [B + U, d] (B = n_cap caption rows, then U
        image rows) through both top-k gates (`top_k`, each > 0): (s_cap [B, k_t + T] float32: s at
        each caption's k_t top columns, then at its own term columns own [B, T] (pad |V|, 0 there);
        s_img [U, k_i]: s at each image's top columns; cap_top [B, k_t], img_top [U, k_i] int64
        columns; live [|V|] bool, the columns positive in some row). Same loss and gradients as
        forward_live + top_k_rows, with a sparse backward (_GatedLogReluLinear)."""
        return _GatedLogReluLinear.apply(self.norm(self.w1(z)), self.w2.weight, self.w2.bias, int(n_cap),
                                         self.top_k("text"), self.top_k("image"), own)

    def forward_live(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training forward of already centred vectors (see `centered`): (s_live [B, L] float32,
        cols [L] int64), the outputs restricted to the
        L vocabulary columns positive in at least one row of the batch (all others are exactly 0 in
        forward() and get no gradient). Same loss and gradients as forward(), less work once sparse."""
        return _LiveLogReluLinear.apply(self.norm(self.w1(z)), self.w2.weight, self.w2.bias)
