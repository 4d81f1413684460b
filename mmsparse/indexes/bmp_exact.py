"""What mmsparse adds around BMP's search so that alpha = beta = 1 is exact on BMP's integer weights
(the k-th score of brute-force integer scoring), and so that no query can make BMP panic.

BMP's `b_search` (src/search.rs of pisa-engine/BMP, the released bmp 0.2.8 included) computes each
block's upper bound ub = sum over the query's terms of (query weight x the term's largest weight in
the block), saturating at 65,535, and a starting threshold thr0 = max over the query's terms of
(the term's 10th / 100th / 1,000th largest weight, by k) x its query weight; it visits the blocks
with ub > thr0 by decreasing ub (ties: increasing block id) and scores a block only when it takes
the next one. So:

* the last block of that order is never scored (unless the search stopped earlier): the
  *completion* scores it here when alpha x its ub >= the heap's threshold (the k-th score, or
  thr0 while fewer than k documents were found), which BMP's own stopping rule would have scored;
* with no block above thr0, BMP's first `next().unwrap()` panics: such queries are recognised
  from the same block bounds (exactly BMP's condition, nothing wider) and not handed to BMP;
* documents scoring exactly thr0 never enter BMP's heap (`score > threshold`): when fewer than k
  documents come back, the *fill* adds the top postings of the term that set thr0 (each scores
  >= thr0, so the k-th score is reached). A panicking query is answered by the fill alone.

Both steps score a handful of rows on the integer forward vectors kept beside the index (never
the whole collection) and run inside `BmpSearcher.search_one`, so their time is BMP's latency.

Files (INDEX_DIR/bmp.exact/, .npy, memory-mapped at search time):
  internal       int32 [|V|]        vocabulary term -> BMP's term id (-1: no postings)
  fwd_ptr        int64 [N+1]        integer forward vectors: row offsets
  fwd_terms      uint16 [nnz]       BMP term ids
  fwd_w          uint8 [nnz]        integer document weights rint(w x scale) (zeros dropped)
  bm_ptr         int64 [T+1]        per BMP term: its blocks
  bm_blocks      int32 [pairs]      block ids (document row // block size), increasing
  bm_max         uint8 [pairs]      the term's largest integer weight in that block
  top_ptr        int64 [T+1]        per BMP term: rows of its largest postings (at most 1,000)
  top_rows       int32 [tops]       by decreasing weight, then increasing row
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import InputError

EXACT_DIR = "bmp.exact"
TOP_ROWS = 1000          # BMP keeps the 10th, 100th and 1,000th largest weight of each term
U16_MAX = 65535
ARRAYS = ("internal", "fwd_ptr", "fwd_terms", "fwd_w", "bm_ptr", "bm_blocks", "bm_max", "top_ptr", "top_rows")


def int_weights(data: np.ndarray, scale: float) -> np.ndarray:
    """Integer document weights as BMP stores them: rint(w x scale) of float32 `data` (the same
    expression at build and search time, so both round alike)."""
    return np.rint(data * scale)


def kth_column(k: int) -> int:
    """Which of BMP's per-term k-th weights (10th, 100th, 1,000th; 3: none, thr0 = 0) k uses."""
    return int(k > 10) + int(k > 100) + int(k > 1000)


def term_blocks(docs: np.ndarray, ws: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(block ids int32, largest weight uint8 per block) of one term's postings (doc rows
    increasing [n] int, integer weights [n])."""
    b = docs // block_size
    if len(b) and (np.diff(b) < 0).any():
        o = np.argsort(b, kind="stable")
        b, ws = b[o], ws[o]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]]) if len(b) else np.zeros(0, np.int64)
    return b[starts].astype(np.int32), (np.maximum.reduceat(ws, starts) if len(b) else ws[:0]).astype(np.uint8)


def term_top_rows(docs: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """Rows of one term's TOP_ROWS largest postings, by decreasing weight then increasing row."""
    if len(ws) > TOP_ROWS:
        part = np.argpartition(-ws, TOP_ROWS - 1)[:TOP_ROWS]
        docs, ws = docs[part], ws[part]
    return docs[np.lexsort((docs, -ws))].astype(np.int32)


def save_arrays(out: Path, arrays: dict) -> None:
    """Write `arrays` (the names of ARRAYS) as INDEX_DIR/bmp.exact/NAME.npy."""
    d = Path(out) / EXACT_DIR
    d.mkdir()
    for name in ARRAYS:
        np.save(d / f"{name}.npy", arrays[name])


class Completion:
    """The arrays of INDEX_DIR/bmp.exact (memory-mapped) and the steps of the module docstring.

    kth: BMP's per-vocabulary-term (10th, 100th, 1,000th) largest integer weight, [|V|, 3] int64.
    Raises InputError when the directory is missing (an index built before it existed)."""

    def __init__(self, index_dir: Path, block_size: int, kth: np.ndarray):
        d = Path(index_dir) / EXACT_DIR
        if not all((d / f"{n}.npy").is_file() for n in ARRAYS):
            raise InputError(f"{index_dir}: BMP index lacks {EXACT_DIR}/ (built by an older mmsparse); rebuild it "
                             "with `mmsparse index --engine bmp`")
        for n in ARRAYS:
            setattr(self, n, np.load(d / f"{n}.npy", mmap_mode="r"))
        self.internal = np.asarray(self.internal)
        self.block_size, self.kth = block_size, kth
        self.num_blocks = -(-(len(self.fwd_ptr) - 1) // block_size)

    @staticmethod
    def keep_beta(idx: np.ndarray, q: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """BMP's beta: the ceil(n x beta) (f32) largest query weights, ties by increasing term id
        (BMP breaks them in hash order; done here, BMP then gets beta = 1, so the kept terms are
        known)."""
        n_keep = math.ceil(np.float32(len(q)) * np.float32(beta))
        if n_keep >= len(q):
            return idx, q
        o = np.sort(np.lexsort((idx, -q))[:n_keep])
        return idx[o], q[o]

    def threshold(self, idx: np.ndarray, q: np.ndarray, k: int) -> tuple[int, int]:
        """(thr0, the vocabulary term that sets it, -1 when thr0 = 0) of query terms idx / integer
        weights q (BMP's `threshold`)."""
        col = kth_column(k)
        if col == 3:
            return 0, -1
        t = self.kth[idx, col] * q
        j = int(np.argmax(t))
        return int(t[j]), (int(idx[j]) if t[j] > 0 else -1)

    def bounds(self, idx: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Every block's upper bound (BMP's compute_upper_bounds: u16, saturating) [num_blocks] int64."""
        ti = self.internal[idx]
        parts = [(self.bm_ptr[t], self.bm_ptr[t + 1]) for t in ti.tolist()]
        blocks = np.concatenate([self.bm_blocks[a:b] for a, b in parts])
        vals = np.concatenate([self.bm_max[a:b].astype(np.int64) * int(w) for (a, b), w in zip(parts, q.tolist())])
        return np.minimum(np.bincount(blocks, weights=vals, minlength=self.num_blocks).astype(np.int64), U16_MAX)

    def score_rows(self, rows: np.ndarray, idx: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Integer scores <q, d> of document rows [r] (query terms idx, integer weights q) [r] int64."""
        qv = np.zeros(len(self.bm_ptr) - 1, dtype=np.int64)
        qv[self.internal[idx]] = q
        a, b = self.fwd_ptr[rows], self.fwd_ptr[rows + 1]
        lens = (b - a).astype(np.int64)
        if not lens.sum():
            return np.zeros(len(rows), dtype=np.int64)
        pos = np.repeat(a - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(int(lens.sum()))
        contrib = qv[self.fwd_terms[pos]] * self.fwd_w[pos]
        return np.bincount(np.repeat(np.arange(len(rows)), lens), weights=contrib, minlength=len(rows)).astype(np.int64)

    def last_block(self, ub: np.ndarray, thr0: int) -> int:
        """The block BMP visits last: the smallest ub above thr0, the largest id among ties; -1: none
        (BMP would panic)."""
        cand = np.flatnonzero(ub > thr0)
        if not len(cand):
            return -1
        low = ub[cand].min()
        return int(cand[ub[cand] == low][-1])

    def complete(self, rows: np.ndarray, scores: np.ndarray, idx: np.ndarray, q: np.ndarray, k: int,
                 alpha: float, thr0: int, term: int, last: int, ub_last: int) -> tuple[np.ndarray, np.ndarray, int]:
        """BMP's answer (rows, integer scores, by decreasing score) completed: the last block scored
        when alpha x its bound >= the heap threshold, then the fill (module docstring). Returns
        (rows int64, integer scores int64, by decreasing score then increasing row; at most k) and
        which steps ran (bit 1: the last block, bit 2: the fill)."""
        got = dict(zip(rows.tolist(), scores.tolist()))
        steps = 0
        heap = int(scores[k - 1]) if len(scores) >= k else thr0
        if last >= 0 and np.float32(ub_last) * np.float32(alpha) >= heap:
            steps |= 1
            r = np.arange(last * self.block_size, min((last + 1) * self.block_size, len(self.fwd_ptr) - 1))
            for d, s in zip(r.tolist(), self.score_rows(r, idx, q).tolist()):
                if s > thr0:
                    got[d] = s
        if len(got) < k and term >= 0:
            steps |= 2
            t = int(self.internal[term])
            r = np.asarray(self.top_rows[self.top_ptr[t]:self.top_ptr[t + 1]], dtype=np.int64)
            r = r[:[10, 100, 1000][kth_column(k)]]
            for d, s in zip(r.tolist(), self.score_rows(r, idx, q).tolist()):
                got.setdefault(d, s)
        out_r = np.fromiter(got.keys(), dtype=np.int64, count=len(got))
        out_s = np.fromiter(got.values(), dtype=np.int64, count=len(got))
        o = np.lexsort((out_r, -out_s))[:k]
        return out_r[o], out_s[o], steps
