"""Search benchmark (issues 5, 17, 20; after D2S Table 6): latency, throughput and quality of every
engine on the same documents and the same queries.

    python -m mmsparse.bench.search --work WORK --head HEAD [--scales flickr8k,123k,1m] [--out DIR]

Scales (documents; queries are always the 5,000 Flickr8k test captions, qrels the test images):
  flickr8k      the real 1,000-image test collection (WORK/sparse/HEAD/test-images.h5, dense test images)
  123k          the test images + 122,000 encoded views of the 7,091 non-test images (bench.views,
                bench.collection: no view shows a test image, or it would be a near-duplicate of a relevant
                document): sparse COLLECTIONS/123k.h5 (`mmsparse sparsify HEAD` of DENSE_COLLECTIONS/123k.dense.h5)
  1m            123k + 877,000 documents (1,000,000 in all) of the view mixture model fitted to those views
                (bench.collection): COLLECTIONS/1m.h5
  synthetic-N   the labelled stress test: N documents with independently placed terms (bench.synthetic),
                dense side random unit vectors and a Gaussian fitted to the real image vectors; no qrels
The views and mixture documents are distractors: R@k counts only the original test images.

Every scale runs as jobs, each in its own fresh process (so `rss_mb` is that job's peak resident
memory: the index loaded and searched; `build_rss_mb` the build's), writing DIR/SCALE/JOB.json:
  exhaustive   exact float <q, d> by scipy over the expanded queries (the sparse reference)
  pisa         PISA, one index (--pisa-bits, block_simdbp, --pisa-block): each --pisa-algorithms at
               every k; expanded queries pruned to their top-N terms (--query-top-n) and to weights
               >= f x the query's largest (--query-min-weight); --query-bits (with --qbits-algorithm);
               caption-term (no-exp)
               queries; two-stage: caption terms for C candidates (--candidates), exact re-score with
               the expanded query over the float forward vectors (indexes.rescore)
  pisa-levers  more PISA builds (--pisa-levers: quantisation bits, block size, posting codec) with
               --lever-algorithms at the smallest k; at --lever-scales only
  seismic      Seismic (--seismic-build), every --seismic-cuts x --seismic-heaps at the smallest k,
               the --seismic-at-k settings at every k
  seismic-levers  more Seismic builds (--seismic-levers: n_postings, max_fraction, centroid_fraction,
               summary_energy, k-NN graph with n_knn, DotVByte) at --lever-scales
  faiss-flat   exact dense inner product (IndexFlatIP): the dense reference
  faiss-hnsw   HNSW, M --hnsw-m, efConstruction --ef-construction (200, as `mmsparse index`), every
               --ef-search at k = 10 and those >= k at larger k (max(efSearch, k) is searched)
  milvus       (only when named in --jobs) Milvus Lite: one collection with the sparse and the dense
               vectors (dense HNSW with the same M and efConstruction); sparse rows (exact TAAT) and
               dense rows at every --ef-search
Equal footing: the same seeded query sample for every configuration at a scale (--queries, per
scale); --warmup untimed queries (outside the sample where the split has them) before every
configuration; latency per query at 1 thread (PISA threads=1, Faiss omp 1, Seismic single-query call, scipy), per k for
every engine including the exhaustive one; `qps_2t` = queries / wall time of the engine's own
batch call over the sample with 2 threads (PISA retrieve threads=2, Seismic batch_search
num_threads=2, Faiss omp 2; the exhaustive scorer and the two-stage re-scoring have no threads of
their own and run on a pool of 2 Python threads); `qps_1t` = queries / summed 1-thread latency.
Quality: R@1, R@10, RR@10 (x100) against the qrels (the original test images), S@10 (x100) the
share of queries whose top 10 holds the relevant image or a single view of it; overlap@10 = |top-10 ∩ exact top-10| / 10 and
overlap@k likewise, exact = the exhaustive sparse scorer (sparse engines) or Flat (dense engines),
over the sample queries whose exact list is not empty. postings_per_query: the mean over sample
queries of sum of df over the searched query's terms (what exhaustive scoring touches).

Outputs in DIR (default WORK/bench/HEAD): SCALE/*.json (rows + job info), search.json (all rows),
search.meta.json (machine, collection figures, settings, goals), search.md (tables), frontier.png.

Files: harness.py (exact top-k and quality, timing, Scale, Rows, saved results and references,
cached indexes, child processes), one file per engine's jobs (exhaustive.py, pisa.py, seismic.py,
faiss.py, milvus.py), scales.py (what each scale holds, the synthetic collections), report.py
(search.md's tables, the goals, the frontier plot), cli.py (options, the job table, main).
"""

# every name stays importable from here, as from the one module this package was (tests and
# bench.train import from it)
from .harness import (Rows, Scale, _top, collection_stamp, exact_dense, exact_sparse, in_child, index_bytes,
                      load_queries, overlap, peak_rss_mb, pool_batch, postings_per_query, recall, scene, time_batch,
                      time_queries)
from .exhaustive import job_exhaustive
from .pisa import job_pisa, job_pisa_levers, prune_relative
from .seismic import job_seismic, job_seismic_levers
from .faiss import job_faiss_flat, job_faiss_hnsw
from .milvus import job_milvus
from .scales import REAL_SCALES, scale_spec, write_synthetic, write_synthetic_dense
from .report import SPARSE_ENGINES, frontier_plot, goals, machine, markdown, search_md, summary
from .cli import DEFAULT_JOBS, JOBS, LEVER_JOBS, collect, main, parse_args

__all__ = [
    "Rows", "Scale", "collection_stamp", "exact_dense", "exact_sparse", "in_child", "index_bytes", "load_queries",
    "overlap", "peak_rss_mb", "pool_batch", "postings_per_query", "recall", "scene", "time_batch", "time_queries",
    "job_exhaustive",
    "job_pisa", "job_pisa_levers", "prune_relative",
    "job_seismic", "job_seismic_levers",
    "job_faiss_flat", "job_faiss_hnsw",
    "job_milvus",
    "REAL_SCALES", "scale_spec", "write_synthetic", "write_synthetic_dense",
    "SPARSE_ENGINES", "frontier_plot", "goals", "machine", "markdown", "search_md", "summary",
    "DEFAULT_JOBS", "JOBS", "LEVER_JOBS", "collect", "main", "parse_args",
]
