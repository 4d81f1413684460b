# vdr.mk — VDR (Zhou et al., ICLR 2024) on Flickr8k over the towers' final layers, against the dense model
# trained alike (VDR paper Table 2, Figure 3, Fig. 7). Included by the example Makefile (after joint.mk and
# frontier.mk). A benchmark target: not part of `all`, never run by CI.
#
#   make -C examples/flickr8k vdr            Table 2 in shape over seeds: for each seed S of VDR_SEEDS a VDR head
#                                            vdr-sS and a dense model trained alike vdr-dense-sS (CLIP's loss on the
#                                            same final layers, projections and data, its own schedule tuned on
#                                            validation); VDR and VDR^α (bag-of-words queries) at each point of
#                                            VDR_POINTS; the shipped dense model; D2S at VDR_D2S_BUDGET where `make
#                                            frontier` trained it. Mean ± standard deviation over seeds, Welch's t-test
#                                            over seeds and each seed's paired t-test per query against the dense
#                                            model trained alike (and D2S); the validation curve of the first seed
#   make -C examples/flickr8k vdr-ablation   Figure 3 in shape at the first point, seed VDR_ABLATION_SEED: without the
#                                            contrastive mask, without the bag-of-words entry, the other pooling, the
#                                            final layers frozen, † vs the full VDR; Fig. 7 (word clouds of the mean
#                                            term weights over the test images, with and without the bag-of-words entry)
#
# Inputs: $(VDR_STATES)/{train,val,test}-{images,captions}.h5, the final-layer inputs of `encode-dense
# --final-layer-inputs` (joint.mk's rule: encoded once for `make vdr` and `make joint`).
# Heads: $(WORK)/heads/vdr-sS, vdr-dense-sS (+ vdr-nomask, vdr-nobow, vdr-pool, vdr-frozen for the ablation).
# Outputs: $(WORK)/eval/vdr-table.md (+ .json: every seed's figures and the tests); per seed S, k_query Q, k_doc D:
#          $(WORK)/eval/vdr-sS-qQ-dD.json (VDR), vdr-bow-sS-dD.json (VDR^α); vdr-ablation.md (parametric queries),
#          vdr-ablation-bow.md (VDR^α), vdr-ablation-se.md; $(WORK)/plots/vdr-curve.png, vdr-clouds.png (Fig. 7).
#
#   VDR_SEEDS        seeds of the VDR and dense heads (default 1 2 3)
#   VDR_SCHEDULE     flags both VDR and the dense baseline train with (the schedule; see below)
#   VDR_FLAGS        VDR's own flags on top (vocabulary, pooling, training k, image init)
#   VDR_DENSE_FLAGS  the dense baseline's own flags on top (its tuned settings: they override VDR_SCHEDULE's)
#   VDR_POINTS       the table's (k_query/k_doc) points: the first chosen on validation at FLOPs <= 10 (docs/vdr.md),
#                    then k = 512 on both sides (the paper's k = d)
#   VDR_D2S_BUDGET   the D2S budget shown beside, at about VDR's FLOPs (`make frontier`'s heads of that budget, every
#                    seed: front-d2s-F-sS, and the main job's head for its own budget and seed)
VDR_STATES      ?= $(JOINT_STATES)
VDR_SEEDS       ?= 1 2 3
# The schedule, chosen on validation (docs/vdr.md "Schedule"; VDR's defaults are the paper's App. A: 20 epochs
# of batch 4096 at 2e-4 on 29,522 terms, days of CPU here):
VDR_SCHEDULE    ?= --epochs 4 --batch-size 256 --lr 1e-3 --lr-warmup 0.1 --lr-schedule cosine --batch-by image \
                   --final-lr 1e-4 --select-metric R@10
# VDR's configuration, chosen on validation (docs/vdr.md "VDR at a sparse budget")
VDR_POINTS      ?= 24/192 48/128 512/512
VDR_POOL        ?= mean
VDR_FLAGS       ?= --vocab-min-df 5 --vdr-pool $(VDR_POOL) --vdr-train-k 48 --vdr-image-init words \
                   --vdr-query-k $(call vdr_kq,$(firstword $(VDR_POINTS))) --vdr-doc-k $(call vdr_kd,$(firstword $(VDR_POINTS)))
# The dense model trained alike, tuned on validation as VDR was (docs/vdr.md "The dense model trained alike")
VDR_DENSE_FLAGS ?= --lr 3e-4
VDR_D2S_BUDGET  ?= 9.4
VDR_ABLATION_SEED ?= 1
VDR_QRELS       := $(VDR_STATES)/$(EVAL_SPLIT).qrels
VDR_INPUTS       = $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
                   $(VDR_STATES)/val-images.h5 $(VDR_STATES)/val-captions.h5
# k of the word clouds' image vectors: every term (clamped to |V|), the mean of the whole V(x)
VDR_ALL         := 1000000
PYTHON          ?= python

VDR_HEADS        := $(foreach s,$(VDR_SEEDS),vdr-s$(s))
VDR_DENSE_HEADS  := $(foreach s,$(VDR_SEEDS),vdr-dense-s$(s))
VDR_REF          := vdr-s$(VDR_ABLATION_SEED)
# per-head flags: the seed; the ablation's variants (one component of VDR_FLAGS changed, seed VDR_ABLATION_SEED)
$(foreach s,$(VDR_SEEDS),$(eval VDR_VARIANT_vdr-s$(s) = --seed $(s))$(eval VDR_DENSE_VARIANT_vdr-dense-s$(s) = --seed $(s)))
VDR_OTHER_POOL          = $(if $(filter mean,$(VDR_POOL)),max,mean)
VDR_VARIANT_vdr-nobow   = --seed $(VDR_ABLATION_SEED) --no-vdr-np-entry
VDR_VARIANT_vdr-nomask  = --seed $(VDR_ABLATION_SEED) --no-vdr-cts-mask
VDR_VARIANT_vdr-pool    = --seed $(VDR_ABLATION_SEED) --vdr-pool $(VDR_OTHER_POOL)
VDR_VARIANT_vdr-frozen  = --seed $(VDR_ABLATION_SEED) --freeze-final-layer

define VDR_HEAD_RULES
$(WORK)/heads/$(1)/config.json: $(VDR_INPUTS)
	$(MMSPARSE) train-head --method vdr $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
	  --val-images $(VDR_STATES)/val-images.h5 --val-captions $(VDR_STATES)/val-captions.h5 \
	  -o $$(@D) $(VDR_SCHEDULE) $(VDR_FLAGS) $(VDR_VARIANT_$(1)) $(TRAIN_FLAGS)

$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode bow $(SPARSIFY_FLAGS)
endef

# Head $(1) with documents of k_doc $(2) (run names $(3)-d$(2)): the documents indexed, the bag-of-words queries
# (VDR^α) searched and evaluated ($(4): what that evaluation tests against, $(5): the runs $(4) names)
define VDR_DOC_RULES
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $$@ --vdr-doc-k $(2) $(SPARSIFY_FLAGS)

$(WORK)/index/$(1)-d$(2)/mmsparse.json: $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5
	$(MMSPARSE) index $$< -o $$(@D) $(INDEX_FLAGS)

$(WORK)/runs/$(3)-d$(2).trec: $(WORK)/index/$(1)-d$(2)/mmsparse.json $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5
	$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/eval/$(3)-d$(2).json: $(WORK)/runs/$(3)-d$(2).trec $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.bow.h5 $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(2).h5 $(5)
	$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ --queries $$(word 2,$$^) --docs $$(word 3,$$^) $(4) $(EVAL_FLAGS)
endef

# Head $(1)'s parametric queries of k_query $(2)
define VDR_QUERY_RULES
$(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5: $(WORK)/heads/$(1)/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$(1) $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode vdr \
	  --vdr-query-k $(2) $(SPARSIFY_FLAGS)
endef

# Head $(1) at k_query $(2), k_doc $(3) (run name $(4)-q$(2)-d$(3)): the parametric queries searched and evaluated
# ($(5): what the evaluation tests against, e.g. --dense-run RUN [--compare RUN]; $(6): the runs $(5) names)
define VDR_POINT_RULES
$(WORK)/runs/$(4)-q$(2)-d$(3).trec: $(WORK)/index/$(1)-d$(3)/mmsparse.json $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5
	$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/eval/$(4)-q$(2)-d$(3).json: $(WORK)/runs/$(4)-q$(2)-d$(3).trec $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-captions.vdr.k$(2).h5 $(WORK)/sparse/$(1)/$(EVAL_SPLIT)-images.k$(3).h5 $(6)
	$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ --queries $$(word 2,$$^) --docs $$(word 3,$$^) $(5) $(EVAL_FLAGS)
endef

# D2S at about VDR's FLOPs (the frontier's heads of VDR_D2S_BUDGET, seed S, named as frontier.mk names them: the
# main job's head $(HEAD) for D2S_BUDGET and SEED), where `make frontier` has searched
vdr_d2s_head = $(call front_d2s,$(VDR_D2S_BUDGET),$(1))
vdr_d2s_run = $(wildcard $(WORK)/runs/$(call vdr_d2s_head,$(1)).expand.trec)
vdr_tests   = --dense-run $(WORK)/runs/vdr-dense-s$(1).trec $(if $(call vdr_d2s_run,$(1)),--compare $(call vdr_d2s_run,$(1)))
vdr_against = $(WORK)/runs/vdr-dense-s$(1).trec $(call vdr_d2s_run,$(1))
vdr_kq      = $(word 1,$(subst /, ,$(1)))
vdr_kd      = $(word 2,$(subst /, ,$(1)))
empty      :=
space      := $(empty) $(empty)
comma      := ,
commas      = $(subst $(space),$(comma),$(strip $(1)))
VDR_KQS     = $(sort $(foreach p,$(VDR_POINTS),$(call vdr_kq,$(p))))
VDR_KDS     = $(sort $(foreach p,$(VDR_POINTS),$(call vdr_kd,$(p))))
# the ablation's point: the table's first
VDR_P       := $(firstword $(VDR_POINTS))
VDR_PQ      := $(call vdr_kq,$(VDR_P))
VDR_PD      := $(call vdr_kd,$(VDR_P))

VDR_ABLATION_HEADS := vdr-nomask vdr-nobow vdr-pool vdr-frozen
$(foreach h,$(VDR_HEADS) $(VDR_ABLATION_HEADS),$(eval $(call VDR_HEAD_RULES,$(h))))
# each seed's head at every point: parametric queries against that seed's dense run (and D2S's), VDR^α against it too
$(foreach s,$(VDR_SEEDS),\
  $(foreach d,$(VDR_KDS),$(eval $(call VDR_DOC_RULES,vdr-s$(s),$(d),vdr-bow-s$(s),--dense-run $(WORK)/runs/vdr-dense-s$(s).trec,$(WORK)/runs/vdr-dense-s$(s).trec)))\
  $(foreach q,$(VDR_KQS),$(eval $(call VDR_QUERY_RULES,vdr-s$(s),$(q))))\
  $(foreach p,$(VDR_POINTS),$(eval $(call VDR_POINT_RULES,vdr-s$(s),$(call vdr_kq,$(p)),$(call vdr_kd,$(p)),vdr-s$(s),$(call vdr_tests,$(s)),$(call vdr_against,$(s))))))
# the ablation's heads at the first point, against the reference head's runs there
VDR_REF_RUNS = $(WORK)/runs/$(VDR_REF)-q$(VDR_PQ)-d$(VDR_PD).trec $(WORK)/runs/vdr-bow-s$(VDR_ABLATION_SEED)-d$(VDR_PD).trec
$(foreach h,$(VDR_ABLATION_HEADS),\
  $(eval $(call VDR_DOC_RULES,$(h),$(VDR_PD),$(subst vdr,vdr-bow,$(h)),--dense-run $(word 2,$(VDR_REF_RUNS)),$(word 2,$(VDR_REF_RUNS))))\
  $(eval $(call VDR_QUERY_RULES,$(h),$(VDR_PQ)))\
  $(eval $(call VDR_POINT_RULES,$(h),$(VDR_PQ),$(VDR_PD),$(h),--dense-run $(word 1,$(VDR_REF_RUNS)),$(word 1,$(VDR_REF_RUNS)))))
.PRECIOUS: $(foreach h,$(VDR_HEADS) $(VDR_DENSE_HEADS),$(WORK)/heads/$(h)/config.json)

# whole V(x) of the test images (no gate) for the word clouds
$(WORK)/sparse/%/$(EVAL_SPLIT)-images.all.h5: $(WORK)/heads/%/config.json
	$(MMSPARSE) sparsify $(WORK)/heads/$* $(VDR_STATES)/$(EVAL_SPLIT)-images.h5 -o $@ --vdr-doc-k $(VDR_ALL) --allow-dense

# The dense models trained alike (one per seed) and the backbone's own dense model (vdr-shipped), served by Faiss
VDR_BACKBONE_ROW := vdr-shipped
VDR_DENSE_RUN    := $(WORK)/runs/vdr-dense-s$(firstword $(VDR_SEEDS)).trec
VDR_CLOUD_HEADS  := $(VDR_REF) vdr-nobow
VDR_CURVE_HEADS  := vdr-s$(firstword $(VDR_SEEDS)) vdr-dense-s$(firstword $(VDR_SEEDS))
include $(ROOT)/stages/vdr-common.mk

.PHONY: vdr vdr-table vdr-clouds vdr-curve vdr-ablation
vdr: vdr-table vdr-curve

# the table's rows: LABEL=EVAL,EVAL,... (one evaluation per seed; ~ for the label's spaces)
vdr_evals   = $(call commas,$(foreach s,$(VDR_SEEDS),$(WORK)/eval/$(1)-s$(s)-$(2).json))
vdr_label   = k~=~$(call vdr_kq,$(1))/$(call vdr_kd,$(1))
VDR_D2S_EVALS = $(wildcard $(foreach s,$(VDR_SEEDS),$(WORK)/eval/$(call vdr_d2s_head,$(s)).expand.json))
VDR_D2S_ROW   = D2S~(F~=~$(VDR_D2S_BUDGET))
VDR_ROWS    = shipped~dense=$(WORK)/eval/vdr-shipped.json \
              dense~trained~alike=$(call commas,$(foreach h,$(VDR_DENSE_HEADS),$(WORK)/eval/$(h).json)) \
              $(foreach p,$(VDR_POINTS),VDR~($(call vdr_label,$(p)))=$(call vdr_evals,vdr,q$(call vdr_kq,$(p))-d$(call vdr_kd,$(p))) \
                VDR^α~($(call vdr_label,$(p)))=$(call vdr_evals,vdr-bow,d$(call vdr_kd,$(p)))) \
              $(if $(VDR_D2S_EVALS),$(VDR_D2S_ROW)=$(call commas,$(VDR_D2S_EVALS)))
VDR_VERSUS  = $(foreach p,$(VDR_POINTS),VDR~($(call vdr_label,$(p)))=dense~trained~alike \
              VDR^α~($(call vdr_label,$(p)))=dense~trained~alike $(if $(VDR_D2S_EVALS),VDR~($(call vdr_label,$(p)))=$(VDR_D2S_ROW)))
VDR_EVALS   = $(WORK)/eval/vdr-shipped.json $(foreach h,$(VDR_DENSE_HEADS),$(WORK)/eval/$(h).json) \
              $(foreach p,$(VDR_POINTS),$(foreach s,$(VDR_SEEDS),$(WORK)/eval/vdr-s$(s)-q$(call vdr_kq,$(p))-d$(call vdr_kd,$(p)).json \
                $(WORK)/eval/vdr-bow-s$(s)-d$(call vdr_kd,$(p)).json))
vdr-table: $(WORK)/eval/vdr-table.md
$(WORK)/eval/vdr-table.md: $(VDR_EVALS) $(VDR_D2S_EVALS)
	$(PYTHON) -m mmsparse.methods.vdr seeds $(foreach r,$(VDR_ROWS),"$(subst ~, ,$(r))") --reference "dense trained alike" \
	  $(foreach v,$(VDR_VERSUS),--versus "$(subst ~, ,$(v))") -o $@

# Figure 3 in shape at the first point, one table per query kind: parametric rows † vs VDR's run, bag-of-words rows
# † vs VDR^α's (the reference rows evaluated on their own: no test against themselves)
$(WORK)/eval/vdr-ref.json: $(word 1,$(VDR_REF_RUNS))
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --queries $(WORK)/sparse/$(VDR_REF)/$(EVAL_SPLIT)-captions.vdr.k$(VDR_PQ).h5 \
	  --docs $(WORK)/sparse/$(VDR_REF)/$(EVAL_SPLIT)-images.k$(VDR_PD).h5 $(EVAL_FLAGS)
$(WORK)/eval/vdr-bow-ref.json: $(word 2,$(VDR_REF_RUNS))
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --queries $(WORK)/sparse/$(VDR_REF)/$(EVAL_SPLIT)-captions.bow.h5 \
	  --docs $(WORK)/sparse/$(VDR_REF)/$(EVAL_SPLIT)-images.k$(VDR_PD).h5 $(EVAL_FLAGS)

VDR_ABL     = $(WORK)/eval/vdr-ref.json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(h)-q$(VDR_PQ)-d$(VDR_PD).json)
VDR_ABL_BOW = $(WORK)/eval/vdr-bow-ref.json $(foreach h,$(VDR_ABLATION_HEADS),$(WORK)/eval/$(subst vdr,vdr-bow,$(h))-d$(VDR_PD).json)
VDR_COLUMNS = --column R@1 --column R@5 --column R@10 --column RR@10 --column FLOPs --column query_terms --column doc_terms
vdr-ablation: $(VDR_ABL) $(VDR_ABL_BOW) vdr-clouds
	$(MMSPARSE) eval --table $(VDR_ABL) --label "VDR" --label "VDR − contrastive mask" \
	  --label "VDR − bag-of-words entry" --label "VDR, $(VDR_OTHER_POOL) pooling" --label "VDR, frozen final layer" \
	  $(VDR_COLUMNS) -o $(WORK)/eval/vdr-ablation.md
	$(MMSPARSE) eval --table $(VDR_ABL_BOW) --label "VDR^α" --label "VDR^α − contrastive mask" \
	  --label "VDR^α − bag-of-words entry" --label "VDR^α, $(VDR_OTHER_POOL) pooling" --label "VDR^α, frozen final layer" \
	  $(VDR_COLUMNS) -o $(WORK)/eval/vdr-ablation-bow.md
	$(PYTHON) -m mmsparse.methods.joint se $(join $(foreach x,VDR VDR-nomask VDR-nobow VDR-pool VDR-frozen \
	  VDRα VDRα-nomask VDRα-nobow VDRα-pool VDRα-frozen,$(x)=),$(VDR_ABL) $(VDR_ABL_BOW)) \
	  -o $(WORK)/eval/vdr-ablation-se.md
