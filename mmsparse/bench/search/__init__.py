"""Search benchmark (issues 5, 17, 20, 25; after D2S Table 6): latency, throughput and quality of
every engine on the same documents and the same queries, for one or more sparse heads, search
only and end to end (caption text in, top-10 image ids out).

    python -m mmsparse.bench.search --work WORK --heads d2s,if [--scales flickr8k,123k,1m] [--out DIR]

Heads: each head of --heads (WORK/heads/HEAD, WORK/sparse/HEAD) has its own sparse documents, made
by that head from the same dense documents, and the query modes of its method, the first being
the primary one (its exhaustive ranking is the head's sparse reference): d2s expand (+
caption-terms), inference-free inference-free. Query files: WORK/sparse/HEAD/SPLIT-captions.MODE.h5.

Scales (documents; queries are always the 5,000 Flickr8k test captions, qrels the test images):
  flickr8k      the real 1,000-image test collection (WORK/sparse/HEAD/test-images.h5, dense test images)
  123k          123,000 documents: the test images, the encoded views of non-test images (bench.views;
                no view may show a test image, or it would be a near-duplicate of a relevant
                document), then draws of the view mixture model fitted to those views (bench.collection;
                the Flickr8k example: 1,000 + 40,000 views + 82,000 draws): sparse COLLECTIONS/123k.h5
                (`mmsparse sparsify HEAD` of DENSE_COLLECTIONS/123k.dense.h5)
  1m            123k + 877,000 more draws of the same mixture (1,000,000 in all): COLLECTIONS/1m.h5
  synthetic-N   the labelled stress test: N documents with independently placed terms (bench.synthetic),
                dense side random unit vectors and a Gaussian fitted to the real image vectors; no qrels
The views and mixture documents are distractors: R@k counts only the original test images.

Every scale runs as jobs, each in its own fresh process (so `rss_mb` is that job's peak resident
memory: the index loaded and searched; `build_rss_mb` the build's), once per head (DIR/HEAD/SCALE/
JOB.json) or once for the dense side (DIR/dense/SCALE/JOB.json):
  exhaustive   (per head) exact float <q, d> by scipy over the primary queries (the sparse reference)
  pisa         (per head) PISA, one index (--pisa-bits, block_simdbp, --pisa-block): each
               --pisa-algorithms on every query mode at every k; primary queries pruned to their top-N
               terms (--query-top-n) and to weights >= f x the query's largest (--query-min-weight);
               --query-bits (with --qbits-algorithm); two-stage (a head with expand and caption-terms):
               caption terms for C candidates (--candidates), exact re-score with the expanded query
               over the float forward vectors (indexes.rescore)
  pisa-levers  (per head) more PISA builds (--pisa-levers: quantisation bits, block size, posting
               codec) with --lever-algorithms at the smallest k; at --lever-scales only
  seismic      (per head) Seismic (--seismic-build), every --seismic-cuts x --seismic-heaps at the
               smallest k, the --seismic-at-k settings at every k
  seismic-levers  (per head) more Seismic builds (--seismic-levers: n_postings, max_fraction,
               centroid_fraction, summary_energy, k-NN graph with n_knn, DotVByte) at --lever-scales
  bmp          (per head) BMP (block-max pruning), one build per --bmp-blocks block size (--bmp-bits),
               every --bmp-alphas x --bmp-betas at the smallest k
  kannolo      (per head) kANNolo: the exhaustive SparseFlatIndex (exact check), then one sparse HNSW
               build per --kannolo-m (--kannolo-efc), every --kannolo-ef at the smallest k (and the
               larger k where ef >= k)
  faiss-flat   (dense) exact dense inner product (IndexFlatIP): the dense reference
  faiss-hnsw   (dense) HNSW, M --hnsw-m, efConstruction --ef-construction (200, as `mmsparse index`),
               every --ef-search at k = 10 and those >= k at larger k (max(efSearch, k) is searched)
  endtoend     (dense, then per head) a caption's text in, the top-10 image ids out, 1 thread, the
               query encoder included (endtoend.py): dense (text tower + HNSW), each query mode of
               each head (D2S: text tower + head; inference-free: the term-weight table) with PISA
               Seismic, BMP and kANNolo; configurations from the search-only rows (--e2e-*)
  milvus       (per head; only when named in --jobs) Milvus Lite: one collection with the sparse and
               the dense vectors (dense HNSW with the same M and efConstruction); sparse rows (exact
               TAAT) and dense rows at every --ef-search
Equal footing: the same seeded query sample of the dense captions' rows for every head and
configuration at a scale (--queries, per scale); --warmup untimed queries (outside the sample
where the split has them) before every configuration; latency per query at 1 thread (PISA
threads=1, Faiss omp 1, Seismic, BMP and kANNolo single-query calls, scipy), per k for every engine including the
exhaustive one; `qps_2t` = queries / wall time of the engine's own batch call over the sample
with 2 threads (PISA retrieve threads=2, Seismic and kANNolo batch_search num_threads=2, Faiss omp
2; BMP has no batch call of its own and gets none; the
exhaustive scorer and the two-stage re-scoring have no threads of their own and run on a pool of
2 Python threads); `qps_1t` = queries / summed 1-thread latency.
Quality: R@1, R@10, RR@10 (x100) against the qrels (the original test images), S@10 (x100) the
share of queries whose top 10 holds the relevant image or a single view of it; overlap@10 =
|top-10 ∩ exact top-10| / 10 and overlap@k likewise, exact = the head's exhaustive scorer
(sparse engines; caption-term rows too, to show what dropping the expansion loses) or Flat
(dense engines), over the sample queries whose exact list is not empty. postings_per_query: the
mean over sample queries of sum of df over the searched query's terms (what exhaustive scoring
touches).

Outputs in DIR (default WORK/bench): HEAD/SCALE/*.json and dense/SCALE/*.json (rows + job info),
HEAD/index and dense/index (cached indexes), search.json (all rows, with `head` and `query_mode`),
search.meta.json (machine, collection figures, settings, goals), search.md (tables), frontier.png.

Files: harness.py (exact top-k and quality, timing, Scale, Rows, saved results and references,
cached indexes, child processes), one file per engine's jobs (exhaustive.py, pisa.py, seismic.py,
bmp.py, kannolo.py, faiss.py, milvus.py), endtoend.py (the end-to-end job), scales.py (what each scale and head holds,
the synthetic collections), report.py (search.md's tables, the goals), frontier.py (the frontier
plot), cli.py (options, the job table, main).
"""

# every name stays importable from here, as from the one module this package was (tests and
# bench.train import from it)
from .harness import (Rows, Scale, _top, collection_stamp, dense_side, exact_dense, exact_sparse, in_child,
                      index_bytes, load_queries, mode_label, overlap, peak_rss_mb, pool_batch, postings_per_query,
                      recall, saved_rows, scene, time_batch, time_queries)
from .exhaustive import job_exhaustive
from .pisa import job_pisa, job_pisa_levers, prune_relative
from .seismic import job_seismic, job_seismic_levers
from .bmp import job_bmp
from .kannolo import job_kannolo
from .faiss import job_faiss_flat, job_faiss_hnsw
from .milvus import job_milvus
from .endtoend import file_match, job_endtoend
from .scales import DENSE, REAL_SCALES, head_query_modes, scale_spec, write_synthetic, write_synthetic_dense
from .report import SPARSE_ENGINES, edges, endtoend_md, goals, machine, markdown, ratio_goals, search_md, summary
from .frontier import frontier_plot
from .cli import DEFAULT_JOBS, JOBS, LEVER_JOBS, SIDES, collect, main, parse_args

__all__ = [
    "Rows", "Scale", "collection_stamp", "dense_side", "exact_dense", "exact_sparse", "in_child", "index_bytes",
    "load_queries", "mode_label", "overlap", "peak_rss_mb", "pool_batch", "postings_per_query", "recall",
    "saved_rows", "scene", "time_batch", "time_queries",
    "job_exhaustive",
    "job_pisa", "job_pisa_levers", "prune_relative",
    "job_seismic", "job_seismic_levers", "job_bmp", "job_kannolo",
    "job_faiss_flat", "job_faiss_hnsw",
    "job_milvus",
    "file_match", "job_endtoend",
    "DENSE", "REAL_SCALES", "head_query_modes", "scale_spec", "write_synthetic", "write_synthetic_dense",
    "SPARSE_ENGINES", "edges", "endtoend_md", "frontier_plot", "goals", "ratio_goals", "machine", "markdown", "search_md", "summary",
    "DEFAULT_JOBS", "JOBS", "LEVER_JOBS", "SIDES", "collect", "main", "parse_args",
]
