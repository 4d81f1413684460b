# frontier.mk — the efficiency frontier: every method trained at FLOPs budgets (`train-head --target-flops F`)
# from its defaults, with several seeds, decided on validation, reported on test. Included by the Makefile
# (needs the main job's variables, joint.mk's rules and the stages). A benchmark target: not part of `all`,
# never run by CI.
#
#   make -C examples/flickr8k frontier
#       For each seed S of FRONTIER_SEEDS, from train-head's defaults and nothing else: D2S through the budgets
#       FRONTIER_D2S in one run (`--target-flops 12,9.4,6,4,2 --seed S`: front-d2s-sS/flops-F, linked as
#       front-d2s-F-sS), the inference-free head through FRONTIER_IF (--method inference-free) and joint through
#       FRONTIER_JOINT (--method joint on joint.mk's final-layer inputs) likewise; FRONTIER_PATHS=0 trains one
#       head per budget instead (the main job's head $(HEAD) standing for D2S_BUDGET and SEED); each head
#       sparsified, indexed, searched and evaluated as the main job's heads.
#       Then $(WORK)/frontier/table.md (+ table.json) and frontier.png (python -m mmsparse.metrics.frontier):
#       mean ± standard deviation over seeds of the validation and test figures, the binomial standard error,
#       the smallest budget per method keeping 0.95 x dense's validation R@1 and 0.97 x its R@10 (validation
#       decides: the main job's D2S_BUDGET is set from it), joint against D2S at equal budgets over seeds
#       (Welch's t-test), and VDR and VDR^α at each of vdr.mk's VDR_POINTS (its first seed) as points where `make vdr` wrote them.
#   FRONTIER_SEEDS / FRONTIER_D2S / FRONTIER_IF / FRONTIER_JOINT   the seeds and each method's budgets (FLOPs, eq. 1;
#                                                                  largest first: a path tightens)
#   FRONTIER_PATHS                                                 1: a path per method and seed (default); 0: a run per head
#   FRONTIER_FLAGS                                                 more train-head flags of every frontier head
# BM25-V is not on the picture: its runs are image-to-image on a class-labelled subset (bm25v.mk), not
# caption-to-image on the test split.
FRONTIER_SEEDS ?= 1 2 3
FRONTIER_D2S   ?= 12 9.4 6 4 2
FRONTIER_IF    ?= 1.5 1 0.5
FRONTIER_JOINT ?= 9.4 6
FRONTIER_FLAGS ?=
# FRONTIER_PATHS (the Makefile's, default 1): one run per method and seed through every budget
# (`train-head --target-flops 12,9.4,6,4,2`, heads front-METHOD-sS/flops-F); 0: one run per head.

comma := ,
budget_list = $(subst $() ,$(comma),$(strip $(1)))
# the D2S head of budget F and seed S: front_d2s (the Makefile's, which vdr.mk reads too)
seeded = $(foreach s,$(FRONTIER_SEEDS),$(foreach b,$(2),$(call $(1),$(b),$(s))))
# budget and seed of a head name front-METHOD-F-sS
front_budget = $(word 3,$(subst -, ,$(1)))
front_seed   = $(patsubst s%,%,$(word 4,$(subst -, ,$(1))))
front_if    = front-if-$(1)-s$(2)
front_joint = front-joint-$(1)-s$(2)
FRONTIER_IF_HEADS    := $(call seeded,front_if,$(FRONTIER_IF))
FRONTIER_JOINT_HEADS := $(call seeded,front_joint,$(FRONTIER_JOINT))

ifeq ($(FRONTIER_PATHS),1)
FRONTIER_D2S_HEADS := $(call seeded,front_d2s,$(FRONTIER_D2S))
# a path's run: front-METHOD-sS/ holds flops-F/ per budget; front-METHOD-F-sS links to its flops-F
# (so every later stage reads a plain head name); 1 method, 2 seed, 3 budgets, 4 train-head flags,
# 5 the dense (or final-layer input) directory, 6 its prerequisites (one budget: a plain run, written to flops-F)
define FRONTIER_PATH_RULES
$(foreach b,$(3),$(WORK)/heads/front-$(1)-s$(2)/flops-$(b)/config.json) &: $(6)
	$$(MMSPARSE) train-head $(4) $(5)/train-images.h5 $(5)/train-captions.h5 \
	  --val-images $(5)/val-images.h5 --val-captions $(5)/val-captions.h5 \
	  -o $(WORK)/heads/front-$(1)-s$(2)$(if $(word 2,$(3)),,/flops-$(3)) --target-flops $(call budget_list,$(3)) --seed $(2) $(FRONTIER_FLAGS) $(TRAIN_FLAGS)
$(foreach b,$(3),$(eval $(call FRONTIER_LINK_RULE,$(1),$(2),$(b))))
endef
define FRONTIER_LINK_RULE
$(WORK)/heads/front-$(1)-$(3)-s$(2)/config.json: $(WORK)/heads/front-$(1)-s$(2)/flops-$(3)/config.json
	ln -sfn front-$(1)-s$(2)/flops-$(3) $(WORK)/heads/front-$(1)-$(3)-s$(2)
endef
$(foreach s,$(FRONTIER_SEEDS),$(eval $(call FRONTIER_PATH_RULES,d2s,$(s),$(FRONTIER_D2S),,$(DENSE_DIR),$(TRAIN_INPUTS))))
$(foreach s,$(FRONTIER_SEEDS),$(eval $(call FRONTIER_PATH_RULES,if,$(s),$(FRONTIER_IF),--method inference-free,$(DENSE_DIR),\
  $(TRAIN_INPUTS))))
# joint reads the final-layer inputs (joint.mk), from its defaults as the other methods
$(foreach s,$(FRONTIER_SEEDS),$(eval $(call FRONTIER_PATH_RULES,joint,$(s),$(FRONTIER_JOINT),--method joint,\
  $(JOINT_STATES),$(JOINT_INPUTS))))
else
FRONTIER_D2S_HEADS := $(call seeded,front_d2s,$(FRONTIER_D2S))
$(foreach h,$(filter front-%,$(FRONTIER_D2S_HEADS)),$(eval HEAD_FLAGS_$(h) = --target-flops $(call front_budget,$(h)) \
  --seed $(call front_seed,$(h)) $(FRONTIER_FLAGS)))
$(foreach h,$(FRONTIER_IF_HEADS),$(eval HEAD_FLAGS_$(h) = --method inference-free --target-flops $(call front_budget,$(h)) \
  --seed $(call front_seed,$(h)) $(FRONTIER_FLAGS)))
$(foreach h,$(FRONTIER_JOINT_HEADS),$(eval $(call JOINT_HEAD_RULES,$(h),--target-flops $(call front_budget,$(h)) \
  --seed $(call front_seed,$(h)) $(FRONTIER_FLAGS))))
endif
$(foreach h,$(FRONTIER_JOINT_HEADS),$(eval $(call JOINT_EVAL_RULES,$(h))))
.PRECIOUS: $(foreach h,$(FRONTIER_D2S_HEADS) $(FRONTIER_IF_HEADS) $(FRONTIER_JOINT_HEADS),$(WORK)/heads/$(h)/config.json)

FRONTIER_ROWS := $(foreach h,$(FRONTIER_D2S_HEADS),D2S=$(WORK)/heads/$(h)=$(WORK)/eval/$(h).expand.json) \
  $(foreach h,$(FRONTIER_JOINT_HEADS),joint=$(WORK)/heads/$(h)=$(WORK)/eval/$(h).expand.json) \
  $(foreach h,$(FRONTIER_IF_HEADS),inference-free=$(WORK)/heads/$(h)=$(WORK)/eval/$(h).inference-free.json)
FRONTIER_EVALS  := $(foreach r,$(FRONTIER_ROWS),$(lastword $(subst =, ,$(r))))
# VDR (vdr.mk) at each of VDR_POINTS (k_query/k_doc), parametric and bag-of-words queries, its first seed's heads,
# where `make vdr` ran (words LABEL=FILE, ~ for the label's spaces)
vdr_point        = $(if $(wildcard $(WORK)/eval/$(2).json),$(1)=$(WORK)/eval/$(2).json)
VDR_SEED1        = $(firstword $(VDR_SEEDS))
FRONTIER_POINTS  = $(foreach p,$(VDR_POINTS),\
                     $(call vdr_point,VDR~(k~$(p)),vdr-s$(VDR_SEED1)-q$(call vdr_kq,$(p))-d$(call vdr_kd,$(p))) \
                     $(call vdr_point,VDR^α~(k_doc~$(call vdr_kd,$(p))),vdr-bow-s$(VDR_SEED1)-d$(call vdr_kd,$(p))))

# The rows in a file rewritten when their list changes, a prerequisite of the table: stages/common.mk's .SECONDARY
# would otherwise leave a budget or seed added later untrained, its evaluation missing under a newer table
FRONTIER_LIST := $(WORK)/frontier/rows.txt
ifneq ($(filter frontier $(WORK)/frontier/table.md,$(MAKECMDGOALS)),)
ifneq ($(strip $(FRONTIER_ROWS) $(FRONTIER_POINTS)),$(strip $(file < $(FRONTIER_LIST))))
$(shell mkdir -p $(WORK)/frontier)
$(file > $(FRONTIER_LIST),$(FRONTIER_ROWS) $(FRONTIER_POINTS))
endif
endif

.PHONY: frontier
frontier: $(WORK)/frontier/table.md

$(WORK)/frontier/table.md: $(FRONTIER_EVALS) $(WORK)/eval/dense.json $(FRONTIER_LIST)
	$(PYTHON) -m mmsparse.metrics.frontier --dense $(WORK)/eval/dense.json \
	  --val-images $(DENSE_DIR)/val-images.h5 --val-captions $(DENSE_DIR)/val-captions.h5 \
	  $(addprefix --row ,$(FRONTIER_ROWS)) $(foreach p,$(FRONTIER_POINTS),--point "$(subst ~, ,$(p))") \
	  $(if $(FRONTIER_JOINT_HEADS),--versus joint=D2S) -o $@ --plot $(WORK)/frontier/frontier.png
