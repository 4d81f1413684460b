"""Dense HDF5: one row per image or caption.

Layout:
  ids      [N] UTF-8 strings, unique
  vectors  [N, d] float32 (float16 allowed)
  texts    [N] UTF-8 strings (captions only)
  image_ids [N] UTF-8 strings (captions only: the image each caption describes)
  extras   optional writer-specific datasets (DenseWriter.append_extra / set_extra), e.g.
           encode-dense's token_states, patch_states, pre_projection (mmsparse/backbones/encode.py)
  attrs    format="dense", modality (image|text), backbone, model, dataset, split,
           normalized (bool), dim, mmsparse_version, command, plus anything a writer adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from ..atomic import atomic_path
from ..errors import InputError
from ..provenance import stamp
from ._h5 import STR, attrs_dict, check_ids, open_h5, read_strings

REQUIRED_ATTRS = ("modality", "backbone", "model", "dataset", "split", "normalized", "dim")
MODALITIES = ("image", "text")


@dataclass
class DenseCollection:
    """An in-memory dense collection.

    ids: N unique strings; vectors: [N, d] float32 or float16; texts: N captions or None;
    attrs: the file attributes (see module docstring).
    """

    ids: list[str]
    vectors: np.ndarray
    attrs: dict = field(default_factory=dict)
    texts: list[str] | None = None
    image_ids: list[str] | None = None

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def modality(self) -> str:
        return self.attrs.get("modality", "")


def _check_attrs(attrs: dict, path) -> None:
    missing = [k for k in REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise InputError(f"{path}: dense file lacks attribute(s) {', '.join(missing)}")
    if attrs["modality"] not in MODALITIES:
        raise InputError(f"{path}: attribute modality={attrs['modality']!r}, expected image or text")


class DenseWriter:
    """Stream rows into a dense HDF5 file; the file appears at `path` only on `close()`.

    Use as a context manager: an exception discards the partial file.
    `attrs` must hold every key of REQUIRED_ATTRS except `dim` (taken from `dim`).
    """

    def __init__(self, path: str | Path, dim: int, attrs: dict, with_texts: bool = False,
                 dtype: str = "float32", chunk_rows: int = 1024):
        if dtype not in ("float32", "float16"):
            raise InputError(f"dense dtype must be float32 or float16, got {dtype!r}")
        self.path = Path(path)
        self._ctx = atomic_path(self.path)
        tmp = self._ctx.__enter__()
        self._f = h5py.File(tmp, "w")
        a = {**attrs, "dim": int(dim), **stamp(), "format": "dense"}
        _check_attrs(a, self.path)
        for k, v in a.items():
            self._f.attrs[k] = v
        self._n = 0
        self._ids = self._f.create_dataset("ids", (0,), maxshape=(None,), dtype=STR, chunks=(chunk_rows,))
        self._vec = self._f.create_dataset("vectors", (0, dim), maxshape=(None, dim), dtype=dtype,
                                           chunks=(chunk_rows, dim))
        self._texts = (self._f.create_dataset("texts", (0,), maxshape=(None,), dtype=STR, chunks=(chunk_rows,))
                       if with_texts else None)
        self._image_ids = (self._f.create_dataset("image_ids", (0,), maxshape=(None,), dtype=STR, chunks=(chunk_rows,))
                           if with_texts else None)
        self._seen: set[str] = set()

    def append(self, ids: list[str], vectors: np.ndarray, texts: list[str] | None = None,
               image_ids: list[str] | None = None) -> None:
        """Append rows. ids: n strings; vectors: [n, dim]; texts (and optionally image_ids,
        the image each caption describes): n strings each, for text files."""
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape[0] != len(ids) or vectors.shape[1] != self._vec.shape[1]:
            raise ValueError(f"vectors shape {vectors.shape} does not match {len(ids)} ids x dim {self._vec.shape[1]}")
        if not np.isfinite(vectors).all():
            raise InputError(f"{self.path}: NaN or Inf in vectors for ids {ids[:3]}...")
        for i in ids:
            if not i or i in self._seen:
                raise InputError(f"{self.path}: empty or duplicate id {i!r}")
            self._seen.add(i)
        n0, n1 = self._n, self._n + len(ids)
        self._ids.resize((n1,))
        self._ids[n0:n1] = ids
        self._vec.resize((n1, self._vec.shape[1]))
        self._vec[n0:n1] = vectors.astype(self._vec.dtype)
        if self._texts is not None:
            if texts is None or len(texts) != len(ids):
                raise ValueError("texts must be given for every row of a text file")
            self._texts.resize((n1,))
            self._texts[n0:n1] = texts
            if image_ids is not None:
                if len(image_ids) != len(ids):
                    raise ValueError("image_ids must have one entry per row")
                self._image_ids.resize((n1,))
                self._image_ids[n0:n1] = image_ids
        self._n = n1

    def append_extra(self, name: str, rows: np.ndarray) -> None:
        """Append rows to an extra per-row dataset `name` (e.g. token_states [n, L, h]); created on
        the first call with rows' trailing shape and dtype. Keep it in step with `append`."""
        rows = np.asarray(rows)
        if name not in self._f:
            tail = rows.shape[1:]
            per_row = max(1, int(np.prod(tail, dtype=np.int64)) * rows.dtype.itemsize)
            chunk = max(1, min(1024, (1 << 20) // per_row))
            self._f.create_dataset(name, (0, *tail), maxshape=(None, *tail), dtype=rows.dtype,
                                   chunks=(chunk, *tail))
        ds = self._f[name]
        n0 = ds.shape[0]
        ds.resize(n0 + rows.shape[0], axis=0)
        ds[n0:] = rows

    def set_extra(self, name: str, array: np.ndarray) -> None:
        """Store a whole extra dataset `name` (e.g. projection weights), written once."""
        self._f.create_dataset(name, data=np.asarray(array))

    def close(self) -> None:
        if self._image_ids is not None and self._image_ids.shape[0] != self._n:
            del self._f["image_ids"]  # written for no row or not for all: drop rather than mislead
        self._f.close()
        self._ctx.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        self._f.close()
        try:
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException:
            pass

    def __enter__(self) -> "DenseWriter":
        return self

    def __exit__(self, et, ev, tb) -> None:
        if et is None:
            self.close()
        else:
            self.abort(ev)


def write_dense(path: str | Path, ids: list[str], vectors: np.ndarray, attrs: dict,
                texts: list[str] | None = None, dtype: str = "float32",
                image_ids: list[str] | None = None) -> None:
    """Write a whole dense collection atomically (see DenseWriter for `attrs`)."""
    vectors = np.asarray(vectors)
    with DenseWriter(path, vectors.shape[1], attrs, with_texts=texts is not None, dtype=dtype) as w:
        w.append(list(ids), vectors, texts, image_ids)


def read_dense_attrs(path: str | Path) -> dict:
    """Attributes of a dense file, validated, without loading vectors."""
    with open_h5(path, "dense") as f:
        a = attrs_dict(f)
        _check_attrs(a, path)
        return a


def read_dense(path: str | Path, dtype=np.float32) -> DenseCollection:
    """Load a dense file. Raises InputError if missing, not dense, or malformed."""
    with open_h5(path, "dense") as f:
        a = attrs_dict(f)
        _check_attrs(a, path)
        for k in ("ids", "vectors"):
            if k not in f:
                raise InputError(f"{path}: dense file lacks dataset {k!r}")
        ids = read_strings(f["ids"])
        vec = f["vectors"][()].astype(dtype, copy=False)
        texts = read_strings(f["texts"]) if "texts" in f else None
        image_ids = read_strings(f["image_ids"]) if "image_ids" in f else None
    if vec.ndim != 2 or vec.shape[0] != len(ids) or vec.shape[1] != int(a["dim"]):
        raise InputError(f"{path}: 'vectors' has shape {vec.shape} but there are {len(ids)} ids of attribute "
                         f"dim={a['dim']}")
    check_ids(ids, path)
    if not np.isfinite(vec).all():
        bad = int((~np.isfinite(vec)).any(axis=1).sum())
        raise InputError(f"{path}: field 'vectors' has NaN/Inf in {bad} row(s); re-encode them")
    return DenseCollection(ids, vec, a, texts, image_ids)


def iter_dense(path: str | Path, chunk_rows: int = 4096) -> Iterator[tuple[list[str], np.ndarray]]:
    """Stream (ids, vectors[float32]) chunks of at most `chunk_rows` rows; memory O(chunk).

    Checks as it goes: attributes, datasets, empty/duplicate ids and NaN/Inf (InputError naming
    `path`), so a consumer never writes an output from a bad input."""
    from ..checks import check_finite

    with open_h5(path, "dense") as f:
        a = attrs_dict(f)
        _check_attrs(a, path)
        for k in ("ids", "vectors"):
            if k not in f:
                raise InputError(f"{path}: dense file lacks dataset {k!r}")
        n = f["ids"].shape[0]
        shape = f["vectors"].shape
        if len(shape) != 2 or shape[0] != n or shape[1] != int(a["dim"]):
            raise InputError(f"{path}: 'vectors' has shape {shape} but there are {n} ids of attribute "
                             f"dim={a['dim']}")
        seen: set[str] = set()
        for s in range(0, n, chunk_rows):
            ids = [x.decode() if isinstance(x, bytes) else x for x in f["ids"][s:s + chunk_rows]]
            for j, i in enumerate(ids):
                if not i or i in seen:
                    what = f"duplicate id {i!r}" if i else "an empty id"
                    raise InputError(f"{path}: field 'ids' has {what} at row {s + j}; ids must be "
                                     "non-empty and unique")
                seen.add(i)
            vec = f["vectors"][s:s + chunk_rows].astype(np.float32)
            check_finite(vec, path, ids)
            yield ids, vec
