"""BM25-V documents from visual words: sum-pool the patches' SAE activations per image (eq. 6-7),
keep the top-k_post (eq. 8), quantise to uint16 ×100 (§3.4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from ...errors import InputError
from ...formats._h5 import read_strings
from ...formats.sharded import open_read  # a file or a sharded directory
from .data import iter_patch_rows, patch_shape

QUANT_SCALE = 100      # §3.4: uint16 = round(v * 100), clipped to [0, 65535]
QUANT_MAX = 65535


def pool_topk(vals, idx, patches: int, vocab_size: int, k_post: int):
    """Sum-pool patch activations per image (eq. 7) and keep the top-k_post (eq. 8).

    vals/idx: torch [B*P, k] float32 / int64, the SAE's top-k per patch, images' patches
    consecutive (P = `patches`). Returns torch (values [B, k_post] float32, indices [B, k_post]
    int64) by decreasing value; values are 0 where an image has fewer than k_post active words.
    """
    b = vals.shape[0] // patches
    rows = torch.arange(b, device=vals.device).repeat_interleave(patches * vals.shape[1])
    pooled = torch.zeros(b, vocab_size, dtype=torch.float32, device=vals.device)
    pooled.index_put_((rows, idx.reshape(-1)), vals.reshape(-1).float(), accumulate=True)
    return torch.topk(pooled, min(k_post, vocab_size), dim=1)


def quantize(v: np.ndarray) -> np.ndarray:
    """float activations -> uint16 rint(v * 100) clipped to [0, 65535] (§3.4)."""
    return np.clip(np.rint(np.asarray(v, dtype=np.float64) * QUANT_SCALE), 0, QUANT_MAX).astype(np.uint16)


def dequantize(q: np.ndarray) -> np.ndarray:
    """uint16 -> float32 q / 100, the term frequency BM25 sees (steps of 0.01)."""
    return (np.asarray(q, dtype=np.float32) / QUANT_SCALE).astype(np.float32)


def to_csr_rows(vals: np.ndarray, idx: np.ndarray, vocab_size: int, quant: bool = True) -> sp.csr_matrix:
    """[B, k_post] values/indices -> CSR [B, eD] float32, quantised (×100, uint16, ÷100) when
    `quant`; entries that are (or round to) 0 dropped."""
    w = dequantize(quantize(vals)) if quant else np.asarray(vals, dtype=np.float32)
    rows = np.repeat(np.arange(vals.shape[0]), vals.shape[1])
    m = sp.csr_matrix((w.ravel(), (rows, idx.ravel())), shape=(vals.shape[0], vocab_size), dtype=np.float32)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def sparsify_patches(head, path: str | Path, k_post: int = 16, batch_images: int = 256, quant: bool = True,
                     progress=None) -> tuple[list[str], sp.csr_matrix]:
    """(ids, CSR [N, eD] float32) of the dense image HDF5 `path` through SAE `head`:
    eq. 6-8 and the quantisation, `batch_images` images at a time (memory O(batch * P * k)).
    progress: called with the number of images done."""
    n, p, d = patch_shape(path)
    skip = int(head.config.get("patch_skip", 0))
    if d != head.dim:
        raise InputError(f"{path}: patch features have D={d} but the SAE head expects D={head.dim}; "
                         "use the head trained on this backbone's patches")
    with open_read(path) as f:
        ids = read_strings(f["ids"])
    v = int(head.config["vocab_size"])
    parts = []
    with torch.no_grad():
        for s, x in iter_patch_rows(path, batch_images, skip):
            vals, idx = head.encode_topk(torch.from_numpy(x))
            pv, pi = pool_topk(vals, idx, p - skip, v, k_post)
            parts.append(to_csr_rows(pv.numpy(), pi.numpy(), v, quant))
            if progress:
                progress(min(n, s + batch_images))
    m = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)
    return ids, m
