# paper-joint.mk — the joint paper's pipeline (Song et al., CIKM 2025: the sparse head trained with the final
# layers of both towers, `train-head --method joint`) over any dataset and backbone. Included by
# stages/paper-d2s.mk after the stage fragments (it reuses DENSE_DIR's dense run as the baseline).
#
#   make joint            encode with --final-layer-inputs -> train the joint head -> sparsify (and the tuned
#                         dense vectors, --dense-out) -> index both -> search -> eval -> $(WORK)/eval/joint-table.md:
#                         Tables 1-2 in shape (dense backbone, joint dense, the D2S heads, joint sparse)
#   make joint-ablation   Table 3 (self-distillation x final-layer tuning): $(WORK)/eval/joint-ablation.md
#
#   JOINT_STATES     the --final-layer-inputs files (default: $(WORK)/dense/$(BACKBONE)-final)
#   JOINT_LIMIT      encode only the first N images of each split into JOINT_STATES (default: all; joint
#                    training holds every stored state in memory: see the example's README for the sizes)
#   JOINT_FLAGS      train-head flags of every joint head: the schedule (set by the example: the authors'
#                    released training configuration for its dataset and backbone)
#   JOINT_REFERENCE  sparse heads shown beside the joint rows (default: the D2S heads of HEADS)
JOINT_STATES    ?= $(WORK)/dense/$(BACKBONE)-final
JOINT_LIMIT     ?=
JOINT_FLAGS     ?=
JOINT_REFERENCE ?= $(HEADS)
JOINT_FILES     := $(call dense_files,$(JOINT_STATES))
$(eval $(call ENCODE_RULES,$(JOINT_STATES),--final-layer-inputs$(if $(JOINT_LIMIT), --limit $(JOINT_LIMIT))))
.PRECIOUS: $(JOINT_FILES)

JOINT_INPUTS = $(JOINT_STATES)/train-images.h5 $(JOINT_STATES)/train-captions.h5 \
               $(JOINT_STATES)/val-images.h5 $(JOINT_STATES)/val-captions.h5
# Table 3's variants: contrastive only (no L'), and the whole dense side frozen
JOINT_VARIANT_joint-nodistill = --no-distill
JOINT_VARIANT_joint-frozen    = --freeze-final-layer --freeze-projection

# Explicit rules per head: they take precedence over the pattern rules of stages/*.mk, whose inputs (DENSE_DIR)
# lack the final-layer inputs.
define PAPER_JOINT_RULES
$(WORK)/heads/$(1)/config.json: $(JOINT_INPUTS)
	$$(MMSPARSE) train-head --method joint $(JOINT_STATES)/train-images.h5 $(JOINT_STATES)/train-captions.h5 \
	  --val-images $(JOINT_STATES)/val-images.h5 --val-captions $(JOINT_STATES)/val-captions.h5 \
	  -o $$(@D) --preset paper $$(JOINT_FLAGS) $$(JOINT_VARIANT_$(1)) $$(TRAIN_FLAGS)

# sparsify recomputes the dense vectors through the head's tuned final layers and projections (--dense-out
# keeps them); index, search and eval of the sparse files are the pattern rules of stages/*.mk
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5 &: $(WORK)/heads/$(1)/config.json $(JOINT_STATES)/$(EVAL_SPLIT)-images.h5
	$$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(JOINT_STATES)/$(EVAL_SPLIT)-images.h5 \
	  -o $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 --dense-out $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5 $$(SPARSIFY_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 &: $(WORK)/heads/$(1)/config.json $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5
	$$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(JOINT_STATES)/$(EVAL_SPLIT)-captions.h5 \
	  -o $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.expand.h5 --query-mode expand \
	  --dense-out $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 $$(SPARSIFY_FLAGS)

# the tuned dense vectors: Faiss index, run, evaluation (p-values vs the backbone's dense run)
$(WORK)/index/dense-$(1)/mmsparse.json: $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5
	$$(MMSPARSE) index $$< -o $$(@D) $$(DENSE_INDEX_FLAGS)

$(WORK)/runs/dense-$(1).trec: $(WORK)/index/dense-$(1)/mmsparse.json $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5
	$$(MMSPARSE) search $$(<D) $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5 -o $$@ --k $$(K) $$(SEARCH_FLAGS)

$(WORK)/eval/dense-$(1).json: $(WORK)/runs/dense-$(1).trec $(QRELS) $(WORK)/runs/dense.trec
	$$(MMSPARSE) eval $$< $(QRELS) -o $$@ --dense-run $(WORK)/runs/dense.trec $$(EVAL_FLAGS)
endef
$(foreach h,joint joint-nodistill joint-frozen,$(eval $(call PAPER_JOINT_RULES,$(h))))

JOINT_COLUMNS = --column R@1 --column R@5 --column RR@10 --column R@10 --column FLOPs

# Tables 1-2: the backbone's dense run, the joint head's dense and sparse runs, the D2S heads (sparse);
# † = p < 0.05 vs the backbone's dense run (paired t-test, Bonferroni over the rows)
$(WORK)/eval/joint-table.md: $(WORK)/eval/dense.json $(WORK)/eval/dense-joint.json $(foreach h,$(JOINT_REFERENCE),$(WORK)/eval/$(h).expand.json) $(WORK)/eval/joint.expand.json
	$(MMSPARSE) eval --table $^ --label "dense ($(BACKBONE))" --label "joint dense" \
	  $(foreach h,$(JOINT_REFERENCE),--label "$(h) sparse") --label "joint sparse" $(JOINT_COLUMNS) -o $@

# Table 3: the sparse runs of the three variants (rows 1-3), then the tuned dense runs
$(WORK)/eval/joint-ablation.md: $(WORK)/eval/dense.json $(foreach h,joint-frozen joint-nodistill joint,$(WORK)/eval/$(h).expand.json) $(WORK)/eval/dense-joint-nodistill.json $(WORK)/eval/dense-joint.json
	$(MMSPARSE) eval --table $^ --label "dense ($(BACKBONE))" --label "sparse: distill, frozen final layer" \
	  --label "sparse: no distill, tuned final layer" --label "sparse: distill, tuned final layer (full)" \
	  --label "dense: no distill, tuned final layer" --label "dense: distill, tuned final layer (full)" \
	  $(JOINT_COLUMNS) -o $@

.PHONY: joint joint-ablation joint-encode
joint-encode: $(JOINT_FILES)
joint: $(WORK)/eval/joint-table.md
joint-ablation: $(WORK)/eval/joint-ablation.md
