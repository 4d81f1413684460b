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

Training streams patches from the `patch_states` dataset of a dense image HDF5 ([N, P, D],
float16/32; see mmsparse/backbones/encode.py) through a bounded shuffle buffer, so it never
holds more than `buffer_images` images' patches in memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import InputError
from .base import SparseHead, register_head

PATCH_DATASET = "patch_states"


def visual_word_vocab(n: int) -> list[str]:
    """Term names of n visual words: vw00000 ... (5 digits, more when n > 100000)."""
    width = max(5, len(str(n - 1)))
    return [f"vw{i:0{width}d}" for i in range(n)]


@register_head("sae")
class SAEHead(SparseHead):
    """Top-k SAE head. config: dim D, vocab_size eD, expansion e, k, lam (λ), patch_skip
    (leading patch positions ignored, e.g. 1 for a ViT [CLS]), training (provenance)."""

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

    def forward(self, z: torch.Tensor) -> torch.Tensor:
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


# -- streaming patches -------------------------------------------------------------------------

def patch_shape(path: str | Path) -> tuple[int, int, int]:
    """(N images, P patches, D) of the `patch_states` dataset. InputError if absent or not 3-D."""
    import h5py

    from ..formats._h5 import open_h5

    with open_h5(path, "dense") as f:
        if PATCH_DATASET not in f:
            raise InputError(f"{path}: no '{PATCH_DATASET}' dataset; encode the images with "
                             "`mmsparse encode-dense ... --patch-states`")
        ds = f[PATCH_DATASET]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 3:
            raise InputError(f"{path}: '{PATCH_DATASET}' has shape {getattr(ds, 'shape', None)}, expected [N, P, D]")
        return tuple(int(x) for x in ds.shape)


def iter_patch_rows(path: str | Path, chunk_images: int = 1024, patch_skip: int = 0,
                    order: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Stream (first image row, patches [n*P', D] float32) chunk by chunk from `patch_states`.

    chunk_images: images per HDF5 read. patch_skip: leading patch positions dropped (P' = P - skip).
    order: chunk numbers in the order to read them (default 0, 1, ...). Memory O(chunk).
    Raises InputError for NaN/Inf patch features.
    """
    import h5py

    n, p, d = patch_shape(path)
    if not 0 <= patch_skip < p:
        raise InputError(f"--patch-skip {patch_skip}: {path} has only {p} patch positions")
    chunks = order if order is not None else np.arange(-(-n // chunk_images))
    with h5py.File(path, "r") as f:
        ds = f[PATCH_DATASET]
        for c in chunks:
            s = int(c) * chunk_images
            x = ds[s:s + chunk_images, patch_skip:].astype(np.float32)
            if not np.isfinite(x).all():
                raise InputError(f"{path}: '{PATCH_DATASET}' has NaN/Inf near image row {s}; re-encode")
            yield s, x.reshape(-1, d)


def shuffled_batches(path: str | Path, batch_size: int, rng: np.random.Generator, buffer_images: int = 8192,
                     chunk_images: int = 1024, patch_skip: int = 0) -> Iterator[np.ndarray]:
    """One epoch of shuffled patch batches [<=batch_size, D] float32, every patch exactly once.

    Chunks of `chunk_images` images are read in random order into a buffer of about
    `buffer_images` images' patches; a full buffer is shuffled and emitted as batches (the
    remainder stays for the next fill). Memory O(buffer_images * P * D), whatever N is.
    """
    n, _, _ = patch_shape(path)
    order = rng.permutation(-(-n // chunk_images))
    per_fill = max(1, buffer_images // chunk_images)
    buf: list[np.ndarray] = []
    held = 0
    for i, (_, x) in enumerate(iter_patch_rows(path, chunk_images, patch_skip, order)):
        buf.append(x)
        held += 1
        if held >= per_fill or i == len(order) - 1:
            pool = np.concatenate(buf)
            pool = pool[rng.permutation(len(pool))]
            last = i == len(order) - 1
            cut = len(pool) if last else (len(pool) // batch_size) * batch_size
            for s in range(0, cut, batch_size):
                yield pool[s:s + batch_size]
            buf, held = ([pool[cut:]] if cut < len(pool) else []), 0


def patch_moments(path: str | Path, chunk_images: int = 1024, patch_skip: int = 0) -> tuple[np.ndarray, float, int]:
    """(mean patch [D] float32, scale s, patches counted) in one streaming pass: s² = E||z - mean||² / D."""
    total, sq, count = None, 0.0, 0
    for _, x in iter_patch_rows(path, chunk_images, patch_skip):
        x64 = x.astype(np.float64)
        total = x64.sum(0) if total is None else total + x64.sum(0)
        sq += float((x64 ** 2).sum())
        count += len(x)
    if not count:
        raise InputError(f"{path}: '{PATCH_DATASET}' holds no patches")
    mean = total / count
    var = max(sq / count - float(mean @ mean), 1e-12)
    return mean.astype(np.float32), math.sqrt(var / len(mean)), count


# -- training ----------------------------------------------------------------------------------

@dataclass
class SAETrainConfig:
    """Paper §3.6 defaults: 5 epochs, batch 4096, Adam with cosine LR decay, λ = 1e-3."""

    epochs: int = 5
    batch_size: int = 4096
    lr: float = 4e-4
    seed: int = 0
    buffer_images: int = 8192
    chunk_images: int = 1024
    extra: dict = field(default_factory=dict)


def train_sae(head: SAEHead, path: str | Path, cfg: SAETrainConfig,
              on_step: Callable[[dict], None] | None = None,
              on_epoch: Callable[[dict], None] | None = None) -> list[dict]:
    """Train `head` in place on the patches of dense image HDF5 `path`. Returns per-epoch figures
    (loss, mse, relative mse = mse / E||x - mean||², l1, alive = fraction of visual words that
    fired in the epoch, seconds).

    Sets b_d to the mean patch and input_scale from one streaming pass first; then Adam with a
    cosine-decayed learning rate over all steps; decoder columns re-normalised after each step.
    """
    skip = int(head.config.get("patch_skip", 0))
    n, p, d = patch_shape(path)
    if d != head.dim:
        raise InputError(f"{path}: patch features have D={d} but the SAE expects D={head.dim}")
    mean, scale, count = patch_moments(path, cfg.chunk_images, skip)
    with torch.no_grad():
        head.input_scale.fill_(scale)
        head.b_dec.copy_(torch.from_numpy(mean / scale))
    steps_per_epoch = -(-n * (p - skip) // cfg.batch_size)  # all batches full but an epoch's last
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.Adam(head.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    rng = np.random.default_rng(cfg.seed)
    history, step = [], 0
    head.train()
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.time()
        fired = torch.zeros(head.enc.out_features, dtype=torch.bool)
        sums = {"loss": 0.0, "mse": 0.0, "l1": 0.0, "rows": 0}
        for batch in shuffled_batches(path, cfg.batch_size, rng, cfg.buffer_images, cfg.chunk_images, skip):
            z = torch.from_numpy(batch)
            loss, fig = head.loss(z)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            head.normalize_decoder()
            step += 1
            fired[fig["idx"].unique()] = True
            b = len(batch)
            sums["loss"] += loss.item() * b
            sums["mse"] += fig["mse"] * b
            sums["l1"] += fig["l1"] * b
            sums["rows"] += b
            if on_step:
                on_step({"step": step, "total": total, "epoch": epoch, "loss": loss.item(), "mse": fig["mse"]})
        r = sums["rows"]
        rec = {"epoch": epoch, "loss": sums["loss"] / r, "mse": sums["mse"] / r, "rel_mse": sums["mse"] / r / d,
               "l1": sums["l1"] / r, "alive": float(fired.float().mean()), "patches": r,
               "seconds": round(time.time() - t0, 1)}
        history.append(rec)
        if on_epoch:
            on_epoch(rec)
    head.eval()
    head.config["training"].update(patches=count, images=n, patches_per_image=p - skip, steps=step,
                                   config={k: v for k, v in cfg.__dict__.items() if k != "extra"},
                                   history=history)
    return history

