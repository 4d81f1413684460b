# bench.mk — the search and train-head benchmarks (issues 17, 20; docs/search-benchmark.md).
# Included by the Makefile (needs WORK, DATA, MODEL, HEAD, BACKBONE, DENSE_DIR, EVAL_SPLIT, the stages).
# Not part of `all`. Heavy: run them under the shared CPU lock on a shared machine.
#
#   make bench-views       $(BENCH)/views/$(BACKBONE)/views.h5: BENCH_VIEWS augmented views (crops, flips,
#                          colour jitter, two-image collages) of all 8,091 images, encoded by the real dual
#                          encoder; head-independent and resumable (shard by shard; ~25 min on 2 idle cores);
#                          and topup/views.h5: BENCH_VIEWS_TOPUP more views (seed 1) of the non-test images only
#   make bench-collections the dense collections (head-independent): $(BENCH)/collections/123k.dense.h5
#                          (test images + the first BENCH_VIEWS views that show no test image: views of a
#                          test image would be near-duplicates of the relevant documents), 1m.dense.h5
#                          (+ BENCH_MIXTURE documents of the view mixture model, fitted to those views only),
#                          mixture-check.dense.h5, mixture.npz
#   make bench-figures     $(BENCH)/$(HEAD)/collections/figures.json (+ .md): terms per document, posting
#                          lengths, FLOPs, most common term of the test set, 123k, the views alone, the
#                          mixture check sample and 1m, all sparsified by HEAD
#   make bench-search      the search benchmark on HEAD: $(BENCH)/$(HEAD)/search.json (+ .md, .meta.json)
#                          and frontier.png, copied to $(BENCH)/frontier.png; `make bench-search HEAD=name`
#                          re-runs everything head-dependent for another head (sparse files by the stages,
#                          the view collections by `mmsparse sparsify` below); indexes are kept and reused
#   make bench-synthetic   the labelled stress test: synthetic collections with independently placed terms
#                          ($(BENCH)/$(HEAD)/synthetic-N, frontier-synthetic.png)
#   make bench-train       $(WORK)/bench/train-head.json (+ .md): train-head step time vs the bare vocabulary
#                          projection; simulated rows labelled, plus a head really trained at |V| = 30522
#
#   BENCH_VIEWS      views in the collection                   (default: 122000; + 1,000 test images = 123k)
#   BENCH_VIEWS_TOPUP views of non-test images made to replace the 17,718 of views.h5 that show a test image
#                    (default: 17718; 0 = no top-up set: the 123k collection then holds 1,000 + 104,282)
#   BENCH_MIXTURE    mixture documents added for the 1M scale (default: 877000)
#   BENCH_SCALES     scales of bench-search                   (default: flickr8k,123k,1m)
#   BENCH_SYNTHETIC  scales of bench-synthetic                (default: synthetic-123000,synthetic-1000000)
#   BENCH_FLAGS      more flags of `python -m mmsparse.bench.search` (see its --help; e.g. --jobs pisa)
#   BENCH_TRAIN_EPOCHS epochs of the |V| = 30522 head of bench-train (default: 5 = 300 steps of 512 captions)
#   BENCH_PYTHON     the interpreter with mmsparse installed  (default: python)
BENCH            ?= $(WORK)/bench
BENCH_VIEWS      ?= 122000
BENCH_VIEWS_TOPUP ?= 17718
BENCH_MIXTURE    ?= 877000
BENCH_SCALES     ?= flickr8k,123k,1m
BENCH_SYNTHETIC  ?= synthetic-123000,synthetic-1000000
BENCH_FLAGS      ?=
BENCH_TRAIN_EPOCHS ?= 5
BENCH_PYTHON     ?= python
VIEWS_DIR        := $(BENCH)/views/$(BACKBONE)
VIEWS_FILES       = $(VIEWS_DIR)/views.h5 $(if $(filter-out 0,$(BENCH_VIEWS_TOPUP)),$(VIEWS_DIR)/topup/views.h5)
COLL_DENSE       := $(BENCH)/collections
COLL_SPARSE       = $(BENCH)/$(HEAD)/collections
# the collections bench-search needs for BENCH_SCALES
bench_colls       = $(foreach s,123k 1m,$(if $(findstring $(s),$(BENCH_SCALES)),$(COLL_SPARSE)/$(s).h5 $(COLL_DENSE)/$(s).dense.h5))
BENCH_INPUTS      = $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5 \
                    $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.expand.h5 \
                    $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.caption-terms.h5 \
                    $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 $(QRELS)
BENCH_SEARCH      = $(BENCH_PYTHON) -m mmsparse.bench.search --work $(WORK) --head $(HEAD) --backbone $(BACKBONE) \
                    --split $(EVAL_SPLIT) --out $(BENCH)/$(HEAD) --collections $(COLL_SPARSE) \
                    --dense-collections $(COLL_DENSE)

.PHONY: bench-views bench-collections bench-figures bench-search bench-synthetic bench-train

bench-views: $(VIEWS_FILES)

$(VIEWS_DIR)/views.h5:
	$(BENCH_PYTHON) -m mmsparse.bench.views $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(VIEWS_DIR) \
	  --backbone $(BACKBONE) --model $(MODEL) --views $(BENCH_VIEWS) --dataset $(DATASET)

$(VIEWS_DIR)/topup/views.h5:
	$(BENCH_PYTHON) -m mmsparse.bench.views $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(VIEWS_DIR)/topup \
	  --backbone $(BACKBONE) --model $(MODEL) --views $(BENCH_VIEWS_TOPUP) --dataset $(DATASET) \
	  --exclude-split $(EVAL_SPLIT) --seed 1

bench-collections: $(COLL_DENSE)/123k.dense.h5

$(COLL_DENSE)/123k.dense.h5 $(COLL_DENSE)/1m.dense.h5 $(COLL_DENSE)/mixture-check.dense.h5 &: \
    $(VIEWS_FILES) $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(BENCH_PYTHON) -m mmsparse.bench.collection dense --views $(VIEWS_FILES) \
	  --originals $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 -o $(COLL_DENSE) --mixture $(BENCH_MIXTURE) \
	  --max-views $(BENCH_VIEWS)

# a head's sparse view collections (the full head output, as for the test images)
$(COLL_SPARSE)/%.h5: $(WORK)/heads/$(HEAD)/config.json $(COLL_DENSE)/%.dense.h5
	$(MMSPARSE) sparsify $(WORK)/heads/$(HEAD) $(COLL_DENSE)/$*.dense.h5 -o $@ --batch-size 4096

bench-figures: $(COLL_SPARSE)/figures.json

$(COLL_SPARSE)/figures.json: $(BENCH_INPUTS) $(COLL_SPARSE)/123k.h5 $(COLL_SPARSE)/mixture-check.h5 $(COLL_SPARSE)/1m.h5
	$(BENCH_PYTHON) -m mmsparse.bench.collection figures --queries $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.expand.h5 \
	  -o $@ flickr8k-test=$(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5 123k=$(COLL_SPARSE)/123k.h5 \
	  views=$(COLL_SPARSE)/123k.h5#views mixture-check=$(COLL_SPARSE)/mixture-check.h5 1m=$(COLL_SPARSE)/1m.h5

bench-search: $(BENCH_INPUTS) $(bench_colls) $(if $(findstring 1m,$(BENCH_SCALES)),$(COLL_SPARSE)/figures.json)
	$(BENCH_SEARCH) --scales $(BENCH_SCALES) $(BENCH_FLAGS)
	cp $(BENCH)/$(HEAD)/frontier.png $(BENCH)/frontier.png

bench-synthetic: $(BENCH_INPUTS)
	$(BENCH_SEARCH) --scales $(BENCH_SYNTHETIC) $(BENCH_FLAGS)

# train-head speed (issue 20): paper shapes (d=256, ω=768, |V|=30522) with a simulated sparse state, the
# issue's shape, this example's head, and a head trained through the CLI at the paper's |V| = 30522
# (the main job's D2S_FLAGS + --vocab-min-df 0) for BENCH_TRAIN_EPOCHS epochs, timed once it is sparse
HEAD_FLAGS_bench-v30522 = $(D2S_FLAGS) --vocab-min-df 0 --epochs $(BENCH_TRAIN_EPOCHS)
bench-train: $(WORK)/heads/$(HEAD)/config.json $(WORK)/heads/bench-v30522/config.json
	$(BENCH_PYTHON) -m mmsparse.bench.train -o $(WORK)/bench/train-head.json --head $(WORK)/heads/$(HEAD) \
	  --trained-head $(WORK)/heads/bench-v30522 \
	  --images $(DENSE_DIR)/train-images.h5 --captions $(DENSE_DIR)/train-captions.h5
