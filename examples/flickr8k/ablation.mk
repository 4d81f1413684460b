# ablation.mk — the D2S expansion x η ablation (paper Table 3 and Fig. 2a) on Flickr8k, and the
# train-head speed benchmark. Included by the Makefile (needs WORK, DENSE_DIR, EVAL_SPLIT, the stages).
#
#   make ablation     trains ABL_MODES x ABL_ETAS heads ($(WORK)/heads/abl-MODE_ETA) and writes
#                     $(WORK)/ablation/table.json (+ table.md) and flops_vs_R@1.png
#   (the train-head speed benchmark, make bench-train, is in bench.mk)
#
#   ABL_MODES  expansion modes             (default: none full caption caption-word)
#   ABL_ETAS   L1 weights η                 (default: 1e-2 1e-3 1e-4 1e-5, the paper's range)
#   ABL_FLAGS  train-head flags of every ablation head (default: --preset paper --epochs 6, every other option the
#              paper's: the full 30,522-term vocabulary, masked L1; one head took ~19 minutes on a
#              shared 2-core CPU, so the 16 take ~5 hours there: run it on a free or GPU machine)
ABL_MODES ?= none full caption caption-word
ABL_ETAS  ?= 1e-2 1e-3 1e-4 1e-5
ABL_FLAGS ?= --preset paper --epochs 6
ABL_HEADS := $(foreach m,$(ABL_MODES),$(foreach e,$(ABL_ETAS),abl-$(m)_$(e)))
# abl-caption-word_1e-3 -> --expansion caption-word --eta 1e-3
abl_eta  = $(word 2,$(subst _, ,$(1)))
abl_mode = $(patsubst abl-%,%,$(word 1,$(subst _, ,$(1))))
$(foreach h,$(ABL_HEADS),$(eval HEAD_FLAGS_$(h) = --expansion $(call abl_mode,$(h)) --eta $(call abl_eta,$(h)) $(ABL_FLAGS)))

.PHONY: ablation
# the heads are named here too: Make treats pattern-built files that only a file target needs as
# intermediate, and would skip heads added to the grid once a table exists
ablation: $(foreach h,$(ABL_HEADS),$(WORK)/heads/$(h)/config.json) $(WORK)/ablation/table.json

$(WORK)/ablation/table.json: $(foreach h,$(ABL_HEADS),$(WORK)/heads/$(h)/config.json) \
                             $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(PYTHON) -m mmsparse.methods.d2s.ablation $(foreach h,$(ABL_HEADS),$(WORK)/heads/$(h)) \
	  --images $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 --captions $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 \
	  -o $@ --plot $(WORK)/ablation/flops_vs_R@1.png
