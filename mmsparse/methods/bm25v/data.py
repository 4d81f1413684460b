"""Patch features streamed from the `patch_states` dataset of a dense image HDF5 ([N, P, D],
float16/32; see mmsparse/backbones/encode.py) through a bounded shuffle buffer, so training never
holds more than `buffer_images` images' patches in memory."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from ...errors import InputError
from ...formats._h5 import open_h5
from ...formats.sharded import open_read  # a file or a sharded directory

PATCH_DATASET = "patch_states"


def patch_shape(path: str | Path) -> tuple[int, int, int]:
    """(N images, P patches, D) of the `patch_states` dataset. InputError if absent or not 3-D."""
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
    n, p, d = patch_shape(path)
    if not 0 <= patch_skip < p:
        raise InputError(f"--patch-skip {patch_skip}: {path} has only {p} patch positions")
    chunks = order if order is not None else np.arange(-(-n // chunk_images))
    with open_read(path) as f:
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
