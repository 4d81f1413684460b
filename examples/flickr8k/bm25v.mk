# bm25v.mk — BM25-V (issue 9): SAE visual words + Okapi BM25 + dense rerank, image-to-image.
#
#   make -C examples/flickr8k bm25v     the whole chain below, then the Table-2-like summary
#
# No fine-grained benchmark is on this machine, so the example builds a class-labelled set from
# Flickr8k: an image belongs to class c (dog, bike, beach, snow, skateboard, climbing, football,
# horse, boat, pool) when >= 2 of its 5 captions mention a keyword of c and none mentions a keyword
# of another class (mmsparse/data/folders.py, FLICKR8K_CLASSES). The folder holds symlinks only.
# For CUB-200 / Cars / Oxford Pets set BM25V_CLASSES to the benchmark's class folder (one
# sub-folder per class; Pets: BM25V_LABELS=stem-prefix) and drop the `keywords` step.
#
#   $(BM25V_CLASSES)/<class>/<image>.jpg   class folder (symlinks) + classes.json
#   $(BM25V_CLASSES).qrels                 image-to-image qrels: same class = relevant, query excluded
#   $(BM25V_DENSE)                         dense vectors + patch_states of the class folder's images
#                                          (rows of the Flickr8k split files, BM25V_FROM; or encoded)
#   $(WORK)/heads/bm25v/                   top-k SAE trained on the patches of $(BM25V_TRAIN)
#                                          (Flickr8k train split; no labels are used)
#   $(WORK)/sparse/bm25v/gallery.h5        visual words per image (sum-pool, top-16, uint16 ×100)
#   $(WORK)/index/bm25v/                   PISA over BM25 weights (--weighting bm25)
#   $(WORK)/index/image-dense/             Faiss exact inner product over the dense vectors
#   $(WORK)/runs/{bm25v,bm25v-rerank100,bm25v-rerank200,image-dense}.trec
#   $(WORK)/eval/{bm25v,bm25v-rerank100,bm25v-rerank200,image-dense}.json
#   $(WORK)/eval/bm25v-table.md            R@1/5/10/100 and bytes/image, as BM25-V Table 2
#   $(WORK)/eval/bm25v-zipf.txt, $(WORK)/plots/bm25v-zipf.png   rank-frequency fit (§5)
#   make bm25v-dot: $(WORK)/eval/bm25v-dot.json, the same words by plain dot product (§4.4 ablation)
#
# Settable: BM25V_SAE_FLAGS (train-head flags), BM25V_K_POST (16), BM25V_INDEX_FLAGS,
# BM25V_RERANK_KS (100 200), BM25V_RUN_K (results per query, 200).
BM25V_CLASSES     ?= $(WORK)/classes/flickr8k-classes
BM25V_LABELS      ?= subfolder
# at most 300 images per class: uncapped, dogs would be 47% of the gallery
BM25V_KEYWORD_FLAGS ?= --max-per-class 300
BM25V_DATASET     ?= $(notdir $(BM25V_CLASSES))
BM25V_DENSE_DIR   ?= $(WORK)/dense/$(BACKBONE)-classes
BM25V_DENSE       := $(BM25V_DENSE_DIR)/all-images.h5
BM25V_QRELS       := $(BM25V_CLASSES).qrels
BM25V_STATES_DIR  ?= $(WORK)/dense/$(BACKBONE)-states
BM25V_TRAIN       ?= $(BM25V_STATES_DIR)/train-images.h5
# Dense files the class folder's rows are gathered from (no second encoding of the same images);
# empty: encode the class folder itself (`encode-dense ROOT --format folder`), as for a benchmark.
BM25V_FROM        ?= $(foreach s,train val test,$(BM25V_STATES_DIR)/$(s)-images.h5)
# 96k training patches: more, smaller steps than the paper's 5 x 4096 (which assumes ImageNet).
BM25V_SAE_FLAGS   ?= --epochs 4 --batch-size 1024 --lr 1e-3 --threads 1
BM25V_K_POST      ?= 16
BM25V_INDEX_FLAGS ?= --quant-bits 16
BM25V_RUN_K       ?= 200
BM25V_RERANK_KS   ?= 100 200
BM25V_MEASURES    := --measure Success@1 --measure Success@5 --measure Success@10 --measure Success@100 --measure R@100
BM25V_EVALS       := $(WORK)/eval/bm25v.json $(WORK)/eval/image-dense.json \
                     $(foreach k,$(BM25V_RERANK_KS),$(WORK)/eval/bm25v-rerank$(k).json)

.PHONY: bm25v bm25v-eval
bm25v: $(WORK)/eval/bm25v-table.md $(WORK)/eval/bm25v-zipf.txt
	@cat $<
bm25v-eval: $(BM25V_EVALS)

$(BM25V_CLASSES)/classes.json: $(KARPATHY_JSON)
	python -m mmsparse.data.folders keywords $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(@D) $(BM25V_KEYWORD_FLAGS)

$(BM25V_QRELS): $(BM25V_CLASSES)/classes.json
	python -m mmsparse.data.folders qrels $(BM25V_CLASSES) -o $@ --labels $(BM25V_LABELS) --dataset $(BM25V_DATASET)

ifneq ($(strip $(BM25V_FROM)),)
# the class folder's images are Flickr8k images already encoded with --patch-states: take their rows
$(BM25V_DENSE): $(BM25V_CLASSES)/classes.json $(BM25V_FROM)
	python -m mmsparse.data.folders gather $(BM25V_CLASSES) $(BM25V_FROM) -o $@ --labels $(BM25V_LABELS) \
	  --dataset $(BM25V_DATASET)
else
$(BM25V_DENSE): $(BM25V_CLASSES)/classes.json
	$(MMSPARSE) encode-dense $(BM25V_CLASSES) --format folder --split all --backbone $(BACKBONE) --model $(MODEL) \
	  --dataset $(BM25V_DATASET) --patch-states -o $(BM25V_DENSE_DIR) $(ENCODE_FLAGS)
endif

# Flickr8k split images with patch features (the SAE's training patches; the gallery's source)
$(BM25V_STATES_DIR)/%-images.h5:
	$(MMSPARSE) encode-dense $(KARPATHY_JSON) $(IMAGE_ROOT) --split $* --backbone $(BACKBONE) --model $(MODEL) \
	  --dataset $(DATASET) --patch-states -o $(@D) $(ENCODE_FLAGS)

$(WORK)/heads/bm25v/config.json: $(BM25V_TRAIN)
	$(MMSPARSE) train-head --method bm25v $< -o $(@D) $(BM25V_SAE_FLAGS)

$(WORK)/sparse/bm25v/gallery.h5: $(WORK)/heads/bm25v/config.json $(BM25V_DENSE)
	$(MMSPARSE) sparsify $(<D) $(BM25V_DENSE) -o $@ --k-post $(BM25V_K_POST)

$(WORK)/index/bm25v/mmsparse.json: $(WORK)/sparse/bm25v/gallery.h5
	$(MMSPARSE) index $< -o $(@D) --weighting bm25 $(BM25V_INDEX_FLAGS)

$(WORK)/index/image-dense/mmsparse.json: $(BM25V_DENSE)
	$(MMSPARSE) index $< -o $(@D)

# every image queries the gallery it belongs to; its own id is dropped from its results
$(WORK)/runs/bm25v.trec: $(WORK)/index/bm25v/mmsparse.json $(WORK)/sparse/bm25v/gallery.h5
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $(BM25V_RUN_K) --exclude-self

$(WORK)/runs/bm25v-rerank%.trec: $(WORK)/index/bm25v/mmsparse.json $(WORK)/sparse/bm25v/gallery.h5 $(BM25V_DENSE)
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $* --exclude-self --rerank-dense $(BM25V_DENSE) --rerank-k $*

$(WORK)/runs/image-dense.trec: $(WORK)/index/image-dense/mmsparse.json $(BM25V_DENSE)
	$(MMSPARSE) search $(<D) $(BM25V_DENSE) -o $@ --k $(BM25V_RUN_K) --exclude-self

$(BM25V_EVALS): $(WORK)/eval/%.json: $(WORK)/runs/%.trec $(BM25V_QRELS)
	$(MMSPARSE) eval $< $(BM25V_QRELS) -o $@ $(BM25V_MEASURES)

$(WORK)/eval/bm25v-table.md: $(BM25V_EVALS) $(WORK)/index/bm25v/mmsparse.json $(WORK)/index/image-dense/mmsparse.json
	python -m mmsparse.methods.bm25v table --bm25v $(WORK)/eval/bm25v.json --dense $(WORK)/eval/image-dense.json \
	  $(foreach k,$(BM25V_RERANK_KS),--rerank $(k)=$(WORK)/eval/bm25v-rerank$(k).json) \
	  --sparse-index $(WORK)/index/bm25v --dense-index $(WORK)/index/image-dense -o $@

$(WORK)/eval/bm25v-zipf.txt: $(WORK)/index/bm25v/mmsparse.json
	@mkdir -p $(WORK)/plots
	$(MMSPARSE) inspect $(<D) --stats --png $(WORK)/plots/bm25v-zipf.png > $@

# §4.4 ablation: the same visual words scored by a plain dot product (no BM25 weighting)
.PHONY: bm25v-dot
bm25v-dot: $(WORK)/eval/bm25v-dot.json
$(WORK)/index/bm25v-dot/mmsparse.json: $(WORK)/sparse/bm25v/gallery.h5
	$(MMSPARSE) index $< -o $(@D) $(BM25V_INDEX_FLAGS)
$(WORK)/runs/bm25v-dot.trec: $(WORK)/index/bm25v-dot/mmsparse.json $(WORK)/sparse/bm25v/gallery.h5
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $(BM25V_RUN_K) --exclude-self --query-bits 16
$(WORK)/eval/bm25v-dot.json: $(WORK)/runs/bm25v-dot.trec $(BM25V_QRELS)
	$(MMSPARSE) eval $< $(BM25V_QRELS) -o $@ $(BM25V_MEASURES)
