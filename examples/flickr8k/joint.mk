# joint.mk — joint sparse-dense self-distillation (train-head --method joint; CIKM 2025) on Flickr8k.
# Included by the Makefile (needs HEAD, WORK, EVAL_SPLIT, QRELS, the stages).
#
#   make joint            the side-by-side table (original dense, joint dense, D2S sparse, joint sparse;
#                         † = significant vs original dense), the Table 3 ablation and the w1 x w2 grid
#   make joint-ablation   only the ablation;   make joint-grid   only the grid (validation R@1)
#   make joint-curve      the full head's validation curve (plots/joint-curve.png)
#
# Inputs: $(JOINT_STATES)/{train,val,test}-{images,captions}.h5 from
#   mmsparse encode-dense ... --final-layer-inputs -o $(JOINT_STATES)   (final_input [+ final_mask]: what
#   enters each tower's final layer, float16; 30.6 KiB per image, 48 KiB per caption, 2.4 GB in all)
# Heads: $(WORK)/heads/joint (full), joint-nodistill (no L'), joint-frozen (final layers and projections frozen),
#        joint-grid-W1-W2 (grid cells, JOINT_GRID_FLAGS schedule).
# Outputs: $(WORK)/eval/joint-dense.json, joint-sparse.json, joint-table.md, joint-ablation.md, joint-grid.md,
#          $(WORK)/plots/joint-curve.png (validation per epoch);
#          tuned dense vectors in $(WORK)/dense/joint*/$(EVAL_SPLIT)-{images,captions}.h5.
#   JOINT_FLAGS       train-head flags of every joint head (the schedule; see below)
#   JOINT_GRID_FLAGS  flags of the grid cells (a shorter schedule: one epoch, 24 steps)
#   JOINT_W1 / JOINT_W2  grid values of w1 and w2
JOINT_STATES     ?= $(WORK)/dense/$(BACKBONE)-final
JOINT_SPLITS     := train val test
JOINT_DENSE      := $(foreach s,$(JOINT_SPLITS),$(JOINT_STATES)/$(s)-images.h5 $(JOINT_STATES)/$(s)-captions.h5)
.PRECIOUS: $(JOINT_DENSE)

$(JOINT_DENSE) &: $(KARPATHY_JSON)
	$(MMSPARSE) encode-dense $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(JOINT_STATES) --backbone $(BACKBONE) \
	  --model $(MODEL) --dataset $(DATASET) $(addprefix --split ,$(JOINT_SPLITS)) --final-layer-inputs $(ENCODE_FLAGS)

# The schedule, chosen by validation R@1 (docs/joint.md "Schedule"): 15 epochs of 24 steps of 256 image-caption
# pairs (the paper trains 200 on a GPU): validation sparse R@1 18.4 at epoch 14, against 16.9 after 10 epochs and
# a peak of 17.0 in 30 (longer runs over-fit: the learning rate decays to 0 over the run, and the training loss
# keeps falling while validation stays flat); the final layers at --final-lr 1e-4 (1e-5, the default, left the
# validation dense R@1 where it was); a negative initial bias starts the head sparse, so early sparse scores do
# not swamp s_inter (the teacher). No expansion control (the paper's main setting; PEC is its Fig. 2 left
# variant): with PEC the first epoch's captions keep only their own, mostly inactive terms and the sparse loss
# barely moves. ~28 s per epoch on 2 idle cores, validation included.
# --preset paper: the joint paper's settings (no D2S option: no gates, L1) under the flags that follow; joint's
# defaults add D2S's sparse options to this schedule (the frontier's joint heads, frontier.mk).
JOINT_FLAGS      ?= --preset paper --epochs 15 --batch-size 256 --eta 2e-3 --l1-warmup 40 --init-bias -2 \
                    --expansion full --vocab-min-df 1 --final-lr 1e-4
JOINT_GRID_FLAGS ?= --epochs 1 --l1-warmup 16
JOINT_W1         ?= 0.1 1
JOINT_W2         ?= 0.3 3
JOINT_INPUTS      = $(JOINT_STATES)/train-images.h5 $(JOINT_STATES)/train-captions.h5 \
                    $(JOINT_STATES)/val-images.h5 $(JOINT_STATES)/val-captions.h5
PYTHON           ?= python
# per-head flags: joint-nodistill, joint-frozen, joint-grid-W1-W2 (w1, w2 from the name)
JOINT_VARIANT_joint-nodistill = --no-distill
JOINT_VARIANT_joint-frozen    = --freeze-final-layer --freeze-projection
joint_flags = $(if $(filter grid,$(word 2,$(subst -, ,$(1)))),$(JOINT_GRID_FLAGS) --w1 $(word 3,$(subst -, ,$(1))) \
              --w2 $(word 4,$(subst -, ,$(1))),$(JOINT_VARIANT_$(1)))
JOINT_GRID  = $(foreach a,$(JOINT_W1),$(foreach b,$(JOINT_W2),joint-grid-$(a)-$(b)))

# Explicit rules per head (a pattern's % cannot match the empty stem of plain "joint"); they take
# precedence over the D2S pattern rules of stages/*.mk, whose inputs lack pre-projection states.
# $(2): the head's flags (default: JOINT_FLAGS and its variant's)
define JOINT_HEAD_RULES
$(WORK)/heads/$(1)/config.json: $(JOINT_INPUTS)
	$(MMSPARSE) train-head --method joint $(JOINT_STATES)/train-images.h5 $(JOINT_STATES)/train-captions.h5 \
	  --val-images $(JOINT_STATES)/val-images.h5 --val-captions $(JOINT_STATES)/val-captions.h5 \
	  -o $$(@D) $(if $(2),$(2),$(JOINT_FLAGS) $(call joint_flags,$(1))) $(TRAIN_FLAGS)
endef

# sparsify recomputes the dense vectors from the stored final-layer inputs through the head's tuned layers;
# --dense-out keeps them.
# Then the tuned dense model: Faiss index, run, evaluation (p-values vs the original dense run).
define JOINT_EVAL_RULES
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5 &: $(WORK)/heads/$(1)/config.json $(JOINT_STATES)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(JOINT_STATES)/$(EVAL_SPLIT)-images.h5 -o $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 \
	  --dense-out $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5 $(SPARSIFY_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 &: $(WORK)/heads/$(1)/config.json $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5 \
	  -o $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.expand.h5 --query-mode expand \
	  --dense-out $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 $(SPARSIFY_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.caption-terms.h5: $(WORK)/heads/$(1)/config.json $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode caption-terms $(SPARSIFY_FLAGS)

$(WORK)/index/dense-$(1)/mmsparse.json: $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $$< -o $$(@D) $(DENSE_INDEX_FLAGS)

$(WORK)/runs/dense-$(1).trec: $(WORK)/index/dense-$(1)/mmsparse.json $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) search $$(<D) $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 -o $$@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/eval/dense-$(1).json: $(WORK)/runs/dense-$(1).trec $(QRELS) $(WORK)/runs/dense.trec
	$(MMSPARSE) eval $$< $(QRELS) -o $$@ --dense-run $(WORK)/runs/dense.trec --n-comparisons 3 $(EVAL_FLAGS)
endef

# JOINT_EXTRA: more head names, each with flags JOINT_VARIANT_<name> (e.g. joint-lr with "--proj-lr 1e-3")
JOINT_EXTRA ?=
$(foreach h,joint joint-nodistill joint-frozen $(JOINT_EXTRA) $(JOINT_GRID),$(eval $(call JOINT_HEAD_RULES,$(h))))
$(foreach h,joint joint-nodistill joint-frozen $(JOINT_EXTRA),$(eval $(call JOINT_EVAL_RULES,$(h))))

$(WORK)/eval/joint-dense.json: $(WORK)/eval/dense-joint.json
	cp $< $@
$(WORK)/eval/joint-sparse.json: $(WORK)/eval/joint.expand.json
	cp $< $@

JOINT_COLUMNS = --column R@1 --column R@5 --column R@10 --column RR@10 --column FLOPs --column query_terms --column doc_terms

.PHONY: joint joint-table joint-ablation joint-grid joint-se joint-curve
joint: joint-table joint-ablation joint-grid joint-se joint-curve

joint-table: $(WORK)/eval/dense.json $(WORK)/eval/joint-dense.json $(WORK)/eval/$(HEAD).expand.json $(WORK)/eval/joint-sparse.json
	$(MMSPARSE) eval --table $^ --label "original dense" --label "joint dense" --label "D2S sparse" \
	  --label "joint sparse" $(JOINT_COLUMNS) -o $(WORK)/eval/joint-table.md

# paper Table 3: distillation x final-layer tuning (test split, † vs original dense)
joint-ablation: $(WORK)/eval/dense.json $(WORK)/eval/joint-frozen.expand.json $(WORK)/eval/joint-nodistill.expand.json $(WORK)/eval/joint.expand.json $(WORK)/eval/dense-joint-nodistill.json $(WORK)/eval/dense-joint.json
	$(MMSPARSE) eval --table $^ --label "original dense" --label "sparse: distill, frozen final layer" \
	  --label "sparse: no distill, tuned final layer" --label "sparse: distill, tuned final layer (full)" \
	  --label "dense: no distill, tuned final layer" --label "dense: distill, tuned final layer (full)" \
	  $(JOINT_COLUMNS) -o $(WORK)/eval/joint-ablation.md

# paper Fig. 2 right: validation R@1 over w1 x w2 (short schedule)
joint-grid: $(foreach h,$(JOINT_GRID),$(WORK)/heads/$(h)/config.json)
	$(PYTHON) -m mmsparse.methods.joint grid $(dir $^) -o $(WORK)/eval/joint-grid.md

# validation R@1 (sparse, dense) and FLOPs per epoch of the full head, against the main job's D2S head
joint-curve: $(WORK)/plots/joint-curve.png
$(WORK)/plots/joint-curve.png: $(WORK)/heads/joint/config.json $(WORK)/heads/$(HEAD)/config.json
	$(PYTHON) -m mmsparse.methods.joint curve $(<D) --reference $(WORK)/heads/$(HEAD) -o $@

# Tables 1-3 again with the standard error of each R@k (sqrt(p(1-p)/n) over the 5,000 queries)
JOINT_SE_ROWS = "original dense=$(WORK)/eval/dense.json" "joint dense=$(WORK)/eval/joint-dense.json" \
  "D2S sparse=$(WORK)/eval/$(HEAD).expand.json" "joint sparse=$(WORK)/eval/joint-sparse.json" \
  "sparse, frozen final layer=$(WORK)/eval/joint-frozen.expand.json" \
  "sparse, no distill=$(WORK)/eval/joint-nodistill.expand.json" \
  "dense, no distill=$(WORK)/eval/dense-joint-nodistill.json"
joint-se: joint-table joint-ablation
	$(PYTHON) -m mmsparse.methods.joint se $(JOINT_SE_ROWS) -o $(WORK)/eval/joint-se.md
