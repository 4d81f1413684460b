"""BMP (block-max pruning, Mallia, Suel and Tonellotto, SIGIR 2024; `pip install bmp`) index over
a sparse HDF5 collection.

BMP splits the documents into fixed blocks of `block_size` consecutive rows, keeps per term the
largest weight of each block, and at query time scores whole blocks (through a block-wise forward
index) in decreasing order of their upper bound, stopping once the k-th score beats alpha x the
next block's bound; beta keeps only that fraction of the query's terms (largest weights first).
alpha = beta = 1 is exact on the integer weights.

Integer weights (BMP's own types, src/index and src/search.rs): document weights are u8, query
weights integers 1..32 (MAX_TERM_WEIGHT; mmsparse hands BMP rint(w x 32 / max w), dropping terms
that round to 0, where BMP's own ceil would lift every small weight to 1), scores are summed
in u16 *without* overflow checks. So a document weight w is stored as rint(w x s), with
s = min((2^bits - 1) / max w, the largest s keeping every document's integer L1 norm <= 65535 / 33):
the second bound keeps every possible score below 2^16 (a score is at most 33 x the document's
integer L1 norm); the metadata records which bound set s. Scores come back as BMP's integer /
(s x 32 / max query w), an approximation of <q, d>.

Layout of INDEX_DIR:
  mmsparse.json   metadata (meta.py): quantisation, settings
  forward.h5      the document vectors as indexed (ids, CSR float32, vocab): maps rows to ids,
                  serves two-stage re-scoring
  bmp.index       the BMP index (InvertedIndexer.finish output)
  bmp.terms.npz   per vocabulary term: indexed (bool), largest integer weight, the 10th / 100th /
                  1,000th largest (BMP's own threshold estimates)
  bmp.exact/      integer forward vectors, per-term block maxima and top rows (bmp_exact.py)

Names inside BMP: document row i is "i"; vocabulary term j is token "j" (only terms with postings
are given to BMP, under consecutive internal ids: BMP stores term ids as u16).

What BMP's own search gets wrong, and mmsparse completes (bmp_exact.py, read from src/search.rs of
the released bmp 0.2.8): it never scores the last block of its visiting order, it panics when no
block's bound exceeds its starting threshold, and documents scoring exactly that threshold never
enter its heap. search_one computes the query's block bounds, hands BMP only queries it cannot
panic on, scores the last block and fills the top k from the threshold term's largest postings
when needed: exact at alpha = beta = 1 on the integer weights, judged by the k-th score.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from ..formats.sparse import to_csr
from ._quiet import quiet_fds
from .bmp_exact import Completion, int_weights, save_arrays, term_blocks, term_top_rows
from .meta import read_meta, write_meta
from .pisa import read_ids_vocab
from .stream import FORWARD, ForwardVectors, SparseSource, stream_meta, write_forward

INDEX_FILE, TERMS_FILE = "bmp.index", "bmp.terms.npz"
MAX_QUERY_WEIGHT = 32      # BMP's MAX_TERM_WEIGHT (src/query/mod.rs)
QUERY_WEIGHT_BOUND = 33    # ceil(max w x 32 / max w) may round up to 33 in f32
U16_MAX, U16_TERMS = 65535, 65536


def _scale(max_w: float, max_l1: float, max_terms: int, bits: int) -> tuple[float, str]:
    """(document scale, the bound that set it): 'bits' or 'u16-score' (see the module docstring)."""
    by_bits = (2 ** bits - 1) / max_w
    # a document's integer L1 norm is at most s x L1 + 0.5 x its terms (rounding), and at most
    # 2 x s x L1 (rint(x) <= 2x for x >= 0.5, and weights below 0.5 round to 0)
    room = U16_MAX / QUERY_WEIGHT_BOUND
    by_u16 = max((room - 0.5 * max_terms) / max_l1, room / (2 * max_l1))
    return (by_bits, "bits") if by_bits <= by_u16 else (by_u16, "u16-score")


def build_bmp_index(src: str | Path, out_dir: str | Path, quant_bits: int = 8, block_size: int = 32,
                    compress_range: bool = False, progress: Callable[[int], None] | None = None) -> dict:
    """Build a BMP index of sparse HDF5 `src` into `out_dir` atomically, reading `src` in chunks;
    returns the metadata.

    quant_bits: document weights become integers 1..2^bits - 1 (1..8; BMP stores u8), unless the
    u16 score bound needs a smaller scale (module docstring). block_size: documents per block
    (1..256; BMP's block-local ids are u8; the paper uses 8-64). compress_range: store the per-block
    maxima sparsely (smaller index when most blocks lack a term; slower to search).
    progress: called with the documents added so far. Raises InputError for an empty collection,
    a vocabulary of more than 65,536 terms, or options out of range.
    """
    import bmp

    if not 1 <= quant_bits <= 8:
        raise InputError(f"--bmp-bits must be in 1..8 (BMP stores document weights as u8), got {quant_bits}")
    if not 1 <= block_size <= 256:
        raise InputError(f"--bmp-block-size must be in 1..256 documents (BMP's in-block ids are u8), got {block_size}")
    t0 = time.time()
    source = SparseSource(src)
    if source.num_docs == 0:
        raise InputError(f"{src}: field 'ids' is empty; nothing to index")
    # pass 1: the scale's inputs and each term's document frequency
    max_w = max_l1 = 0.0
    max_terms, df = 0, np.zeros(len(source.vocab), dtype=np.int64)
    for _, _, m in source.chunks():
        if m.nnz:
            max_w = max(max_w, float(m.data.max()))
            max_l1 = max(max_l1, float(np.asarray(m.sum(axis=1)).max()))
            max_terms = max(max_terms, int(np.diff(m.indptr).max()))
            df += np.bincount(m.indices, minlength=len(df))
    if max_w <= 0:
        raise InputError(f"{src}: field 'weights' has no positive weight; every document is empty")
    if int((df > 0).sum()) > U16_TERMS:
        raise InputError(f"{src}: {int((df > 0).sum())} terms have postings; BMP holds at most {U16_TERMS} "
                         "(u16 term ids): use PISA or Seismic")
    scale, bound = _scale(max_w, max_l1, max_terms, quant_bits)
    # pass 2: integer documents (BMP's forward index) and their postings, term by term
    internal = np.full(len(df), -1, dtype=np.int64)
    internal[df > 0] = np.arange(int((df > 0).sum()))
    postings = [[] for _ in range(len(df))]   # per term: chunks of (doc rows, integer weights)
    out_dir = Path(out_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        ix = bmp.InvertedIndexer(str(tmp / INDEX_FILE), block_size, compress_range)
        kept = dropped = 0
        tmax = np.zeros(len(df), dtype=np.int64)
        fwd_ptr, fwd_terms, fwd_w = [np.zeros(1, np.int64)], [], []   # the integer forward vectors (bmp_exact)
        for s, _, m in source.chunks():
            q = sp.csr_matrix((int_weights(m.data, scale), m.indices, m.indptr), shape=m.shape)
            dropped += int((q.data == 0).sum())
            q.eliminate_zeros()
            kept += q.nnz
            if q.nnz and np.asarray(q.sum(axis=1)).max() * QUERY_WEIGHT_BOUND > U16_MAX:   # _scale's bound
                raise InputError(f"{src}: a document's integer weights sum past BMP's 16-bit scores; lower --bmp-bits")
            fwd_ptr.append(fwd_ptr[-1][-1] + q.indptr[1:].astype(np.int64))
            fwd_terms.append(internal[q.indices].astype(np.uint16))
            fwd_w.append(q.data.astype(np.uint8))
            terms, w = internal[q.indices].tolist(), q.data.astype(np.int64).tolist()
            for i in range(q.shape[0]):
                a, b = q.indptr[i], q.indptr[i + 1]
                ix.add_document(str(s + i), list(zip(terms[a:b], w[a:b])))
            c = q.tocsc()
            for j in np.flatnonzero(np.diff(c.indptr)):
                a, b = c.indptr[j], c.indptr[j + 1]
                postings[j].append((c.indices[a:b] + s, c.data[a:b].astype(np.uint8)))   # 5 bytes a posting
                tmax[j] = max(tmax[j], int(c.data[a:b].max()))
            if progress:
                progress(s + q.shape[0])
        if kept == 0:
            raise InputError(f"{src}: every weight rounds to 0 at the scale BMP's 16-bit scores allow ({scale:.3g}): "
                             "its documents hold too many terms for BMP; use PISA or Seismic")
        kth = np.zeros((len(df), 3), dtype=np.int64)
        bm_blocks, bm_max, tops = [], [], []
        for j in np.flatnonzero(df > 0):   # in internal id order: BMP numbers terms as they are added
            # (a term whose weights all round to 0 keeps its internal id, with no postings)
            docs = np.concatenate([d for d, _ in postings[j]] or [np.zeros(0, np.int32)]).astype(np.int64)
            ws = np.concatenate([w for _, w in postings[j]] or [np.zeros(0, np.uint8)]).astype(np.int64)
            postings[j] = None
            top = -np.sort(-ws)
            kth[j] = [top[r] if len(top) > r else 0 for r in (9, 99, 999)]
            b, mx = term_blocks(docs, ws, block_size)
            bm_blocks.append(b)
            bm_max.append(mx)
            tops.append(term_top_rows(docs, ws))
            ix.add_term(str(j), list(zip(docs.tolist(), ws.tolist())))
        with quiet_fds():   # BMP draws a progress bar on stderr
            ix.finish()
        np.savez(tmp / TERMS_FILE, indexed=tmax > 0, max=tmax, kth=kth)

        def ptr(parts):
            return np.r_[0, np.cumsum([len(x) for x in parts])].astype(np.int64)
        save_arrays(tmp, {"internal": internal.astype(np.int32), "fwd_ptr": np.concatenate(fwd_ptr),
                          "fwd_terms": np.concatenate(fwd_terms), "fwd_w": np.concatenate(fwd_w),
                          "bm_ptr": ptr(bm_blocks), "bm_blocks": np.concatenate(bm_blocks),
                          "bm_max": np.concatenate(bm_max), "top_ptr": ptr(tops), "top_rows": np.concatenate(tops)})
        write_forward(source, tmp / FORWARD)
        meta = stream_meta(
            "bmp", src, source, "bmp", {"block_size": block_size, "compress_range": compress_range,
                                        "quant_bits": quant_bits}, t0,
            indexed_terms=int((df > 0).sum()), postings=kept, dropped_postings=dropped,
            quantization={"bits": quant_bits, "scale": scale, "bound": bound, "max_weight": max_w,
                          "max_doc_l1": max_l1, "rounding": "rint(w * scale)",
                          "query": f"rint(w * {MAX_QUERY_WEIGHT} / max w), zeros dropped",
                          "score": f"bmp_score / (scale * {MAX_QUERY_WEIGHT} / max query w) ~ <q, d>"},
            term_tokens="<vocab index as a string>")
        write_meta(tmp, meta)
    return meta


class BmpSearcher(ForwardVectors):
    """Top-k search over a BMP index directory (one query at a time: BMP's Python call holds the GIL).

    alpha: a block is scored while its upper bound x alpha exceeds the k-th score so far (1 = exact
    on the integer weights; < 1 stops earlier, faster, may return fewer than k); beta: the fraction
    of each query's terms kept, largest weights first (1 = all). threads is accepted for the common
    interface and ignored.
    """

    kind = "bmp"

    def __init__(self, index_dir: str | Path, threads: int = 1, alpha: float = 1.0, beta: float = 1.0):
        import bmp

        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "bmp":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not bmp")
        if not 0 < alpha <= 1:
            raise InputError(f"--bmp-alpha must be in (0, 1], got {alpha}")
        if not 0 < beta <= 1:
            raise InputError(f"--bmp-beta must be in (0, 1], got {beta}")
        paths = [self.dir / x for x in (INDEX_FILE, TERMS_FILE, FORWARD)]
        if not all(p.is_file() for p in paths):
            raise InputError(f"{self.dir}: index is incomplete (no {', '.join(p.name for p in paths)}); rebuild it")
        self.ids, self.vocab = read_ids_vocab(self.dir / FORWARD)
        with quiet_fds():
            self.index = bmp.Searcher(str(paths[0]))
        t = np.load(paths[1])
        self._indexed, self._max, self._kth = t["indexed"], t["max"], t["kth"]
        self._tokens = [str(j) for j in range(len(self.vocab))]
        self.scale = float(self.meta["quantization"]["scale"])
        self.threads, self.alpha, self.beta = threads, alpha, beta
        self.exact = Completion(self.dir, int(self.meta["settings"]["block_size"]), self._kth)
        self.fallbacks = self.completions = 0

    def search_one(self, indices: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of one query (term ids [n] int, weights [n] float32): (doc rows int64, scores
        float64 ~ <q, d>) by decreasing score, ties by increasing row; terms without postings are
        ignored. At alpha = beta = 1 the k-th score is brute-force integer scoring's (bmp_exact.py:
        the block bounds, BMP's call, the last block and the fill, all timed as one call).
        Counters: `fallbacks`, queries BMP would panic on (answered by the fill, BMP not called);
        `completions`, queries whose answer the last block or the fill changed or could have."""
        indices, weights = np.asarray(indices), np.asarray(weights, dtype=np.float32)
        keep = (weights > 0) & self._indexed[indices]
        idx, w = indices[keep], weights[keep]
        if len(idx) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        top = float(w.max())
        # integer query weights rint(w x 32 / max w) handed over as they are: the largest is 32, so
        # BMP's own ceil(w x 32 / max) keeps them (its ceil would lift every small weight to 1/32 of
        # the largest, inflating scores of long expanded queries); terms rounding to 0 are dropped
        q = np.rint(w * (MAX_QUERY_WEIGHT / top)).astype(np.int64)
        idx, q = self.exact.keep_beta(idx[q > 0], q[q > 0], self.beta)
        thr0, term = self.exact.threshold(idx, q, k)
        ub = self.exact.bounds(idx, q)
        last = self.exact.last_block(ub, thr0)
        if last < 0:   # no block above thr0: BMP's search would panic (src/search.rs unwrap)
            self.fallbacks += 1
            rows, scores = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        else:
            docs, sc = self.index.search(dict(zip([self._tokens[j] for j in idx.tolist()],
                                                  q.astype(np.float32).tolist())), k, self.alpha, 1.0)
            rows = np.fromiter(map(int, docs), dtype=np.int64, count=len(docs))
            scores = np.asarray(sc, dtype=np.float64).astype(np.int64)
        rows, scores, steps = self.exact.complete(rows, scores, idx, q, k, self.alpha, thr0, term, last,
                                                  int(ub[last]) if last >= 0 else 0)
        self.completions += bool(steps)
        return rows, scores / (self.scale * MAX_QUERY_WEIGHT / top)

    def search(self, queries: sp.csr_matrix, k: int) -> list[list[tuple[int, float]]]:
        """Top-k of each query row (CSR [nq, |V|] float32 >= 0): nq lists of (doc row, score);
        empty rows get an empty list."""
        q = to_csr(queries)
        out = []
        for i in range(q.shape[0]):
            a, b = q.indptr[i], q.indptr[i + 1]
            docs, scores = self.search_one(q.indices[a:b], q.data[a:b], k)
            out.append(list(zip(docs.tolist(), scores.tolist())))
        return out
