"""Sparse HDF5: one row per image or caption, a bag of weighted vocabulary terms, CSR.

Layout:
  ids      [N] UTF-8 strings, unique
  indptr   [N+1] int64; row i owns indices/weights[indptr[i]:indptr[i+1]]
  indices  [nnz] int32, term ids into `vocab`, strictly increasing within a row
  weights  [nnz] float32, > 0
  vocab    [|V|] UTF-8 term strings
  texts    [N] UTF-8 strings (captions only, optional)
  attrs    format="sparse", modality, head (head directory or name), method,
           query_mode (expand | caption-terms | doc), plus the dense file's provenance.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from ..provenance import stamp
from ._h5 import STR, attrs_dict, check_ids, open_h5, read_strings

REQUIRED_ATTRS = ("modality", "head", "query_mode")


@dataclass
class SparseCollection:
    """An in-memory sparse collection. `matrix` is a scipy CSR [N, |V|] float32."""

    ids: list[str]
    matrix: sp.csr_matrix
    vocab: list[str]
    attrs: dict = field(default_factory=dict)
    texts: list[str] | None = None

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(term ids int32, weights float32) of row i."""
        s, e = self.matrix.indptr[i], self.matrix.indptr[i + 1]
        return self.matrix.indices[s:e], self.matrix.data[s:e]

    def terms(self, i: int, k: int | None = None) -> list[tuple[str, float]]:
        """The row's (term, weight) pairs by decreasing weight, at most k of them."""
        idx, w = self.row(i)
        order = np.argsort(-w, kind="stable")[:k]
        return [(self.vocab[idx[j]], float(w[j])) for j in order]

    @property
    def nnz_per_row(self) -> np.ndarray:
        return np.diff(self.matrix.indptr)


def to_csr(matrix, n_cols: int | None = None) -> sp.csr_matrix:
    """Canonical CSR: float32 weights, int32 indices, sorted, no explicit zeros."""
    m = sp.csr_matrix(matrix, dtype=np.float32)
    if n_cols is not None and m.shape[1] != n_cols:
        m = sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.shape[0], n_cols))
    m.eliminate_zeros()
    m.sort_indices()
    return m


def write_sparse(path: str | Path, ids: list[str], matrix, vocab: list[str], attrs: dict,
                 texts: list[str] | None = None) -> None:
    """Write a sparse collection atomically. matrix: anything scipy.sparse.csr_matrix accepts,
    shape [len(ids), len(vocab)], non-negative."""
    m = _checked_rows(ids, matrix, len(vocab))
    a = _file_attrs(attrs)
    check_ids(list(ids), path)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for k, v in a.items():
            f.attrs[k] = v
        f.create_dataset("ids", data=list(ids), dtype=STR)
        f.create_dataset("indptr", data=m.indptr.astype(np.int64))
        f.create_dataset("indices", data=m.indices.astype(np.int32))
        f.create_dataset("weights", data=m.data.astype(np.float32))
        f.create_dataset("vocab", data=list(vocab), dtype=STR)
        if texts is not None:
            f.create_dataset("texts", data=list(texts), dtype=STR)


def _checked_rows(ids, matrix, n_terms: int) -> sp.csr_matrix:
    """`matrix` as canonical CSR (to_csr), checked: [len(ids), n_terms], non-negative (ValueError)."""
    m = to_csr(matrix)
    if m.shape != (len(ids), n_terms):
        raise ValueError(f"matrix shape {m.shape} != ({len(ids)} ids, {n_terms} terms)")
    if m.nnz and m.data.min() < 0:
        raise ValueError("sparse weights must be non-negative")
    return m


def _file_attrs(attrs: dict) -> dict:
    """The attributes a sparse file is written with: `attrs`, the provenance stamp, format=sparse
    (ValueError when a REQUIRED_ATTRS key is missing)."""
    a = {**attrs, **stamp(), "format": "sparse"}
    missing = [k for k in REQUIRED_ATTRS if k not in a]
    if missing:
        raise ValueError(f"sparse attrs lack {missing}")
    return a


class SparseWriter:
    """Write a sparse file row batch by row batch, in O(batch) memory, atomically.

        with SparseWriter("out.h5", vocab, {"modality": "image", "head": ..., "query_mode": "doc"}) as w:
            w.append(ids, csr)          # any number of times: ids [B] str, csr [B, |V|] >= 0

    The file appears at `path` only when the block ends without an exception (a temporary sibling
    until then); ids must be unique over all batches (InputError naming the first repeat, raised
    when it is appended). Same layout and attributes as write_sparse; datasets are chunked and grow."""

    def __init__(self, path: str | Path, vocab: list[str], attrs: dict):
        self.path, self.vocab, self.attrs = Path(path), list(vocab), _file_attrs(attrs)
        self.rows = self.nnz = 0
        self._seen: set[str] = set()

    def __enter__(self) -> "SparseWriter":
        self._atomic = atomic_path(self.path)
        tmp = self._atomic.__enter__()
        try:
            self._f = h5py.File(tmp, "w")
            for k, v in self.attrs.items():
                self._f.attrs[k] = v
            for name, dtype in (("ids", STR), ("indices", np.int32), ("weights", np.float32)):
                self._f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(1 << 16,))
            self._f.create_dataset("indptr", data=np.zeros(1, np.int64), maxshape=(None,), chunks=(1 << 16,))
            self._f.create_dataset("vocab", data=self.vocab, dtype=STR)
        except BaseException:
            self._atomic.__exit__(*sys.exc_info())
            raise
        return self

    def append(self, ids: list[str], matrix) -> None:
        """Add rows: ids [B] (unique, non-empty), matrix [B, |V|] (anything scipy.sparse.csr_matrix
        accepts) of non-negative weights; explicit zeros are dropped and columns sorted."""
        m = _checked_rows(ids, matrix, len(self.vocab))
        for r, i in enumerate(ids, self.rows + 1):
            if not i or i in self._seen:
                raise InputError(f"{self.path}: id {i!r} of row {r} is {'empty' if not i else 'a repeat'}; ids must "
                                 "be unique and non-empty")
            self._seen.add(i)
        f, b = self._f, len(ids)
        for name, data in (("ids", list(ids)), ("indices", m.indices.astype(np.int32)),
                           ("weights", m.data.astype(np.float32)),
                           ("indptr", m.indptr[1:].astype(np.int64) + self.nnz)):
            ds = f[name]
            n = ds.shape[0]
            ds.resize((n + len(data),))
            ds[n:] = data
        self.rows, self.nnz = self.rows + b, self.nnz + m.nnz

    def __exit__(self, *exc) -> None:
        self._f.close()
        self._atomic.__exit__(*exc)


def read_sparse_attrs(path: str | Path) -> dict:
    with open_h5(path, "sparse") as f:
        return attrs_dict(f)


def read_sparse(path: str | Path) -> SparseCollection:
    """Load a sparse file. Raises InputError if missing, not sparse, or inconsistent."""
    with open_h5(path, "sparse") as f:
        a = attrs_dict(f)
        missing = [k for k in REQUIRED_ATTRS if k not in a]
        if missing:
            raise InputError(f"{path}: sparse file lacks attribute(s) {', '.join(missing)}; "
                             "write it with `mmsparse sparsify`")
        for k in ("ids", "indptr", "indices", "weights", "vocab"):
            if k not in f:
                raise InputError(f"{path}: sparse file lacks dataset {k!r}")
        ids = read_strings(f["ids"])
        vocab = read_strings(f["vocab"])
        indptr = f["indptr"][()].astype(np.int64)
        indices = f["indices"][()].astype(np.int32)
        weights = f["weights"][()].astype(np.float32)
        texts = read_strings(f["texts"]) if "texts" in f else None
    if len(indptr) != len(ids) + 1 or indptr[-1] != len(indices) or len(indices) != len(weights):
        raise InputError(f"{path}: CSR fields indptr/indices/weights are inconsistent with {len(ids)} ids")
    if len(indices) and (indices.min() < 0 or indices.max() >= len(vocab)):
        raise InputError(f"{path}: field 'indices' points outside the {len(vocab)}-term vocab")
    if len(weights) and not (np.isfinite(weights).all() and weights.min() >= 0):
        raise InputError(f"{path}: field 'weights' has NaN/Inf or negative values; re-run sparsify")
    if len(indptr) and (indptr[0] != 0 or (np.diff(indptr) < 0).any()):
        raise InputError(f"{path}: field 'indptr' is not non-decreasing from 0; the file is corrupt")
    check_ids(ids, path)
    m = sp.csr_matrix((weights, indices, indptr), shape=(len(ids), len(vocab)))
    return SparseCollection(ids, m, vocab, a, texts)
