"""Top-k sparse autoencoder over patch features: the visual words of BM25-V (paper §3.3, §3.6).

    x = z / s                                   (s = input_scale, a scalar fixed before training
                                                 so that E||x - mean||^2 = D; keeps λ scale-free)
    h = top-k(ReLU(W_e (x - b_d) + b_e))        eq. (3), ||h||_0 <= k  (= k unless fewer than k
                                                 pre-activations are positive)
    x̂ = W_d h + b_d,  ẑ = s · x̂                 eq. (4), with the decoder bias b_d of the SAE of
                                                 Bricken et al. [2] (subtracted before encoding)
    L = ||x̂ - x||² + λ ||h||_1                   per patch, averaged over the batch

W_e [eD, D], b_e [eD], W_d [D, eD] (stored transposed as `w_dec` [eD, D], one row per visual word,
so decoding gathers contiguous rows; rows kept at unit norm, so the L1 term cannot be gamed by
shrinking h and growing W_d), b_d [D]. Vocabulary: eD visual words named vw00000, vw00001, ...
Gradients reach only the k kept activations (straight-through on the kept values).

"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import InputError
from ..head import SparseHead


def visual_word_vocab(n: int) -> list[str]:
    """Term names of n visual words: vw00000 ... (5 digits, more when n > 100000)."""
    width = max(5, len(str(n - 1)))
    return [f"vw{i:0{width}d}" for i in range(n)]


class SAEHead(SparseHead):
    """Top-k SAE head. config: dim D, vocab_size eD, expansion e, k, lam (λ), patch_skip
    (leading patch positions ignored, e.g. 1 for a ViT [CLS]), training (provenance)."""

    method = "bm25v"

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__(config, vocab)
        d, n = int(config["dim"]), int(config["vocab_size"])
        self.k = int(config["k"])
        if not 1 <= self.k <= n:
            raise InputError(f"SAE k={self.k} must be in 1..{n} (the vocabulary size)")
        self.enc = nn.Linear(d, n)                           # W_e, b_e
        self.w_dec = nn.Parameter(torch.empty(n, d))         # W_d transposed: row i = visual word i
        self.b_dec = nn.Parameter(torch.zeros(d))            # b_d
        self.register_buffer("input_scale", torch.ones(()))  # s
        nn.init.normal_(self.w_dec)
        with torch.no_grad():
            self.normalize_decoder()
            self.enc.weight.copy_(self.w_dec)  # tied init (Gao et al. 2024): fewer dead latents
            self.enc.bias.zero_()

    @classmethod
    def create(cls, dim: int, expansion: int = 16, k: int = 16, lam: float = 1e-3, patch_skip: int = 0,
               training: dict | None = None) -> "SAEHead":
        """A freshly initialised SAE with vocabulary eD = expansion * dim."""
        n = int(expansion) * int(dim)
        cfg = {"dim": int(dim), "vocab_size": n, "expansion": int(expansion), "k": int(k), "lam": float(lam),
               "patch_skip": int(patch_skip), "training": dict(training or {})}
        return cls(cfg, visual_word_vocab(n))

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Rescale every decoder column W_d[:, i] (row i of w_dec) to unit L2 norm."""
        self.w_dec.div_(self.w_dec.norm(dim=1, keepdim=True).clamp_min(1e-8))

    def encode_topk(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Patch features z [B, D] float32 -> (values [B, k] float32 >= 0, indices [B, k] int64):
        the k largest of ReLU(W_e (z/s - b_d) + b_e) per row (eq. 3). Values are 0 where fewer
        than k pre-activations are positive."""
        x = z / self.input_scale - self.b_dec
        if not torch.is_grad_enabled():
            vals, idx = torch.topk(self.enc(x), self.k, dim=-1)
            return F.relu(vals), idx
        # Training: select without a graph, then recompute only the k kept pre-activations with one;
        # gradients are the same (zero for the masked entries) but backward costs O(B·k·D), not O(B·eD·D).
        with torch.no_grad():
            idx = torch.topk(self.enc(x), self.k, dim=-1).indices
        vals = torch.einsum("bd,bkd->bk", x, self.enc.weight[idx]) + self.enc.bias[idx]
        return F.relu(vals), idx

    def decode(self, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """x̂ = W_d h + b_d [B, D] in the scaled space, from the top-k (values, indices) (eq. 4)."""
        return F.embedding_bag(idx, self.w_dec, per_sample_weights=vals, mode="sum") + self.b_dec

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None = None, side: str = "image") -> torch.Tensor:
        """Patch features z [B, D] -> h [B, eD] float32, at most k non-zeros per row (eq. 3)."""
        vals, idx = self.encode_topk(z)
        return torch.zeros(z.shape[0], self.enc.out_features, dtype=vals.dtype, device=z.device).scatter_(1, idx, vals)

    def loss(self, z: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """L = mean over rows of ||x̂ - x||² + λ ||h||_1 (x = z/s). Returns (loss, figures)."""
        x = z / self.input_scale
        vals, idx = self.encode_topk(z)
        mse = (self.decode(vals, idx) - x).pow(2).sum(-1).mean()
        l1 = vals.sum(-1).mean()
        loss = mse + float(self.config["lam"]) * l1
        return loss, {"mse": mse.item(), "l1": l1.item(), "idx": idx}
