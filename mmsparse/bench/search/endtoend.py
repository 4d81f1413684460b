"""The end-to-end job of the search benchmark (issue 25): a caption's text in, the top-10 image
ids out, one query at a time on 1 thread, the query encoder's time included.

What one query's time holds, per query type (the encoder and the index are loaded once, before
timing, as a server keeps them loaded; each query is encoded on its own, a batch of 1):
  dense           the backbone's text tower: tokenize, forward, projection, L2 normalisation
                  (Backbone.encode_texts) -> Faiss HNSW
  expand          D2S: the text tower, then the D2S head on its vector (every term)
  caption-terms   D2S: the same, keeping only the caption's own WordPiece terms (what `sparsify
                  --query-mode caption-terms` keeps)
  inference-free  the head's term-weight table (TermWeightQueryEncoder: tokenizer + table lookup;
                  no torch is imported in that process)
each sparse query type -> PISA, Seismic, BMP and kANNolo (the last three when chosen, below)
then the search and the result rows' image ids. Rows: p50/p90/p99 of the total, encode_p50_ms
(the encoder) and search_p50_ms (the rest: search + id lookup), qps_1t = 1000 / mean total ms.
Threads: torch 1 (set before the model loads), Faiss omp 1, PISA threads=1, Seismic's
single-query call. Not timed: `mmsparse query` / QueryEngine's own path, which also writes a
temporary HDF5 file per call (what is timed here is the encoder's own work).

Configurations (settings e2e_*; "auto" reads the search-only rows of this scale and side measured
on the same collection): PISA: its fastest algorithm on the query mode (else maxscore) on the pisa
job's index; Seismic: the fastest configuration with overlap@10 >= e2e_min_overlap on the head's
primary queries, its build included (else query_cut 10, heap_factor 0.8 on the scale's
--seismic-build), the same for every query mode of the head; BMP and kANNolo: their jobs' fastest
row with overlap@10 >= e2e_min_overlap on the primary queries (no row: not run), or --e2e-bmp /
--e2e-kannolo; HNSW: the fastest efSearch with overlap@10 >= e2e_min_overlap (else 64). Each row
names its choice (`choice`).

Quality: overlap@10 against the exhaustive ranking of the same encoded queries (exact float
<q, d> over the head's sparse documents; Faiss Flat for dense), R@10 against the qrels, and
`file_match`: the share of sampled queries whose encoding equals that query's row in the file
the search-only jobs read, up to float noise (file_match), i.e. whether the two kinds of rows
measure the same queries.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import scipy.sparse as sp

from ...errors import InputError
from .faiss import flat_build, hnsw_build
from .harness import (Rows, Scale, _dense_ids, _save, _sparse_docs, exact_sparse, load_queries, mode_label,
                      postings_per_query, saved_rows)
from .bmp import bmp_build
from .kannolo import kannolo_build
from .pisa import pisa_default_build
from .seismic import _seismic_build, seismic_build_params

K = 10
PISA_DEFAULT, SEISMIC_DEFAULT, EF_DEFAULT = "maxscore", (10, 0.8, 0), 64


def job_endtoend(sc: Scale) -> dict:
    """Text-in, ids-out rows of the dense side (sc.head None) or of each query mode of a head."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")   # one thread in the tokenizer too
    q = load_queries(sc)
    if q["texts"] is None:
        raise InputError(f"{sc.dq}: no caption texts; the end-to-end job encodes the captions from their text")
    rows, info = _dense_rows(sc, q) if sc.head is None else _sparse_rows(sc, q)
    return _save(sc, "endtoend", rows, info)


# ---------------------------------------------------------------- encoders (text -> query)

_TOWER: dict = {}


def _tower(sc: Scale):
    """The backbone's text tower (loaded once per process, torch on 1 thread): text -> unit [d]."""
    import torch

    from ...backbones import load_backbone
    from ...formats.dense import read_dense_attrs

    torch.set_num_threads(1)
    if "bb" not in _TOWER:
        a = read_dense_attrs(sc.dq)
        kw = {"max_length": int(a["max_length"])} if "max_length" in a else {}
        _TOWER["bb"] = load_backbone(a.get("backbone", "hf-dual"), sc.settings.get("model") or a["model"], "cpu",
                                     **kw)
    bb = _TOWER["bb"]
    return lambda text: bb.encode_texts([text])[0]


def _d2s(sc: Scale, mode: str):
    """D2S queries: the text tower, then the head (expand: every term; caption-terms: the
    caption's own terms, as D2S.sparsify). text -> (term ids int32, weights float32)."""
    import torch

    from ...methods.head import load_head, require_tokenizer
    from ...vocab import caption_token_ids

    tower, head = _tower(sc), load_head(sc.head_dir)
    if mode == "caption-terms":
        tok = require_tokenizer(head, sc.head_dir)
        tids = head.token_ids.numpy()
        col = np.full(max(int(tids.max()) + 1, len(tok)), -1, dtype=np.int64)   # tokenizer id -> head column
        col[tids] = np.arange(len(tids))

    def encode(text):
        with torch.inference_mode():   # caption-term queries skip the top-k gate, as sparsify's do
            s = head(torch.from_numpy(tower(text)[None]), side="text", gate=mode != "caption-terms")[0].numpy()
        if mode == "caption-terms":
            ids = caption_token_ids(tok, [text])[0]
            c = np.unique(col[ids[ids < len(col)]])
            c = c[c >= 0]
        else:
            c = np.flatnonzero(s)
        c = c[s[c] > 0]
        return c.astype(np.int32), s[c]
    return encode


def _table(sc: Scale, mode: str):
    """Inference-free queries: the head's term-weight table, no model. text -> (ids, weights)."""
    from ...methods.inference_free.queries import TermWeightQueryEncoder

    return TermWeightQueryEncoder.load(sc.head_dir).encode_one


ENCODERS = {"expand": _d2s, "caption-terms": _d2s, "inference-free": _table}


# ---------------------------------------------------------------- timing and quality

def _fn(encode, search, texts: list[str], doc_ids: list[str], enc_s: np.ndarray | None = None):
    """fn(j, k) for time_queries: encode texts[j], search, map the rows to image ids; the encoder's
    seconds go to enc_s[j]."""
    def fn(j, k):
        t0 = time.perf_counter()
        x = encode(texts[j])
        t1 = time.perf_counter()
        rows = search(x, k)
        _ = [doc_ids[r] for r in rows]   # what a server returns
        if enc_s is not None:
            enc_s[j] = t1 - t0
        return rows
    return fn


def _warm(encode, search, texts, doc_ids):
    f = _fn(encode, search, texts, doc_ids)
    return lambda k: [f(j, k) for j in range(len(texts))]


def _csr(parts: list[tuple[np.ndarray, np.ndarray]], v: int) -> sp.csr_matrix:
    """Encoded queries [(ids, weights)] as CSR [n, v] float32 (sorted indices)."""
    indptr = np.cumsum([0] + [len(i) for i, _ in parts])
    m = sp.csr_matrix((np.concatenate([w for _, w in parts]).astype(np.float32),
                       np.concatenate([i for i, _ in parts]).astype(np.int32), indptr), shape=(len(parts), v))
    m.sort_indices()
    return m


def file_match(a, b, rel: float = 1e-3) -> float:
    """Share of rows of a equal to b's up to float noise: max |a - b| <= rel x max |b| (CSR or
    dense [n, dim], same shape). A batch of 1 and encode-dense's batches of 64 give vectors that
    differ in the last bits, which can switch a D2S term of weight ~0 on or off: noise, not a
    different query."""
    a, b = (x.toarray() if sp.issparse(x) else np.asarray(x) for x in (a, b))
    ok = np.abs(a - b).max(axis=1, initial=0) <= rel * np.abs(b).max(axis=1, initial=0)
    return round(float(ok.mean()), 4) if len(ok) else 1.0


# ---------------------------------------------------------------- configurations

def _pisa_choice(sc: Scale, saved: list[dict], mode: str) -> tuple[str, str]:
    """(PISA algorithm, why): --e2e-pisa, else the pisa job's fastest full query of this mode."""
    if sc.settings["e2e_pisa"] != "auto":
        return sc.settings["e2e_pisa"], "--e2e-pisa"
    lab = mode_label(mode)
    rows = [r for r in saved if r["engine"] == "pisa" and r["k"] == K and r.get("query_mode") == mode
            and r["mode"] == f"{lab} {r.get('algorithm')}"]
    if not rows:
        return PISA_DEFAULT, "default (no pisa rows of this query mode)"
    best = min(rows, key=lambda r: r["p50_ms"])
    return best["algorithm"], f"pisa job's fastest ({best['p50_ms']} ms)"


def _seismic_choice(sc: Scale, saved: list[dict]) -> tuple[dict, tuple[int, float, int], str]:
    """(build parameters, (query_cut, heap_factor, n_knn), why): --e2e-seismic QC:HF[:KNN] on the
    scale's build, else the seismic jobs' fastest row with overlap@10 >= e2e_min_overlap."""
    want, base = sc.settings["e2e_seismic"], seismic_build_params(sc)
    if want != "auto":
        qc, hf, *nk = want.split(":")
        return base, (int(qc), float(hf), int(nk[0]) if nk else 0), "--e2e-seismic"
    ok = [r for r in saved if r["engine"] == "seismic" and r["k"] == K and r.get("query_mode") == sc.primary
          and r.get("build") and (r.get("overlap@10") or 0) >= sc.settings["e2e_min_overlap"]]
    if not ok:
        return base, SEISMIC_DEFAULT, "default (no seismic row at the overlap)"
    b = min(ok, key=lambda r: r["p50_ms"])
    return b["build"], (b["query_cut"], b["heap_factor"], b["n_knn"] or 0), f"seismic job's fastest: {b['mode']}"


def _graph_engines(sc: Scale, saved: list[dict]) -> list[tuple[str, object, str, dict]]:
    """(engine, search(x, k) -> rows, label, extra row fields) of BMP and kANNolo: --e2e-bmp
    BLOCK:ALPHA:BETA / --e2e-kannolo M:EF, else the job's fastest row with overlap@10 >=
    e2e_min_overlap on the head's primary queries (none there: the engine is left out)."""
    from ...indexes.bmp import BmpSearcher
    from ...indexes.kannolo import KannoloSearcher

    out = []
    for engine in ("bmp", "kannolo"):
        want = sc.settings.get(f"e2e_{engine}", "auto")
        if want == "none":
            continue
        if want != "auto":
            a, b, *c = want.split(":")
            build, search, why = ({"block_size": int(a)}, {"alpha": float(b), "beta": float(c[0])}, "--e2e-bmp") \
                if engine == "bmp" else ({"index_type": "hnsw", "m": int(a)}, {"ef_search": int(b)}, "--e2e-kannolo")
        else:
            ok = [r for r in saved if r["engine"] == engine and r["k"] == K and r.get("query_mode") == sc.primary
                  and r.get("build") and (r.get("overlap@10") or 0) >= sc.settings["e2e_min_overlap"]]
            if not ok:
                continue
            b = min(ok, key=lambda r: r["p50_ms"])
            build, search, why = b["build"], b["search"], f"{engine} job's fastest: {b['mode']}"
        if engine == "bmp":
            d, _, _ = bmp_build(sc, build["block_size"])
            s = BmpSearcher(d, alpha=search["alpha"], beta=search["beta"])
            label = f"block={build['block_size']} a={search['alpha']} b={search['beta']}"
        else:
            d, _, _ = kannolo_build(sc, build["index_type"], build.get("m") or 32)
            s = KannoloSearcher(d, ef_search=search.get("ef_search") or 1)
            label = "flat" if build["index_type"] == "flat" else f"M={build['m']} ef={search['ef_search']}"
        out.append((engine, lambda x, k, s=s: s.search_one(x[0], x[1], k)[0], label,
                    dict(build=build, search=search, choice=why, index=d.name)))
    return out


def _ef_choice(sc: Scale) -> tuple[int, str]:
    """(efSearch, why): --e2e-ef-search, else faiss-hnsw's fastest with overlap@10 >= the bound."""
    if sc.settings["e2e_ef_search"] != "auto":
        return int(sc.settings["e2e_ef_search"]), "--e2e-ef-search"
    ok = [r for r in saved_rows(sc, skip=("endtoend",)) if r["engine"] == "faiss-hnsw" and r["k"] == K
          and "[" not in r["mode"] and (r.get("overlap@10") or 0) >= sc.settings["e2e_min_overlap"]]
    if not ok:
        return EF_DEFAULT, "default (no faiss-hnsw row at the overlap)"
    b = min(ok, key=lambda r: r["p50_ms"])
    return int(b["ef_search"]), f"faiss-hnsw job's fastest ({b['p50_ms']} ms)"


# ---------------------------------------------------------------- the two sides

def _dense_rows(sc: Scale, q: dict) -> tuple[list[dict], dict]:
    import faiss

    from ...indexes.faiss_index import FaissSearcher

    texts, n = q["texts"], len(sc.sample)
    t0 = time.perf_counter()
    encode = _tower(sc)
    load_s = round(time.perf_counter() - t0, 2)
    vecs = np.stack([encode(t) for t in texts]).astype(np.float32)    # untimed: the reference's queries
    d, _, _ = flat_build(sc, "real", sc.dense_docs)
    flat = FaissSearcher(d, threads=2)
    _, ex = flat.index.search(vecs, K)
    del flat
    faiss.omp_set_num_threads(1)
    ef, why = _ef_choice(sc)
    d, meta, brss = hnsw_build(sc, "real", sc.dense_docs)
    hs = FaissSearcher(d, threads=1, ef_search=ef)
    ids = _dense_ids(sc.dense_docs)
    rows = Rows(sc, q, ids, hs.index.ntotal, [r[r >= 0].astype(np.int64) for r in ex])
    enc_s = np.zeros(n)

    def search(v, k):
        return hs.search_one(v, k)[0]
    rows.run("faiss-hnsw", f"ef={ef}", K, _fn(encode, search, texts, ids, enc_s),
             _warm(encode, search, q["texts_warm"], ids), query_mode="dense", split={"encode": enc_s},
             endtoend=True, ef_search=ef, choice=why, encoder_load_s=load_s, torch_loaded="torch" in sys.modules,
             file_match=file_match(vecs, q["dq"]),
             build_s=meta["build_seconds"], build_rss_mb=brss)
    return rows.rows, {"index": meta}


def _sparse_rows(sc: Scale, q: dict) -> tuple[list[dict], dict]:
    import gc

    from ...indexes.pisa import PisaSearcher
    from ...indexes.seismic import SeismicSearcher

    texts, n = q["texts"], len(sc.sample)
    unknown = [m for m in q["modes"] if m not in ENCODERS]
    if unknown:
        raise InputError(f"head {sc.head}: no end-to-end encoder for query mode {unknown[0]!r} "
                         f"(known: {', '.join(ENCODERS)})")
    # every mode's encoder, its queries and their exact ranking first, then the documents' CSR
    # matrix is freed before the indexes open (peak memory: the larger of the two, not their sum)
    D, doc_ids, _ = _sparse_docs(sc)
    inv, df = D.T.tocsr(), np.bincount(D.indices, minlength=D.shape[1])
    modes = {}
    for mode in q["modes"]:
        t0 = time.perf_counter()
        encode = ENCODERS[mode](sc, mode)
        load_s = round(time.perf_counter() - t0, 2)
        Q = _csr([encode(t) for t in texts], D.shape[1])    # untimed: the reference's queries
        modes[mode] = (encode, exact_sparse(D, Q, K, inv=inv),
                       dict(query_mode=mode, endtoend=True, encoder_load_s=load_s,
                            file_match=file_match(Q, q["q"][mode]), postings_per_query=postings_per_query(df, Q)))
    ndocs = D.shape[0]
    del D, inv, Q
    gc.collect()
    saved = saved_rows(sc, skip=("endtoend",))
    pd, pmeta, _ = pisa_default_build(sc)
    ps = PisaSearcher(pd, threads=1)
    metas, seismic = {"pisa": pmeta}, ()
    if sc.settings["e2e_seismic"] != "none":   # none: PISA only (a Seismic build at 1M takes ~40 min on 2 cores)
        build, (qc, hf, nk), s_why = _seismic_choice(sc, saved)
        sd, metas["seismic"], _ = _seismic_build(sc, build)
        ss = SeismicSearcher(sd, threads=1, query_cut=qc, heap_factor=hf, n_knn=nk)
        seismic = (("seismic", lambda x, k: ss.search_one(x[0], x[1], k)[0],
                    f"qc={qc} hf={hf}" + (f" knn={nk}" if nk else ""),
                    dict(query_cut=qc, heap_factor=hf, n_knn=nk, build=build, choice=s_why, index=sd.name)),)
    graphs = tuple(_graph_engines(sc, saved))
    out = []
    for mode, (encode, exact, common) in modes.items():
        rows = Rows(sc, q, doc_ids, ndocs, exact)
        algo, p_why = _pisa_choice(sc, saved, mode)
        ps.query_algorithm = algo
        for engine, search, label, extra in (
                ("pisa", lambda x, k: ps.search_one(x[0], x[1], k)[0], algo,
                 dict(algorithm=algo, choice=p_why, index=pd.name)), *seismic, *graphs):
            enc_s = np.zeros(n)
            rows.run(engine, label, K, _fn(encode, search, texts, doc_ids, enc_s),
                     _warm(encode, search, q["texts_warm"], doc_ids), split={"encode": enc_s},
                     torch_loaded="torch" in sys.modules, **common, **extra)
        out += rows.rows
    return out, {"indexes": metas}
