# paper-vdr.mk — the VDR paper's cross-modal runs (Zhou et al., ICLR 2024: Table 2, Figure 3, Fig. 7) over the
# towers' final layers, against the dense model trained alike, for any dataset and backbone. Included by
# stages/paper-d2s.mk after stages/paper-joint.mk: VDR reads the final-layer inputs `make joint` encodes
# (JOINT_STATES, JOINT_LIMIT: one encode for both targets).
#
#   make vdr            train VDR (`train-head --method vdr`: the DST heads with the towers' final layers) and the
#                       dense model trained alike (`--method dense`: CLIP's loss on the same final layers and
#                       projections, data and schedule) -> sparsify -> index (PISA; Faiss for the dense rows) ->
#                       search -> eval -> $(WORK)/eval/vdr-table.md, Table 2 in shape: the backbone's dense
#                       model, the dense model trained alike, VDR and VDR^α (bag-of-words queries) at each k of
#                       VDR_KS, the D2S heads of VDR_REFERENCE; † = p < 0.05 vs the dense model trained alike
#                       (paired t-test, Bonferroni over the rows); $(WORK)/eval/vdr-se.md (R@k ± standard error);
#                       $(WORK)/plots/vdr-clouds.png (Fig. 7: mean term weights over the test images, with and
#                       without the bag-of-words entry) and vdr-curve.png (validation R@10 per epoch)
#   make vdr-ablation   Figure 3 in shape (no contrastive mask, no bag-of-words entry, mean pooling) and the final
#                       layers frozen, at the first k of VDR_KS -> $(WORK)/eval/vdr-ablation.md (parametric
#                       queries, † vs VDR), vdr-ablation-bow.md (VDR^α, † vs VDR^α), vdr-ablation-se.md
#
#   VDR_SCHEDULE     train-head flags of VDR and of the dense model trained alike (the same schedule for both),
#                    made of VDR_EPOCHS, VDR_BATCH_SIZE, VDR_BATCH_BY, VDR_LR, VDR_FINAL_LR, VDR_BUFFER_ROWS
#   VDR_FLAGS        VDR's own flags (default: the paper's vocabulary, k, image init and image positions)
#   VDR_DENSE_FLAGS  the dense model's own flags (default: none)
#   VDR_KS           k of the documents and parametric queries of the table's rows (default 512: k = d, App. A)
#   VDR_REFERENCE    sparse heads shown beside, D2S's by default (default: $(HEADS); empty: none)
VDR_STATES      := $(JOINT_STATES)
VDR_QRELS       := $(VDR_STATES)/$(EVAL_SPLIT).qrels
VDR_INPUTS       = $(JOINT_INPUTS)
# App. A (cross-modal): 20 epochs, batch 4096, lr 2e-4, cosine, 1 epoch of warm-up (0.05 of 20). The batch is
# meant to fit one 80 GB GPU, not measured (the example's README, "VDR"); the final layers' rate is the example's (VDR_FINAL_LR).
VDR_EPOCHS      ?= 20
VDR_BATCH_SIZE  ?= 2048
VDR_BATCH_BY    ?= image
VDR_LR          ?= 2e-4
VDR_FINAL_LR    ?= $(VDR_LR)
VDR_BUFFER_ROWS ?= 16384
VDR_SCHEDULE    ?= --epochs $(VDR_EPOCHS) --batch-size $(VDR_BATCH_SIZE) --batch-by $(VDR_BATCH_BY) --lr $(VDR_LR) \
                   --lr-schedule cosine --lr-warmup 0.05 --final-lr $(VDR_FINAL_LR) --vdr-buffer-rows $(VDR_BUFFER_ROWS) \
                   --select-metric R@10
# the paper's: the whole BERT vocabulary (30,522 terms here; the paper drops the unused ones: 29,522), k = 512 in
# training and at inference (1.7 %), the image head from random weights (§3.3 a), pooled over the image patches
# (no [CLS]: App. A's 49 positions)
VDR_FLAGS       ?= --vocab-min-df 0 --vdr-train-k 512 --vdr-query-k 512 --vdr-doc-k 512 --vdr-image-init random \
                   --no-vdr-image-cls
VDR_DENSE_FLAGS ?=
VDR_KS          ?= 512
VDR_REFERENCE   ?= $(HEADS)
PYTHON          ?= python
VDR_K           := $(firstword $(VDR_KS))

# Figure 3's variants and the frozen final layers (vdr-nobow also draws Fig. 7's second cloud)
VDR_VARIANT_vdr-nobow  = --no-vdr-np-entry
VDR_VARIANT_vdr-nomask = --no-vdr-cts-mask
VDR_VARIANT_vdr-mean   = --vdr-pool mean
VDR_VARIANT_vdr-frozen = --freeze-final-layer
VDR_ABLATION_HEADS    := vdr-nomask vdr-nobow vdr-mean vdr-frozen
VDR_DENSE_RUN         := $(WORK)/runs/vdr-dense.trec

# Explicit rules (they take precedence over the pattern rules of stages/*.mk): head $(1) and its bag-of-words queries
define PAPER_VDR_HEAD_RULES
$(WORK)/heads/$(1)/config.json: $(VDR_INPUTS)
	$$(MMSPARSE) train-head --method vdr $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
	  --val-images $(VDR_STATES)/val-images.h5 --val-captions $(VDR_STATES)/val-captions.h5 \
	  -o $$(@D) $$(VDR_SCHEDULE) $$(VDR_FLAGS) $$(VDR_VARIANT_$(1)) $$(TRAIN_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5: $(WORK)/heads/$(1)/config.json $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5
	$$(MMSPARSE) sparsify $$(<D) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode bow $$(SPARSIFY_FLAGS)
endef

# Head $(1) at k $(2): documents and parametric queries top-k, and the index of those documents
define PAPER_VDR_K_RULES
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5: $(WORK)/heads/$(1)/config.json $(VDR_STATES)/$(EVAL_SPLIT)-images.h5
	$$(MMSPARSE) sparsify $$(<D) $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $$@ --vdr-doc-k $(2) $$(SPARSIFY_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5: $(WORK)/heads/$(1)/config.json $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5
	$$(MMSPARSE) sparsify $$(<D) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode vdr --vdr-query-k $(2) \
	  $$(SPARSIFY_FLAGS)

$(WORK)/index/$(1)-k$(2)/mmsparse.json: $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5
	$$(MMSPARSE) index $$< -o $$(@D) $$(INDEX_FLAGS)
endef

# Run $(3) of head $(1) at k $(2): queries $(4) against that index
define PAPER_VDR_SEARCH_RULE
$(WORK)/runs/$(3).trec: $(WORK)/index/$(1)-k$(2)/mmsparse.json $(4)
	$$(MMSPARSE) search $$(<D) $(4) -o $$@ --k $$(K) $$(SEARCH_FLAGS)
endef

# Evaluation $(5) of that run, with FLOPs and, when $(6) names a run, paired tests against it
define PAPER_VDR_EVAL_RULE
$(WORK)/eval/$(5).json: $(WORK)/runs/$(3).trec $(4) $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5 $(6)
	$$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ --queries $(4) --docs $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5 \
	  $(if $(6),--dense-run $(6)) $$(EVAL_FLAGS)
endef

# $(call vdr_runs,HEAD,K,PARAMETRIC REFERENCE,BAG-OF-WORDS REFERENCE): the head's two runs at k, evaluated
vdr_query   = $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.$(if $(filter bow,$(2)),bow,vdr.k$(3)).h5
vdr_run     = $(eval $(call PAPER_VDR_SEARCH_RULE,$(1),$(2),$(3),$(4))) \
              $(eval $(call PAPER_VDR_EVAL_RULE,$(1),$(2),$(3),$(4),$(3),$(5)))
vdr_runs    = $(eval $(call PAPER_VDR_K_RULES,$(1),$(2))) \
              $(call vdr_run,$(1),$(2),$(1)-k$(2),$(call vdr_query,$(1),vdr,$(2)),$(3)) \
              $(call vdr_run,$(1),$(2),$(1)-bow-k$(2),$(call vdr_query,$(1),bow,$(2)),$(4))
$(foreach h,vdr $(VDR_ABLATION_HEADS),$(eval $(call PAPER_VDR_HEAD_RULES,$(h))))
$(foreach k,$(VDR_KS),$(call vdr_runs,vdr,$(k),$(VDR_DENSE_RUN),$(VDR_DENSE_RUN)))
$(foreach h,$(VDR_ABLATION_HEADS),$(call vdr_runs,$(h),$(VDR_K),$(WORK)/runs/vdr-k$(VDR_K).trec,$(WORK)/runs/vdr-bow-k$(VDR_K).trec))
# the ablation's reference rows: VDR's own runs at VDR_K evaluated again without a reference (no test against themselves)
$(eval $(call PAPER_VDR_EVAL_RULE,vdr,$(VDR_K),vdr-k$(VDR_K),$(call vdr_query,vdr,vdr,$(VDR_K)),vdr-ref-k$(VDR_K),))
$(eval $(call PAPER_VDR_EVAL_RULE,vdr,$(VDR_K),vdr-bow-k$(VDR_K),$(call vdr_query,vdr,bow,$(VDR_K)),vdr-bow-ref-k$(VDR_K),))

# The dense model trained alike and the backbone's own dense model (vdr-backbone), both served by Faiss
VDR_BACKBONE_ROW := vdr-backbone
include $(ROOT)/stages/vdr-common.mk

# the D2S heads' expanded-query runs (stages/*.mk), tested against the dense model trained alike like the other rows
define PAPER_VDR_D2S_RULE
$(WORK)/eval/$(1).vs-vdr-dense.json: $(WORK)/runs/$(1).expand.trec $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.h5 $(VDR_DENSE_RUN)
	$$(MMSPARSE) eval $$< $(QRELS) -o $$@ --queries $$(word 2,$$^) --docs $$(word 3,$$^) --dense-run $(VDR_DENSE_RUN) \
	  $$(EVAL_FLAGS)
endef
$(foreach h,$(VDR_REFERENCE),$(eval $(call PAPER_VDR_D2S_RULE,$(h))))

# Table 2 in shape: each row's evaluation and label, in order
VDR_COLUMNS = --column R@1 --column R@5 --column R@10 --column RR@10 --column FLOPs --column query_terms --column doc_terms
VDR_EVALS   = $(WORK)/eval/vdr-backbone.json $(WORK)/eval/vdr-dense.json \
              $(foreach k,$(VDR_KS),$(WORK)/eval/vdr-k$(k).json $(WORK)/eval/vdr-bow-k$(k).json) \
              $(foreach h,$(VDR_REFERENCE),$(WORK)/eval/$(h).vs-vdr-dense.json)
# labels are words with ~ for their spaces: $(call vdr_labels,LABELS) -> --label "..." arguments of `eval --table`,
# $(call vdr_pairs,LABELS,FILES) -> "LABEL=FILE" arguments of `python -m mmsparse.methods.joint se`
VDR_LABELS  = dense~($(BACKBONE)) dense~trained~alike $(foreach k,$(VDR_KS),VDR~(k=$(k)) VDR^α~(k=$(k))) \
              $(foreach h,$(VDR_REFERENCE),$(h)~sparse)
vdr_labels  = $(subst ~, ,$(foreach l,$(1),--label "$(l)"))
vdr_pairs   = $(subst ~, ,$(join $(addprefix ",$(addsuffix =,$(1))),$(addsuffix ",$(2))))

.PHONY: vdr vdr-table vdr-clouds vdr-curve vdr-ablation
vdr: vdr-table vdr-clouds vdr-curve
vdr-table: $(WORK)/eval/vdr-table.md
$(WORK)/eval/vdr-table.md: $(VDR_EVALS)
	$(MMSPARSE) eval --table $^ $(call vdr_labels,$(VDR_LABELS)) $(VDR_COLUMNS) -o $@
	$(PYTHON) -m mmsparse.methods.joint se $(call vdr_pairs,$(VDR_LABELS),$^) -o $(WORK)/eval/vdr-se.md

# Fig. 7's input (stages/vdr-common.mk draws it): the whole V(x) of the test images, no gate
$(WORK)/sparse/%/$(EVAL_SPLIT)-images.all.h5: $(WORK)/heads/%/config.json $(VDR_STATES)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) sparsify $(<D) $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $@ --vdr-doc-k 1000000 --allow-dense $(SPARSIFY_FLAGS)

# Figure 3 in shape at VDR_K, one table per query kind (parametric rows † vs VDR, bag-of-words rows † vs VDR^α)
VDR_ABL        = $(WORK)/eval/vdr-ref-k$(VDR_K).json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(h)-k$(VDR_K).json)
VDR_ABL_BOW    = $(WORK)/eval/vdr-bow-ref-k$(VDR_K).json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(h)-bow-k$(VDR_K).json)
VDR_ABL_LABELS = VDR VDR~−~contrastive~mask VDR~−~bag-of-words~entry VDR,~mean~pooling VDR,~frozen~final~layers
VDR_ABL_BOW_LABELS = $(patsubst VDR%,VDR^α%,$(VDR_ABL_LABELS))
vdr-ablation: $(WORK)/eval/vdr-ablation.md
$(WORK)/eval/vdr-ablation.md: $(VDR_ABL) $(VDR_ABL_BOW)
	$(MMSPARSE) eval --table $(VDR_ABL) $(call vdr_labels,$(VDR_ABL_LABELS)) $(VDR_COLUMNS) -o $@
	$(MMSPARSE) eval --table $(VDR_ABL_BOW) $(call vdr_labels,$(VDR_ABL_BOW_LABELS)) $(VDR_COLUMNS) \
	  -o $(WORK)/eval/vdr-ablation-bow.md
	$(PYTHON) -m mmsparse.methods.joint se $(call vdr_pairs,$(VDR_ABL_LABELS) $(VDR_ABL_BOW_LABELS),$^) \
	  -o $(WORK)/eval/vdr-ablation-se.md
