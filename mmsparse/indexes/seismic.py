"""Seismic (pyseismic-lsr) index over a sparse HDF5 collection: a second sparse backend.

Seismic (Bruch et al., SIGIR 2024) keeps each term's n_postings largest postings, clusters
them into blocks with summary vectors, and at query time skips blocks whose summary score
is too low against the current k-th score (tuned by heap_factor): approximate, usually near-exact, top-k of
the inner product <q, d> on the float weights (no integer quantisation).

Layout of INDEX_DIR:
  mmsparse.json          metadata (meta.py)
  forward.h5             the document vectors (ids, CSR, vocab), as for PISA
  seismic.index.seismic  SeismicIndex.save("seismic") output
Names inside Seismic: document row i is id "i"; vocab term j is component j (queried as "j").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from ..formats.sparse import read_sparse, to_csr, write_sparse
from ._quiet import quiet_fds
from .meta import read_meta, source_attrs, write_meta
from .pisa import read_ids_vocab
from .stream import FORWARD, ForwardVectors

STEM = "seismic"
U16_LIMIT = 65536  # SeismicIndex stores components as u16; larger vocabularies need the LV variant


VARIANTS = ("f16", "dotvbyte")


def _index_class(vocab_size: int, variant: str = "f16"):
    """The pyseismic-lsr index class: f16 values with u16 (or, for |V| >= 65536, u32) components,
    or the DotVByte-compressed forward index (u16 components only)."""
    import seismic

    if variant == "dotvbyte":
        if vocab_size >= U16_LIMIT:
            raise InputError(f"Seismic variant dotvbyte needs a vocabulary < {U16_LIMIT} terms, got {vocab_size}")
        return seismic.SeismicIndexDotVByte
    if variant != "f16":
        raise InputError(f"Seismic variant {variant!r} unknown; choose one of {', '.join(VARIANTS)}")
    return seismic.SeismicIndex if vocab_size < U16_LIMIT else seismic.SeismicIndexLV


def build_seismic_index(src: str | Path, out_dir: str | Path, n_postings: int = 4000,
                        centroid_fraction: float = 0.1, summary_energy: float = 0.4, threads: int = 1,
                        progress: Callable[[int], None] | None = None, max_fraction: float = 1.5,
                        min_cluster_size: int = 2, doc_cut: int = 15, knn: int = 0,
                        variant: str = "f16", postings_share: float | None = None, n_knn: int = 0) -> dict:
    """Build a Seismic index of sparse HDF5 `src` into `out_dir` atomically; returns the metadata.

    The parameters are pyseismic-lsr's `build_from_dataset` arguments (Seismic's
    docs/Guidelines.md): n_postings: postings kept per term on average (global threshold);
    max_fraction: no list longer than max_fraction x n_postings; centroid_fraction: blocks per
    list / n_postings; min_cluster_size: smallest block; summary_energy: L1 mass kept in block
    summaries; doc_cut: terms per document used by the approximate k-means; knn: neighbours per
    document of the k-NN graph built with the index (0 = none; searched with `n_knn`, Bruch et al.
    2024's graph refinement; much slower to build); variant: f16 (values stored as float16) or
    dotvbyte (compressed forward index, no k-NN graph). postings_share: n_postings as a share of
    the documents (replaces n_postings; Seismic's authors keep ~0.14 % a list at 8.8M passages);
    n_knn: graph neighbours `search` scores by default (recorded; needs knn). Raises InputError for
    an empty collection, a bad variant or n_knn without a graph.
    """
    import seismic

    t0 = time.time()
    col = read_sparse(src)
    m = col.matrix
    if m.shape[0] == 0 or m.nnz == 0:
        raise InputError(f"{src}: no non-empty document to index")
    if postings_share is not None:
        n_postings = max(1, round(postings_share * m.shape[0]))
    if n_knn and not knn:
        raise InputError(f"--seismic-n-knn {n_knn} searches a k-NN graph; build one with --seismic-knn N")
    cls = _index_class(len(col.vocab), variant)
    if knn and variant == "dotvbyte":
        raise InputError("Seismic variant dotvbyte cannot hold a k-NN graph; use variant f16 with knn")
    dataset_cls = seismic.SeismicDataset if len(col.vocab) < U16_LIMIT else seismic.SeismicDatasetLV
    ds = dataset_cls(dim=len(col.vocab))
    ds.add_documents_by_id([str(i) for i in range(m.shape[0])], m.indices.astype(np.int64),
                           m.data.astype(np.float32), m.indptr.astype(np.int64))
    if progress:
        progress(m.shape[0])
    with quiet_fds():  # Seismic prints its configuration and timings to stdout
        index = cls.build_from_dataset(
            ds, n_postings=n_postings, centroid_fraction=centroid_fraction, summary_energy=summary_energy,
            max_fraction=max_fraction, min_cluster_size=min_cluster_size, doc_cut=doc_cut, nknn=knn,
            num_threads=threads)
    with atomic_path(out_dir, directory=True) as tmp:
        with quiet_fds():
            index.save(str(tmp / STEM))
        write_sparse(tmp / FORWARD, col.ids, m, col.vocab, {**col.attrs, "source": str(Path(src).resolve())},
                     texts=col.texts)
        meta = {
            "kind": "seismic",
            "source": str(Path(src).resolve()),
            "source_attrs": source_attrs(col.attrs),
            "num_docs": int(m.shape[0]),
            "indexed_docs": int(index.len),
            "vocab_size": len(col.vocab),
            "nnz": int(m.nnz),
            "quantization": None,
            "term_tokens": "<vocab index as a string>",
            "docnos": "<row index in forward.h5>",
            "settings": {"engine": "pyseismic-lsr", "engine_version": _version(),
                         "index_class": type(index).__name__, "n_postings": n_postings,
                         "centroid_fraction": centroid_fraction, "summary_energy": summary_energy,
                         "max_fraction": max_fraction, "min_cluster_size": min_cluster_size, "doc_cut": doc_cut,
                         "knn": knn, "n_knn": n_knn, "postings_share": postings_share, "variant": variant,
                         "threads": threads},
            "build_seconds": round(time.time() - t0, 3),
        }
        write_meta(tmp, meta)
    return meta


def _version() -> str:
    from importlib.metadata import version

    return version("pyseismic-lsr")


class SeismicSearcher(ForwardVectors):
    """Approximate top-k inner-product search over a Seismic index directory.

    query_cut: query terms (largest first) whose posting lists are scanned; heap_factor:
    a block is skipped once k results are held and its summary's dot product with the query is
    below heap_factor x the k-th best score so far (Seismic's posting_list.rs), so lower values
    skip fewer blocks (slower, closer to exact) and values above 1 skip more (faster); n_knn: neighbours of each result
    taken from the index's k-NN graph and scored too (0 = off; needs an index built with knn; None:
    the index's recorded default);
    sorted: visit the first list's blocks by decreasing summary score (pyseismic's default).
    """

    kind = "seismic"

    def __init__(self, index_dir: str | Path, threads: int = 1, query_cut: int = 10, heap_factor: float = 0.7,
                 n_knn: int | None = None, sorted: bool = True):
        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "seismic":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not seismic")
        path = self.dir / f"{STEM}.index.seismic"
        if not path.is_file() or not (self.dir / FORWARD).is_file():
            raise InputError(f"{self.dir}: index is incomplete (no {path.name} or {FORWARD}); rebuild it")
        self.ids, self.vocab = read_ids_vocab(self.dir / FORWARD)
        with quiet_fds():
            self.index = _index_class(len(self.vocab), self.meta["settings"].get("variant", "f16")).load(str(path))
        self.threads, self.query_cut, self.heap_factor = threads, query_cut, heap_factor
        if n_knn is None:   # the index's recorded default (index --seismic-n-knn)
            n_knn = int(self.meta["settings"].get("n_knn", 0))
        if n_knn and not self.index.knn_len:
            raise InputError(f"{self.dir}: n_knn={n_knn} needs a k-NN graph; rebuild the index with knn > 0")
        self.n_knn, self.sorted = n_knn, sorted
        self._str = None

    def search(self, queries: sp.csr_matrix, k: int) -> list[list[tuple[int, float]]]:
        """Top-k of each query row (CSR [nq, |V|] float32). Returns nq lists of (doc row, score)."""
        from seismic import get_seismic_string

        q = to_csr(queries)
        st = get_seismic_string()
        out: list[list[tuple[int, float]]] = [[] for _ in range(q.shape[0])]
        live = [i for i in range(q.shape[0]) if q.indptr[i + 1] > q.indptr[i]]
        if not live:
            return out
        comps = [np.array([str(t) for t in q.indices[q.indptr[i]:q.indptr[i + 1]]], dtype=st) for i in live]
        vals = [q.data[q.indptr[i]:q.indptr[i + 1]].astype(np.float32) for i in live]
        with quiet_fds():
            res = self.index.batch_search(np.array([str(i) for i in live], dtype=st), comps, vals, k=k,
                                          query_cut=self.query_cut, heap_factor=self.heap_factor,
                                          n_knn=self.n_knn, sorted=self.sorted, num_threads=self.threads)
        for hits in res:  # results may come back in any order: map them by query id
            if hits:
                out[int(hits[0][0])] = [(int(doc), float(score)) for _, score, doc in hits]
        return out

    def search_one(self, indices: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of one query (term ids [n] int, weights [n] float32): (doc rows int64, scores).

        Seismic's single-query call without the batch machinery; used for per-query latency.
        """
        if len(indices) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        if self._str is None:
            from seismic import get_seismic_string

            self._str = get_seismic_string()
        comps = np.array([str(t) for t in indices], dtype=self._str)
        hits = self.index.search("0", comps, np.asarray(weights, dtype=np.float32), k=k,
                                 query_cut=self.query_cut, heap_factor=self.heap_factor, n_knn=self.n_knn,
                                 sorted=self.sorted)
        docs = np.fromiter((int(d) for _, _, d in hits), dtype=np.int64, count=len(hits))
        return docs, np.fromiter((s for _, s, _ in hits), dtype=np.float64, count=len(hits))
