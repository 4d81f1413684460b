# milvus.mk — Milvus as the index engine (docs/milvus.md; needs `pip install -e '.[scale]'`): the
# main job's sparse test images and the dense test images in one Milvus Lite collection, searched
# sparse (expanded captions), dense (dense captions) and hybrid (both, fused), then evaluated.
#
#   make -C examples/flickr8k milvus
#     -> $(WORK)/index/milvus-$(HEAD)/   (mmsparse.json + milvus.db/, the Milvus Lite database)
#     -> $(WORK)/runs/milvus-{sparse,dense,hybrid}.trec
#     -> $(WORK)/eval/milvus-sparse.json, milvus-dense.json, milvus-hybrid.json
#   make -C examples/flickr8k milvus-timing
#     -> $(WORK)/eval/milvus-timing.json   (build time and 1-query latency: Milvus Lite, PISA, Seismic, Faiss)
#   Compare with the PISA run and Faiss run of the main job:
#     mmsparse eval --table $(WORK)/eval/dense.json $(WORK)/eval/sparse.json $(WORK)/eval/milvus-*.json
#
#   MILVUS_INDEX_FLAGS   extra `index --engine milvus` flags, e.g. a server instead of Milvus Lite:
#                        --uri http://host:19530 --collection flickr8k_d2s   (default: none)
#   MILVUS_SEARCH_FLAGS  extra `search` flags of every Milvus run                 (default: none)
#   MILVUS_HYBRID_FLAGS  fusion of the hybrid run, e.g. --fusion weighted --sparse-weight 0.3
#                        --dense-weight 0.7                                      (default: RRF, k = 60)
MILVUS_INDEX_FLAGS  ?=
MILVUS_SEARCH_FLAGS ?=
MILVUS_HYBRID_FLAGS ?=
MILVUS_DIR          := $(WORK)/index/milvus-$(HEAD)
MILVUS_SPARSE_Q     := $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.expand.h5
MILVUS_DENSE_Q      := $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5

.PHONY: milvus
milvus: $(WORK)/eval/milvus-sparse.json $(WORK)/eval/milvus-dense.json $(WORK)/eval/milvus-hybrid.json

$(MILVUS_DIR)/mmsparse.json: $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< --dense $(word 2,$^) --engine milvus -o $(@D) $(MILVUS_INDEX_FLAGS)

$(WORK)/runs/milvus-sparse.trec: $(MILVUS_DIR)/mmsparse.json $(MILVUS_SPARSE_Q)
	$(MMSPARSE) search $(<D) $(MILVUS_SPARSE_Q) --mode sparse -o $@ --k $(K) $(MILVUS_SEARCH_FLAGS)

$(WORK)/runs/milvus-dense.trec: $(MILVUS_DIR)/mmsparse.json $(MILVUS_DENSE_Q)
	$(MMSPARSE) search $(<D) $(MILVUS_DENSE_Q) --mode dense -o $@ --k $(K) $(MILVUS_SEARCH_FLAGS)

$(WORK)/runs/milvus-hybrid.trec: $(MILVUS_DIR)/mmsparse.json $(MILVUS_SPARSE_Q) $(MILVUS_DENSE_Q)
	$(MMSPARSE) search $(<D) $(MILVUS_SPARSE_Q) --dense-queries $(MILVUS_DENSE_Q) --mode hybrid -o $@ --k $(K) \
	  $(MILVUS_HYBRID_FLAGS) $(MILVUS_SEARCH_FLAGS)

$(WORK)/eval/milvus-%.json: $(WORK)/runs/milvus-%.trec $(QRELS)
	$(MMSPARSE) eval $< $(QRELS) -o $@ $(EVAL_FLAGS)

# Build time and one-query-at-a-time latency at this collection's size (1,000 test images), Milvus
# Lite beside PISA, Seismic and Faiss Flat, each built fresh into a temporary directory with the
# `mmsparse index` defaults (Milvus: sparse + dense in one collection, exact FLAT dense field).
# Latency: MILVUS_TIMING_QUERIES expanded captions (seeded sample, non-empty), after
# MILVUS_TIMING_WARMUP untimed ones, one query per call, k = 10, 1 thread (Faiss OpenMP 1).
#   make -C examples/flickr8k milvus-timing   -> $(WORK)/eval/milvus-timing.json
MILVUS_TIMING_QUERIES ?= 500
MILVUS_TIMING_WARMUP  ?= 50
PYTHON                ?= python

define MILVUS_TIMING_PY
import json, platform, os, sys, tempfile, time
from pathlib import Path
import numpy as np
import faiss
import mmsparse
from mmsparse.atomic import atomic_path
from mmsparse.formats.dense import read_dense
from mmsparse.formats.sparse import read_sparse
from mmsparse.indexes import open_index
docs, dense_docs, qs, dq, out = sys.argv[1:6]
n, warm, k = int(sys.argv[6]), int(sys.argv[7]), 10
faiss.omp_set_num_threads(1)
Q, X = read_sparse(qs).matrix, read_dense(dq).vectors
live = np.flatnonzero(np.diff(Q.indptr) > 0)
pick = np.random.default_rng(0).choice(live, min(len(live), n + warm), replace=False)
def timed(fn):
    for j in pick[:warm]:
        fn(j)
    t = []
    for j in pick[warm:]:
        s = time.perf_counter()
        fn(j)
        t.append(time.perf_counter() - s)
    t = np.array(t) * 1e3
    return {"p50_ms": round(float(np.percentile(t, 50)), 3), "p90_ms": round(float(np.percentile(t, 90)), 3),
            "mean_ms": round(float(t.mean()), 3), "queries": len(t)}
def row(j):
    return Q.indices[Q.indptr[j]:Q.indptr[j + 1]], Q.data[Q.indptr[j]:Q.indptr[j + 1]]
D = read_sparse(docs).matrix
res = {"documents": D.shape[0], "nnz_per_doc": round(D.nnz / D.shape[0], 2), "query_nnz_mean":
       round(float(np.diff(Q.indptr)[pick].mean()), 2), "k": k, "warmup": warm, "machine":
       f"{platform.machine()}, {os.cpu_count()} logical CPUs", "engines": {}}
with tempfile.TemporaryDirectory() as tmp:
    for name, src, kw in (("milvus", docs, {"engine": "milvus", "dense": dense_docs}), ("pisa", docs, {}),
                          ("seismic", docs, {"engine": "seismic"}), ("faiss-flat", dense_docs, {})):
        d = Path(tmp) / name
        t0 = time.perf_counter()
        mmsparse.build_index(src, out=d, **kw)
        e = {"build_s": round(time.perf_counter() - t0, 3),
             "index_bytes": sum(p.stat().st_size for p in d.rglob("*") if p.is_file())}
        s = open_index(d)
        if name == "milvus":
            e["sparse"] = timed(lambda j: s.search_sparse(Q[j], k))
            e["dense"] = timed(lambda j: s.search_dense(X[j:j + 1], k))
            e["hybrid_rrf_c1000"] = timed(lambda j: s.search_hybrid(Q[j], X[j:j + 1], k))
            e["hybrid_rrf_c100"] = timed(lambda j: s.search_hybrid(Q[j], X[j:j + 1], k, candidates=100))
            s.close()
        elif name == "faiss-flat":
            e["dense"] = timed(lambda j: s.search_one(X[j], k))
        else:
            e["sparse"] = timed(lambda j: s.search_one(*row(j), k))
        res["engines"][name] = e
with atomic_path(out) as tmp:
    Path(tmp).write_text(json.dumps(res, indent=1) + "\n")
print(json.dumps(res, indent=1))
endef
export MILVUS_TIMING_PY

.PHONY: milvus-timing
milvus-timing: $(WORK)/eval/milvus-timing.json

$(WORK)/eval/milvus-timing.json: $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 \
  $(MILVUS_SPARSE_Q) $(MILVUS_DENSE_Q)
	$(PYTHON) -c "$$MILVUS_TIMING_PY" $^ $@ $(MILVUS_TIMING_QUERIES) $(MILVUS_TIMING_WARMUP)
