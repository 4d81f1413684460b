"""PISA inverted index over a sparse HDF5 collection, via pyterrier-pisa (no JVM needed).

Building goes through pyterrier-pisa's PisaIndex / PisaRetrieve; searching calls its C++
extension `_pisathon` (PISA itself) directly, loaded without the pyterrier_pisa package
(`pisa_native`), whose __init__ imports pyterrier, pandas and ir_datasets: 0.9 s that a one-query
`mmsparse query` would otherwise spend before PISA answers in a millisecond.

Layout of INDEX_DIR:
  mmsparse.json   metadata (meta.py) incl. quantisation scale and PISA settings
  forward.h5      the document vectors as indexed (sparse HDF5: ids, CSR float32, vocab);
                  it maps PISA docnos back to ids and serves exact re-scoring (two-stage)
  pisa/           the PISA index: fwd.documents/terms(+lex), inv.docs/freqs/sizes,
                  quantized.q0.bmw.<block>  (block-max WAND data),
                  quantized.q0.bmw.<block>.<encoding>  (compressed index)

Names inside PISA: document row i is docno "i"; vocabulary term j is token "t<j>", so word
pieces ('##ing'), punctuation and upper case survive PISA's lexicon untouched and the
index round-trips exactly (term j of forward.h5 vocab <-> "t<j>").

Scoring: PISA's `quantized` scorer returns sum over shared terms of q_int * d_int, with
  d_int = round(w_d * s_d),  s_d = (2^quant_bits - 1) / max_w_d   (one scale per index)
  q_int = round(w_q * s_q),  s_q = (2^query_bits - 1) / max_w_q   (one scale per query)
so score / (s_d * s_q) approximates the sparse inner product <q, d> (the learned sparse
retrieval score, e.g. SPLADE/D2S), up to rounding. Postings that round to 0 are dropped.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from ..formats._h5 import read_strings
from ..formats.sparse import read_sparse, to_csr, write_sparse
from ._quiet import quiet_fds
from .meta import read_meta, source_attrs, write_meta
from .stream import FORWARD, ForwardVectors

QUERY_ALGORITHMS = ("block_max_wand", "block_max_maxscore", "maxscore", "wand", "ranked_or",
                    "block_max_ranked_and", "ranked_and", "ranked_or_taat", "ranked_or_taat_lazy")
# PisaRetrieve only accepts the document-at-a-time names; the retrieval context it prepares does
# not depend on the algorithm, so it is made with this one and the algorithm given per call.
_CONTEXT_ALGORITHM = "block_max_wand"
ENCODINGS = ("block_simdbp", "block_optpfor", "block_varintg8iu", "block_streamvbyte",
             "block_maskedvbyte", "block_interpolative", "block_qmx", "block_varintgb",
             "block_simple8b", "block_simple16", "ef", "single", "pefuniform", "pefopt")
PISA_DIR = "pisa"


def term_token(j: int) -> str:
    """The PISA token of vocabulary term id j."""
    return f"t{j}"


def quantize_rows(m: sp.csr_matrix, scale: float | np.ndarray) -> sp.csr_matrix:
    """Round weights to integers: rint(w * scale), zeros dropped.

    m: CSR [N, |V|] float32 >= 0; scale: a float, or [N] floats (one per row).
    Returns CSR [N, |V|] float32 holding integers.
    """
    m = to_csr(m)
    s = np.asarray(scale, dtype=np.float64)
    if s.ndim:
        s = np.repeat(s, np.diff(m.indptr))
    q = sp.csr_matrix((np.rint(m.data * s).astype(np.float32), m.indices.copy(), m.indptr.copy()),
                      shape=m.shape)
    q.eliminate_zeros()
    return q


def row_scales(m: sp.csr_matrix, bits: int) -> np.ndarray:
    """Per-row scale (2^bits - 1) / max weight; 0 for empty rows. [N] float64."""
    mx = np.zeros(m.shape[0])
    nz = np.diff(m.indptr) > 0
    if nz.any():
        mx[nz] = np.maximum.reduceat(m.data, m.indptr[:-1][nz])
    with np.errstate(divide="ignore"):
        return np.where(mx > 0, (2 ** bits - 1) / np.where(mx > 0, mx, 1), 0.0)


def pisa_native():
    """pyterrier-pisa's C++ extension module `_pisathon` (RetrievalContext, prepare_index,
    retrieve, ...), loaded from the installed package's folder without running the package's
    __init__ (module docstring). Registered in sys.modules under its own name, so a later
    `import pyterrier_pisa` reuses it: an extension module is initialised once per process.
    InputError when pyterrier-pisa is not installed."""
    import importlib.machinery
    import importlib.util

    name = "pyterrier_pisa._pisathon"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("pyterrier_pisa")   # finds the package; does not import it
    if spec is None or not spec.submodule_search_locations:
        raise InputError("PISA indexes need pyterrier-pisa; install it (pip install pyterrier-pisa)")
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_pisathon{suffix}"
            if path.is_file():
                ext = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(ext)   # runs the extension's init
                sys.modules[name] = module
                ext.loader.exec_module(module)
                return module
    from pyterrier_pisa import _pisathon   # another layout: through the package after all

    return _pisathon


def write_pisa_collection(pdir: Path, qm: sp.csr_matrix) -> None:
    """Write PISA's uncompressed binary collection for integer weights `qm` into `pdir`.

    qm: CSR [N, |V|] float32 holding integers >= 1 (quantize_rows output). Writes exactly what
    pyterrier-pisa's toks_indexer writes (fwd.documents, fwd.terms sorted as strings,
    inv.docs = [1, N] + per term [df, doc ids...], inv.freqs = per term [df, weights...],
    inv.sizes = [N, sum of weights per doc], fwd.doclex/termlex, pt_meta.json), but with
    numpy in O(nnz) instead of a Python loop per posting (minutes at 1M documents).
    """
    import json

    _pisathon = pisa_native()
    pdir.mkdir(parents=True, exist_ok=True)
    n = qm.shape[0]
    csc = qm.tocsc()
    csc.sort_indices()
    df = np.diff(csc.indptr)
    active = np.flatnonzero(df)
    toks = [term_token(int(j)) for j in active]
    order = sorted(range(len(active)), key=toks.__getitem__)  # PISA's lexicon is sorted by string
    terms = active[order]
    lens = df[terms]
    # source positions of every posting, term by term in lexicon order
    starts = np.repeat(csc.indptr[terms] - np.cumsum(np.concatenate(([0], lens[:-1]))), lens)
    src = starts + np.arange(int(lens.sum()))
    # destination layout: [len, postings...] per term; headers at cumulative offsets
    head = np.cumsum(np.concatenate(([0], lens[:-1] + 1)))
    body = np.ones(len(src) + len(lens), dtype=bool)
    body[head] = False
    docs = np.empty(len(body), dtype=np.uint32)
    freqs = np.empty(len(body), dtype=np.uint32)
    docs[head] = lens
    freqs[head] = lens
    docs[body] = csc.indices[src]
    freqs[body] = csc.data[src].astype(np.uint32)
    (pdir / "inv.docs").write_bytes(np.array([1, n], dtype=np.uint32).tobytes() + docs.tobytes())
    (pdir / "inv.freqs").write_bytes(freqs.tobytes())
    sizes = np.asarray(qm.sum(axis=1)).ravel().astype(np.uint32)
    (pdir / "inv.sizes").write_bytes(np.concatenate(([n], sizes)).astype(np.uint32).tobytes())
    (pdir / "fwd.documents").write_text("".join(f"{i}\n" for i in range(n)), encoding="utf-8")
    (pdir / "fwd.terms").write_text("".join(f"{toks[i]}\n" for i in order), encoding="utf-8")
    _pisathon.build_binlex(str(pdir / "fwd.documents"), str(pdir / "fwd.doclex"))
    _pisathon.build_binlex(str(pdir / "fwd.terms"), str(pdir / "fwd.termlex"))
    (pdir / "pt_meta.json").write_text(json.dumps({"type": "sparse_index", "format": "pisa",
                                                   "package_hint": "pyterrier-pisa", "stemmer": "none"}))


def _setup_logging() -> None:
    # pyterrier-pisa reports through ir_datasets' logger; keep it to warnings.
    logging.getLogger("ir_datasets").setLevel(logging.WARNING)


def build_pisa_index(src: str | Path, out_dir: str | Path, quant_bits: int = 8, threads: int = 1,
                     index_encoding: str = "block_simdbp", block_size: int = 64,
                     query_algorithm: str = "block_max_wand", batch_size: int = 100_000,
                     progress: Callable[[int], None] | None = None) -> dict:
    """Build a PISA index of sparse HDF5 `src` into `out_dir` (atomically). Returns the metadata.

    quant_bits: document weights are scaled so the largest maps to 2^bits - 1 (1..16).
    threads: PISA indexing threads. index_encoding: PISA posting codec (`-e/--encoding` in
    PISA's tools). block_size: fixed block size of the block-max WAND data.
    query_algorithm: default recorded for `search` (PISA `-a/--algorithm`).
    progress: called with the number of documents fed so far (every 1000).
    Raises InputError for a non-sparse, empty or all-zero collection or bad options.
    """
    if not 1 <= quant_bits <= 16:
        raise InputError(f"--quant-bits must be in 1..16, got {quant_bits}")
    if index_encoding not in ENCODINGS:
        raise InputError(f"--index-encoding {index_encoding!r} unknown; choose one of {', '.join(ENCODINGS)}")
    if query_algorithm not in QUERY_ALGORITHMS:
        raise InputError(f"--query-algorithm {query_algorithm!r} unknown; choose one of {', '.join(QUERY_ALGORITHMS)}")
    t0 = time.time()
    col = read_sparse(src)
    m = col.matrix
    if m.shape[0] == 0:
        raise InputError(f"{src}: field 'ids' is empty; nothing to index")
    if m.nnz == 0 or m.data.max() <= 0:
        raise InputError(f"{src}: field 'weights' has no positive weight; every document is empty")
    max_w = float(m.data.max())
    scale = (2 ** quant_bits - 1) / max_w
    qm = quantize_rows(m, scale)
    if progress:
        progress(0)

    _setup_logging()
    from pyterrier_pisa import PisaIndex, PisaRetrieve

    out_dir = Path(out_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        pdir = tmp / PISA_DIR
        write_pisa_collection(pdir, qm)
        if progress:
            progress(qm.shape[0])
        index = PisaIndex(str(pdir), stemmer="none", stops="none", index_encoding=index_encoding,
                          threads=threads, batch_size=batch_size)
        with quiet_fds():
            # Building the retriever once writes the block-max data and compressed index now,
            # so `search` never writes into the index directory.
            PisaRetrieve(index, "quantized", threads=threads, stops="none", toks_scale=1.0,
                         query_algorithm=_CONTEXT_ALGORITHM, block_size=block_size)
            num_docs, num_terms = index.num_docs(), index.num_terms()
        write_sparse(tmp / FORWARD, col.ids, m, col.vocab, {**col.attrs, "source": str(Path(src).resolve())},
                     texts=col.texts)
        meta = {
            "kind": "pisa",
            "source": str(Path(src).resolve()),
            "source_attrs": source_attrs(col.attrs),
            "num_docs": int(num_docs),
            "num_terms": int(num_terms),
            "vocab_size": len(col.vocab),
            "nnz": int(m.nnz),
            "postings": int(qm.nnz),
            "dropped_postings": int(m.nnz - qm.nnz),
            "quantization": {"bits": quant_bits, "scale": scale, "max_weight": max_w,
                             "rounding": "rint(w * scale)", "query_bits_default": 8,
                             "score": "pisa_score / (scale * query_scale) ~ <q, d>"},
            "term_tokens": "t<vocab index>",
            "docnos": "<row index in forward.h5>",
            "settings": {"engine": "pyterrier-pisa", "engine_version": _version(), "scorer": "quantized",
                         "index_encoding": index_encoding, "block_size": block_size,
                         "query_algorithm": query_algorithm, "threads": threads, "stemmer": "none",
                         "stops": "none"},
            "build_seconds": round(time.time() - t0, 3),
        }
        write_meta(tmp, meta)
    return meta


def _version() -> str:
    from importlib.metadata import version

    return version("pyterrier-pisa")


def read_ids_vocab(path: Path) -> tuple[list[str], list[str]]:
    """ids and vocab of a sparse HDF5 file without loading its CSR."""
    with h5py.File(path, "r") as f:
        return read_strings(f["ids"]), read_strings(f["vocab"])


class PisaSearcher(ForwardVectors):
    """Top-k search of sparse queries over a PISA index built by `build_pisa_index`.

    threads: PISA query threads. query_algorithm: PISA algorithm (None: the index's default).
    query_bits: each query is scaled so its largest weight maps to 2^bits - 1 (1..16).
    """

    kind = "pisa"

    def __init__(self, index_dir: str | Path, threads: int = 1, query_algorithm: str | None = None,
                 query_bits: int = 8):
        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "pisa":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not pisa")
        st = self.meta["settings"]
        self.query_algorithm = query_algorithm or st["query_algorithm"]
        if self.query_algorithm not in QUERY_ALGORITHMS:
            raise InputError(f"--query-algorithm {self.query_algorithm!r} unknown; "
                             f"choose one of {', '.join(QUERY_ALGORITHMS)}")
        if not 1 <= query_bits <= 16:
            raise InputError(f"--query-bits must be in 1..16, got {query_bits}")
        self.query_bits = query_bits
        self.threads = threads
        fwd = self.dir / FORWARD
        if not fwd.is_file() or not (self.dir / PISA_DIR).is_dir():
            raise InputError(f"{self.dir}: index is incomplete (no {FORWARD} or {PISA_DIR}/); rebuild it")
        self.ids, self.vocab = read_ids_vocab(fwd)
        self.scale = float(self.meta["quantization"]["scale"])
        self._tokens = np.array([term_token(j) for j in range(len(self.vocab))], dtype=object)
        self._pisa = pisa_native()
        self._context = None

    def _ctxt(self):
        """PISA's retrieval context over the index (what PisaRetrieve prepares: the quantized scorer,
        no stemmer, no stopwords, the index's block size), made on first use; k is per call."""
        if self._context is None:
            st = self.meta["settings"]
            ctx = self._pisa.RetrievalContext()
            with quiet_fds():
                self._pisa.prepare_index(ctx, str(self.dir / PISA_DIR), st["index_encoding"], "quantized", "",
                                         quantize=0, stop_fname="", block_size=st["block_size"])
            self._context = ctx
        return self._context

    def _run(self, items: list, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """PISA over items [(query index, {token: integer weight})]: (qidx, doc row, int score).

        Calls PISA's extension as PisaRetrieve.transform does, minus the DataFrame round trips
        (they cost more than a small query itself) and the pyterrier import.
        """
        n = len(items) * k
        qidx, docnos = np.empty(n, dtype=np.int32), np.empty(n, dtype=object)
        ranks, scores = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.float32)
        size = self._pisa.retrieve(self._ctxt(), self.query_algorithm, items, k=k, threads=self.threads,
                                   query_weighted=1, pretokenised=True, result_qidxs=qidx,
                                   result_docnos=docnos, result_ranks=ranks, result_scores=scores)
        docs = np.fromiter(map(int, docnos[:size]), dtype=np.int64, count=size)
        return qidx[:size], docs, scores[:size].astype(np.float64)

    def _query_toks(self, indices: np.ndarray, weights: np.ndarray) -> tuple[dict, float]:
        """One query as PISA tokens with integer weights, and its scale s_q (0: empty query)."""
        if len(weights) == 0 or weights.max() <= 0:
            return {}, 0.0
        sq = (2 ** self.query_bits - 1) / float(weights.max())
        w = np.rint(weights * sq)
        keep = w > 0
        return dict(zip(self._tokens[indices[keep]], w[keep].tolist())), sq

    def search_one(self, indices: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of one query given as term ids [n] int and weights [n] float32 > 0.

        Returns (doc rows int64 [<=k], scores float64 ~ <q, d>) by decreasing score; the
        lowest-overhead path, used for per-query latency measurements.
        """
        toks, sq = self._query_toks(np.asarray(indices), np.asarray(weights, dtype=np.float32))
        if not toks:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        _, docs, scores = self._run([(0, toks)], k)
        return docs, scores / (self.scale * sq)

    def search(self, queries: sp.csr_matrix, k: int) -> list[list[tuple[int, float]]]:
        """Top-k documents of each query row.

        queries: CSR [nq, |V|] float32 >= 0 over the index vocab. Returns nq lists of
        (document row, score) by decreasing score, score ~ <q, d> (see module docstring).
        Empty rows get an empty list.
        """
        q = to_csr(queries)
        scales = row_scales(q, self.query_bits)
        qq = quantize_rows(q, scales)
        items = []
        for i in range(qq.shape[0]):
            s, e = qq.indptr[i], qq.indptr[i + 1]
            if e > s:
                items.append((i, dict(zip(self._tokens[qq.indices[s:e]], qq.data[s:e].tolist()))))
        out: list[list[tuple[int, float]]] = [[] for _ in range(qq.shape[0])]
        if not items:
            return out
        qids, docs, scores = self._run(items, k)
        scores = scores / (self.scale * scales[qids])
        # results come grouped by query; split them without a per-result Python loop
        order = np.argsort(qids, kind="stable")
        qids, docs, scores = qids[order], docs[order], scores[order]
        cuts = np.searchsorted(qids, np.arange(qq.shape[0] + 1))
        for i in np.flatnonzero(np.diff(cuts)):
            s, e = cuts[i], cuts[i + 1]
            out[i] = list(zip(docs[s:e].tolist(), scores[s:e].tolist()))
        return out
