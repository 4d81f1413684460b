"""Caption-image training pairs read from dense files, shared by the caption-vocabulary methods.

A split is every caption paired with its own image: dense vectors of both, which image each
caption describes (the captions file's `image_ids`, else a qrels file), the caption texts and,
once a vocabulary is chosen, each caption's term columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..checks import check_compatible
from ..errors import InputError
from ..formats.dense import read_dense, read_dense_attrs
from ..formats.sharded import open_read  # a file or a sharded directory
from ..formats.trec import read_qrels
from ..vocab import caption_token_ids, pad_ids, to_columns

SAME_MODEL = "use dense files encoded with the same backbone and model"


@dataclass
class PairData:
    """Dense vectors of one split, captions paired with images.

    z_img [Ni, d] float32, z_cap [Nc, d] float32, cap_img [Nc] int64 (row of the caption's image
    in z_img), img_ids / cap_ids / texts (lists), attrs_img / attrs_cap (file attributes).
    After `tokenize`: raw_ids (tokenizer ids of each caption); after `set_columns`: token_ids
    (head columns of each caption's terms) and tok [Nc, L] int64 padded with |V|.
    """

    z_img: torch.Tensor
    z_cap: torch.Tensor
    cap_img: torch.Tensor
    img_ids: list[str]
    cap_ids: list[str]
    texts: list[str]
    attrs_img: dict
    attrs_cap: dict
    tok: torch.Tensor | None = None
    token_ids: list[np.ndarray] = field(default_factory=list)
    raw_ids: list[np.ndarray] = field(default_factory=list)

    def to(self, device) -> "PairData":
        """Move the tensors (vectors, pairing, padded term ids) to `device`, in place; returns self."""
        self.z_img, self.z_cap, self.cap_img = (t.to(device) for t in (self.z_img, self.z_cap, self.cap_img))
        if self.tok is not None:
            self.tok = self.tok.to(device)
        return self

    def subset(self, img_rows) -> tuple["PairData", torch.Tensor]:
        """(the images at rows `img_rows` [n] int64 with every caption of them, as a PairData of their
        own; the rows of those captions here [m] int64). Tokens and columns follow when set."""
        dev = self.cap_img.device
        img_rows = torch.as_tensor(img_rows, dtype=torch.int64).to(dev)
        new_row = torch.full((self.z_img.shape[0],), -1, dtype=torch.int64, device=dev)
        new_row[img_rows] = torch.arange(len(img_rows), device=dev)
        caps = torch.nonzero(new_row[self.cap_img] >= 0).squeeze(1)
        ci, ii = caps.cpu().tolist(), img_rows.cpu().tolist()
        out = PairData(self.z_img[img_rows], self.z_cap[caps], new_row[self.cap_img[caps]],
                       [self.img_ids[i] for i in ii], [self.cap_ids[i] for i in ci], [self.texts[i] for i in ci],
                       self.attrs_img, self.attrs_cap, None if self.tok is None else self.tok[caps],
                       [self.token_ids[i] for i in ci] if self.token_ids else [],
                       [self.raw_ids[i] for i in ci] if self.raw_ids else [])
        return out, caps

    def tokenize(self, tokenizer) -> None:
        self.raw_ids = caption_token_ids(tokenizer, self.texts)

    def set_columns(self, head_token_ids) -> None:
        """Map raw_ids onto the head's columns (head.token_ids) and build `tok`."""
        tid = np.asarray(head_token_ids, dtype=np.int64)
        self.token_ids = to_columns(self.raw_ids, tid)
        self.tok = torch.from_numpy(pad_ids(self.token_ids, len(tid)))


def sample_rows(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """min(k, n) distinct rows of n, drawn with `seed` and sorted: int64 [min(k, n)]."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].sort().values


def caption_image_ids(captions_path: str | Path, cap_ids: list[str], qrels_path: str | Path | None) -> list[str]:
    """Image id of each caption: the captions file's `image_ids` dataset if present, else the
    (caption id -> image id) qrels file. Raises InputError if neither gives every caption one."""
    with open_read(captions_path) as f:
        if "image_ids" in f:
            out = [x.decode() if isinstance(x, bytes) else str(x) for x in f["image_ids"][()]]
            if len(out) != len(cap_ids):
                raise InputError(f"{captions_path}: image_ids: {len(out)} entries for {len(cap_ids)} captions")
            return out
    if qrels_path is None:
        raise InputError(f"{captions_path}: no 'image_ids' dataset; pass --qrels/--val-qrels "
                         "(caption id -> image id, TREC qrels) to pair captions with images")
    qrels = read_qrels(qrels_path)
    out, missing = [], []
    for c in cap_ids:
        rel = [d for d, r in qrels.get(c, {}).items() if r > 0]
        out.append(rel[0] if rel else "")
        if not rel:
            missing.append(c)
    if missing:
        raise InputError(f"{qrels_path}: no relevant image for {len(missing)} caption(s) of {captions_path}, "
                         f"e.g. {missing[:3]}; pass the qrels of the same split")
    return out


def load_pairs(images_path: str | Path, captions_path: str | Path, qrels_path: str | Path | None = None) -> PairData:
    """Read an image and a caption dense file and pair them. Raises InputError on any mismatch."""
    im = read_dense(images_path)
    ca = read_dense(captions_path)
    if im.modality != "image":
        raise InputError(f"{images_path}: modality={im.modality!r}, expected an image dense file")
    if ca.modality != "text":
        raise InputError(f"{captions_path}: modality={ca.modality!r}, expected a caption (text) dense file")
    if im.dim != ca.dim:
        raise InputError(f"{captions_path}: dim {ca.dim} differs from {images_path} dim {im.dim}; "
                         "encode both with the same backbone")
    if ca.texts is None:
        raise InputError(f"{captions_path}: no 'texts' dataset; re-run encode-dense on captions")
    img_of = caption_image_ids(captions_path, ca.ids, qrels_path)
    row = {i: k for k, i in enumerate(im.ids)}
    unknown = [c for c, i in zip(ca.ids, img_of) if i not in row]
    if unknown:
        raise InputError(f"{captions_path}: {len(unknown)} caption(s) name images not in {images_path}, "
                         f"e.g. caption {unknown[0]!r}; use files of the same split")
    cap_img = torch.tensor([row[i] for i in img_of], dtype=torch.int64)
    return PairData(torch.from_numpy(im.vectors), torch.from_numpy(ca.vectors), cap_img,
                    im.ids, ca.ids, list(ca.texts), im.attrs, ca.attrs)


def check_inputs(inputs, fix: str = SAME_MODEL) -> tuple[dict, dict]:
    """Check a run's files belong together: train images and captions of one backbone, model,
    dataset and split; validation files of the same backbone and model; both val files or
    neither. Returns (train image attrs, train caption attrs). InputError naming both files."""
    if inputs.train_captions is None:
        raise InputError("missing TRAIN_CAPTIONS: this method trains on caption-image pairs")
    if (inputs.val_images is None) != (inputs.val_captions is None):
        raise InputError("pass both --val-images and --val-captions (or neither)")
    ai, ac = read_dense_attrs(inputs.train_images), read_dense_attrs(inputs.train_captions)
    check_compatible(ai, ac, ("backbone", "model", "dataset", "split"), str(inputs.train_images),
                     str(inputs.train_captions), fix)
    if inputs.val_images is not None:
        vi, vc = read_dense_attrs(inputs.val_images), read_dense_attrs(inputs.val_captions)
        check_compatible(ai, vi, ("backbone", "model"), str(inputs.train_images), str(inputs.val_images), fix)
        check_compatible(vi, vc, ("backbone", "model", "dataset", "split"), str(inputs.val_images),
                         str(inputs.val_captions), fix)
        if int(vi.get("dim", ai.get("dim", 0))) != int(ai.get("dim", 0)):
            raise InputError(f"{inputs.val_images}: dim {vi.get('dim')} differs from the training dim {ai.get('dim')}")
    return ai, ac


def training_record(inputs, cap_attrs: dict, **extra) -> dict:
    """What a head's config.json records about its training inputs (backbone, model, dataset and
    the absolute paths), plus `extra`."""
    def p(x):
        return str(Path(x).resolve()) if x is not None else None
    fp = cap_attrs.get("model_fingerprint")  # (absent from older files: their checkpoints still resume)
    return {"backbone": cap_attrs.get("backbone"), "model": cap_attrs.get("model"),
            **({"model_fingerprint": fp} if fp else {}),
            "dataset": cap_attrs.get("dataset"), "train_images": p(inputs.train_images),
            "train_captions": p(inputs.train_captions), "val_images": p(inputs.val_images),
            "val_captions": p(inputs.val_captions), **extra}
