"""kANNolo (Delfino, Ermanno, Nardini, Rulli, Venturini, ECIR 2025; `pip install kannolo`, MIT
licence, the authors ask to be cited) index over a sparse HDF5 collection: graph search (HNSW)
over the sparse document vectors, inner product on their weights (kANNolo keeps them in 16 bits:
scores agree with float32 <q, d> to about 1e-3 relative, so near-ties may swap).

Two index types: `hnsw` (SparsePlainHNSW: approximate; m neighbours per node, built with beam
ef_construction, searched with beam ef_search) and `flat` (SparseFlatIndex: exhaustive, exact,
the check for the graph).

Layout of INDEX_DIR:
  mmsparse.json   metadata (meta.py)
  forward.h5      the document vectors as indexed (ids, CSR, vocab): maps rows to ids and serves
                  two-stage re-scoring
  kannolo.index   the kANNolo index (`save` output)
Names inside kANNolo: document row i is id i; vocabulary term j is component j.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from ..formats.sparse import to_csr
from .meta import read_meta, write_meta
from .pisa import read_ids_vocab
from .stream import FORWARD, ForwardVectors, SparseSource, stream_meta, write_forward

INDEX_FILE = "kannolo.index"
INDEX_TYPES = ("hnsw", "flat")


def _classes(index_type: str):
    import kannolo

    return {"hnsw": kannolo.SparsePlainHNSW, "flat": kannolo.SparseFlatIndex}[index_type]


def build_kannolo_index(src: str | Path, out_dir: str | Path, index_type: str = "hnsw", m: int = 32,
                        ef_construction: int = 200, ef_search: int = 128, threads: int = 1,
                        progress: Callable[[int], None] | None = None,
                        early_exit_threshold: float | None = None) -> dict:
    """Build a kANNolo index of sparse HDF5 `src` into `out_dir` atomically; returns the metadata.

    index_type: hnsw (graph, approximate) or flat (exhaustive, exact). m: graph neighbours per node;
    ef_construction: build beam width (nodes); ef_search: the query beam width `search` uses by
    default (nodes, recorded); early_exit_threshold: kANNolo's early termination of the graph search,
    recorded as the default of `search` (None: off); all four hnsw only. threads: build threads (kANNolo's
    rayon pool; set before kANNolo's first parallel call in this process, so later builds in the
    same process keep the first value). The collection is read chunk by chunk into kANNolo's three
    arrays (term ids, weights, row offsets). Raises InputError for an empty collection or options
    out of range.
    """
    if index_type not in INDEX_TYPES:
        raise InputError(f"--kannolo-index {index_type!r} unknown; choose one of {', '.join(INDEX_TYPES)}")
    if m < 2 or ef_construction < 1:
        raise InputError(f"--hnsw-m must be >= 2 and --ef-construction >= 1 (got {m}, {ef_construction})")
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    t0 = time.time()
    source = SparseSource(src)
    if source.num_docs == 0 or source.nnz == 0:
        raise InputError(f"{src}: no non-empty document to index")
    comps, vals, offs = source.arrays()
    if progress:
        progress(source.num_docs)
    cls = _classes(index_type)
    index = (cls.build_from_arrays(comps, vals, offs, m=m, ef_construction=ef_construction) if index_type == "hnsw"
             else cls.build_from_arrays(comps, vals, offs))
    del comps, vals, offs
    out_dir = Path(out_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        index.save(str(tmp / INDEX_FILE))
        write_forward(source, tmp / FORWARD)
        settings = {"index_type": index_type, "index_class": cls.__name__, "threads": threads}
        if index_type == "hnsw":
            settings.update(hnsw_m=m, ef_construction=ef_construction, ef_search=ef_search,
                            early_exit_threshold=early_exit_threshold)
        meta = stream_meta("kannolo", src, source, "kannolo", settings, t0, quantization=None,
                           term_tokens="<vocab index>")
        write_meta(tmp, meta)
    return meta


class KannoloSearcher(ForwardVectors):
    """Top-k inner-product search over a kANNolo index directory.

    ef_search: the graph's query beam width in nodes (hnsw; None or 0: the index's recorded
    default; at least k is used; larger is slower and closer to exact); early_exit_threshold:
    kANNolo's early termination of the graph search (None: the index's recorded default); threads: threads of the batch call (`search`); `search_one` is one
    thread.
    """

    kind = "kannolo"

    def __init__(self, index_dir: str | Path, threads: int = 1, ef_search: int | None = None,
                 early_exit_threshold: float | None = None):
        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "kannolo":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not kannolo")
        ef_search = ef_search or self.meta["settings"].get("ef_search", 128)
        if ef_search < 1:
            raise InputError(f"--ef-search must be >= 1, got {ef_search}")
        path = self.dir / INDEX_FILE
        if not path.is_file() or not (self.dir / FORWARD).is_file():
            raise InputError(f"{self.dir}: index is incomplete (no {INDEX_FILE} or {FORWARD}); rebuild it")
        self.ids, self.vocab = read_ids_vocab(self.dir / FORWARD)
        self.index_type = self.meta["settings"]["index_type"]
        self.index = _classes(self.index_type).load(str(path))
        self.threads, self.ef_search = threads, ef_search
        self.early_exit = (early_exit_threshold if early_exit_threshold is not None
                           else self.meta["settings"].get("early_exit_threshold"))

    def _beam(self, k: int) -> int:
        return max(self.ef_search, k)

    def search_one(self, indices: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of one query (term ids [n] int, weights [n] float32): (doc rows int64, scores
        float64 = <q, d>) by decreasing score; documents scoring 0 are left out."""
        keep = np.asarray(weights) > 0
        if not keep.any():
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        c = np.ascontiguousarray(np.asarray(indices)[keep], dtype=np.int32)
        v = np.ascontiguousarray(np.asarray(weights)[keep], dtype=np.float32)
        if self.index_type == "hnsw":
            dist, ids = self.index.search(c, v, k, ef_search=self._beam(k), early_exit_threshold=self.early_exit)
        else:
            dist, ids = self.index.search(c, v, k)
        ok = (ids >= 0) & (dist > 0)
        return ids[ok].astype(np.int64), dist[ok].astype(np.float64)

    def search(self, queries: sp.csr_matrix, k: int) -> list[list[tuple[int, float]]]:
        """Top-k of each query row (CSR [nq, |V|] float32 >= 0) by kANNolo's batch call on
        `threads` threads: nq lists of (doc row, score); empty rows get an empty list."""
        q = to_csr(queries)
        q.sort_indices()
        out: list[list[tuple[int, float]]] = [[] for _ in range(q.shape[0])]
        live = np.flatnonzero(np.diff(q.indptr) > 0)
        if not len(live):
            return out
        sub = q[live]
        args = (np.ascontiguousarray(sub.indices, dtype=np.int32), np.ascontiguousarray(sub.data, dtype=np.float32),
                sub.indptr.astype(np.int64), k)
        if self.index_type == "hnsw":
            dist, ids = self.index.batch_search(*args, ef_search=self._beam(k), early_exit_threshold=self.early_exit,
                                                num_threads=self.threads)
        else:
            dist, ids = self.index.batch_search(*args, num_threads=self.threads)
        dist, ids = dist.reshape(len(live), k), ids.reshape(len(live), k)
        for r, i in enumerate(live):
            ok = (ids[r] >= 0) & (dist[r] > 0)
            out[i] = list(zip(ids[r][ok].tolist(), dist[r][ok].astype(np.float64).tolist()))
        return out
