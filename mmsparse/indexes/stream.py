"""Read a sparse HDF5 collection chunk by chunk, for index builds that must not hold the whole
CSR matrix twice (BMP, kANNolo), and write the index's forward.h5 copy the same way.

`SparseSource(path)` checks the file as `read_sparse` does (attributes, datasets, term ids in the
vocabulary, finite non-negative weights), one chunk at a time; `chunks()` yields
(first row, ids, CSR [rows, |V|] float32) in O(chunk) memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..formats._h5 import attrs_dict, open_h5, read_strings
from ..formats.sparse import REQUIRED_ATTRS, read_sparse
from .meta import source_attrs

FORWARD = "forward.h5"   # the indexed document vectors, beside every sparse engine's own files

CHUNK_ROWS = 65_536


class SparseSource:
    """A sparse HDF5 file (or sharded directory) opened for chunked reads.

    Attributes: path, attrs (dict), vocab (list[str]), num_docs, nnz. Raises InputError for a
    file that is missing, not sparse, or lacks a dataset or required attribute.
    """

    def __init__(self, path: str | Path, chunk_rows: int = CHUNK_ROWS):
        self.path, self.chunk_rows = Path(path), chunk_rows
        with open_h5(path, "sparse") as f:
            self.attrs = attrs_dict(f)
            missing = [k for k in REQUIRED_ATTRS if k not in self.attrs]
            if missing:
                raise InputError(f"{path}: sparse file lacks attribute(s) {', '.join(missing)}; "
                                 "write it with `mmsparse sparsify`")
            for k in ("ids", "indptr", "indices", "weights", "vocab"):
                if k not in f:
                    raise InputError(f"{path}: sparse file lacks dataset {k!r}")
            self.vocab = read_strings(f["vocab"])
            self.num_docs = int(f["ids"].shape[0])
            self.nnz = int(f["indices"].shape[0])
            if int(f["indptr"].shape[0]) != self.num_docs + 1 or int(f["weights"].shape[0]) != self.nnz:
                raise InputError(f"{path}: CSR fields indptr/indices/weights are inconsistent with "
                                 f"{self.num_docs} ids")

    def chunks(self) -> Iterator[tuple[int, list[str], sp.csr_matrix]]:
        """(first row, ids [B], CSR [B, |V|] float32) per chunk of at most chunk_rows rows."""
        v = len(self.vocab)
        with open_h5(self.path, "sparse") as f:
            for s in range(0, self.num_docs, self.chunk_rows):
                e = min(self.num_docs, s + self.chunk_rows)
                ptr = f["indptr"][s:e + 1].astype(np.int64)
                if (np.diff(ptr) < 0).any() or (s == 0 and ptr[0] != 0) or ptr[-1] > self.nnz:
                    raise InputError(f"{self.path}: field 'indptr' is not non-decreasing from 0; the file is corrupt")
                idx = f["indices"][ptr[0]:ptr[-1]].astype(np.int32)
                w = f["weights"][ptr[0]:ptr[-1]].astype(np.float32)
                if len(idx) and (idx.min() < 0 or idx.max() >= v):
                    raise InputError(f"{self.path}: field 'indices' points outside the {v}-term vocab")
                if len(w) and not (np.isfinite(w).all() and w.min() >= 0):
                    raise InputError(f"{self.path}: field 'weights' has NaN/Inf or negative values; re-run sparsify")
                yield s, read_strings(f["ids"][s:e]), sp.csr_matrix((w, idx, ptr - ptr[0]), shape=(e - s, v))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole collection as (term ids int32 [nnz], weights float32 [nnz], row offsets
        int64 [N+1]), filled chunk by chunk (no CSR matrix or second copy)."""
        comps = np.empty(self.nnz, dtype=np.int32)
        vals = np.empty(self.nnz, dtype=np.float32)
        offs = np.zeros(self.num_docs + 1, dtype=np.int64)
        for s, _, m in self.chunks():
            base = offs[s]
            comps[base:base + m.nnz], vals[base:base + m.nnz] = m.indices, m.data
            offs[s + 1:s + 1 + m.shape[0]] = base + m.indptr[1:]
        return comps, vals, offs


def write_forward(src: SparseSource, out: Path) -> None:
    """Copy `src` into `out` (an index's forward.h5: ids, CSR, vocab, plus a `source` attribute)
    chunk by chunk."""
    from ..formats.sparse import SparseWriter

    with SparseWriter(out, src.vocab, {**src.attrs, "source": str(src.path.resolve())}) as w:
        for _, ids, m in src.chunks():
            w.append(ids, m)


def stream_meta(kind: str, src: str | Path, source: SparseSource, engine: str, settings: dict, t0: float,
                **extra) -> dict:
    """The mmsparse.json fields of a sparse index built from `source` (kind, source file and its
    attributes, sizes, the engine's name, version and settings, build seconds since `t0`), plus
    `extra` (the engine's own keys)."""
    from importlib.metadata import version

    return {"kind": kind, "source": str(Path(src).resolve()), "source_attrs": source_attrs(source.attrs),
            "num_docs": source.num_docs, "vocab_size": len(source.vocab), "nnz": source.nnz,
            "docnos": f"<row index in {FORWARD}>", **extra,
            "settings": {"engine": engine, "engine_version": version(engine), **settings},
            "build_seconds": round(time.time() - t0, 3)}


class ForwardVectors:
    """Mixin of the sparse searchers: `forward`, the indexed document vectors of self.dir/forward.h5
    as CSR [N, |V|] float32, read on first use (two-stage re-scoring, exact fallbacks)."""

    _forward: sp.csr_matrix | None = None

    @property
    def forward(self) -> sp.csr_matrix:
        if self._forward is None:
            self._forward = read_sparse(self.dir / FORWARD).matrix
        return self._forward
