"""Okapi BM25 over sparse term-frequency collections (BM25-V, paper eq. 1, 2, 9), query-side
helpers of image-to-image search, and the dense rerank of the two-stage pipeline (§3.5).

`index --weighting bm25`: the document weights are replaced by their BM25 term weights before
the engine indexes them, so a query is a sparse inner product with binary query terms:

    w(i, d) = IDF_i · f_i(d) (k1 + 1) / (f_i(d) + k1 (1 - b + b |d| / avgdl))
    IDF_i   = ln(1 + (N - df_i + 0.5) / (df_i + 0.5))           (eq. 2 / eq. 9)
    BM25(d, Q) = Σ_{i: q_i > 0} w(i, d) = <1[q > 0], w(·, d)>   (eq. 1)

with f_i(d) the collection's weight (BM25-V: the dequantised sum-pooled activation), |d| the
row's L1 norm, avgdl its mean, df_i the number of rows with f_i > 0, N the rows indexed. The
index's mmsparse.json gets a `weighting` block (scheme, k1, b, N, avgdl) and `source` stays the
term-frequency file; OUT/bm25.npz holds idf [|V|] and df [|V|]. `search` binarises the queries
of such an index (query_matrix).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..formats.sparse import to_csr

K1, B = 1.5, 0.75
WEIGHTINGS = ("none", "bm25")


def bm25_idf(df: np.ndarray, n: int) -> np.ndarray:
    """IDF_i = ln(1 + (N - df_i + 0.5) / (df_i + 0.5)) (eq. 2), float64 [|V|]; > 0 for every df <= N."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n - df + 0.5) / (df + 0.5))


def bm25_weights(tf: sp.csr_matrix, k1: float = K1, b: float = B) -> tuple[sp.csr_matrix, dict]:
    """BM25 term weights of a term-frequency collection.

    tf: CSR [N, |V|] float32 >= 0. Returns (CSR [N, |V|] float32 of w(i, d), same sparsity;
    info {k1, b, N, avgdl, idf [|V|] float64, df [|V|] int64}). Raises InputError for negative
    k1 or b outside [0, 1].
    """
    if k1 < 0 or not 0 <= b <= 1:
        raise InputError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={k1}, b={b})")
    m = to_csr(tf)
    n = m.shape[0]
    df = np.bincount(m.indices, minlength=m.shape[1]).astype(np.int64)
    idf = bm25_idf(df, n)
    dl = np.asarray(m.sum(axis=1)).ravel().astype(np.float64)
    avgdl = float(dl.mean()) if n and dl.mean() > 0 else 1.0
    rows = np.repeat(np.arange(n), np.diff(m.indptr))
    f = m.data.astype(np.float64)
    w = idf[m.indices] * f * (k1 + 1) / (f + k1 * (1 - b + b * dl[rows] / avgdl))
    out = sp.csr_matrix((w.astype(np.float32), m.indices.copy(), m.indptr.copy()), shape=m.shape)
    return out, {"k1": k1, "b": b, "N": n, "avgdl": avgdl, "idf": idf, "df": df}


def bm25_scores(queries: sp.csr_matrix, weights: sp.csr_matrix) -> np.ndarray:
    """Exact BM25 of every query against every document: binary queries [nq, |V|] times the
    BM25 weights [N, |V|] -> [nq, N] float64 (eq. 1)."""
    q = binary(queries).astype(np.float64)
    return np.asarray((q @ weights.astype(np.float64).T).todense())


def binary(q: sp.csr_matrix) -> sp.csr_matrix:
    """1 where q > 0 (query presence, Table 1), CSR float32."""
    q = to_csr(q)
    return sp.csr_matrix((np.ones_like(q.data), q.indices.copy(), q.indptr.copy()), shape=q.shape)


@contextlib.contextmanager
def bm25_source(src: str | Path, k1: float = K1, b: float = B) -> Iterator[tuple[Path, dict]]:
    """Yield (temporary sparse HDF5 holding the BM25 weights of `src`, info); removed afterwards.
    The temporary file keeps src's ids, vocab and attributes (plus `weighting`)."""
    import tempfile

    from ..formats.sparse import read_sparse, write_sparse

    col = read_sparse(src)
    w, info = bm25_weights(col.matrix, k1, b)
    with tempfile.TemporaryDirectory(prefix=".bm25-", dir=Path(src).resolve().parent) as d:
        tmp = Path(d) / "bm25.h5"
        write_sparse(tmp, col.ids, w, col.vocab, {**col.attrs, "weighting": "bm25"}, texts=col.texts)
        yield tmp, info


def annotate_index(index_dir: str | Path, src: str | Path, info: dict) -> dict:
    """Record the BM25 weighting in INDEX_DIR/mmsparse.json (source = the term-frequency file
    `src`, weighting block) and write INDEX_DIR/bm25.npz (idf, df). Returns the new metadata."""
    from ..atomic import atomic_path, write_text_atomic
    from ..formats.sparse import read_sparse_attrs
    from .meta import META_NAME, source_attrs

    d = Path(index_dir)
    meta = json.loads((d / META_NAME).read_text(encoding="utf-8"))
    meta["source"] = str(Path(src).resolve())
    meta["source_attrs"] = source_attrs(read_sparse_attrs(src))
    meta["weighting"] = {"scheme": "bm25", "k1": info["k1"], "b": info["b"], "N": info["N"],
                         "avgdl": info["avgdl"], "active_terms": int((info["df"] > 0).sum()),
                         "idf": "ln(1 + (N - df + 0.5) / (df + 0.5)); arrays in bm25.npz",
                         "doc_length": "L1 norm of the row", "query": "binary: 1 where the query weight > 0"}
    with atomic_path(d / "bm25.npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, idf=info["idf"], df=info["df"])
    write_text_atomic(d / META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def query_matrix(meta: dict, q: sp.csr_matrix) -> sp.csr_matrix:
    """The query matrix to search an index with: binary for a BM25-weighted index, else q."""
    if (meta.get("weighting") or {}).get("scheme") == "bm25":
        return binary(q)
    return q


# -- image-to-image search: self exclusion and dense rerank ---------------------------------

def first_stage_k(k: int, rerank_k: int | None, exclude_self: bool) -> int:
    """Results to fetch from the index: the rerank pool (or k), +1 for the query's own image."""
    return (rerank_k or k) + (1 if exclude_self else 0)


class DenseReranker:
    """Cosine similarity of dense vectors looked up by id in one or more dense HDF5 files
    (documents and queries; a later file wins for a repeated id). Vectors are L2-normalised on
    load, so <q, d> is the cosine; memory O(rows * D)."""

    def __init__(self, files: Iterable[str | Path]):
        from ..formats.dense import read_dense

        self.files = [str(f) for f in files]
        self.pos: dict[str, int] = {}
        parts = []
        for f in self.files:
            dc = read_dense(f)
            base = sum(len(p) for p in parts)
            parts.append(dc.vectors)
            self.pos.update({i: base + j for j, i in enumerate(dc.ids)})
        if not parts:
            raise InputError("--rerank-dense: give at least one dense HDF5 file")
        v = np.concatenate(parts).astype(np.float32)
        self.vectors = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)

    def _rows(self, ids: list[str], what: str) -> np.ndarray:
        miss = [i for i in ids if i not in self.pos]
        if miss:
            raise InputError(f"{', '.join(self.files)}: field 'ids' lacks {len(miss)} {what} id(s) "
                             f"(e.g. {miss[0]!r}); --rerank-dense must hold the dense vectors of the "
                             "queries and of every indexed document")
        return np.fromiter((self.pos[i] for i in ids), dtype=np.int64, count=len(ids))

    def rerank(self, qid: str, cands: list[tuple[str, float]], k: int) -> list[tuple[str, float]]:
        """Candidates (doc id, first-stage score) re-ordered by cosine, top k: [(doc id, cosine)],
        ties by first-stage order."""
        if not cands:
            return []
        q = self.vectors[self._rows([qid], "query")[0]]
        docs = [d for d, _ in cands]
        s = self.vectors[self._rows(docs, "document")] @ q
        order = np.lexsort((np.arange(len(docs)), -s))[:k]
        return [(docs[j], float(s[j])) for j in order]


def postprocess(ranked: Iterable[tuple[str, list[tuple[str, float]]]], k: int, exclude_self: bool = False,
                reranker: DenseReranker | None = None, rerank_k: int | None = None
                ) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Per query: drop the query's own id (exclude_self), then with a reranker rerank the first
    rerank_k candidates by dense cosine; cut to k. Streams (qid, [(doc id, score)])."""
    for qid, res in ranked:
        if exclude_self:
            res = [(d, s) for d, s in res if d != qid]
        if reranker is not None:
            res = reranker.rerank(qid, res[:rerank_k], k)
        yield qid, res[:k]
