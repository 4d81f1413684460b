"""VDR's data: token / patch states streamed from dense HDF5 files in shuffled blocks (memory
O(buffer)), caption bags of words, and caption-image pairing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ...errors import InputError
from ...formats._h5 import read_strings
from ...formats.sharded import open_read  # a file or a sharded directory
from ...vocab import caption_token_ids, indicator, pad_ids
from ..pairs import caption_image_ids, sample_rows

STATE_SETS = {"text": "token_states", "image": "patch_states"}
MASKS = {"token_states": "token_mask", "final_input": "final_mask"}


def input_kind(path: str | Path, side: str) -> str:
    """What a dense file offers VDR, best first: final_input (final-layer inputs), token_states /
    patch_states (the towers' last position states), or vectors (pooled)."""
    with open_read(path) as f:
        for name in ("final_input", STATE_SETS[side]):
            if name in f:
                return name
    return "vectors"


class States:
    """Position inputs of one dense file, read lazily: `want` = final_input (+ final_mask of
    captions), token_states (+ token_mask) of captions, patch_states of images, or the pooled
    `vectors` as one position; None = the best the file has (input_kind).
    read(lo, hi) -> (x [n, L, h] or, for images' final_input, [n, C, H, W] float16/32 numpy,
    mask [n, L] uint8 or None). InputError when the file lacks `want`."""

    def __init__(self, path: str | Path, side: str, want: str | None = None):
        self.path = Path(path)
        self.name = want or input_kind(self.path, side)
        self.f = open_read(self.path)
        if self.name not in self.f:
            self.f.close()
            raise InputError(f"{path}: no {self.name!r} dataset; re-encode with `mmsparse encode-dense "
                             f"--{self.name.replace('_', '-').replace('final-input', 'final-layer-inputs')}`")
        ds = self.f[self.name]
        self.n = int(ds.shape[0])
        self.hidden = int(ds.shape[1] if ds.ndim == 4 else ds.shape[-1])
        mask = MASKS.get(self.name)
        self.mask_name = mask if mask is not None and mask in self.f else None
        self.has_mask = self.mask_name is not None
        # trim the trailing padding columns no caption uses: fewer bytes read per batch (not where the
        # final layer pools the last position: SigLIP's text tower, `fixed_length`)
        self.length = int(ds.shape[1]) if ds.ndim == 3 else 1
        spec = json.loads(str(self.f.attrs.get("final_layer", "{}"))) if self.name == "final_input" else {}
        self.fixed = bool(spec.get("fixed_length"))
        if self.has_mask and not self.fixed:
            end = 1
            for s in range(0, self.n, 65536):
                m = self.f[self.mask_name][s:s + 65536].astype(bool)
                if m.size:
                    end = max(end, int((m.shape[1] - np.argmax(m[:, ::-1], axis=1))[m.any(1)].max(initial=1)))
            self.length = end

    def read(self, lo: int, hi: int):
        ds = self.f[self.name]
        x = ds[lo:hi, :self.length] if ds.ndim == 3 else ds[lo:hi] if ds.ndim == 4 else ds[lo:hi][:, None, :]
        return x, (self.f[self.mask_name][lo:hi, :self.length] if self.has_mask else None)

    def read_rows(self, rows: np.ndarray):
        """Rows (any order, may repeat) -> (x, mask) in that order; reads contiguous runs."""
        uniq, inv = np.unique(rows, return_inverse=True)
        parts, masks = [], []
        # consecutive runs of the sorted unique rows are one slice each
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        for run in np.split(uniq, breaks):
            x, m = self.read(int(run[0]), int(run[-1]) + 1)
            parts.append(x)
            masks.append(m)
        x = np.concatenate(parts)[inv]
        return x, (np.concatenate(masks)[inv] if self.has_mask else None)

    def close(self) -> None:
        self.f.close()


def caption_token_sets(path: str | Path, tokenizer, special_ids, check: int = 256) -> list[np.ndarray]:
    """Bag of words of each caption as sorted unique ids of `tokenizer` (int64, special tokens dropped):
    the stored token_ids, checked to be this tokenizer's (the first `check` untruncated captions
    tokenize to them again; unchecked without a tokenizer or texts); the tokenized `texts` when the
    file stores no token_ids. InputError (one line) when the stored token_ids are another tokenizer's
    (e.g. the backbone's under a --vocab-model with another tokenizer: they name other terms, and the
    texts are not re-tokenised in silence, since the towers saw the stored tokens), or the file has
    neither."""

    special = np.asarray(sorted(special_ids), dtype=np.int64)
    with open_read(path) as f:
        texts = read_strings(f["texts"]) if "texts" in f else None
        if "token_ids" in f and "token_mask" in f:
            ids, full = [], []
            for s in range(0, f["token_ids"].shape[0], 65536):
                t, m = f["token_ids"][s:s + 65536], f["token_mask"][s:s + 65536].astype(bool)
                full += list(m.all(1))          # every position real: the caption may have been cut
                for row, mk in zip(t, m):
                    a = np.unique(row[mk].astype(np.int64))
                    ids.append(a[~np.isin(a, special)])
            if tokenizer is None or texts is None or _same_tokenizer(ids, full, texts, tokenizer, check):
                return ids
            name = getattr(tokenizer, "name_or_path", "") or "the vocabulary's"
            raise InputError(f"{path}: token_ids are another tokenizer's than {name} (the vocabulary's), so the "
                             "bags of words would name other terms; use a --vocab-model whose tokenizer is the "
                             "backbone's (or none), or re-encode the captions with a backbone of that tokenizer")
    if texts is None:
        raise InputError(f"{path}: neither token_ids nor texts; re-run encode-dense on captions")
    if tokenizer is None:
        raise InputError(f"{path}: no token_ids and no tokenizer to make bags of words from its texts")
    return caption_token_ids(tokenizer, texts)


def _same_tokenizer(ids: list[np.ndarray], full: list[bool], texts: list[str], tokenizer, n: int) -> bool:
    """Whether the stored bags `ids` are `tokenizer`'s: its bags of the first n captions not cut by the
    encoder's length (`full` False) equal them."""
    rows = [i for i in range(min(n, len(texts))) if not full[i]] or list(range(min(n, len(texts))))
    fresh = caption_token_ids(tokenizer, [texts[i] for i in rows])
    return all(np.array_equal(ids[i], a) for i, a in zip(rows, fresh))


@dataclass
class Split:
    """A split of paired files: caption states, image states, each caption's image row, bows."""

    captions: States
    images: States
    cap_img: np.ndarray          # [Nc] int64 row in images
    bows: list[np.ndarray]       # per caption, head columns
    img_ids: list[str]
    cap_ids: list[str]

    def bow_matrix(self, rows, v: int) -> torch.Tensor:
        return indicator(pad_ids([self.bows[i] for i in rows], v), v)


def open_split(images: Path, captions: Path, qrels: Path | None, want: dict | None = None) -> Split:
    """Open an image and a caption dense file of one split and pair them (InputError on mismatch).
    want: {"text": dataset, "image": dataset} to read (States), default the best each file has."""

    with open_read(images) as f:
        img_ids = read_strings(f["ids"])
    with open_read(captions) as f:
        cap_ids = read_strings(f["ids"])
    of = caption_image_ids(captions, cap_ids, qrels)
    row = {i: k for k, i in enumerate(img_ids)}
    bad = [c for c, i in zip(cap_ids, of) if i not in row]
    if bad:
        raise InputError(f"{captions}: {len(bad)} caption(s) name images not in {images}, e.g. {bad[0]!r}; "
                         "use files of the same split")
    want = want or {}
    return Split(States(captions, "text", want.get("text")), States(images, "image", want.get("image")),
                 np.array([row[i] for i in of], dtype=np.int64), [], img_ids, cap_ids)


class RowView:
    """Rows `rows` (int64, any order) of a States, read as a States of their own: n, read(lo, hi) and
    read_rows(rows) index the view (the parent's shapes and dtypes); close() leaves the parent open."""

    def __init__(self, states: States, rows: np.ndarray):
        self.states, self.rows = states, np.asarray(rows, dtype=np.int64)
        self.n = len(self.rows)
        self.path, self.name, self.hidden = states.path, states.name, states.hidden
        self.fixed, self.has_mask = states.fixed, states.has_mask

    def read(self, lo: int, hi: int):
        return self.states.read_rows(self.rows[lo:hi])

    def read_rows(self, rows: np.ndarray):
        return self.states.read_rows(self.rows[np.asarray(rows, dtype=np.int64)])

    def close(self) -> None:
        pass


def sample_split(split: Split, n_images: int, seed: int = 0) -> Split:
    """A seeded sample of min(n_images, Ni) images of `split` (sorted rows) with all their captions, as a
    Split over RowViews of the same open files (bows, ids and cap_img re-indexed to the sample).
    Closing the sample closes nothing; the parent's files must stay open while it is read."""
    img = sample_rows(split.images.n, n_images, seed).numpy().astype(np.int64)
    caps = np.flatnonzero(np.isin(split.cap_img, img))
    return Split(RowView(split.captions, caps), RowView(split.images, img),
                 np.searchsorted(img, split.cap_img[caps]).astype(np.int64),
                 [split.bows[i] for i in caps] if split.bows else [],
                 [split.img_ids[i] for i in img], [split.cap_ids[i] for i in caps])


def batches(split: Split, batch_size: int, gen: torch.Generator, block: int = 256,
            buffer_rows: int = 4096, by_image: bool = False) -> Iterator[tuple]:
    """One epoch of batches (rows, x_cap, mask, x_img, cap_img, fixed): caption rows [B] int64, their
    states [B, L, h] and masks [B, L] (or None), the batch's distinct images' states [U, P, h]
    (numpy, stored dtype), each caption's image column [B] int64, and whether caption rows keep
    every position (States.fixed).

    Captions are read in contiguous blocks of `block` rows; the blocks are shuffled and loaded
    `buffer_rows` captions (plus their images) at a time, so memory is O(buffer) and every read is
    a slice. Inside a buffer each caption gets a random rank among the buffer's captions of its
    image and batches follow rank order, so a batch rarely holds an image twice."""
    n = split.captions.n
    starts = np.arange(0, n, block)
    order = starts[torch.randperm(len(starts), generator=gen).numpy()]
    per = max(1, buffer_rows // block)
    for s in range(0, len(order), per):
        rows = np.sort(np.concatenate([np.arange(b, min(n, b + block)) for b in order[s:s + per]]))
        xs, ms = split.captions.read_rows(rows)
        img_rows, img_pos = np.unique(split.cap_img[rows], return_inverse=True)
        xi, _ = split.images.read_rows(img_rows)
        noise = torch.rand(len(rows), generator=gen).numpy()
        o = np.lexsort((noise, img_pos))                  # group by image, random inside
        grp_start = np.r_[0, np.flatnonzero(np.diff(img_pos[o]) != 0) + 1]
        rank = np.empty(len(rows), dtype=np.int64)
        rank[o] = np.arange(len(rows)) - np.repeat(grp_start, np.diff(np.r_[grp_start, len(rows)]))
        if by_image:   # images in random order, each with all its captions
            rank = torch.randperm(len(img_rows), generator=gen).numpy()[img_pos]
        seq = np.lexsort((torch.rand(len(rows), generator=gen).numpy(), rank))   # positions in the buffer
        for b in range(0, len(seq), batch_size):
            sel = seq[b:b + batch_size]
            u, local = np.unique(img_pos[sel], return_inverse=True)
            yield (rows[sel], xs[sel], ms[sel] if ms is not None else None, xi[u],
                   local.astype(np.int64), split.captions.fixed)


def load_states(batch: tuple):
    """A `batches` item -> torch (x_cap [B, L, h] f32 trimmed to the batch's longest caption,
    mask [B, L] or None, x_img [U, P, h] (final-layer inputs [U, C, H, W]) f32, cap_img [B])."""
    rows, xs, ms, xi, local, fixed = batch
    mc = None
    if ms is not None:
        longest = max(1, int(ms.sum(1).max())) if not fixed else ms.shape[1]
        xs, ms = xs[:, :longest], ms[:, :longest]
        mc = torch.from_numpy(ms.astype(np.float32))
    return (torch.from_numpy(np.asarray(xs, dtype=np.float32)), mc,
            torch.from_numpy(np.asarray(xi, dtype=np.float32)), torch.from_numpy(local))


def load_batch(split: Split, batch: tuple, v: int):
    """load_states(batch) plus the captions' bags of words [B, |V|] 0/1."""
    return (*load_states(batch), split.bow_matrix(batch[0], v))
