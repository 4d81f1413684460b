"""Fixed batch shapes on CUDA: every new input shape costs a CUDA run seconds of set-up.

Measured on one H200 (encode-dense of 6,000 images and 30,000 captions, batch 256; docs/speed.md):
the first batch of a process takes 2-7 s (images; captions 0.3-1.4 s) and each later batch of a
shape not seen before takes 0.1-2.8 s (cuDNN picks and builds kernels per shape: 2.7 s for the last,
partial image batch in channels-last), against 17-39 ms for a batch of a known shape. Captions
sorted by length give about 40 sequence lengths, each a new shape; under bf16 autocast they cost
about 80 ms each, which made bf16 caption encoding slower than fp32 (3,482 vs 7,734 captions/s).

So on CUDA a batch is padded to the full batch size (repeating its last row) and caption tokens to
a multiple of LENGTH_MULTIPLE (capped at the backbone's max_length), and the padded rows are cut
from the outputs. Padding tokens are masked out, so every real row's vector is the one an
unpadded batch gives (to float rounding: a different shape can pick a different kernel). On the CPU
nothing is padded: oneDNN's per-shape set-up is cheap and padding would be wasted arithmetic.
"""

from __future__ import annotations

import numpy as np

LENGTH_MULTIPLE = 16


def fixed_shapes(device) -> bool:
    """Whether batches on `device` are padded to fixed shapes (CUDA devices)."""
    return str(device).startswith("cuda")


def _pad_rows(x, rows: int):
    """[B, ...] tensor -> [rows, ...], repeating the last row (rows >= B)."""
    import torch
    extra = rows - x.shape[0]
    return x if extra <= 0 else torch.cat([x, x[-1:].expand(extra, *x.shape[1:])])


def pad_token_batch(batch: dict, rows: int, max_length: int, pad_id: int, multiple: int = LENGTH_MULTIPLE) -> dict:
    """A tokenizer batch ({name: [B, L] tensor}) padded to [rows, L'] with L' = L rounded up to
    `multiple`, at most max(L, max_length): input_ids with pad_id, every other field (attention_mask,
    token_type_ids) with 0 on the new positions; rows beyond B repeat the last row."""
    import torch
    n, length = batch["input_ids"].shape
    target = max(length, min(-(-length // multiple) * multiple, max_length))
    out = {}
    for k, v in batch.items():
        if torch.is_tensor(v) and v.dim() == 2 and v.shape == (n, length):
            if target > length:
                v = torch.nn.functional.pad(v, (0, target - length), value=pad_id if k == "input_ids" else 0)
            v = _pad_rows(v, rows)
        out[k] = v
    return out


TOKEN_ARRAYS = ("token_states", "token_mask", "token_ids", "final_input", "final_mask")


def _take(res: dict, n: int, length: int | None = None) -> dict:
    """The first n rows of each array (and of token arrays [B, L', ...] the first `length` positions)."""
    out = {}
    for k, v in res.items():
        if isinstance(v, np.ndarray):
            v = v[:n, :length] if length is not None and k in TOKEN_ARRAYS else v[:n]
        out[k] = v
    return out


def encode_pixel_batch(backbone, pixel_values, rows: int, extras=(), layer: int = -1) -> dict:
    """backbone.encode_pixels of a [B, 3, H, W] batch, padded to `rows` rows on CUDA; outputs have
    B rows either way."""
    n = pixel_values.shape[0]
    if fixed_shapes(backbone.device) and n < rows:
        return _take(backbone.encode_pixels(_pad_rows(pixel_values, rows), extras, layer), n)
    return backbone.encode_pixels(pixel_values, extras, layer)


def encode_token_batch(backbone, batch: dict, rows: int, extras=()) -> dict:
    """backbone.encode_tokens of a tokenizer batch [B, L], padded on CUDA (pad_token_batch); outputs
    have B rows and the token arrays (TOKEN_ARRAYS) L positions either way, as unpadded."""
    if not fixed_shapes(backbone.device):
        return backbone.encode_tokens(batch, extras)
    n, length = batch["input_ids"].shape
    pad = backbone.tokenizer.pad_token_id or 0
    return _take(backbone.encode_tokens(pad_token_batch(batch, rows, backbone.max_length, pad), extras), n, length)
