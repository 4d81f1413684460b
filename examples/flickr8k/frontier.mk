# frontier.mk — the efficiency frontier: every method trained at FLOPs budgets (`train-head --target-flops F`),
# R@1 against FLOPs on the test split. Included by the Makefile (needs the main job's variables, joint.mk's
# rules and the stages). A benchmark target: not part of `all`, never run by CI.
#
#   make -C examples/flickr8k frontier
#       D2S heads front-d2s-F (D2S_BASE_FLAGS --target-flops F) for F in FRONTIER_D2S; the main job's head
#       $(HEAD) stands for the budget it is trained at (D2S_BUDGET), so it is not trained twice;
#       inference-free heads front-if-F (IF_FLAGS --target-flops F) for F in FRONTIER_IF;
#       joint heads front-joint-F for F in FRONTIER_JOINT: JOINT_FLAGS, then JOINT_FRONTIER_FLAGS (D2S's
#       sparse options D2S_SPARSE_OPTIONS: the same gates, caption-term loss, image dropout, word loss, posting
#       floor and FLOPs regulariser, through the same code) and the budget;
#       each sparsified, indexed, searched and evaluated as the main job's heads, then at each joint budget
#       the paired t-test of joint against the D2S head of the same budget on the same queries
#       ($(WORK)/frontier/joint-vs-d2s-F.json); the table $(WORK)/frontier/table.md (+ table.json) and the
#       picture $(WORK)/frontier/frontier.png (R@1 vs FLOPs, a line per method, dense as a horizontal line,
#       VDR and VDR^α at k = VDR_K_PAPER and VDR_K as points where `make vdr` wrote them).
#   FRONTIER_D2S / FRONTIER_IF / FRONTIER_JOINT   the budgets (FLOPs, eq. 1) of each method
#   JOINT_FRONTIER_FLAGS                          the joint heads' flags after JOINT_FLAGS, before --target-flops
# BM25-V is not on the picture: its runs are image-to-image on a class-labelled subset (bm25v.mk), not
# caption-to-image on the test split.
FRONTIER_D2S   ?= 2 4 6 8 9.4 12
FRONTIER_IF    ?= 0.5 1 2
FRONTIER_JOINT ?= 6 9.4
# joint's schedule (joint.mk) with D2S's sparse options; η 0.025 = D2S's λ·η (0.5 x 0.05): eq. 3 has no λ
JOINT_FRONTIER_FLAGS ?= $(D2S_SPARSE_OPTIONS) --eta 0.025

# the head of budget F: the main job's for D2S_BUDGET, else front-METHOD-F
front_d2s = $(if $(filter $(1),$(D2S_BUDGET)),$(HEAD),front-d2s-$(1))
FRONTIER_D2S_HEADS   := $(foreach b,$(FRONTIER_D2S),$(call front_d2s,$(b)))
FRONTIER_IF_HEADS    := $(foreach b,$(FRONTIER_IF),front-if-$(b))
FRONTIER_JOINT_HEADS := $(foreach b,$(FRONTIER_JOINT),front-joint-$(b))
$(foreach b,$(FRONTIER_D2S),$(eval HEAD_FLAGS_front-d2s-$(b) = $(D2S_BASE_FLAGS) --target-flops $(b)))
$(foreach b,$(FRONTIER_IF),$(eval HEAD_FLAGS_front-if-$(b) = $(IF_FLAGS) --target-flops $(b)))
$(foreach b,$(FRONTIER_JOINT),$(eval JOINT_VARIANT_front-joint-$(b) = $(JOINT_FRONTIER_FLAGS) --target-flops $(b)))
$(foreach h,$(FRONTIER_JOINT_HEADS),$(eval $(call JOINT_HEAD_RULES,$(h))))
$(foreach h,$(FRONTIER_JOINT_HEADS),$(eval $(call JOINT_EVAL_RULES,$(h))))
.PRECIOUS: $(foreach h,$(FRONTIER_D2S_HEADS) $(FRONTIER_IF_HEADS) $(FRONTIER_JOINT_HEADS),$(WORK)/heads/$(h)/config.json)

FRONTIER_ROWS := $(foreach b,$(FRONTIER_D2S),D2S=$(WORK)/heads/$(call front_d2s,$(b))=$(WORK)/eval/$(call front_d2s,$(b)).expand.json) \
  $(foreach h,$(FRONTIER_JOINT_HEADS),joint=$(WORK)/heads/$(h)=$(WORK)/eval/$(h).expand.json) \
  $(foreach h,$(FRONTIER_IF_HEADS),inference-free=$(WORK)/heads/$(h)=$(WORK)/eval/$(h).inference-free.json)
FRONTIER_EVALS  := $(foreach r,$(FRONTIER_ROWS),$(lastword $(subst =, ,$(r))))
FRONTIER_PAIRED := $(foreach b,$(FRONTIER_JOINT),$(WORK)/frontier/joint-vs-d2s-$(b).json)
# VDR (vdr.mk) at the paper's k and at k = 512, with parametric and bag-of-words queries, where `make vdr` ran
# (words LABEL=FILE, ~ for the label's spaces)
vdr_point        = $(if $(wildcard $(WORK)/eval/$(2).json),$(1)=$(WORK)/eval/$(2).json)
FRONTIER_POINTS  = $(call vdr_point,VDR~(k=$(VDR_K_PAPER)),vdr-k$(VDR_K_PAPER)) \
                   $(call vdr_point,VDR^α~(k=$(VDR_K_PAPER)),vdr-bow-k$(VDR_K_PAPER)) \
                   $(call vdr_point,VDR~(k=$(VDR_K)),vdr-k$(VDR_K)) $(call vdr_point,VDR^α~(k=$(VDR_K)),vdr-bow-k$(VDR_K))

# The rows in a file rewritten when their list changes, a prerequisite of the table: stages/common.mk's .SECONDARY
# would otherwise leave a budget added later untrained, its evaluation missing under a newer table
FRONTIER_LIST := $(WORK)/frontier/rows.txt
ifneq ($(filter frontier $(WORK)/frontier/table.md,$(MAKECMDGOALS)),)
ifneq ($(strip $(FRONTIER_ROWS) $(FRONTIER_POINTS)),$(strip $(file < $(FRONTIER_LIST))))
$(shell mkdir -p $(WORK)/frontier)
$(file > $(FRONTIER_LIST),$(FRONTIER_ROWS) $(FRONTIER_POINTS))
endif
endif

.PHONY: frontier
frontier: $(WORK)/frontier/table.md

# joint against the D2S head of the same budget, per query (paired two-tailed t-test, R@1 and R@10)
define FRONTIER_PAIRED_RULE
$(WORK)/frontier/joint-vs-d2s-$(1).json: $(WORK)/runs/front-joint-$(1).expand.trec $(WORK)/runs/$(call front_d2s,$(1)).expand.trec $(QRELS)
	@mkdir -p $$(@D)
	$(MMSPARSE) eval $$< $(QRELS) --compare $$(word 2,$$^) -o $$@ $(EVAL_FLAGS)
endef
$(foreach b,$(FRONTIER_JOINT),$(eval $(call FRONTIER_PAIRED_RULE,$(b))))

$(WORK)/frontier/table.md: $(FRONTIER_EVALS) $(FRONTIER_PAIRED) $(WORK)/eval/dense.json $(FRONTIER_LIST)
	$(PYTHON) -m mmsparse.metrics.frontier --dense $(WORK)/eval/dense.json $(addprefix --row ,$(FRONTIER_ROWS)) \
	  $(foreach p,$(FRONTIER_POINTS),--point "$(subst ~, ,$(p))") \
	  $(foreach b,$(FRONTIER_JOINT),--paired "joint vs D2S, budget $(b)=$(WORK)/frontier/joint-vs-d2s-$(b).json") \
	  -o $@ --plot $(WORK)/frontier/frontier.png
