"""`mmsparse search`: top-k retrieval of a query file against an index, written as a TREC run."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

PISA, SEISMIC, BMP, FAISS, MILVUS, TWO, BM25V = ("PISA options", "Seismic options", "BMP options",
                                                 "HNSW options (Faiss, kANNolo, Milvus)", "Milvus options",
                                                 "Two-stage", "BM25-V rerank")


def main(
    index_dir: Path = typer.Argument(..., help="Index directory made by `mmsparse index`."),
    queries: Path = typer.Argument(..., help="Query HDF5: sparse for a PISA/Seismic/BMP/kANNolo index, dense for "
                                   "Faiss; "
                                   "either for Milvus. For the index of an inference-free head also query text, "
                                   "encoded on the fly by the head's term-weight table (no model): a .tsv "
                                   "(id<TAB>text per line) or .txt (one query per line, ids = line numbers)."),
    out: Path = typer.Option(..., "-o", "--out", help="TREC run file to write."),
    k: int = typer.Option(1000, "--k", min=1, help="Results per query."),
    threads: int = typer.Option(1, min=1, help="Search threads (PISA, Seismic, kANNolo, Faiss; BMP searches on one)."),
    batch_size: int = typer.Option(1000, min=1, help="Queries per search call (progress granularity)."),
    tag: str = typer.Option("", help="Run tag (6th TREC column); default mmsparse-<index kind>."),
    mode: str = typer.Option("single", help="single: search with QUERIES directly. two-stage (sparse indexes): "
                             "the index over --first-stage queries for --candidates documents, then exact "
                             "re-scoring of those with the full QUERIES vectors (sparse inner product). "
                             "Milvus: sparse, dense or hybrid (sparse QUERIES fused with --dense-queries)."),
    query_top_n: int = typer.Option(0, min=0, help="Sparse, every engine: keep only each query's N largest "
                                    "weights before searching (terms); in two-stage mode, of the first-stage queries "
                                    "(0 = keep all). Fewer postings read, at some overlap with the full query's "
                                    "ranking (docs/search-benchmark.md)."),
    min_weight: float = typer.Option(0.0, min=0.0, help="Sparse: drop query weights below this value "
                                     "(same units as the stored weights) before searching (0 = keep all)."),
    force: bool = typer.Option(False, "--force", help="Search even when the queries' recorded backbone, model, "
                               "head, dataset or split differ from the indexed documents', or when queries and "
                               "documents have the same modality (mismatches become warnings)."),
    allow_dense: bool = typer.Option(False, "--allow-dense", help="No warning for near-dense sparse queries or "
                                     "documents (over 10% of the vocabulary per vector: a head not sparse yet; "
                                     "the warning estimates the postings the search walks)."),
    query_algorithm: str = typer.Option("", help="Query algorithm (block_max_wand, block_max_maxscore, maxscore, "
                                        "wand, ranked_or, ranked_or_taat, ...); default: the one recorded by "
                                        "`index`. Long expanded queries: maxscore or ranked_or_taat are usually "
                                        "faster than block_max_wand (see the search benchmark).",
                                        rich_help_panel=PISA),
    query_bits: int = typer.Option(8, min=1, max=16, help="Each query is scaled so its largest weight becomes "
                                   "2^bits-1 and rounded to integers (bits; PISA repeats a term weight times, so "
                                   "query cost grows with 2^bits).", rich_help_panel=PISA),
    heap_factor: float = typer.Option(0.7, min=0.0, help="A block is skipped when its summary's score is below "
                                      "heap_factor x the k-th best score so far (a ratio, > 0): higher skips more "
                                      "blocks (faster, less exact); above 1 is allowed.", rich_help_panel=SEISMIC),
    query_cut: int = typer.Option(10, min=1, help="Query terms, largest weights first, whose posting lists are "
                                  "scanned (query_cut, terms).", rich_help_panel=SEISMIC),
    n_knn: Optional[int] = typer.Option(None, "--n-knn", min=0, help="Neighbours of each result taken from the "
                                        "index's k-NN graph and scored too (index --seismic-knn; 0 = off; default: "
                                        "the index's --seismic-n-knn).", rich_help_panel=SEISMIC),
    bmp_alpha: float = typer.Option(1.0, "--bmp-alpha", min=0.0, max=1.0, help="Blocks are scored while alpha x "
                                    "their score bound beats the k-th score so far (a ratio in (0, 1]; 1 = exact on "
                                    "the integer weights, lower stops earlier and may return fewer than k).",
                                    rich_help_panel=BMP),
    bmp_beta: float = typer.Option(1.0, "--bmp-beta", min=0.0, max=1.0, help="Share of each query's terms kept, "
                                   "largest weights first (a ratio in (0, 1]; 1 = all).", rich_help_panel=BMP),
    ef_search: int = typer.Option(0, min=0, help="HNSW query beam width efSearch in nodes (Faiss, kANNolo, Milvus dense; "
                                  "0 = the index's setting; at least k is used).", rich_help_panel=FAISS),
    early_exit_threshold: Optional[float] = typer.Option(None, "--early-exit-threshold", min=0.0, help="kANNolo: "
                                                         "early termination threshold of the graph search (default: "
                                                         "the index's).", rich_help_panel=FAISS),
    dense_queries: Optional[Path] = typer.Option(None, "--dense-queries", help="Dense HDF5 of the same queries "
                                                 "(same ids): the dense route of --mode hybrid, or the queries "
                                                 "of --mode dense.", rich_help_panel=MILVUS),
    fusion: str = typer.Option("rrf", "--fusion", help="Hybrid fusion: rrf (sum of 1/(rrf_k + rank) over the "
                               "routes) or weighted (weighted sum of normalised scores).", rich_help_panel=MILVUS),
    rrf_k: int = typer.Option(60, "--rrf-k", min=1, help="RRF constant k (rank units): larger flattens the "
                              "difference between top and lower ranks.", rich_help_panel=MILVUS),
    sparse_weight: float = typer.Option(0.5, "--sparse-weight", min=0.0, help="--fusion weighted: weight of the "
                                        "sparse route's normalised score.", rich_help_panel=MILVUS),
    dense_weight: float = typer.Option(0.5, "--dense-weight", min=0.0, help="--fusion weighted: weight of the "
                                       "dense route's normalised score.", rich_help_panel=MILVUS),
    milvus_drop_ratio_search: float = typer.Option(0.0, "--milvus-drop-ratio-search", min=0.0, max=0.99,
                                                   help="Fraction of each sparse query's smallest weights Milvus "
                                                   "ignores: faster, less exact (Milvus Lite: 0 only).",
                                                   rich_help_panel=MILVUS),
    token: str = typer.Option("", "--token", envvar="MMSPARSE_MILVUS_TOKEN", show_default=False,
                              help="Token of the Milvus server the index lives on.", rich_help_panel=MILVUS),
    timeout: float = typer.Option(30.0, "--timeout", min=0.1, help="Seconds to wait for the Milvus server (or "
                                  "Milvus Lite) to connect and to answer each call; a server that does not answer "
                                  "in time is an error.", rich_help_panel=MILVUS),
    first_stage: Optional[Path] = typer.Option(None, help="Sparse query file for the first stage "
                                               "(e.g. caption terms only); same ids and vocab as QUERIES.",
                                               rich_help_panel=TWO),
    candidates: int = typer.Option(1000, min=1, help="Documents per query from the first stage (two-stage), or "
                                   "from each route before fusion (Milvus hybrid).", rich_help_panel=TWO),
    exclude_self: bool = typer.Option(False, "--exclude-self", help="Within-collection search (e.g. image-to-image, "
                                      "queries = the indexed images): drop each query's own id from its results "
                                      "(still k results) and accept queries of the documents' modality.",
                                      rich_help_panel=BM25V),
    rerank_dense: Optional[List[Path]] = typer.Option(None, "--rerank-dense", help="Rerank the first --rerank-k "
                                                      "results by dense cosine, with vectors looked up by id in "
                                                      "this dense HDF5 (queries and documents; repeatable).",
                                                      rich_help_panel=BM25V),
    rerank_k: int = typer.Option(100, "--rerank-k", min=1, help="--rerank-dense: first-stage candidates per query "
                                 "reranked (K; the paper uses 100 and 200).", rich_help_panel=BM25V),
    head: Optional[str] = typer.Option(None, "--head", help="Text QUERIES only: the inference-free head whose "
                                       "term-weight table encodes them (default: the head the index's documents "
                                       "were sparsified with, from its provenance)."),
) -> None:
    """Search QUERIES against INDEX_DIR and write the top-k per query as a TREC run.

    Scores are inner products: sparse <q, d> (PISA: from integer-quantised weights, divided back
    by the scales) or dense <q, d>; Milvus hybrid: the fused score. Queries with empty sparse
    vectors get no results and are counted in the summary. Query text (.tsv/.txt) needs the
    index of an inference-free head; no model is loaded for it.
    """
    from ..api.retrieval import search
    from ..cli_ui import RichReporter

    search(index_dir, queries, out=out, k=k, threads=threads, batch_size=batch_size, tag=tag, mode=mode,
           query_top_n=query_top_n, min_weight=min_weight, force=force, first_stage=first_stage,
           candidates=candidates, query_algorithm=query_algorithm, query_bits=query_bits, heap_factor=heap_factor,
           query_cut=query_cut, n_knn=n_knn, bmp_alpha=bmp_alpha, bmp_beta=bmp_beta, ef_search=ef_search,
           early_exit_threshold=early_exit_threshold, dense_queries=dense_queries, fusion=fusion, rrf_k=rrf_k,
           sparse_weight=sparse_weight, dense_weight=dense_weight,
           milvus_drop_ratio_search=milvus_drop_ratio_search, token=token, timeout=timeout, exclude_self=exclude_self,
           rerank_dense=rerank_dense, rerank_k=rerank_k, head=head, allow_dense=allow_dense, progress=RichReporter())
