# bench.mk — the search and train-head benchmarks (issues 17, 20, 25; docs/search-benchmark.md).
# Included by the Makefile (needs WORK, DATA, MODEL, HEAD, BACKBONE, DENSE_DIR, EVAL_SPLIT, the stages).
# Not part of `all`. Heavy: run them under the shared CPU lock on a shared machine.
#
#   make bench-views       $(BENCH)/views/$(BACKBONE)/views.h5: BENCH_VIEWS augmented views (crops, flips,
#                          colour jitter, two-image collages) of the 7,091 non-test images (no view may show a
#                          test image: it would be a near-duplicate of a relevant document), encoded by the real
#                          dual encoder; head-independent and resumable (shard by shard; ~25 images/s on 2 idle
#                          cores)
#   make bench-collections the dense collections (head-independent) in $(BENCH)/collections: 123k.dense.h5 (the
#                          test images + the BENCH_VIEWS real views + draws of the view mixture model, fitted to
#                          those views, up to BENCH_SIZE documents), 1m.dense.h5 (+ BENCH_MIXTURE more draws),
#                          mixture-check.dense.h5 (as many draws as real views, another seed), mixture.npz and
#                          collections.json (what each file holds)
#   make bench-figures     $(BENCH)/HEAD/collections/figures.json (+ .md) for every head of BENCH_HEADS: terms per
#                          document, posting lengths, FLOPs, most common term of the test set, 123k, the real views
#                          alone, the mixture check sample and 1m, all sparsified by that head
#   make bench-search      the search benchmark on every head of BENCH_HEADS: the search-only jobs per head on its
#                          own sparse collections (sparsified from the same dense ones by `mmsparse sparsify`
#                          below: exhaustive, PISA, Seismic, BMP, kANNolo, each over a grid of its settings that
#                          runs past overlap@10 0.95), the dense jobs once (Faiss Flat, HNSW at efSearch 10-512), the end-to-end job (caption text in, top-10 image ids out,
#                          encoder included) for dense and each head's query modes: $(BENCH)/search.json (+ .md:
#                          first every engine's fastest setting at overlap@10 >= 0.95 per scale, .meta.json: the
#                          goals, issue 50's ratios to HNSW) and $(BENCH)/frontier.png; results per head in
#                          $(BENCH)/HEAD/SCALE, dense in $(BENCH)/dense/SCALE; indexes are kept and reused
#   make bench-synthetic   the labelled stress test: synthetic collections with independently placed terms
#                          ($(BENCH)/HEAD/synthetic-N, frontier-synthetic.png)
#   make bench-train       $(WORK)/bench/train-head.json (+ .md): train-head step time vs the bare vocabulary
#                          projection; simulated rows labelled, plus a head really trained at |V| = 30522; each
#                          row in fp32 and under bf16 autocast (--amp bf16; only where the CPU has AMX/AVX512-BF16)
#   make bench-encode      $(WORK)/bench/encode.json (+ .md): encode-dense images/s and captions/s on the first
#                          BENCH_ENCODE_IMAGES images and BENCH_ENCODE_CAPTIONS captions of the train split, one
#                          process per configuration: glibc's malloc (before) vs mmsparse's setting, fp32 vs
#                          bf16 (where the CPU or GPU has it), channels-last, 1 thread vs all (docs/speed.md)
#
#   BENCH_HEADS      heads of bench-search / bench-figures    (default: d2s if; `if` is the inference-free head)
#   BENCH_QUERY_MODES_NAME  the query files of head NAME      (default: expand caption-terms; if: inference-free;
#                    the benchmark reads the modes from the head's method, these only tell Make what to build)
#   BENCH_VIEWS      real views encoded and kept              (default: 40000)
#   BENCH_SIZE       documents of the 123k collection         (default: 123000 = 1,000 test images + BENCH_VIEWS
#                    views + 82,000 mixture draws)
#   BENCH_MIXTURE    more mixture draws of the 1M collection   (default: 877000: 1,000,000 documents)
#   BENCH_SCALES     scales of bench-search                   (default: flickr8k,123k,1m)
#   BENCH_SYNTHETIC  scales of bench-synthetic                (default: synthetic-123000,synthetic-1000000)
#   BENCH_FLAGS      more flags of `python -m mmsparse.bench.search` (see its --help; e.g. --jobs pisa)
#   BENCH_TRAIN_EPOCHS epochs of the |V| = 30522 head of bench-train (default: 5 = 300 steps of 512 captions)
#   make faults            $(WORK)/bench/faults.json (+ .md): encode-dense (images, captions), train-head, sparsify and
#                          index interrupted FAULT_KILLS times each at random points (SIGKILL, SIGINT), rerun and
#                          compared with a clean run (docs/formats.md, Reliability; ~40 min on 2 cores)
#   FAULT_KILLS      interruptions per stage of `faults`         (default: 50)
#   FAULT_SEED       their seed                                  (default: 0)
#   BENCH_ENCODE_IMAGES / BENCH_ENCODE_CAPTIONS  images / captions per bench-encode row (default: 512 / 4096)
#   BENCH_ENCODE_FLAGS more flags of `python -m mmsparse.bench.encode` (e.g. --device cuda --batch-size 256)
#   BENCH_PYTHON     the interpreter with mmsparse installed  (default: python)
BENCH            ?= $(WORK)/bench
BENCH_HEADS      ?= d2s if
BENCH_QUERY_MODES_d2s ?= expand caption-terms
BENCH_QUERY_MODES_if  ?= inference-free
BENCH_VIEWS      ?= 40000
BENCH_SIZE       ?= 123000
BENCH_MIXTURE    ?= 877000
BENCH_SCALES     ?= flickr8k,123k,1m
BENCH_SYNTHETIC  ?= synthetic-123000,synthetic-1000000
BENCH_FLAGS      ?=
BENCH_TRAIN_EPOCHS ?= 5
FAULT_KILLS      ?= 50
FAULT_SEED       ?= 0
BENCH_ENCODE_IMAGES   ?= 512
BENCH_ENCODE_CAPTIONS ?= 4096
BENCH_ENCODE_FLAGS    ?=
BENCH_PYTHON     ?= python
VIEWS_DIR        := $(BENCH)/views/$(BACKBONE)
COLL_DENSE       := $(BENCH)/collections
bench_empty      :=
bench_space      := $(bench_empty) $(bench_empty)
bench_comma      := ,
# a head's query modes, its test inputs, and its sparse collections for BENCH_SCALES
bench_modes       = $(or $(BENCH_QUERY_MODES_$(1)),expand caption-terms)
bench_inputs      = $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 \
                    $(foreach m,$(call bench_modes,$(1)),$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.$(m).h5)
bench_colls       = $(foreach s,123k 1m,$(if $(findstring $(s),$(BENCH_SCALES)),$(BENCH)/$(1)/collections/$(s).h5 \
                    $(COLL_DENSE)/$(s).dense.h5))
BENCH_DENSE_INPUTS = $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 $(QRELS)
BENCH_SEARCH      = $(BENCH_PYTHON) -m mmsparse.bench.search --work $(WORK) \
                    --heads $(subst $(bench_space),$(bench_comma),$(strip $(BENCH_HEADS))) --backbone $(BACKBONE) \
                    --split $(EVAL_SPLIT) --out $(BENCH) --dense-collections $(COLL_DENSE)

.PHONY: bench-views bench-collections bench-figures bench-search bench-synthetic bench-train bench-encode faults

bench-views: $(VIEWS_DIR)/views.h5

$(VIEWS_DIR)/views.h5:
	$(BENCH_PYTHON) -m mmsparse.bench.views $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(VIEWS_DIR) \
	  --backbone $(BACKBONE) --model $(MODEL) --views $(BENCH_VIEWS) --dataset $(DATASET) --exclude-split $(EVAL_SPLIT)

bench-collections: $(COLL_DENSE)/123k.dense.h5

$(COLL_DENSE)/123k.dense.h5 $(COLL_DENSE)/1m.dense.h5 $(COLL_DENSE)/mixture-check.dense.h5 &: \
    $(VIEWS_DIR)/views.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(BENCH_PYTHON) -m mmsparse.bench.collection dense --views $(VIEWS_DIR)/views.h5 \
	  --originals $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 -o $(COLL_DENSE) --max-views $(BENCH_VIEWS) \
	  --size $(BENCH_SIZE) --mixture $(BENCH_MIXTURE)

# each head's sparse collections (its full output on the same dense collections, as for the test images)
# and their figures (FLOPs against its first query mode: expanded for D2S, the table's for inference-free)
define bench_head_rules
$(BENCH)/$(1)/collections/%.h5: $(WORK)/heads/$(1)/config.json $(COLL_DENSE)/%.dense.h5
	$$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(COLL_DENSE)/$$*.dense.h5 -o $$@ --batch-size 4096

$(BENCH)/$(1)/collections/figures.json: $(call bench_inputs,$(1)) $(foreach c,123k mixture-check 1m,$(BENCH)/$(1)/collections/$(c).h5)
	$$(BENCH_PYTHON) -m mmsparse.bench.collection figures \
	  --queries $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.$(firstword $(call bench_modes,$(1))).h5 -o $$@ \
	  flickr8k-test=$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 123k=$(BENCH)/$(1)/collections/123k.h5 \
	  views=$(BENCH)/$(1)/collections/123k.h5#views mixture-check=$(BENCH)/$(1)/collections/mixture-check.h5 \
	  1m=$(BENCH)/$(1)/collections/1m.h5
endef
$(foreach h,$(BENCH_HEADS),$(eval $(call bench_head_rules,$(h))))

bench-figures: $(foreach h,$(BENCH_HEADS),$(BENCH)/$(h)/collections/figures.json)

bench-search: $(BENCH_DENSE_INPUTS) $(foreach h,$(BENCH_HEADS),$(call bench_inputs,$(h)) $(call bench_colls,$(h))) \
    $(if $(findstring 1m,$(BENCH_SCALES)),$(foreach h,$(BENCH_HEADS),$(BENCH)/$(h)/collections/figures.json))
	$(BENCH_SEARCH) --scales $(BENCH_SCALES) $(BENCH_FLAGS)

bench-synthetic: $(BENCH_DENSE_INPUTS) $(foreach h,$(BENCH_HEADS),$(call bench_inputs,$(h)))
	$(BENCH_SEARCH) --scales $(BENCH_SYNTHETIC) $(BENCH_FLAGS)

# train-head speed (issue 20): paper shapes (d=256, ω=768, |V|=30522) with a simulated sparse state, the
# issue's shape, this example's head, and a head trained through the CLI at the paper's |V| = 30522
# (the main job's D2S_FLAGS + --vocab-min-df 0) for BENCH_TRAIN_EPOCHS epochs, timed once it is sparse
HEAD_FLAGS_bench-v30522 = $(D2S_FLAGS) --vocab-min-df 0 --epochs $(BENCH_TRAIN_EPOCHS)
bench-train: $(WORK)/heads/$(HEAD)/config.json $(WORK)/heads/bench-v30522/config.json
	$(BENCH_PYTHON) -m mmsparse.bench.train -o $(WORK)/bench/train-head.json --head $(WORK)/heads/$(HEAD) --amp none,bf16 \
	  --trained-head $(WORK)/heads/bench-v30522 \
	  --images $(DENSE_DIR)/train-images.h5 --captions $(DENSE_DIR)/train-captions.h5

# encode-dense throughput (issue 35): each configuration in its own process, every row in one run
bench-encode:
	$(BENCH_PYTHON) -m mmsparse.bench.encode $(KARPATHY_JSON) $(IMAGE_ROOT) --model $(MODEL) -o $(WORK)/bench/encode.json \
	  --images $(BENCH_ENCODE_IMAGES) --captions $(BENCH_ENCODE_CAPTIONS) $(BENCH_ENCODE_FLAGS)

# interrupted and rerun stages compared with clean runs (issue 37): exits 1 if any rerun differs
faults:
	$(BENCH_PYTHON) -m mmsparse.bench.faults -o $(WORK)/bench/faults.json --kills $(FAULT_KILLS) --seed $(FAULT_SEED) \
	  --data $(DATA) --model $(MODEL)
