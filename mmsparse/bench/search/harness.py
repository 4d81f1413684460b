"""The harness every engine's job of the search benchmark runs in: exact top-k and quality
figures, timing, one scale's context (Scale), the rows a job measures (Rows), saved job results and
exact references, indexes built once per collection file, and the child processes jobs and builds
run in (so each one's peak RSS is its own)."""

from __future__ import annotations

import gc
import json
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ...errors import InputError, require_file


# ---------------------------------------------------------------- exact top-k and quality

def _top(rows: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k largest scores, by decreasing score then increasing row (ties at the k-th
    score are broken by row too, so any k gives a prefix of the same ranking)."""
    if len(rows) > k:
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        keep = scores >= kth
        rows, scores = rows[keep], scores[keep]
    return rows[np.lexsort((rows, -scores))][:k].astype(np.int64)


def exact_sparse(docs: sp.csr_matrix, queries: sp.csr_matrix, k: int, chunk: int = 64,
                 inv: sp.csr_matrix | None = None) -> list[np.ndarray]:
    """Exhaustive float top-k of every query row: <q, d> over docs, documents with score > 0.

    docs: CSR [N, |V|]; queries: CSR [nq, |V|]. Returns nq arrays of doc rows (int64, <= k) by
    decreasing score then increasing row. Memory O(nnz(docs) + chunk x N).
    """
    inv = docs.T.tocsr() if inv is None else inv
    out = []
    for s in range(0, queries.shape[0], chunk):
        sc = (queries[s:s + chunk] @ inv).tocsr()
        for j in range(sc.shape[0]):
            a, b = sc.indptr[j], sc.indptr[j + 1]
            out.append(_top(sc.indices[a:b], sc.data[a:b], k))
    return out


def exact_dense(docs: np.ndarray, queries: np.ndarray, k: int) -> list[np.ndarray]:
    """Exact inner-product top-k by numpy (for tests): rows by decreasing score, ties by row."""
    s = queries @ docs.T
    return [_top(np.arange(docs.shape[0]), r, k) for r in s]


def overlap(got: list[np.ndarray], exact: list[np.ndarray], k: int) -> float | None:
    """Mean over queries with a non-empty exact list of |got[:k] ∩ exact[:k]| / min(k, |exact|)."""
    ov = [len(set(g[:k].tolist()) & set(e[:k].tolist())) / min(k, len(e)) for g, e in zip(got, exact) if len(e)]
    return round(float(np.mean(ov)), 4) if ov else None


def scene(doc_id: str) -> str | None:
    """The image a document shows: an original's own id, a single view's source image
    ("<image>#v<j>" -> image), None for a two-image collage ("<a>+<b>#c<j>")."""
    a = doc_id.split("#", 1)[0]
    return None if "+" in a else a


def recall(got: list[np.ndarray], qids: list[str], doc_ids: list[str], qrels: dict) -> dict:
    """R@1, R@10, RR@10 (x100) of result rows against qrels (queries without relevant docs skipped),
    and S@10: the share of queries whose top 10 holds the relevant image or a single view of it
    (the scene found; views are distractors for R@k, so S@10 = R@10 on a collection without views)."""
    r1, r10, rr, s10 = [], [], [], []
    for rows, q in zip(got, qids):
        rel = {d for d, g in qrels.get(q, {}).items() if g > 0}
        if not rel:
            continue
        top = [doc_ids[r] for r in rows[:10]]
        hits = [d in rel for d in top]
        r1.append(sum(hits[:1]) / len(rel))
        r10.append(sum(hits) / len(rel))
        rr.append(next((1.0 / (j + 1) for j, h in enumerate(hits) if h), 0.0))
        s10.append(any(scene(d) in rel for d in top))
    if not r1:
        return {"R@1": None, "R@10": None, "RR@10": None, "S@10": None}
    return {"R@1": round(100 * float(np.mean(r1)), 2), "R@10": round(100 * float(np.mean(r10)), 2),
            "RR@10": round(100 * float(np.mean(rr)), 2), "S@10": round(100 * float(np.mean(s10)), 2)}


def postings_per_query(df: np.ndarray, q: sp.csr_matrix) -> float:
    """Mean over query rows of sum of df over the row's terms (postings exhaustive scoring touches)."""
    return round(float(np.asarray(q.astype(bool).astype(np.float64) @ df.astype(np.float64)).mean()), 1)


# ---------------------------------------------------------------- timing

def peak_rss_mb() -> float:
    """This process's peak resident memory, MB (Linux ru_maxrss is in KB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def time_queries(fn, n: int, k: int, warm, warmup: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """fn(j, k) -> doc rows for sample query j = 0..n-1, one at a time (1 thread).

    warm(k) runs `warmup` untimed queries first. Returns (seconds per query [n], results).
    The garbage collector is off while timing (memory is freed by reference counting anyway).
    """
    warm(k)
    lat, res = np.empty(n), []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for j in range(n):
            t0 = time.perf_counter()
            rows = fn(j, k)
            lat[j] = time.perf_counter() - t0
            res.append(np.asarray(rows, dtype=np.int64))
    finally:
        if enabled:
            gc.enable()
    return lat, res


def time_batch(batch, n: int, k: int) -> float | None:
    """Queries per second of batch(k) (all n sample queries, the engine's 2-thread call)."""
    if batch is None:
        return None
    t0 = time.perf_counter()
    batch(k)
    return round(n / (time.perf_counter() - t0), 1)


def pool_batch(fn, n: int, threads: int = 2):
    """A batch(k) running fn(j, k) for every j on a pool of `threads` Python threads."""
    from concurrent.futures import ThreadPoolExecutor

    def batch(k):
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda j: fn(j, k), range(n)))
    return batch


# ---------------------------------------------------------------- one scale's context (picklable)

# how rows name a query mode in their `mode` column (PISA: "exp maxscore", "if maxscore")
MODE_LABEL = {"expand": "exp", "caption-terms": "no-exp", "inference-free": "if"}


def mode_label(mode: str) -> str:
    """The short name of a query mode in rows' `mode` column (the mode itself when it has none)."""
    return MODE_LABEL.get(mode, mode)


@dataclass
class Scale:
    """What every job of one scale needs, for one head (its sparse documents and queries) or for
    the dense side (head None: Faiss jobs, dense end-to-end rows). Paths, not arrays, so a job
    process loads its own."""

    label: str
    out: Path                   # this job's results: OUT/HEAD/SCALE, or OUT/dense/SCALE (head None)
    sparse_docs: Path | None
    dense_docs: Path | None
    queries: dict               # the head's query mode -> sparse query file; first = the primary mode
                                # (the exhaustive reference); {} on the dense side
    dq: Path                    # dense captions (vectors, texts): the sample's rows index this file
    qrels: Path | None
    sample: np.ndarray          # rows of dq timed, fixed, the same for every head and the dense side
    warm: np.ndarray            # untimed warm-up rows of dq (outside the sample when possible)
    ks: list[int]
    settings: dict = field(default_factory=dict)
    synthetic: bool = False
    dense_kinds: dict = field(default_factory=dict)  # synthetic: kind -> dense docs path
    head: str | None = None     # head name (WORK/sparse/HEAD); None: the dense side
    head_dir: Path | None = None    # WORK/heads/HEAD (end-to-end encoders)
    dense_out: Path | None = None   # OUT/dense/SCALE: dense exact references and results

    @property
    def primary(self) -> str | None:
        """The head's primary query mode (its exhaustive ranking is the sparse reference)."""
        return next(iter(self.queries), None)


def dense_side(sc: Scale) -> Scale:
    """The dense side of a head's scale (same sample, documents and settings; out = dense_out)."""
    from dataclasses import replace

    return replace(sc, out=sc.dense_out, sparse_docs=None, queries={}, head=None, head_dir=None)


def load_queries(sc: Scale) -> dict:
    """The sample's queries. Keys: qids, dq / dq_warm (dense [n, d] float32), texts / texts_warm
    (the captions, None when the file has none), and for a head: modes (its query modes, primary
    first), q / q_warm (mode -> CSR rows of the sample / warm-up), main / main_warm (the primary
    mode's), vocab. Every query file is read in the order of the dense captions' ids; InputError
    when one lacks a sampled id or the files have different vocabularies."""
    from ...formats.dense import read_dense
    from ...formats.sparse import read_sparse

    dq = read_dense(require_file(sc.dq, "dense queries"))
    ids = dq.ids
    out: dict = {"qids": [ids[i] for i in sc.sample],
                 "dq": np.ascontiguousarray(dq.vectors[sc.sample], dtype=np.float32),
                 "dq_warm": np.ascontiguousarray(dq.vectors[sc.warm], dtype=np.float32),
                 "texts": [dq.texts[i] for i in sc.sample] if dq.texts is not None else None,
                 "texts_warm": [dq.texts[i] for i in sc.warm] if dq.texts is not None else None,
                 "modes": list(sc.queries), "q": {}, "q_warm": {}}
    for mode, path in sc.queries.items():
        f = read_sparse(require_file(path, f"{mode} sparse queries"))
        if "vocab" in out and f.vocab != out["vocab"]:
            raise InputError(f"{path}: its vocabulary differs from {sc.queries[sc.primary]}'s; sparsify every "
                             "query file of a head with that head")
        out.setdefault("vocab", f.vocab)
        pos = {q: i for i, q in enumerate(f.ids)}
        missing = [ids[i] for i in np.concatenate([sc.sample, sc.warm]) if ids[i] not in pos]
        if missing:
            raise InputError(f"query id {missing[0]!r} of {sc.dq} is missing from {path}; every query file must "
                             "hold the dense captions' ids")
        out["q"][mode] = f.matrix[[pos[ids[i]] for i in sc.sample]]
        out["q_warm"][mode] = f.matrix[[pos[ids[i]] for i in sc.warm]]
    if sc.queries:
        out["main"], out["main_warm"] = out["q"][sc.primary], out["q_warm"][sc.primary]
    return out


def _qrels(sc: Scale):
    from ...formats.trec import read_qrels

    return read_qrels(sc.qrels) if sc.qrels is not None else None


class Rows:
    """Collects rows of one job: timing + quality of each configuration."""

    def __init__(self, sc: Scale, q: dict, doc_ids: list[str] | None, ndocs: int, exact: list | None):
        self.sc, self.q, self.doc_ids, self.ndocs, self.exact = sc, q, doc_ids, ndocs, exact
        self.qrels = _qrels(sc) if not sc.synthetic else None
        self.rows: list[dict] = []

    def run(self, engine: str, mode: str, k: int, fn, warm, batch=None, query_mode: str | None = None,
            split: dict | None = None, **extra) -> dict:
        """Time fn over the sample (time_queries) and add its row. query_mode: the queries searched
        (default: the head's primary mode; "dense" on the dense side). split: name -> seconds [n]
        that fn fills per query (e.g. "encode"); the row gets NAME_p50_ms / NAME_mean_ms for each
        and search_p50_ms / search_mean_ms for the rest of the time."""
        n = len(self.sc.sample)
        lat, res = time_queries(fn, n, k, warm, self.sc.settings["warmup"])
        ms = lat * 1000

        def pct(x, p):
            return round(float(np.percentile(x, p)), 3)
        row = {"scale": self.sc.label, "head": self.sc.head,
               "query_mode": query_mode or self.sc.primary or "dense", "engine": engine, "mode": mode,
               "docs": self.ndocs, "k": k, "queries": n, "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90),
               "p99_ms": pct(ms, 99), "mean_ms": round(float(ms.mean()), 3),
               "qps_1t": round(1000 / float(ms.mean()), 1), "qps_2t": time_batch(batch, n, k)}
        if split:
            rest = ms.copy()
            for name, sec in split.items():
                part = np.asarray(sec) * 1000
                rest -= part
                row.update({f"{name}_p50_ms": pct(part, 50), f"{name}_mean_ms": round(float(part.mean()), 3)})
            row.update({"search_p50_ms": pct(rest, 50), "search_mean_ms": round(float(rest.mean()), 3)})
        if self.exact is not None:
            row["overlap@10"] = overlap(res, self.exact, 10)
            row[f"overlap@k"] = overlap(res, self.exact, k)
        row.update(recall(res, self.q["qids"], self.doc_ids, self.qrels) if self.qrels is not None
                   and self.doc_ids is not None else {"R@1": None, "R@10": None, "RR@10": None, "S@10": None})
        row.update(extra)
        self.rows.append(row)
        print(f"  {self.sc.label:>8} {self.sc.head or 'dense':<6} {engine:<11} {mode:<28} k={k:<4} "
              f"p50 {row['p50_ms']:9.3f} ms  p99 {row['p99_ms']:9.3f}  qps2 {row['qps_2t']}  "
              f"ov@10 {row.get('overlap@10')}  R@10 {row.get('R@10')}", flush=True)
        return row


# ---------------------------------------------------------------- what a job reads and saves

def collection_stamp(sc: Scale) -> list:
    """The documents a scale's rows were measured on: _source_stamp of its sparse and dense files."""
    return _source_stamp(*[x for x in (sc.sparse_docs, sc.dense_docs) if x is not None and Path(x).is_file()])


def _save(sc: Scale, job: str, rows: list[dict], info: dict) -> dict:
    info = {**info, "rss_mb": peak_rss_mb(), "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "collection": collection_stamp(sc)}
    for r in rows:
        r.setdefault("rss_mb", info["rss_mb"])
    sc.out.mkdir(parents=True, exist_ok=True)
    tag = sc.settings.get("tag")
    (sc.out / (f"{job}-{tag}.json" if tag else f"{job}.json")).write_text(json.dumps({"rows": rows, "info": info},
                                                                                    indent=1))
    return {"rows": rows, "info": info}


def saved_rows(sc: Scale, skip: tuple[str, ...] = ()) -> list[dict]:
    """The rows of the jobs saved in sc.out (JOB.json, JOB-TAG.json) that were measured on the
    scale's current collection, without the files whose name starts with one of `skip`."""
    rows, stamp = [], collection_stamp(sc)
    for f in sorted(sc.out.glob("*.json")) if sc.out.is_dir() else []:
        if f.stem.startswith(skip):
            continue
        d = json.loads(f.read_text())
        if isinstance(d, dict) and d.get("info", {}).get("collection") == stamp:
            rows += d["rows"]
    return rows


def _exact_dir(sc: Scale, kind: str) -> Path:
    """Where the exact top-k of `kind` lives: dense kinds on the dense side (one for every head)."""
    return sc.dense_out if kind.startswith("dense") and sc.dense_out is not None else sc.out


def _read_exact(sc: Scale, kind: str) -> list[np.ndarray]:
    f = np.load(require_file(_exact_dir(sc, kind) / f"exact-{kind}.npz", f"exact {kind} top-k (run the exhaustive / "
                                                                f"faiss-flat job of this scale first)"))
    return [r[r >= 0] for r in f["rows"]]


def _save_exact(sc: Scale, kind: str, exact: list[np.ndarray], kmax: int) -> None:
    a = np.full((len(exact), kmax), -1, dtype=np.int64)
    for i, r in enumerate(exact):
        a[i, :len(r)] = r[:kmax]
    d = _exact_dir(sc, kind)
    d.mkdir(parents=True, exist_ok=True)
    np.savez(d / f"exact-{kind}.npz", rows=a, sample=sc.sample)


def _sparse_docs(sc: Scale):
    from ...formats.sparse import read_sparse

    d = read_sparse(require_file(sc.sparse_docs, "sparse documents"))
    return d.matrix, (None if sc.synthetic else d.ids), d.vocab


def _dense_ids(path: Path) -> list[str]:
    import h5py

    from ...formats._h5 import read_strings

    with h5py.File(path, "r") as f:
        return read_strings(f["ids"])


def _sparse_job_inputs(sc: Scale):
    """What every sparse engine's job reads: the queries, the documents' CSR matrix [N, |V|] and
    ids, the exhaustive top-k of the same vectors (the overlap reference) and the document
    frequency of every term (for postings touched per query)."""
    q = load_queries(sc)
    D, doc_ids, _ = _sparse_docs(sc)
    return q, D, doc_ids, _read_exact(sc, "sparse"), np.bincount(D.indices, minlength=D.shape[1])


def lean_job_inputs(sc: Scale) -> tuple[dict, np.ndarray, "Rows"]:
    """(queries, document frequencies, an empty Rows) of a sparse job whose engine keeps its own
    copy of the documents: the CSR matrix is dropped before the engine loads, to keep the peak RSS
    the engine's (rows.ndocs holds the document count)."""
    q, D, doc_ids, exact, df = _sparse_job_inputs(sc)
    rows = Rows(sc, q, doc_ids, D.shape[0], exact)
    del D
    gc.collect()
    return q, df, rows


def _row_fn(searcher, q: sp.csr_matrix):
    def f(j, k):
        s, e = q.indptr[j], q.indptr[j + 1]
        return searcher.search_one(q.indices[s:e], q.data[s:e], k)[0]
    return f


def _warm_fn(fn_factory, qwarm, n):
    f = fn_factory(qwarm)

    def warm(k):
        for j in range(n):
            f(j, k)
    return warm


# ---------------------------------------------------------------- indexes (built once per collection file)

def _source_stamp(*sources: Path) -> list:
    """What identifies the files an index was built from: path, size and modification time."""
    return [[str(Path(x).resolve()), st.st_size, st.st_mtime_ns] for x in sources for st in [Path(x).stat()]]


def _cached_index(sc: Scale, name: str, build, sources: list[Path], kwargs: dict) -> tuple[Path, dict, float | None]:
    """The index `name` of this scale built by build(sources[0], dir, **kwargs) in a child process, or the one already there when --reuse is on and it was built
    from these very source files (a collection rebuilt since, e.g. after a top-up of views, must
    not be served by the old index). Returns (dir, meta, build peak RSS MB)."""
    d = sc.out.parent / "index" / sc.label / name
    f = d / "mmsparse.json"
    if sc.settings["reuse"] and f.is_file():
        meta = json.loads(f.read_text())
        if meta.get("bench_sources") == _source_stamp(*sources):
            return d, meta, meta.get("bench_build_rss_mb")
    meta, rss = in_child(_build_and_rss, build, sources[0], d, kwargs)
    m = json.loads(f.read_text())
    m["bench_build_rss_mb"] = rss
    m["bench_sources"] = _source_stamp(*sources)
    f.write_text(json.dumps(m, indent=2))
    return d, meta, rss


def _build_and_rss(fn, src, dst, kwargs):
    meta = fn(src, dst, **kwargs)
    return meta, peak_rss_mb()


def index_bytes(index_dir: Path, kind: str, with_forward: bool = False) -> int:
    """Bytes of the files a search reads: PISA compressed index + block-max data + lexicons
    (+ forward.h5 for two-stage re-scoring); Seismic its index file (it embeds the forward
    vectors, and the k-NN graph when built); BMP bmp.index (inverted lists' block maxima and the
    block-wise forward index) + bmp.terms.npz + bmp.exact/ (what its exact completion reads); kANNolo kannolo.index (vectors and graph); Faiss faiss.index."""
    def size(ps):
        return int(sum(p.stat().st_size for p in ps if p.is_file()))
    if kind == "pisa":
        p = index_dir / "pisa"
        n = size(list(p.glob("quantized.*")) + [p / "fwd.termlex", p / "fwd.doclex"])
        return n + (size([index_dir / "forward.h5"]) if with_forward else 0)
    if kind == "seismic":
        return size(index_dir.glob("*.index.seismic"))
    if kind == "bmp":   # + the block maxima, integer vectors and top rows of mmsparse's completion
        return size([index_dir / "bmp.index", index_dir / "bmp.terms.npz", *(index_dir / "bmp.exact").glob("*.npy")])
    if kind == "kannolo":
        return size([index_dir / f"{kind}.index"])
    return size([index_dir / "faiss.index"])


# ---------------------------------------------------------------- child processes

def _exit_with_parent(parent: int) -> None:
    """Pool initializer: end this process within a second of its parent's death. A benchmark
    stopped by a signal would otherwise leave its job and build processes running, orphaned,
    and their load would skew every later timing on the machine."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def in_child(fn, *args):
    """Run fn(*args) in a fresh (spawned) process and return its result; errors propagate. The
    child (and, level by level, its own children) ends when this process dies."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=_exit_with_parent,
                             initargs=(os.getpid(),)) as ex:
        return ex.submit(fn, *args).result()
