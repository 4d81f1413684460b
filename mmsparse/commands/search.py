"""`mmsparse search`: top-k retrieval of a query file against an index, written as a TREC run."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import InputError


def main(
    index_dir: Path = typer.Argument(..., help="Index directory made by `mmsparse index`."),
    queries: Path = typer.Argument(..., help="Query HDF5: sparse for a PISA/Seismic index, dense for Faiss."),
    out: Path = typer.Option(..., "-o", "--out", help="TREC run file to write."),
    k: int = typer.Option(1000, "--k", min=1, help="Results per query."),
    threads: int = typer.Option(1, min=1, help="Search threads."),
    batch_size: int = typer.Option(1000, min=1, help="Queries per search call (progress granularity)."),
    tag: str = typer.Option("", help="Run tag (6th TREC column); default mmsparse-<index kind>."),
    mode: str = typer.Option("single", help="single: search with QUERIES directly. two-stage: the index over "
                             "--first-stage queries for --candidates documents, then exact re-scoring "
                             "of those with the full QUERIES vectors (sparse inner product)."),
    first_stage: Path = typer.Option(None, help="two-stage: sparse query file for the first stage "
                                     "(e.g. caption terms only); same ids and vocab as QUERIES."),
    candidates: int = typer.Option(1000, min=1, help="two-stage: first-stage candidates per query."),
    query_top_n: int = typer.Option(0, min=0, help="Sparse: keep only each query's N largest weights "
                                    "before searching; in two-stage mode, of the first-stage queries (0 = keep all)."),
    min_weight: float = typer.Option(0.0, min=0.0, help="Sparse: drop query weights below this value "
                                     "before searching (0 = keep all)."),
    query_algorithm: str = typer.Option("", help="PISA query algorithm (block_max_wand, "
                                        "block_max_maxscore, maxscore, wand, ranked_or, ranked_or_taat, "
                                        "...); default: the one recorded by `index`. Long expanded "
                                        "queries: maxscore or ranked_or_taat are usually faster than "
                                        "block_max_wand (see the search benchmark)."),
    query_bits: int = typer.Option(8, min=1, max=16, help="PISA: each query is scaled so its largest "
                                   "weight becomes 2^bits-1 and rounded to integers (PISA repeats a term "
                                   "weight times, so query cost grows with 2^bits)."),
    ef_search: int = typer.Option(0, min=0, help="Faiss HNSW: query beam width efSearch "
                                  "(0 = the index's setting; at least k is used)."),
    heap_factor: float = typer.Option(0.7, min=0.0, max=1.0, help="Seismic: block pruning factor "
                                      "heap_factor in (0, 1]; higher skips fewer blocks (more exact, slower)."),
    query_cut: int = typer.Option(10, min=1, help="Seismic: query terms used to select blocks (query_cut)."),
    force: bool = typer.Option(False, "--force", help="Search even when the queries' recorded backbone, model, "
                               "head, dataset or split differ from the indexed documents', or when queries and "
                               "documents have the same modality (mismatches become warnings)."),
    exclude_self: bool = typer.Option(False, "--exclude-self", help="Within-collection search (e.g. image-to-image, "
                                      "queries = the indexed images): drop each query's own id from its results "
                                      "(still k results) and accept queries of the documents' modality."),
    rerank_dense: Optional[List[Path]] = typer.Option(None, "--rerank-dense", help="Two-stage BM25-V: rerank the "
                                                      "first --rerank-k results by dense cosine, with vectors looked "
                                                      "up by id in this dense HDF5 (queries and documents; repeatable)."),
    rerank_k: int = typer.Option(100, "--rerank-k", min=1, help="--rerank-dense: first-stage candidates per query "
                                 "reranked (K; the paper uses 100 and 200)."),
) -> None:
    """Search QUERIES against INDEX_DIR and write the top-k per query as a TREC run.

    Scores are inner products: sparse <q, d> (PISA: from integer-quantised weights, divided back
    by the scales) or dense <q, d>. Queries with empty sparse vectors get no results and are
    counted in the summary.
    """
    from ..indexes.meta import SPARSE_KINDS, hdf5_format, read_meta

    meta = read_meta(index_dir)
    kind = meta["kind"]
    want = "sparse" if kind in SPARSE_KINDS else "dense"
    fmt = hdf5_format(queries, "query HDF5")
    if fmt != want:
        raise InputError(f"{queries}: is a {fmt} query file but {index_dir} is a {kind} index built from "
                         f"{want} vectors ({meta.get('source', '?')}); pass {want} queries or a "
                         f"{'faiss' if want == 'sparse' else 'pisa'} index")
    if mode not in ("single", "two-stage"):
        raise InputError(f"--mode {mode!r} unknown; choose single or two-stage")
    if mode == "two-stage" and (kind not in SPARSE_KINDS or first_stage is None):
        raise InputError("--mode two-stage needs a sparse (pisa or seismic) index and --first-stage QUERIES_CT.h5")
    if mode == "single" and first_stage is not None:
        raise InputError("--first-stage is only used with --mode two-stage")
    if want == "dense" and (query_top_n or min_weight or query_algorithm):
        raise InputError("--query-top-n, --min-weight and --query-algorithm apply to sparse indexes; "
                         f"{index_dir} is a {kind} index")
    if out.exists() and out.is_dir():
        raise InputError(f"{out}: is a directory; --out must be a file path")
    q_attrs = _check_queries(queries, first_stage, index_dir, meta, force, same_modality_ok=exclude_self)

    from ..indexes import bm25, open_index

    options: dict = {}
    if kind == "pisa":
        options = {"query_algorithm": query_algorithm or None, "query_bits": query_bits}
    elif kind == "seismic":
        options = {"heap_factor": heap_factor, "query_cut": query_cut}
    elif ef_search:
        options = {"ef_search": ef_search}
    searcher = open_index(index_dir, threads=threads, **options)

    if want == "sparse":
        qids, qmat = _sparse_queries(queries, searcher, index_dir)
        qmat = bm25.query_matrix(meta, qmat)  # binary query terms on a BM25-weighted index
        if mode == "two-stage":
            first = _align(first_stage, qids, searcher, index_dir)
            probe = _prune(first, query_top_n, min_weight)
        else:
            probe = _prune(qmat, query_top_n, min_weight)
        empty = int((probe.getnnz(axis=1) == 0).sum())
    else:
        from ..formats.dense import read_dense

        dq = read_dense(queries)
        if dq.dim != searcher.dim:
            raise InputError(f"{queries}: vectors have dimension {dq.dim} but {index_dir} holds "
                             f"dimension {searcher.dim}; encode queries with the index's model")
        qids, probe, empty = dq.ids, dq.vectors, 0

    from ..formats.trec import write_run
    from ..indexes._quiet import console

    con = console()
    rescore_with = qmat if mode == "two-stage" else None
    counts = {"results": 0}
    reranker = bm25.DenseReranker(rerank_dense) if rerank_dense else None
    k_first = bm25.first_stage_k(k, rerank_k if reranker else None, exclude_self)
    ranked = bm25.postprocess(_ranked(searcher, qids, probe, k_first, candidates, batch_size, rescore_with, con, counts),
                              k, exclude_self, reranker, rerank_k)
    run_meta = {"queries": q_attrs, "index": str(Path(index_dir).resolve()), "index_kind": kind, "k": k,
                "mode": mode, "empty_queries": empty}
    if exclude_self or reranker:
        run_meta.update(exclude_self=exclude_self, rerank_dense=reranker and reranker.files,
                        rerank_k=rerank_k if reranker else None)
    write_run(out, ranked, tag=tag or f"mmsparse-{kind}" + ("-2stage" if mode == "two-stage" else ""),
              meta=run_meta)
    msg = f"searched {len(qids)} queries -> {out} ({counts['results']} results, k={k}, {kind}, {mode})"
    if empty:
        msg += f"; {empty} queries had empty sparse vectors and got no results"
    con.print(msg, highlight=False, soft_wrap=True)


# Query attributes that must match the indexed documents' (dense: same backbone and model;
# sparse: also the same head), and that the run's sidecar keeps for `eval`.
MATCH_KEYS = ("backbone", "model", "head", "dataset", "split")
RUN_KEYS = ("modality", "backbone", "model", "head", "method", "query_mode", "dataset", "split")


def _check_queries(queries: Path, first_stage: Path | None, index_dir: Path, meta: dict, force: bool,
                   same_modality_ok: bool = False) -> dict:
    """Compatibility of the query file(s) with the index, from their recorded attributes.
    Returns the query attributes the run sidecar records."""
    import h5py

    from ..checks import check_compatible, check_cross_modal
    from ..formats._h5 import attrs_dict

    docs = meta.get("source_attrs", {})
    out = {}
    for path in [queries] + ([first_stage] if first_stage is not None else []):
        with h5py.File(path, "r") as f:
            a = attrs_dict(f)
        if not same_modality_ok:  # --exclude-self: queries are the collection's own items
            check_cross_modal(a, docs, path, f"index {index_dir}", force)
        check_compatible(a, docs, MATCH_KEYS, str(path), f"index {index_dir} (documents)",
                         "search with queries made like the indexed documents", force)
        out = out or {k: a[k] for k in RUN_KEYS if k in a}
    return out


def _ranked(searcher, qids, probe, k, candidates, batch_size, rescore_with, con, counts):
    """Yield (qid, [(doc id, score)...]) batch by batch, so memory stays O(batch x k).

    With `rescore_with` (two-stage), the first stage fetches `candidates` per query and the
    full query vectors re-score them exactly (indexes.rescore.rescore).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..indexes.rescore import rescore

    ids, n = searcher.ids, probe.shape[0]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True, disable=not con.is_terminal) as bar:
        task = bar.add_task(f"searching ({searcher.kind})", total=n)
        for s in range(0, n, batch_size):
            e = min(n, s + batch_size)
            if rescore_with is None:
                res = searcher.search(probe[s:e], k)
            else:
                res = rescore(rescore_with[s:e], searcher.forward, searcher.search(probe[s:e], candidates), k)
            for q, r in zip(qids[s:e], res):
                counts["results"] += len(r)
                yield q, [(ids[d], sc) for d, sc in r]
            bar.update(task, completed=e)


def _sparse_queries(path: Path, searcher, index_dir: Path):
    from ..formats.sparse import read_sparse

    col = read_sparse(path)
    if col.vocab != searcher.vocab:
        raise InputError(f"{path}: field 'vocab' ({len(col.vocab)} terms) differs from the vocab of "
                         f"{index_dir} ({len(searcher.vocab)} terms); use queries and documents from "
                         "heads with the same vocabulary")
    return col.ids, col.matrix


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
