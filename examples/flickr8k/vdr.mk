# vdr.mk — VDR (Zhou et al., ICLR 2024) on Flickr8k over the towers' final layers, against the dense model
# trained alike (VDR paper Table 2, Figure 3, Fig. 7). Included by the example Makefile (after joint.mk).
#
#   make -C examples/flickr8k vdr            Table 2 in shape: the shipped dense model, the dense model trained
#                                            alike (CLIP's loss on the same final layers, projections, data and
#                                            schedule), VDR and VDR^α at the k chosen on validation (512) and at the
#                                            paper's share of the vocabulary (k = 48 of 2,810 terms),
#                                            D2S for reference (when the main job has run); R@k ± standard error,
#                                            FLOPs, † = paired t-test vs the dense model trained alike; Fig. 7 (word
#                                            clouds of the mean term weights over the test images, with and without
#                                            the bag-of-words entry) and the validation curve
#   make -C examples/flickr8k vdr-ablation   Figure 3 in shape: without the contrastive mask, without the
#                                            bag-of-words entry, mean instead of max pooling, and the final layers
#                                            frozen (VDR on the stored states), † vs the full VDR
#
# Inputs: $(VDR_STATES)/{train,val,test}-{images,captions}.h5, the final-layer inputs of `encode-dense
# --final-layer-inputs` (joint.mk's rule: encoded once for `make vdr` and `make joint`).
# Heads: $(WORK)/heads/vdr, vdr-nobow, vdr-dense (+ vdr-nomask, vdr-mean, vdr-frozen for the ablation).
# Outputs: $(WORK)/eval/vdr-table.md (Table 2, † vs the dense model trained alike), vdr-se.md (± standard errors),
#          vdr-ablation.md (parametric queries), vdr-ablation-bow.md (VDR^α), vdr-ablation-se.md;
#          $(WORK)/plots/vdr-clouds.png (Fig. 7), vdr-curve.png.
#
#   VDR_SCHEDULE     flags both VDR and the dense baseline train with (the schedule; see below)
#   VDR_FLAGS        VDR's own flags on top (vocabulary, k, image init)
#   VDR_DENSE_FLAGS  the dense baseline's own flags on top
#   VDR_K            the k of documents and parametric queries (default 512, chosen on validation: the paper's
#                    k = d); VDR_K_PAPER the table's second sparsity (default 48: 1.7 % of the 2,810 terms, the
#                    paper's share of its 29,522)
VDR_STATES      ?= $(JOINT_STATES)
# The schedule, chosen on validation (docs/vdr.md "Schedule"; VDR's defaults are the paper's App. A: 20 epochs
# of batch 4096 at 2e-4 on 29,522 terms, days of CPU here):
VDR_SCHEDULE    ?= --epochs 4 --batch-size 256 --lr 1e-3 --lr-warmup 0.1 --lr-schedule cosine --batch-by image \
                   --final-lr 1e-4 --select-metric R@10
VDR_FLAGS       ?= --vocab-min-df 5 --vdr-train-k 48 --vdr-query-k 512 --vdr-doc-k 512 --vdr-image-init words
VDR_DENSE_FLAGS ?=
VDR_K           ?= 512
VDR_K_PAPER     ?= 48
VDR_QRELS       := $(VDR_STATES)/$(EVAL_SPLIT).qrels
VDR_INPUTS       = $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
                   $(VDR_STATES)/val-images.h5 $(VDR_STATES)/val-captions.h5
# k of the word clouds' image vectors: every term (clamped to |V|), the mean of the whole V(x)
VDR_ALL         := 1000000
PYTHON          ?= python

# per-head flags
VDR_VARIANT_vdr-nobow  = --no-vdr-np-entry
VDR_VARIANT_vdr-nomask = --no-vdr-cts-mask
VDR_VARIANT_vdr-mean   = --vdr-pool mean
VDR_VARIANT_vdr-frozen = --freeze-final-layer

define VDR_HEAD_RULES
$(WORK)/heads/$(1)/config.json: $(VDR_INPUTS)
	$(MMSPARSE) train-head --method vdr $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
	  --val-images $(VDR_STATES)/val-images.h5 --val-captions $(VDR_STATES)/val-captions.h5 \
	  -o $$(@D) $(VDR_SCHEDULE) $(VDR_FLAGS) $(VDR_VARIANT_$(1)) $(TRAIN_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode bow $(SPARSIFY_FLAGS)
endef

# One head $(1) at one k $(2): documents and parametric queries with top-k, both query kinds searched and
# evaluated ($(3), $(4): the reference runs of the paired tests of parametric and bag-of-words queries)
define VDR_K_RULES
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $$@ --vdr-doc-k $(2) $(SPARSIFY_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode vdr \
	  --vdr-query-k $(2) $(SPARSIFY_FLAGS)

$(WORK)/index/$(1)-k$(2)/mmsparse.json: $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5
	$(MMSPARSE) index $$< -o $$(@D) $(INDEX_FLAGS)

$(WORK)/runs/$(1)-k$(2).trec: $(WORK)/index/$(1)-k$(2)/mmsparse.json $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5
	$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/runs/$(1)-bow-k$(2).trec: $(WORK)/index/$(1)-k$(2)/mmsparse.json $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5
	$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/eval/$(1)-k$(2).json: $(WORK)/runs/$(1)-k$(2).trec $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5 $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5 $(3)
	$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ --queries $$(word 2,$$^) --docs $$(word 3,$$^) --dense-run $(3) $(EVAL_FLAGS)

$(WORK)/eval/$(1)-bow-k$(2).json: $(WORK)/runs/$(1)-bow-k$(2).trec $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5 $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5 $(4)
	$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ --queries $$(word 2,$$^) --docs $$(word 3,$$^) --dense-run $(4) $(EVAL_FLAGS)
endef

VDR_ABLATION_HEADS := vdr-nomask vdr-nobow vdr-mean vdr-frozen
VDR_DENSE_RUN      := $(WORK)/runs/vdr-dense.trec
$(foreach h,vdr $(VDR_ABLATION_HEADS),$(eval $(call VDR_HEAD_RULES,$(h))))
$(foreach k,$(sort $(VDR_K) $(VDR_K_PAPER)),$(eval $(call VDR_K_RULES,vdr,$(k),$(VDR_DENSE_RUN),$(VDR_DENSE_RUN))))
$(foreach h,$(VDR_ABLATION_HEADS),$(eval $(call VDR_K_RULES,$(h),$(VDR_K),$(WORK)/runs/vdr-k$(VDR_K).trec,$(WORK)/runs/vdr-bow-k$(VDR_K).trec)))

# whole V(x) of the test images (no gate) for the word clouds
$(WORK)/sparse/%/$(EVAL_SPLIT)-images.all.h5: $(WORK)/heads/%/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$* $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $@ --vdr-doc-k $(VDR_ALL) --allow-dense

# The dense model trained alike and the backbone's own dense model (vdr-shipped), both served by Faiss
VDR_BACKBONE_ROW := vdr-shipped
include $(ROOT)/stages/vdr-common.mk

.PHONY: vdr vdr-table vdr-clouds vdr-curve vdr-ablation
vdr: vdr-table vdr-clouds vdr-curve

VDR_COLUMNS = --column R@1 --column R@5 --column R@10 --column RR@10 --column FLOPs --column query_terms --column doc_terms
# D2S (the main job's expanded-query head) only when the main job has searched with it, tested against the dense
# model trained alike like the other rows
VDR_D2S_RUN = $(wildcard $(WORK)/runs/$(HEAD).expand.trec)
VDR_D2S     = $(if $(VDR_D2S_RUN),$(WORK)/eval/vdr-d2s.json)
$(WORK)/eval/vdr-d2s.json: $(VDR_D2S_RUN) $(VDR_DENSE_RUN)
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --queries $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.expand.h5 \
	  --docs $(WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5 --dense-run $(VDR_DENSE_RUN) $(EVAL_FLAGS)
VDR_EVALS   = $(WORK)/eval/vdr-shipped.json $(WORK)/eval/vdr-dense.json \
              $(foreach k,$(VDR_K) $(VDR_K_PAPER),$(WORK)/eval/vdr-k$(k).json $(WORK)/eval/vdr-bow-k$(k).json)
VDR_LABELS  = --label "shipped dense" --label "dense trained alike" --label "VDR (k=$(VDR_K))" --label "VDR^α (k=$(VDR_K))" \
              --label "VDR (k=$(VDR_K_PAPER))" --label "VDR^α (k=$(VDR_K_PAPER))" $(if $(VDR_D2S),--label "D2S (main job)")
vdr-table: $(VDR_EVALS) $(VDR_D2S)
	$(MMSPARSE) eval --table $(VDR_EVALS) $(VDR_D2S) $(VDR_LABELS) $(VDR_COLUMNS) -o $(WORK)/eval/vdr-table.md
	$(PYTHON) -m mmsparse.methods.joint se "shipped dense=$(word 1,$(VDR_EVALS))" "dense trained alike=$(word 2,$(VDR_EVALS))" \
	  "VDR (k=$(VDR_K))=$(word 3,$(VDR_EVALS))" "VDR^α (k=$(VDR_K))=$(word 4,$(VDR_EVALS))" \
	  "VDR (k=$(VDR_K_PAPER))=$(word 5,$(VDR_EVALS))" "VDR^α (k=$(VDR_K_PAPER))=$(word 6,$(VDR_EVALS))" \
	  $(if $(VDR_D2S),"D2S (main job)=$(VDR_D2S)") -o $(WORK)/eval/vdr-se.md

# Figure 3 in shape (and the frozen final layer) at VDR_K, one table per query kind: parametric rows † vs VDR's run,
# bag-of-words rows † vs VDR^α's (the reference rows evaluated on their own: no test against themselves)
$(WORK)/eval/vdr-ref-k$(VDR_K).json: $(WORK)/runs/vdr-k$(VDR_K).trec
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --queries $(WORK)/sparse/vdr/$(EVAL_SPLIT)-captions.vdr.k$(VDR_K).h5 \
	  --docs $(WORK)/sparse/vdr/$(EVAL_SPLIT)-images.k$(VDR_K).h5 $(EVAL_FLAGS)
$(WORK)/eval/vdr-bow-ref-k$(VDR_K).json: $(WORK)/runs/vdr-bow-k$(VDR_K).trec
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --queries $(WORK)/sparse/vdr/$(EVAL_SPLIT)-captions.bow.h5 \
	  --docs $(WORK)/sparse/vdr/$(EVAL_SPLIT)-images.k$(VDR_K).h5 $(EVAL_FLAGS)

VDR_ABL     = $(WORK)/eval/vdr-ref-k$(VDR_K).json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(h)-k$(VDR_K).json)
VDR_ABL_BOW = $(WORK)/eval/vdr-bow-ref-k$(VDR_K).json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(h)-bow-k$(VDR_K).json)
vdr-ablation: $(VDR_ABL) $(VDR_ABL_BOW)
	$(MMSPARSE) eval --table $(VDR_ABL) --label "VDR" --label "VDR − contrastive mask" \
	  --label "VDR − bag-of-words entry" --label "VDR, mean pooling" --label "VDR, frozen final layer" \
	  $(VDR_COLUMNS) -o $(WORK)/eval/vdr-ablation.md
	$(MMSPARSE) eval --table $(VDR_ABL_BOW) --label "VDR^α" --label "VDR^α − contrastive mask" \
	  --label "VDR^α − bag-of-words entry" --label "VDR^α, mean pooling" --label "VDR^α, frozen final layer" \
	  $(VDR_COLUMNS) -o $(WORK)/eval/vdr-ablation-bow.md
	$(PYTHON) -m mmsparse.methods.joint se $(join $(foreach x,VDR VDR-nomask VDR-nobow VDR-mean VDR-frozen \
	  VDRα VDRα-nomask VDRα-nobow VDRα-mean VDRα-frozen,$(x)=),$(VDR_ABL) $(VDR_ABL_BOW)) \
	  -o $(WORK)/eval/vdr-ablation-se.md
