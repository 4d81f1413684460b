"""PyTerrier transformers over mmsparse: learned-sparse and dense query encoders, and retrievers
over mmsparse index directories, so mmsparse pipelines run inside `pt.Experiment`.

    import pyterrier as pt
    from ir_measures import RR, R
    from mmsparse.pyterrier import DenseQueryEncoder, SparseQueryEncoder, qrels_frame, retriever, topics_frame

    sparse = SparseQueryEncoder("index/d2s") >> retriever("index/d2s", num_results=100)   # PISA
    dense = DenseQueryEncoder("index/dense") >> retriever("index/dense", num_results=100)  # Faiss
    pt.Experiment([dense, sparse], topics_frame("dense/test-captions.h5"), qrels_frame("dense/test.qrels"),
                  eval_metrics=[R@1, R@10, RR@10], names=["dense", "d2s"], baseline=0,
                  correction="bonferroni")

No model: an inference-free head's queries are its term-weight table, so
`InferenceFreeQueryEncoder("index/inference-free") >> retriever("index/inference-free")` loads no
torch, transformers or backbone (SparseQueryEncoder on such an index does the same).

Columns. SparseQueryEncoder: `query` (text) -> `query_toks`, a dict {vocabulary term: weight > 0},
the learned-sparse query format pyterrier-pisa's PisaRetrieve reads (weights are floats; the
retriever quantises them). DenseQueryEncoder: `query` -> `query_vec` (np.ndarray [d] float32).
Retrievers return qid, query, docno (the image id), score, rank: the results `mmsparse search`
writes for the same queries and index.

Encoding is mmsparse.api.querying.QueryEncoder's (the backbone exactly as encode-dense runs it,
then mmsparse.sparsify with the head), so `SparseQueryEncoder(idx) >> retriever(idx)` ranks as
`encode-dense` + `sparsify` + `search` do: same vectors, same sparse rows, same PISA call.

PISA through pyterrier-pisa: `PisaRetriever` maps the terms to the index's PISA tokens ("t<j>"
for vocabulary term j, mmsparse/indexes/pisa.py), scales each query so its largest weight is
2^query_bits - 1 and rounds (as `mmsparse search`), runs pyterrier_pisa.PisaRetrieve with the
quantized scorer on INDEX/pisa, and maps PISA's docnos (rows of forward.h5) back to image ids
with scores divided by both scales (~ <q, d>). Other engines (Faiss, Seismic, Milvus) go through
`IndexRetriever`, a small transformer over mmsparse.indexes.open_index.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt

from .api.querying import TABLE_METHOD, QueryEncoder, TableQueryEncoder, index_route, resolve_origin
from .errors import InputError


def _check_query_frame(inp: pd.DataFrame, column: str = "query") -> None:
    missing = [c for c in ("qid", column) if c not in inp.columns]
    if missing:
        raise InputError(f"PyTerrier frame lacks column(s) {', '.join(missing)} (has {', '.join(map(str, inp.columns))})")


class SparseQueryEncoder(pt.Transformer):
    """`query` (text) -> `query_toks` {term: weight}: the index's (or `head`'s) learned-sparse
    query, encoded by QueryEncoder.for_index. source: an index directory (its provenance gives
    head, backbone and model; `head`, `backbone`, `model` override). query_mode, device, force:
    QueryEncoder. batch_size: texts per forward pass (64 = encode-dense's, identical vectors).
    All queries of a frame are encoded in one call; a blank query gets {} (no results). The
    index of an inference-free head gets its term-weight table (no model; QueryEncoder.for_index)."""

    def __init__(self, source: str | Path, *, head=None, backbone: str | None = None, model=None,
                 query_mode: str | None = None, device: str = "cpu", force: bool = False, batch_size: int = 64):
        super().__init__()
        self.source, self.batch_size = str(source), batch_size
        self.encoder = QueryEncoder.for_index(source, head=head, backbone=backbone, model=model,
                                              query_mode=query_mode, device=device, force=force)
        if self.encoder.vocab is None:
            raise InputError(f"{source}: a dense index; use DenseQueryEncoder (or pass head=HEAD_DIR)")

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        _check_query_frame(inp)
        out = inp.copy()
        texts = [str(q) for q in out["query"]]
        live = [i for i, t in enumerate(texts) if t.strip()]
        toks: list[dict] = [{} for _ in texts]
        if live:
            enc = self.encoder.encode([texts[i] for i in live], batch_size=self.batch_size)
            m, vocab = enc.matrix, self.encoder.vocab
            for r, i in enumerate(live):
                s, e = m.indptr[r], m.indptr[r + 1]
                toks[i] = {vocab[c]: float(w) for c, w in zip(m.indices[s:e].tolist(), m.data[s:e].tolist())}
        out["query_toks"] = toks
        return out

    def __repr__(self) -> str:
        return f"SparseQueryEncoder({self.source!r})"


class InferenceFreeQueryEncoder(SparseQueryEncoder):
    """`query` (text) -> `query_toks` {term: weight} with the term-weight table of an inference-free
    head, and no model (api.querying.TableQueryEncoder: the tokenizer and the table only): each
    text's terms at max(0, w_t), the rows `sparsify` writes for the same texts. source: an index
    directory (its provenance names the head) or the head itself (a directory or hub id). A blank
    query gets {} (no results). InputError when the head is of another method."""

    def __init__(self, source: str | Path):
        pt.Transformer.__init__(self)
        from .indexes.meta import META_NAME
        from .methods.headdir import head_method

        self.source, self.batch_size = str(source), 64
        if (Path(source) / META_NAME).is_file():
            o = resolve_origin(source)
            head, method = o.head, o.method
        else:
            head, method = source, head_method(source)
        if method != TABLE_METHOD:
            raise InputError(f"{source}: a {method or 'dense'} index or head; InferenceFreeQueryEncoder needs an "
                             "inference-free head (use SparseQueryEncoder, which loads the backbone)")
        self.encoder = TableQueryEncoder(head)

    def __repr__(self) -> str:
        return f"InferenceFreeQueryEncoder({self.source!r})"


class DenseQueryEncoder(pt.Transformer):
    """`query` (text) -> `query_vec` (np.ndarray [d] float32): the backbone vector of the text,
    as encode-dense computes it. source: an index directory (dense or sparse: its documents'
    backbone and model), overridden by `backbone` / `model`."""

    def __init__(self, source: str | Path, *, backbone: str | None = None, model=None, device: str = "cpu",
                 batch_size: int = 64):
        super().__init__()
        self.source, self.batch_size = str(source), batch_size
        self.encoder = QueryEncoder.for_index(source, backbone=backbone, model=model, sparse=False, device=device)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        _check_query_frame(inp)
        out = inp.copy()
        texts = [str(q) for q in out["query"]]
        if any(not t.strip() for t in texts):
            raise InputError("a blank query; a dense encoder needs text")
        vec = self.encoder.encode(texts, batch_size=self.batch_size).vectors if texts else np.zeros((0, 1))
        out["query_vec"] = list(vec.astype(np.float32))
        return out

    def __repr__(self) -> str:
        return f"DenseQueryEncoder({self.source!r})"


def _results_frame(inp: pd.DataFrame, hits: list[list[tuple[str, float]]], drop=()) -> pd.DataFrame:
    """qid, (other input columns but `drop`), docno, score, rank from per-row (id, score) lists."""
    keep = [c for c in inp.columns if c not in drop and c not in ("docno", "score", "rank")]
    rows, docnos, scores, ranks = [], [], [], []
    for i, h in enumerate(hits):
        for r, (d, s) in enumerate(h):
            rows.append(i)
            docnos.append(str(d))
            scores.append(float(s))
            ranks.append(r)
    out = inp.iloc[rows][keep].reset_index(drop=True) if rows else pd.DataFrame(columns=keep)
    out["docno"] = pd.Series(docnos, dtype=object)
    out["score"] = pd.Series(scores, dtype=np.float64)
    out["rank"] = pd.Series(ranks, dtype=np.int64)
    return out


class PisaRetriever(pt.Transformer):
    """`query_toks` {vocabulary term: weight} -> the top `num_results` documents of an mmsparse
    PISA index directory through pyterrier-pisa (module docstring). query_bits: query
    quantisation (mmsparse search's --query-bits); threads: PISA threads. Terms outside the
    index vocabulary raise InputError (queries from another head). Queries of a BM25-weighted
    index count as binary terms, as in `mmsparse search`."""

    def __init__(self, index_dir: str | Path, num_results: int = 1000, *, query_bits: int = 8, threads: int = 1):
        super().__init__()
        from pyterrier_pisa import PisaIndex, PisaQueryAlgorithm, PisaRetrieve

        from .indexes.meta import read_meta
        from .indexes.pisa import FORWARD, PISA_DIR, read_ids_vocab, term_token

        self.index_dir, self.num_results, self.query_bits = Path(index_dir), int(num_results), int(query_bits)
        self.meta = read_meta(index_dir)
        if self.meta["kind"] != "pisa":
            raise InputError(f"{index_dir}: a {self.meta['kind']} index; PisaRetriever reads PISA indexes "
                             "(use retriever(INDEX) for any kind)")
        if not 1 <= self.query_bits <= 16:
            raise InputError(f"query_bits {query_bits}: must be in 1..16")
        self.ids, vocab = read_ids_vocab(self.index_dir / FORWARD)
        self.token = {t: term_token(j) for j, t in enumerate(vocab)}
        self.scale = float(self.meta["quantization"]["scale"])
        self.bm25 = (self.meta.get("weighting") or {}).get("scheme") == "bm25"
        st = self.meta["settings"]
        algos = {a.value for a in PisaQueryAlgorithm}
        index = PisaIndex(str(self.index_dir / PISA_DIR), stemmer="none", stops="none",
                          index_encoding=st["index_encoding"], threads=threads)
        self.pisa = PisaRetrieve(index, "quantized", num_results=self.num_results, threads=threads, stops="none",
                                 toks_scale=1.0, block_size=st["block_size"],
                                 query_algorithm=st["query_algorithm"] if st["query_algorithm"] in algos
                                 else "block_max_wand")

    def _pisa_toks(self, toks: dict) -> tuple[dict, float]:
        """{PISA token: integer weight} of one query and its scale s_q (0 for an empty query)."""
        if not isinstance(toks, dict):
            raise InputError(f"query_toks must be a dict {{term: weight}}, got {type(toks).__name__}")
        unknown = [t for t in toks if t not in self.token]
        if unknown:
            raise InputError(f"query_toks: term {unknown[0]!r} is not in the vocabulary of {self.index_dir}; "
                             "encode queries with the index's head")
        w = {t: (1.0 if self.bm25 else float(v)) for t, v in toks.items() if v > 0}
        if not w:
            return {}, 0.0
        sq = (2 ** self.query_bits - 1) / max(w.values())
        q = {self.token[t]: float(np.rint(np.float32(v) * sq)) for t, v in w.items()}
        return {t: v for t, v in q.items() if v > 0}, sq

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        _check_query_frame(inp, "query_toks")
        pisa_toks, scales = zip(*[self._pisa_toks(t) for t in inp["query_toks"]]) if len(inp) else ((), ())
        live = [i for i, t in enumerate(pisa_toks) if t]
        hits: list[list[tuple[str, float]]] = [[] for _ in range(len(inp))]
        if live:
            frame = pd.DataFrame({"qid": [str(i) for i in live], "query_toks": [pisa_toks[i] for i in live]})
            res = self.pisa(frame)
            for q, d, s in zip(res["qid"].tolist(), res["docno"].tolist(), res["score"].astype(np.float64).tolist()):
                i = int(q)
                hits[i].append((self.ids[int(d)], s / (self.scale * scales[i])))
        return _results_frame(inp, hits)

    def __repr__(self) -> str:
        return f"PisaRetriever({str(self.index_dir)!r}, num_results={self.num_results})"


class IndexRetriever(pt.Transformer):
    """Any mmsparse index (mmsparse.indexes.open_index): a dense one (Faiss; Milvus' dense field)
    reads `query_vec`, a sparse one (Seismic, PISA, Milvus' sparse field) `query_toks`. Returns
    the top `num_results` per query as docno (image id), score, rank. options: the engine's
    search settings (e.g. ef_search for HNSW)."""

    def __init__(self, index_dir: str | Path, num_results: int = 1000, *, threads: int = 1, **options):
        super().__init__()
        from .indexes import open_index

        from .indexes.meta import read_meta

        self.index_dir, self.num_results = Path(index_dir), int(num_results)
        self.meta = read_meta(index_dir)
        self.route = index_route(self.meta)
        self.searcher = open_index(index_dir, threads=threads, **options)
        self.kind = self.searcher.kind
        if self.route == "sparse":
            vocab = getattr(self.searcher, "vocab", None)
            if vocab is None:
                raise InputError(f"{index_dir}: cannot read its vocabulary for query_toks")
            self.col = {t: j for j, t in enumerate(vocab)}

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        import scipy.sparse as sp

        from .indexes import bm25

        if self.route == "dense":
            _check_query_frame(inp, "query_vec")
            x = np.stack([np.asarray(v, dtype=np.float32) for v in inp["query_vec"]]) if len(inp) else None
            res = ([] if x is None else self.searcher.search_dense(x, self.num_results) if self.kind == "milvus"
                   else self.searcher.search(x, self.num_results))
        else:
            _check_query_frame(inp, "query_toks")
            rows, cols, vals = [], [], []
            for i, toks in enumerate(inp["query_toks"]):
                for t, w in toks.items():
                    if t not in self.col:
                        raise InputError(f"query_toks: term {t!r} is not in the vocabulary of {self.index_dir}")
                    if w > 0:
                        rows.append(i), cols.append(self.col[t]), vals.append(w)
            q = sp.csr_matrix((np.array(vals, dtype=np.float32), (rows, cols)), shape=(len(inp), len(self.col)))
            q = bm25.query_matrix(self.meta, q)
            res = self.searcher.search_sparse(q, self.num_results) if self.kind == "milvus" else \
                self.searcher.search(q, self.num_results)
        ids = getattr(self.searcher, "ids", None)
        hits = [[(d if ids is None else ids[d], s) for d, s in r] for r in res]
        return _results_frame(inp, hits)

    def __repr__(self) -> str:
        return f"IndexRetriever({str(self.index_dir)!r}, num_results={self.num_results})"


def retriever(index_dir: str | Path, num_results: int = 1000, **options) -> pt.Transformer:
    """The retriever of an mmsparse index directory: PisaRetriever (pyterrier-pisa) for PISA,
    IndexRetriever for Faiss, Seismic and Milvus. options go to that class."""
    from .indexes.meta import read_meta

    if read_meta(index_dir)["kind"] == "pisa":
        return PisaRetriever(index_dir, num_results, **options)
    return IndexRetriever(index_dir, num_results, **options)


def topics_frame(path: str | Path) -> pd.DataFrame:
    """qid, query of a captions file: dense or sparse HDF5 with `texts` (ids are the qids), or a
    .txt captions file (one per line, qid = line number, as encode-dense numbers them)."""
    import h5py

    from .formats._h5 import read_strings

    p = Path(path)
    if p.suffix in (".h5", ".hdf5"):
        with h5py.File(p, "r") as f:
            if "texts" not in f:
                raise InputError(f"{p}: no 'texts' dataset; topics need the caption texts")
            ids, texts = read_strings(f["ids"]), read_strings(f["texts"])
    else:
        from .data.plain import read_captions_file

        caps = [c for sd in read_captions_file(p).values() for c in sd.captions]
        ids, texts = [c.id for c in caps], [c.text for c in caps]
    return pd.DataFrame({"qid": [str(i) for i in ids], "query": texts})


def qrels_frame(path: str | Path) -> pd.DataFrame:
    """qid, docno, label of a TREC qrels file (as PyTerrier and ir-measures read it)."""
    from .formats.trec import read_qrels

    q = read_qrels(path)
    rows = [(str(qid), str(d), int(rel)) for qid, docs in q.items() for d, rel in docs.items()]
    return pd.DataFrame(rows, columns=["qid", "docno", "label"])
