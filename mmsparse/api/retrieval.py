"""`search`: top-k retrieval of a query file against an index directory, written as a TREC run.

Query files are sparse or dense HDF5; for the index of an inference-free head also query text
(.tsv id<TAB>text, .txt one per line: mmsparse.formats.queries), encoded on the fly by the
head's term-weight table, with no model: the rows `sparsify` writes for the same file."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter

# Query attributes that must match the indexed documents' (dense: same backbone and model;
# sparse: also the same head), and that the run's sidecar keeps for `eval`.
MATCH_KEYS = ("backbone", "model", "head", "dataset", "split")
RUN_KEYS = ("modality", "backbone", "model", "model_fingerprint", "head", "method", "query_mode", "dataset", "split")
MODES = ("single", "two-stage", "sparse", "dense", "hybrid")


@provenance.recorded("index_dir", "queries", "first_stage", "rerank_dense", "dense_queries")
def search(index_dir: str | Path, queries: str | Path, *, out: str | Path, k: int = 1000, threads: int = 1,
           batch_size: int = 1000, tag: str = "", mode: str = "single", query_top_n: int = 0,
           min_weight: float = 0.0, force: bool = False, first_stage: str | Path | None = None,
           candidates: int = 1000, query_algorithm: str = "", query_bits: int = 8, heap_factor: float = 0.7,
           query_cut: int = 10, n_knn: int | None = None, bmp_alpha: float = 1.0, bmp_beta: float = 1.0,
           ef_search: int = 0, early_exit_threshold: float | None = None, dense_queries: str | Path | None = None, fusion: str = "rrf",
           rrf_k: int = 60, sparse_weight: float = 0.5, dense_weight: float = 0.5,
           milvus_drop_ratio_search: float = 0.0, token: str = "", timeout: float = 30.0,
           exclude_self: bool = False, rerank_dense: Sequence[str | Path] | None = None, rerank_k: int = 100,
           head: str | Path | None = None, allow_dense: bool = False, progress: Reporter | None = None) -> Path:
    """Search `queries` (sparse or dense HDF5) against `index_dir` and write the top `k` per query
    to the TREC run `out` (plus its provenance sidecar OUT.meta.json); returns `out`.

    Text queries: for an index whose documents an inference-free head made (PISA, Seismic, or
    Milvus with a sparse field), `queries` may be a .tsv (id<TAB>text) or .txt (one per line,
    ids = line numbers) file, encoded by that head's term-weight table (the head the index's
    provenance records, or `head`), no model loaded; they rank as `sparsify` + `search` of the
    same file. Other indexes refuse text (encode it with encode-dense + sparsify).

    Scores are inner products: sparse <q, d> = sum_t q_t d_t (PISA: from integer-quantised
    weights divided back by the scales; Seismic, Milvus: float weights) or dense <q, d>.
    mode: single (the index's own kind: sparse queries for PISA/Seismic, dense for Faiss; for
    Milvus sparse or dense by the query file), two-stage (PISA/Seismic: the index over the
    `first_stage` queries for `candidates` documents, re-scored exactly with the full
    queries), or for a Milvus index sparse | dense | hybrid (sparse QUERIES fused with
    `dense_queries` by `fusion`: rrf with constant rrf_k, or weighted with sparse_weight and
    dense_weight; each route fetches `candidates`). query_top_n / min_weight prune sparse
    queries first (largest weights kept), for every engine. query_algorithm / query_bits: PISA;
    heap_factor / query_cut: Seismic (a block is skipped when its summary scores below heap_factor
    x the k-th score so far: above 1 skips more, faster, less exact; n_knn: neighbours of each
    result from the index's k-NN graph, None: the index's default); bmp_alpha / bmp_beta: BMP
    (blocks scored while alpha x their bound beats the k-th score; the share of query terms kept);
    ef_search: HNSW beam (Faiss, kANNolo, Milvus); early_exit_threshold: kANNolo's early exit of
    the graph search (None: the index's); milvus_drop_ratio_search:
    fraction of each sparse query's smallest weights Milvus ignores; token: Milvus server token;
    timeout: seconds to connect to Milvus and for each Milvus call.
    exclude_self drops each query's own id (image-to-image); rerank_dense reranks the first
    rerank_k results by dense cosine (BM25-V two-stage). force turns query/index mismatches
    into warnings. batch_size: queries per search call (progress granularity).

    Queries with empty sparse vectors get no results and are counted in the summary. Near-dense
    sparse queries or documents (over 10 % of the vocabulary per vector: a head not sparse yet) get
    a warning line with the postings the search will walk, unless allow_dense. Raises InputError
    for bad input or options (nothing is written then).
    """
    from ..formats.queries import query_file_kind
    from ..indexes.meta import SPARSE_KINDS, hdf5_format, read_meta

    rep = reporter(progress)
    index_dir, queries, out = Path(index_dir), Path(queries), Path(out)
    meta = read_meta(index_dir)
    kind = meta["kind"]
    text = None   # text queries, encoded by the head's table (a SparseCollection)
    if query_file_kind(queries, "query file") == "hdf5":
        if head is not None:
            raise InputError("--head applies to text QUERIES (.tsv or .txt, encoded by an inference-free head's "
                             f"table); {queries} is HDF5")
        fmt = hdf5_format(queries, "query HDF5")
    else:
        text, fmt = _text_queries(index_dir, queries, head, rep), "sparse"
    if mode not in MODES:
        raise InputError(f"--mode {mode!r} unknown; choose single or two-stage (pisa, seismic, bmp, kannolo; single "
                         "for faiss), or sparse, "
                         "dense or hybrid (milvus)")
    if mode != "two-stage" and first_stage is not None:
        raise InputError("--first-stage is only used with --mode two-stage")
    if kind == "milvus":
        route = _milvus_route(mode, fmt, queries, dense_queries, index_dir)
        need = {"sparse": ["sparse"], "dense": ["dense"], "hybrid": ["sparse", "dense"]}[route]
        if any(f not in meta.get("fields", []) for f in need):
            raise InputError(f"{index_dir}: the collection holds {' and '.join(meta.get('fields', []))} vectors only; "
                             f"--mode {route} needs {' and '.join(need)} (index a sparse INPUT, with --dense DENSE.h5 "
                             "for dense and hybrid search)")
    else:
        if mode in ("sparse", "dense", "hybrid"):
            raise InputError(f"--mode {mode} needs a milvus index (mmsparse index --engine milvus); {index_dir} is "
                             f"a {kind} index: use --mode single or two-stage")
        if dense_queries is not None:
            raise InputError(f"--dense-queries is for hybrid search on a milvus index; {index_dir} is a {kind} index")
        route = "sparse" if kind in SPARSE_KINDS else "dense"
        if fmt != route:
            raise InputError(f"{queries}: is a {fmt} query file but {index_dir} is a {kind} index built from "
                             f"{route} vectors ({meta.get('source', '?')}); pass {route} queries or a "
                             f"{'faiss' if route == 'sparse' else 'pisa'} index")
        if mode == "two-stage" and (kind not in SPARSE_KINDS or first_stage is None):
            raise InputError("--mode two-stage needs a sparse (pisa, seismic, bmp or kannolo) index and --first-stage "
                             "QUERIES_CT.h5")
    if route == "dense" and (query_top_n or min_weight or query_algorithm):
        raise InputError("--query-top-n, --min-weight and --query-algorithm apply to sparse queries; "
                         f"this search uses dense ones ({kind} index)")
    if out.exists() and out.is_dir():
        raise InputError(f"{out}: is a directory; --out must be a file path")
    dense_file = (dense_queries or queries) if route in ("dense", "hybrid") else None
    q_attrs = _check_queries(queries if route != "dense" else dense_file, first_stage, index_dir, meta, force,
                             same_modality_ok=exclude_self, dense_file=dense_file if route == "hybrid" else None,
                             attrs=text.attrs if text is not None and route != "dense" else None)

    from ..formats.trec import write_run
    from ..indexes import bm25, open_index

    options: dict = {}
    if kind == "pisa":
        options = {"query_algorithm": query_algorithm or None, "query_bits": query_bits}
    elif kind == "seismic":
        options = {"heap_factor": heap_factor, "query_cut": query_cut, "n_knn": n_knn}
    elif kind == "bmp":
        options = {"alpha": bmp_alpha, "beta": bmp_beta}
    elif kind == "kannolo":
        options = {"ef_search": ef_search or None, "early_exit_threshold": early_exit_threshold}
    elif kind == "milvus":
        options = {"token": token, "drop_ratio_search": milvus_drop_ratio_search, "ef_search": ef_search,
                   "timeout": timeout}
    elif ef_search:
        options = {"ef_search": ef_search}
    with contextlib.ExitStack() as stack:
        searcher = open_index(index_dir, threads=threads, **options)
        if hasattr(searcher, "close"):
            stack.callback(searcher.close)
        qmat = probe = vectors = None
        if route in ("sparse", "hybrid"):
            qids, qmat = _sparse_queries(queries, searcher, index_dir, text)
            qmat = bm25.query_matrix(meta, qmat)  # binary query terms on a BM25-weighted index
            if mode == "two-stage":
                probe = _prune(_align(first_stage, qids, searcher, index_dir), query_top_n, min_weight)
            else:
                probe = _prune(qmat, query_top_n, min_weight)
            empty = int((probe.getnnz(axis=1) == 0).sum())
            if kind == "milvus" and empty == len(qids):
                raise InputError(f"{queries}: {'every query has' if qids else 'there is no query with'} an empty sparse "
                                 "vector; nothing to search (check the query file, --query-top-n and --min-weight)")
        else:
            qids, empty = None, 0
        if route in ("dense", "hybrid"):
            qids, vectors = _dense_queries(dense_file, qids, searcher, index_dir)
        if probe is not None and not allow_dense:
            _warn_if_dense(queries, probe, meta)  # after every input check: a refused search prints only its error

        counts = {"results": 0}
        reranker = bm25.DenseReranker(rerank_dense) if rerank_dense else None
        k_first = bm25.first_stage_k(k, rerank_k if reranker else None, exclude_self)
        if kind != "milvus":
            from ..indexes.rescore import rescore

            if route == "sparse" and mode == "two-stage":
                def batch(s, e):
                    return rescore(qmat[s:e], searcher.forward, searcher.search(probe[s:e], candidates), k_first)
            else:
                x = probe if route == "sparse" else vectors

                def batch(s, e):
                    return searcher.search(x[s:e], k_first)
        elif route == "sparse":
            def batch(s, e):
                return searcher.search_sparse(probe[s:e], k_first)
        elif route == "dense":
            def batch(s, e):
                return searcher.search_dense(vectors[s:e], k_first)
        else:
            def batch(s, e):
                return searcher.search_hybrid(probe[s:e], vectors[s:e], k_first, candidates=candidates,
                                              fusion=fusion, rrf_k=rrf_k, sparse_weight=sparse_weight,
                                              dense_weight=dense_weight)

        task = stack.enter_context(rep.task(f"searching ({kind}{'' if kind != 'milvus' else ', ' + route})",
                                            total=len(qids)))
        ranked = bm25.postprocess(_ranked(batch, qids, searcher.ids, batch_size, task, counts), k, exclude_self,
                                  reranker, rerank_k)
        run_meta = {"queries": q_attrs, "index": str(index_dir.resolve()), "index_kind": kind, "k": k,
                    "mode": mode, "empty_queries": empty}
        if kind == "milvus":
            run_meta["milvus"] = {"route": route, "collection": meta["milvus"]["collection"],
                                  "drop_ratio_search": milvus_drop_ratio_search}
            if route == "hybrid":
                run_meta["milvus"].update(dense_queries=str(Path(dense_file).resolve()), fusion=fusion,
                                          candidates=candidates,
                                          **({"rrf_k": rrf_k} if fusion == "rrf" else
                                             {"sparse_weight": sparse_weight, "dense_weight": dense_weight}))
        if exclude_self or reranker:
            run_meta.update(exclude_self=exclude_self, rerank_dense=reranker and reranker.files,
                            rerank_k=rerank_k if reranker else None)
        default_tag = f"mmsparse-{kind}" + ("-2stage" if mode == "two-stage" else "") + \
            (f"-{route}" if kind == "milvus" else "")
        write_run(out, ranked, tag=tag or default_tag, meta=run_meta)
    shown = f"{kind}, {mode}" if kind != "milvus" else f"milvus, {route}" + (f" {fusion}" if route == "hybrid" else "")
    msg = f"searched {len(qids)} queries -> {out} ({counts['results']} results, k={k}, {shown})"
    if empty:
        msg += f"; {empty} queries had empty sparse vectors and got no results" + \
            (" from the sparse route" if route == "hybrid" else "")
    rep.log(msg)
    return out


def _warn_if_dense(queries, probe, meta: dict) -> None:
    """One warning line when the queries (probe, CSR [Nq, |V|]) or the index's documents hold more
    than checks.NEAR_DENSE of the vocabulary: the postings the search will walk, from FLOPs (D2S
    eq. 1, mean shared terms of a query-document pair) estimated as q·d/|V|, times the documents."""
    from ..checks import DENSE_FIX, near_dense, terms_share, warn

    v = int(meta.get("vocab_size") or probe.shape[1])
    n_docs, postings = meta.get("num_docs"), meta.get("postings")
    q = float(probe.getnnz(axis=1).mean()) if probe.shape[0] else 0.0
    d = postings / n_docs if n_docs and postings else None
    if not (near_dense(q, v) or (d is not None and near_dense(d, v))):
        return
    docs = f", and the {n_docs:,} documents {d:,.0f}" if d is not None else ""
    cost = ""
    if d is not None:
        per_query = q * d / v * n_docs
        cost = (f"; each query walks about {per_query:,.0f} postings ({per_query * probe.shape[0]:.2g} for these "
                f"{probe.shape[0]:,}), where the Flickr8k example's head walks about 12 per document")
    warn(f"{queries}: {terms_share('queries', q, v)}{docs}: the head is not sparse yet{cost}; {DENSE_FIX}, or "
         "pass --allow-dense to search anyway quietly")


def _milvus_route(mode: str, fmt: str, queries: Path, dense_queries, index_dir: Path) -> str:
    """sparse | dense | hybrid for a Milvus index, checking the query files fit the mode."""
    if mode == "two-stage":
        raise InputError("--mode two-stage needs a sparse (pisa or seismic) index and --first-stage QUERIES_CT.h5; "
                         f"{index_dir} is a milvus index: use --mode sparse, dense or hybrid")
    route = fmt if mode == "single" else mode
    if route == "sparse":
        if fmt != "sparse":
            raise InputError(f"{queries}: is a dense query file but --mode sparse needs sparse queries")
        if dense_queries is not None:
            raise InputError("--dense-queries is only used with --mode dense or hybrid")
    elif route == "dense":
        if dense_queries is None and fmt != "dense":
            raise InputError(f"{queries}: is a sparse query file; --mode dense needs dense queries "
                             "(a dense QUERIES file or --dense-queries DENSE.h5)")
    else:
        if fmt != "sparse" or dense_queries is None:
            raise InputError("--mode hybrid needs sparse QUERIES and --dense-queries DENSE.h5 (the same queries, dense)")
    if dense_queries is not None:
        from ..indexes.meta import hdf5_format

        if hdf5_format(dense_queries, "dense query HDF5") != "dense":
            raise InputError(f"{dense_queries}: --dense-queries must be a dense HDF5 file")
    return route


def _check_queries(queries: Path, first_stage: Path | None, index_dir: Path, meta: dict, force: bool,
                   same_modality_ok: bool = False, dense_file: Path | None = None, attrs: dict | None = None) -> dict:
    """Compatibility of the query file(s) with the index, from their recorded attributes
    (`attrs`: those of `queries` when they were encoded here, from text). Returns the query
    attributes the run sidecar records."""
    from ..checks import check_compatible, check_cross_modal
    from ..formats._h5 import attrs_dict
    from ..formats.sharded import open_read

    out = {}
    files = [(queries, "source_attrs", attrs)]
    if first_stage is not None:
        files.append((first_stage, "source_attrs", None))
    if dense_file is not None:
        files.append((dense_file, "dense_source_attrs", None))
    for path, key, a in files:
        docs = meta.get(key) or meta.get("source_attrs", {})
        if a is None:
            with open_read(path) as f:  # a file or a sharded directory (formats/sharded.py)
                a = attrs_dict(f)
        if not same_modality_ok:  # --exclude-self: queries are the collection's own items
            check_cross_modal(a, docs, path, f"index {index_dir}", force)
        check_compatible(a, docs, MATCH_KEYS, str(path), f"index {index_dir} (documents)",
                         "search with queries made like the indexed documents", force)
        out = out or {k: a[k] for k in RUN_KEYS if k in a}
    return out


def _ranked(batch, qids: list[str], ids: list[str] | None, batch_size: int, task,
            counts: dict) -> Iterator[tuple[str, list[tuple[str, float]]]]:
    """Yield (qid, [(doc id, score)...]) batch by batch, so memory stays O(batch x k).

    batch(s, e): the results of queries s..e, lists of (doc row, score) mapped through `ids`,
    or (doc id, score) when `ids` is None (Milvus returns ids)."""
    n = len(qids)
    for s in range(0, n, batch_size):
        e = min(n, s + batch_size)
        for q, r in zip(qids[s:e], batch(s, e)):
            counts["results"] += len(r)
            yield q, (r if ids is None else [(ids[d], sc) for d, sc in r])
        task.update(completed=e)


def _sparse_queries(path: Path, searcher, index_dir: Path, col=None):
    """(ids, CSR [nq, |V|] float32) of a sparse query file (or of `col`, a SparseCollection of
    it encoded here); InputError if its vocab is not the index's."""
    from ..formats.sparse import read_sparse

    col = col if col is not None else read_sparse(path)
    if searcher.kind == "milvus":
        from ..indexes.milvus import vocab_sha256

        same = searcher.vocab_sha256 is not None and vocab_sha256(col.vocab) == searcher.vocab_sha256
        n_index = searcher.vocab_size
    else:
        same, n_index = col.vocab == searcher.vocab, len(searcher.vocab)
    if not same:
        raise InputError(f"{path}: field 'vocab' ({len(col.vocab)} terms) differs from the vocab of "
                         f"{index_dir} ({n_index} terms); use queries and documents from "
                         "heads with the same vocabulary")
    return col.ids, col.matrix


def _text_queries(index_dir: Path, queries: Path, head, rep):
    """The .tsv/.txt file `queries` encoded by the term-weight table of the inference-free head of
    `index_dir` (its provenance; `head` overrides): a SparseCollection (sparsification.table_queries).
    InputError for a dense index or a head of another method, which need a model for text."""
    from .querying import TABLE_METHOD, resolve_origin
    from .sparsification import table_queries

    o = resolve_origin(index_dir, head)
    if o.route != "sparse" or o.method != TABLE_METHOD:
        what = f"a {o.method} head ({o.head})" if o.route == "sparse" else "dense vectors"
        raise InputError(f"{queries}: query text, but {index_dir} holds documents of {what}, whose queries need a "
                         f"model: encode them with `mmsparse encode-dense {queries}` (then `mmsparse sparsify` for a "
                         "sparse index); only an inference-free head's index takes text")
    provenance.add_inputs([(o.head, "head")])
    return table_queries(o.head, queries, rep)


def _dense_queries(path: Path, qids: list[str] | None, searcher, index_dir: Path):
    """(ids, vectors [nq, d] float32) of a dense query file, rows in the order of `qids` when given."""
    from ..formats.dense import read_dense

    dq = read_dense(path)
    if dq.dim != searcher.dim:
        raise InputError(f"{path}: vectors have dimension {dq.dim} but {index_dir} holds "
                         f"dimension {searcher.dim}; encode queries with the index's model")
    if qids is None:
        return dq.ids, dq.vectors
    pos = {q: i for i, q in enumerate(dq.ids)}
    missing = [q for q in qids if q not in pos]
    if missing:
        raise InputError(f"{path}: field 'ids' lacks {len(missing)} query id(s) of the sparse query file "
                         f"(e.g. {missing[0]!r}); --dense-queries must hold the same queries")
    return qids, dq.vectors[[pos[q] for q in qids]]


def _align(path: Path, qids: list[str], searcher, index_dir: Path):
    """The first-stage query matrix, rows reordered to `qids`."""
    fids, fmat = _sparse_queries(path, searcher, index_dir)
    pos = {q: i for i, q in enumerate(fids)}
    missing = [q for q in qids if q not in pos]
    if missing:
        raise InputError(f"{path}: field 'ids' lacks {len(missing)} query id(s) of the main query file "
                         f"(e.g. {missing[0]!r}); both files must hold the same queries")
    return fmat[[pos[q] for q in qids]]


def _prune(m, top_n: int, min_weight: float):
    """Query-side pruning: weights < min_weight dropped, then the top_n largest kept per row."""
    if not top_n and not min_weight:
        return m
    from ..indexes.rescore import prune_rows

    return prune_rows(m, top_n=top_n, min_weight=min_weight)
