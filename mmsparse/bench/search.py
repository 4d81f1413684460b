"""Search benchmark (issue 5, after D2S paper Table 6): latency and quality of every engine.

    python -m mmsparse.bench.search --work WORK [--scales flickr8k,123000,1000000] [-o OUT]

Inputs (the Flickr8k example's workspace): WORK/sparse/HEAD/SPLIT-images.h5,
SPLIT-captions.expand.h5, SPLIT-captions.caption-terms.h5 (a trained head's sparse vectors),
WORK/dense/BACKBONE/SPLIT-images.h5, SPLIT-captions.h5, SPLIT.qrels.

Scales: `flickr8k` is the real test collection with its qrels. A number N is a synthetic
collection of N documents drawn from the real sparse documents by mmsparse.bench.synthetic
(per-term df and weights of the real head scaled to N; see that module), searched with the
real sparse queries; its dense side is N random unit vectors of the backbone's dimension
(issue 5's setting), and also N vectors drawn from a Gaussian fitted to the real image vectors
(rows marked [gaussian]; random unit vectors have no structure for HNSW to exploit, so its
recall collapses there while it stays near 1 on real-like data), both searched with the real
dense caption vectors. HNSW over random unit vectors is skipped above --hnsw-max-docs (its
build takes most of an hour at 1M on 2 cores). Synthetic collections have no qrels: rows carry
R@k = null and `overlap` only.

Configurations (engine, mode):
  faiss-flat  exact            dense exhaustive inner product (IndexFlatIP)
  faiss-hnsw  ef=E             dense HNSW (M, efConstruction fixed) at query beam max(E, k)
  exhaustive  exp              sparse exact <q, d> by scipy (postings of every query term)
  pisa        exp / no-exp     PISA block-max WAND over expanded / caption-term queries
  pisa        exp taat         ... term-at-a-time exhaustive scoring (PISA ranked_or_taat)
  pisa        exp maxscore     ... the MaxScore algorithm
  pisa        exp top=N        expanded queries pruned to their N largest weights, MaxScore
                               (smallest k only)
  two-stage   c=C              PISA over caption terms for C candidates, exact re-scoring with
                               the expanded query (indexes.rescore)
  seismic     qc=Q hf=H        Seismic, query_cut Q, heap_factor H
Timing: one query at a time through each searcher's `search_one` (PISA threads=1, Faiss
omp 1 thread, Seismic single-query call), time.perf_counter around the call; `warmup` queries
first, not counted. A configuration stops after `budget_s` seconds (but not before
`min_queries` queries). qps = 1000 / mean_ms (one thread, sequential).
Quality: R@1, R@10, RR@10 against the qrels (real scale) and `overlap` = |top-k returned ∩
exact top-k| / min(k, |exact|), exact = exhaustive float sparse scoring of the expanded query
(documents with score > 0; sparse engines) or IndexFlatIP (dense engines), averaged over the
timed queries whose exact list is not empty.
Sizes: `index_bytes` = the files a search reads (PISA: compressed index + block-max data +
lexicons; two-stage: plus forward.h5; Seismic: its index file, which embeds the forward
vectors; Faiss: faiss.index); `build_s` = the `index` build's wall time (build_threads).

Output: OUT (default WORK/bench/search.json), a JSON list of rows with keys scale, engine,
mode, docs, k, queries, qps, mean_ms, p50_ms, p99_ms, R@1, R@10, RR@10, overlap, build_s,
index_bytes, bytes_per_doc, postings_per_query (sparse: mean exhaustive postings of the
searched query terms); plus OUT with suffix .meta.json (machine, collection statistics of
real vs synthetic collections, settings) and .md (the tables).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError, require_file


# ---------------------------------------------------------------- inputs

def load_inputs(sd: Path, dd: Path, head: str, backbone: str, split: str, sparse: bool = True) -> dict:
    """The real sparse (dir sd) / dense (dir dd) documents and queries, aligned to the expanded
    queries' ids (to the dense queries' ids when `sparse` is False: dense engines only)."""
    from ..formats.dense import read_dense
    from ..formats.sparse import read_sparse
    from ..formats.trec import read_qrels

    ddocs = read_dense(require_file(dd / f"{split}-images.h5", "dense documents"))
    dq = read_dense(require_file(dd / f"{split}-captions.h5", "dense queries"))
    qrels = read_qrels(require_file(dd / f"{split}.qrels", "qrels"))
    fit = [ddocs.vectors]
    if split != "train" and (dd / "train-images.h5").is_file():
        fit.append(read_dense(dd / "train-images.h5").vectors)
    out = {"fit": np.concatenate(fit), "ddocs": ddocs, "qrels": qrels, "head": head, "backbone": backbone,
           "docs": None, "qe": None, "qc": None, "qids": dq.ids,
           "dq": np.ascontiguousarray(dq.vectors, dtype=np.float32)}
    if not sparse:
        return out
    docs = read_sparse(require_file(sd / f"{split}-images.h5", "sparse documents"))
    qe = read_sparse(require_file(sd / f"{split}-captions.expand.h5", "expanded sparse queries"))
    qc = read_sparse(require_file(sd / f"{split}-captions.caption-terms.h5", "caption-term sparse queries"))
    if qe.vocab != docs.vocab or qc.vocab != docs.vocab:
        raise InputError(f"{sd}: query and document files have different vocabularies")
    pos_c = {q: i for i, q in enumerate(qc.ids)}
    pos_d = {q: i for i, q in enumerate(dq.ids)}
    missing = [q for q in qe.ids if q not in pos_c or q not in pos_d]
    if missing:
        raise InputError(f"query id {missing[0]!r} of the expanded queries is missing from the "
                         "caption-term or dense query file; all three must hold the same captions")
    out.update({"docs": docs, "qe": qe.matrix, "qc": qc.matrix[[pos_c[q] for q in qe.ids]], "qids": qe.ids,
                "dq": np.ascontiguousarray(dq.vectors[[pos_d[q] for q in qe.ids]], dtype=np.float32)})
    return out


def write_synthetic(real: dict, n: int, out: Path, seed: int, reuse: bool) -> tuple[Path, dict]:
    """The sparse synthetic collection of n documents in out/docs.h5 (kept for reuse) + its stats."""
    from ..formats.sparse import write_sparse
    from .synthetic import collection_stats, synthesize

    out.mkdir(parents=True, exist_ok=True)
    sfile, stats_file = out / "docs.h5", out / "stats.json"
    if reuse and sfile.is_file() and stats_file.is_file():
        return sfile, json.loads(stats_file.read_text())
    t0 = time.time()
    m = synthesize(real["docs"].matrix, n, seed=seed)
    gen_s = time.time() - t0
    stats = {"synthetic": collection_stats(m, real["qe"]), "synthetic_no_exp": collection_stats(m, real["qc"]),
             "generate_s": round(gen_s, 1), "seed": seed}
    ids = [f"syn{i:07d}" for i in range(n)]
    write_sparse(sfile, ids, m, real["docs"].vocab,
                 {"modality": "image", "head": real["head"], "query_mode": "doc", "dataset": f"synthetic-{n}",
                  "split": "synthetic", "method": "mmsparse.bench.synthetic", "seed": seed})
    stats_file.write_text(json.dumps(stats, indent=2))
    return sfile, stats


def write_synthetic_dense(real: dict, n: int, out: Path, kind: str, seed: int, reuse: bool) -> Path:
    """n synthetic dense documents in out/dense-KIND.h5 (kept for reuse).

    kind random: uniform random unit vectors of the backbone's dimension (issue 5's setting).
    kind gaussian: x ~ N(mu, Sigma) fitted to the real image vectors (test + train images when
    present), then L2-normalised: keeps the real embeddings' anisotropy (a few dominant
    directions), which is what makes HNSW work on real data and fail on random vectors.
    """
    from ..formats.dense import DenseWriter
    from .synthetic import random_unit

    out.mkdir(parents=True, exist_ok=True)
    dfile = out / f"dense-{kind}.h5"
    if reuse and dfile.is_file():
        return dfile
    dim = real["ddocs"].dim
    if kind == "random":
        chunks = random_unit(n, dim, seed=seed + 1)
    else:
        x = real["fit"].astype(np.float64)
        mu, cov = x.mean(axis=0), np.cov(x, rowvar=False)
        w, v = np.linalg.eigh(cov)
        root = (v * np.sqrt(np.clip(w, 0, None))).astype(np.float32)  # cov = root @ root.T
        rng = np.random.default_rng(seed + 2)

        def gen(chunk=65536):
            for s in range(0, n, chunk):
                z = rng.standard_normal((min(chunk, n - s), dim), dtype=np.float32) @ root.T + mu.astype(np.float32)
                yield z / np.linalg.norm(z, axis=1, keepdims=True)
        chunks = gen()
    with DenseWriter(dfile, dim, {"modality": "image", "backbone": real["backbone"], "model": f"synthetic-{kind}",
                                  "dataset": f"synthetic-{n}", "split": "synthetic", "normalized": True}) as w:
        s = 0
        for x in chunks:
            w.append([f"syn{i:07d}" for i in range(s, s + len(x))], x)
            s += len(x)
    return dfile


# ---------------------------------------------------------------- exact top-k

def exact_sparse(docs: sp.csr_matrix, queries: sp.csr_matrix, order: np.ndarray, k: int, chunk: int = 1
                 ) -> tuple[dict[int, np.ndarray], list[float]]:
    """Exhaustive float top-k of queries[order] by sparse products; also per-query seconds.

    Memory O(nnz(docs) + chunk x N): the inverted (term-major) copy of docs is the only copy.
    """
    inv = docs.T.tocsr()  # [|V|, N]: term rows = posting lists
    out, secs = {}, []
    for s in range(0, len(order), chunk):
        rows = order[s:s + chunk]
        t0 = time.perf_counter()
        sc = (queries[rows] @ inv).tocsr()
        for j, i in enumerate(rows):
            r = sc.indices[sc.indptr[j]:sc.indptr[j + 1]]
            v = sc.data[sc.indptr[j]:sc.indptr[j + 1]]
            out[int(i)] = _top(r, v, k)
        secs.extend([(time.perf_counter() - t0) / len(rows)] * len(rows))
    return out, secs


def _top(rows: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k largest scores, by decreasing score then increasing row."""
    if len(rows) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        rows, scores = rows[part], scores[part]
    return rows[np.lexsort((rows, -scores))].astype(np.int64)


# ---------------------------------------------------------------- timing

def measure(fn, order: np.ndarray, k: int, warmup: int, budget_s: float, min_queries: int
            ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Run fn(i, k) -> doc rows for each query i of `order`, one at a time.

    Warm-up: the last `warmup` queries of `order` first (untimed). Returns per-query seconds
    and {query: rows}. Stops once `budget_s` is spent and `min_queries` are done.
    """
    for i in order[-warmup:] if warmup else []:
        fn(int(i), k)
    lat, res = [], {}
    enabled = gc.isenabled()
    gc.disable()  # no collector pauses inside timed calls (memory is freed by refcounting anyway)
    try:
        start = time.perf_counter()
        for n, i in enumerate(order):
            t0 = time.perf_counter()
            rows = fn(int(i), k)
            lat.append(time.perf_counter() - t0)
            res[int(i)] = np.asarray(rows)
            if budget_s and n + 1 >= min_queries and time.perf_counter() - start > budget_s:
                break
    finally:
        if enabled:
            gc.enable()
    return np.asarray(lat), res


def quality(res: dict[int, np.ndarray], k: int, exact: dict[int, np.ndarray] | None, qids: list[str],
            doc_ids: list[str] | None, qrels: dict | None) -> dict:
    """overlap with the exact top-k, and R@1, R@10, RR@10 when qrels are given."""
    out: dict = {"overlap": None, "R@1": None, "R@10": None, "RR@10": None}
    if exact is not None:
        # queries with an empty exact list (no term in common with any document) have nothing to find
        ov = [len(set(res[i][:k].tolist()) & set(exact[i][:k].tolist())) / min(k, len(exact[i]))
              for i in res if len(exact[i])]
        out["overlap"] = round(float(np.mean(ov)), 4) if ov else None
    if qrels is not None and doc_ids is not None:
        r1, r10, rr = [], [], []
        for i, rows in res.items():
            rel = {d for d, g in qrels.get(qids[i], {}).items() if g > 0}
            if not rel:
                continue
            got = [doc_ids[r] for r in rows[:10]]
            hits = [d in rel for d in got]
            r1.append(sum(hits[:1]) / len(rel))
            r10.append(sum(hits) / len(rel))
            rr.append(next((1.0 / (j + 1) for j, h in enumerate(hits) if h), 0.0))
        if r1:
            out.update({"R@1": round(100 * float(np.mean(r1)), 2), "R@10": round(100 * float(np.mean(r10)), 2),
                        "RR@10": round(100 * float(np.mean(rr)), 2)})
    return out


def timing_row(lat: np.ndarray) -> dict:
    ms = lat * 1000
    return {"queries": int(len(ms)), "qps": round(1000 / float(ms.mean()), 1), "mean_ms": round(float(ms.mean()), 3),
            "p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


def _bytes(paths) -> int:
    return int(sum(p.stat().st_size for p in paths if p.is_file()))


def index_bytes(index_dir: Path, kind: str, with_forward: bool = False) -> int:
    """Bytes of the files a search reads (see module docstring)."""
    if kind == "pisa":
        p = index_dir / "pisa"
        n = _bytes(list(p.glob("quantized.*")) + [p / "fwd.termlex", p / "fwd.doclex"])
        return n + (_bytes([index_dir / "forward.h5"]) if with_forward else 0)
    if kind == "seismic":
        return _bytes(index_dir.glob("*.index.seismic"))
    return _bytes([index_dir / "faiss.index"])


def postings_per_query(df: np.ndarray, q: sp.csr_matrix, order: np.ndarray) -> float:
    """Mean over queries of sum of df over the query's terms (exhaustive postings touched)."""
    sub = q[order]
    return round(float(np.asarray(sub.astype(bool).astype(np.float64) @ df.astype(np.float64)).mean()), 1)


# ---------------------------------------------------------------- one scale

def sparse_rows(sfile, synthetic, order, ks, real, args, idx, add, build, log) -> dict:
    """Exhaustive, PISA, two-stage and Seismic rows (through `add`); returns build settings."""
    from ..formats.sparse import read_sparse
    from ..indexes.pisa import PisaSearcher, build_pisa_index
    from ..indexes.rescore import prune_rows, rescore_one
    from ..indexes.seismic import SeismicSearcher, build_seismic_index

    kmax, bt, label = ks[-1], args.build_threads, idx.parent.name
    docs = read_sparse(sfile)
    D, doc_ids = docs.matrix, (docs.ids if not synthetic else None)
    ndocs = D.shape[0]
    del docs
    df = np.bincount(D.indices, minlength=D.shape[1])
    ppq_exp = postings_per_query(df, real["qe"], order)
    ppq_noexp = postings_per_query(df, real["qc"], order)
    log(f"[{label}] {ndocs} docs, nnz {D.nnz}; exact sparse top-{kmax} of {len(order)} queries")
    exact_s, secs = exact_sparse(D, real["qe"], order, kmax)
    for k in ks:
        add("exhaustive", "exp (scipy)", k, np.asarray(secs), {i: exact_s[i] for i in order}, exact_s, doc_ids,
            None, None, ndocs, ppq_exp)

    pisa_dir = idx / "pisa"
    pmeta = build("pisa", pisa_dir, lambda: build_pisa_index(sfile, pisa_dir, threads=bt))
    ps = PisaSearcher(pisa_dir, threads=1)
    ps._forward = D  # share the in-memory document vectors for re-scoring
    qe, qc = real["qe"], real["qc"]

    def sparse_fn(searcher, q):
        def f(i, k):
            s, e = q.indptr[i], q.indptr[i + 1]
            return searcher.search_one(q.indices[s:e], q.data[s:e], k)[0]
        return f

    pbytes, pbuild = index_bytes(pisa_dir, "pisa"), pmeta["build_seconds"]
    for mode, q, ppq, algo, kk in (("exp", qe, ppq_exp, "block_max_wand", ks),
                                   ("no-exp", qc, ppq_noexp, "block_max_wand", ks),
                                   ("exp taat", qe, ppq_exp, "ranked_or_taat", ks),
                                   ("exp maxscore", qe, ppq_exp, "maxscore", ks)):
        ps.query_algorithm = algo
        for k in kk:
            lat, res = measure(sparse_fn(ps, q), order, k, args.warmup, args.budget_s, args.min_queries)
            add("pisa", mode, k, lat, res, exact_s, doc_ids, pbuild, pbytes, ndocs, ppq)
    ps.query_algorithm = "maxscore"
    for top in args.query_top_n:
        qp = prune_rows(qe[order], top_n=top)
        qpf = sp.csr_matrix((qp.data, qp.indices, qp.indptr), shape=(len(order), qe.shape[1]))
        pos = {int(i): j for j, i in enumerate(order)}

        def f(i, k, qpf=qpf, pos=pos):
            j = pos[i]
            s, e = qpf.indptr[j], qpf.indptr[j + 1]
            return ps.search_one(qpf.indices[s:e], qpf.data[s:e], k)[0]
        lat, res = measure(f, order, ks[0], args.warmup, args.budget_s, args.min_queries)
        add("pisa", f"exp top={top}", ks[0], lat, res, exact_s, doc_ids, pbuild, pbytes, ndocs,
            postings_per_query(df, qpf, np.arange(len(order))))
    ps.query_algorithm = "block_max_wand"  # short caption-term queries: the index default
    fbytes = index_bytes(pisa_dir, "pisa", with_forward=True)
    for c in args.candidates:
        def f(i, k, c=c):
            s, e = qc.indptr[i], qc.indptr[i + 1]
            cand = ps.search_one(qc.indices[s:e], qc.data[s:e], c)[0]
            s, e = qe.indptr[i], qe.indptr[i + 1]
            return rescore_one(qe.indices[s:e], qe.data[s:e], D, cand, k)[0]
        for k in [k for k in ks if k <= c]:
            lat, res = measure(f, order, k, args.warmup, args.budget_s, args.min_queries)
            add("two-stage", f"c={c}", k, lat, res, exact_s, doc_ids, pbuild, fbytes, ndocs, ppq_noexp)
    del ps
    gc.collect()

    seis_dir = idx / "seismic"
    smeta = build("seismic", seis_dir, lambda: build_seismic_index(sfile, seis_dir, threads=bt,
                                                                    n_postings=args.seismic_postings))
    ss = SeismicSearcher(seis_dir, threads=1)
    sbytes, sbuild = index_bytes(seis_dir, "seismic"), smeta["build_seconds"]
    for j, (qcut, hf) in enumerate(args.seismic):
        ss.query_cut, ss.heap_factor = qcut, hf
        for k in (ks if j == 0 else [ks[0]]):
            lat, res = measure(sparse_fn(ss, qe), order, k, args.warmup, args.budget_s, args.min_queries)
            add("seismic", f"qc={qcut} hf={hf}", k, lat, res, exact_s, doc_ids, sbuild, sbytes, ndocs, ppq_exp)
    del ss, D, exact_s
    gc.collect()
    return {"pisa": pmeta["settings"], "seismic": smeta["settings"], "docs": ndocs}



def run_scale(label: str, real: dict, args, log) -> tuple[list[dict], dict]:
    """All configurations at one scale. Returns (rows, collection statistics)."""
    import faiss

    from ..indexes.faiss_index import FaissSearcher, build_faiss_index
    from .synthetic import collection_stats

    base = args.work / "bench" / label
    base.mkdir(parents=True, exist_ok=True)
    synthetic = label != "flickr8k"
    nq_all = len(real["qids"])
    rng = np.random.default_rng(args.seed)
    if synthetic:
        n = int(label)
        sfile, stats = (write_synthetic(real, n, base / "data", args.seed, args.reuse)
                        if "sparse" in args.engines else (None, {}))
        dfiles = {kind: write_synthetic_dense(real, n, base / "data", kind, args.seed, args.reuse)
                  for kind in args.dense_synthetic} if "dense" in args.engines else {}
        order = rng.permutation(nq_all)[:args.synthetic_queries]
        qrels = None
    else:
        sfile = args.sparse_dir / f"{args.split}-images.h5"
        dfiles = {"real": args.dense_dir / f"{args.split}-images.h5"} if "dense" in args.engines else {}
        stats = {}
        order = rng.permutation(nq_all)[:args.queries] if args.queries else rng.permutation(nq_all)
        qrels = real["qrels"]
        args = argparse.Namespace(**{**vars(args), "budget_s": 0.0})  # R@k over every query
    if "sparse" in args.engines:
        stats["real"] = collection_stats(real["docs"].matrix, real["qe"])
        stats["real_no_exp"] = collection_stats(real["docs"].matrix, real["qc"])
    ks = sorted(args.ks)
    kmax = ks[-1]
    rows: list[dict] = []
    qids = real["qids"]

    def add(engine, mode, k, lat, res, exact, doc_ids, build_s, nbytes, ndocs, ppq=None):
        row = {"scale": label, "engine": engine, "mode": mode, "docs": ndocs, "k": k, **timing_row(lat),
               **quality(res, k, exact, qids, doc_ids, qrels), "build_s": build_s, "index_bytes": nbytes,
               "bytes_per_doc": round(nbytes / ndocs, 1) if nbytes else None, "postings_per_query": ppq}
        rows.append(row)
        log(f"  {label:>8} {engine:<11} {mode:<16} k={k:<5} n={row['queries']:<5} {row['mean_ms']:9.3f} ms "
            f"p99 {row['p99_ms']:9.3f}  overlap {row['overlap']}  R@10 {row['R@10']}")

    def build(kind, path, fn):
        meta_file = path / "mmsparse.json"
        if args.reuse and meta_file.is_file():
            return json.loads(meta_file.read_text())
        log(f"  building {kind} -> {path}")
        return fn()

    idx = base / "index"
    bt = args.build_threads

    import h5py

    with h5py.File(sfile or next(iter(dfiles.values())), "r") as f:
        ndocs = int(f["ids"].shape[0])
    if "sparse" in args.engines:
        stats["build_settings"] = sparse_rows(sfile, synthetic, order, ks, real, args, idx, add, build, log)

    # ---- dense: one Flat + HNSW pair per dense collection
    from ..formats.dense import read_dense, read_dense_attrs

    dq = real["dq"]
    for kind, dfile in dfiles.items():
        tag = "" if kind in ("real", "random") else f" [{kind}]"
        dense_ids = read_dense(dfile).ids if not synthetic else None
        flat_dir, hnsw_dir = idx / f"flat-{kind}", idx / f"hnsw-{kind}"
        fmeta = build("faiss-flat", flat_dir, lambda: build_faiss_index(dfile, flat_dir, threads=bt))
        fs = FaissSearcher(flat_dir, threads=bt)
        _, exact_rows = fs.index.search(dq[order], min(kmax, fs.index.ntotal))  # exact, untimed, all threads
        exact_d = {int(i): r[r >= 0].astype(np.int64) for i, r in zip(order, exact_rows)}
        faiss.omp_set_num_threads(1)
        for k in ks:
            lat, res = measure(lambda i, k: fs.search_one(dq[i], k)[0], order, k, args.warmup, args.budget_s,
                               args.min_queries)
            add("faiss-flat", "exact" + tag, k, lat, res, exact_d, dense_ids, fmeta["build_seconds"],
                index_bytes(flat_dir, "faiss"), ndocs)
        ndocs = fs.index.ntotal
        del fs
        gc.collect()
        stats.setdefault("build_settings", {})["faiss_flat"] = fmeta["settings"]
        stats["dense_dim"] = int(read_dense_attrs(dfile)["dim"])
        if kind == "random" and args.hnsw_max_docs and ndocs > args.hnsw_max_docs:
            log(f"  faiss-hnsw skipped: {ndocs} documents > --hnsw-max-docs {args.hnsw_max_docs}")
            stats["hnsw_skipped"] = f"{ndocs} documents > --hnsw-max-docs {args.hnsw_max_docs}"
            continue
        hmeta = build("faiss-hnsw", hnsw_dir, lambda: build_faiss_index(
            dfile, hnsw_dir, hnsw=True, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, threads=bt))
        hs = FaissSearcher(hnsw_dir, threads=1)
        faiss.omp_set_num_threads(1)
        for ef in sorted(set(args.ef_search) | set(args.ef_sweep)):
            hs.index.hnsw.efSearch = ef
            for k in (ks if ef in args.ef_search else [ks[0]]):
                lat, res = measure(lambda i, k: hs.search_one(dq[i], k)[0], order, k, args.warmup,
                                   args.budget_s, args.min_queries)
                add("faiss-hnsw", f"ef={ef}{tag}", k, lat, res, exact_d, dense_ids, hmeta["build_seconds"],
                    index_bytes(hnsw_dir, "faiss"), ndocs)
        del hs
        gc.collect()
        stats["build_settings"]["faiss_hnsw"] = hmeta["settings"]
    stats["timed_queries"] = int(len(order))
    return rows, stats


# ---------------------------------------------------------------- report

def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "arch": platform.machine(), "python": platform.python_version(),
            "load_avg_start": os.getloadavg()}


COLUMNS = ("engine", "mode", "docs", "k", "queries", "qps", "mean_ms", "p50_ms", "p99_ms", "R@1", "R@10", "RR@10",
           "overlap", "build_s", "bytes_per_doc", "postings_per_query")


def markdown(rows: list[dict]) -> str:
    """One markdown table per scale."""
    out = []
    for scale in dict.fromkeys(r["scale"] for r in rows):
        out.append(f"\n### {scale}\n\n| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
        for r in (r for r in rows if r["scale"] == scale):
            out.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(out) + "\n"


SPARSE_ENGINES = ("pisa", "two-stage", "seismic")


def goals(rows: list[dict], goal_scale: str = "123000") -> dict:
    """Issue 5's goals from the rows.

    two_stage: per scale with qrels, R@10 of each two-stage row (k=10) minus exhaustive R@10
    (goal: >= -1 point). latency: at `goal_scale`, the fastest sparse row (k=10) with overlap
    >= 0.95 vs the fastest HNSW row (k=10) with overlap >= 0.95, ratio of mean latencies
    (goal: <= 3); None where no row qualifies.
    """
    out: dict = {"two_stage": {}, "latency": None}
    for scale in dict.fromkeys(r["scale"] for r in rows):
        ex = [r for r in rows if r["scale"] == scale and r["engine"] == "exhaustive" and r["k"] == 10]
        if ex and ex[0]["R@10"] is not None:
            out["two_stage"][scale] = {r["mode"]: round(r["R@10"] - ex[0]["R@10"], 2) for r in rows
                                       if r["scale"] == scale and r["engine"] == "two-stage" and r["k"] == 10}
    at = [r for r in rows if r["scale"] == goal_scale and r["k"] == 10 and (r["overlap"] or 0) >= 0.95]
    sparse = min((r for r in at if r["engine"] in SPARSE_ENGINES), key=lambda r: r["mean_ms"], default=None)
    dense = min((r for r in at if r["engine"] == "faiss-hnsw"), key=lambda r: r["mean_ms"], default=None)
    if sparse or dense:
        out["latency"] = {"scale": goal_scale,
                          "sparse": sparse and f"{sparse['engine']} {sparse['mode']}",
                          "sparse_ms": sparse and sparse["mean_ms"], "sparse_overlap": sparse and sparse["overlap"],
                          "hnsw": dense and dense["mode"], "hnsw_ms": dense and dense["mean_ms"],
                          "hnsw_overlap": dense and dense["overlap"],
                          "ratio": round(sparse["mean_ms"] / dense["mean_ms"], 2) if sparse and dense else None}
    return out


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _pairs(s: str) -> list[tuple[int, float]]:
    return [(int(a), float(b)) for a, b in (x.split(":") for x in s.split(",") if x)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.search", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="workspace (the Flickr8k example's WORK)")
    p.add_argument("-o", "--out", type=Path, default=None, help="rows JSON (default: WORK/bench/search.json)")
    p.add_argument("--head", default="d2s", help="sparse head name under WORK/sparse/")
    p.add_argument("--backbone", default="hf-dual", help="dense backbone name under WORK/dense/")
    p.add_argument("--split", default="test", help="split searched")
    p.add_argument("--sparse-dir", type=Path, default=None, help="sparse files (default: WORK/sparse/HEAD)")
    p.add_argument("--dense-dir", type=Path, default=None, help="dense files + qrels (default: WORK/dense/BACKBONE)")
    p.add_argument("--scales", default="flickr8k,123000,1000000",
                   help="comma list: flickr8k (real) and/or synthetic document counts")
    p.add_argument("--ks", type=_ints, default=[10, 100, 1000], help="cut-offs k")
    p.add_argument("--queries", type=int, default=0, help="real scale: queries timed (0 = all)")
    p.add_argument("--synthetic-queries", type=int, default=200, help="synthetic scales: queries timed (a seeded "
                   "sample of the real queries)")
    p.add_argument("--warmup", type=int, default=20, help="untimed warm-up queries per configuration")
    p.add_argument("--budget-s", type=float, default=10.0, help="seconds per configuration and k; 0 = no limit "
                   "(real scale always runs every query)")
    p.add_argument("--min-queries", type=int, default=30, help="queries timed at least, whatever the budget")
    p.add_argument("--build-threads", type=int, default=2, help="threads for index builds (queries use 1)")
    p.add_argument("--hnsw-m", type=int, default=32, help="Faiss HNSW M")
    p.add_argument("--ef-construction", type=int, default=40, help="Faiss HNSW efConstruction")
    p.add_argument("--ef-search", type=_ints, default=[32, 128, 512], help="HNSW efSearch values run at every k "
                   "(max(efSearch, k) is used)")
    p.add_argument("--ef-sweep", type=_ints, default=[16, 64, 256, 1024, 2048], help="more efSearch values, "
                   "run at the smallest k only (the overlap/latency frontier)")
    p.add_argument("--candidates", type=_ints, default=[100, 1000], help="two-stage first-stage candidates")
    p.add_argument("--query-top-n", type=_ints, default=[10, 20, 40], help="PISA exp with queries pruned to top-N")
    p.add_argument("--seismic", type=_pairs, default=[(10, 0.7), (5, 0.9), (20, 0.9), (40, 1.0)],
                   help="Seismic query_cut:heap_factor pairs; the first at every k, the others at the smallest")
    p.add_argument("--seismic-postings", type=int, default=4000, help="Seismic n_postings at build")
    p.add_argument("--engines", type=lambda x: x.split(","), default=["sparse", "dense"],
                   help="comma list of sparse, dense")
    p.add_argument("--dense-synthetic", type=lambda x: x.split(","), default=["random", "gaussian"],
                   help="synthetic dense documents: random (unit vectors) and/or gaussian (fitted to the real "
                   "image vectors); rows of kinds other than random carry the kind in their mode")
    p.add_argument("--hnsw-max-docs", type=int, default=200_000, help="skip HNSW over random unit vectors above this "
                   "many documents (0 = never): slow to build and far from exact there")
    p.add_argument("--seed", type=int, default=0, help="seed of the query sample and synthetic collections")
    p.add_argument("--merge", action="store_true", help="keep rows of other scales already in OUT (run scales "
                   "one at a time)")
    p.add_argument("--reuse", action="store_true", help="reuse synthetic collections and indexes in WORK/bench/")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out = args.out or args.work / "bench" / "search.json"
    args.sparse_dir = args.sparse_dir or args.work / "sparse" / args.head
    args.dense_dir = args.dense_dir or args.work / "dense" / args.backbone
    import faiss

    faiss.omp_set_num_threads(1)
    import sys

    if "torch" in sys.modules:  # only if something imported it: keep it to one thread too
        sys.modules["torch"].set_num_threads(1)

    def log(msg):
        print(msg, flush=True)

    info = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    real = load_inputs(args.sparse_dir, args.dense_dir, args.head, args.backbone, args.split,
                       sparse="sparse" in args.engines)
    labels = args.scales.split(",")
    meta_out = args.out.with_suffix(".meta.json")
    rows, scales = [], {}
    if args.merge and args.out.is_file():  # keep the other scales' rows from an earlier run
        rows = [r for r in json.loads(args.out.read_text()) if r["scale"] not in labels]
        if meta_out.is_file():
            old = json.loads(meta_out.read_text())
            scales = {k: v for k, v in old.get("scales", {}).items() if k not in labels}
            info["earlier_runs"] = old.get("earlier_runs", []) + [
                {k: old.get(k) for k in ("started", "finished", "machine") if k in old}]
    for label in labels:
        r, st = run_scale(label, real, args, log)
        rows.extend(r)
        st["run_started"] = info["started"]
        scales[label] = st
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))  # partial results survive a later failure
    info["scales"] = scales
    info["goals"] = goals(rows)
    info["machine"]["load_avg_end"] = os.getloadavg()
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    meta_out.write_text(json.dumps(info, indent=1))
    md = markdown(rows) + "\n### goals\n\n```\n" + json.dumps(info["goals"], indent=1) + "\n```\n"
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
