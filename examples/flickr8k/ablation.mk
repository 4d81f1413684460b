# ablation.mk — the D2S expansion x η ablation (paper Table 3 and Fig. 2a) on Flickr8k, and the
# train-head speed benchmark. Included by the Makefile (needs WORK, DENSE_DIR, EVAL_SPLIT, the stages).
#
#   make ablation     trains ABL_MODES x ABL_ETAS heads ($(WORK)/heads/abl-MODE_ETA) and writes
#                     $(WORK)/ablation/table.json (+ table.md) and flops_vs_R@1.png
#   make bench-train  $(WORK)/bench/train-head.json: step time vs bare vocabulary projection
#
#   ABL_MODES  expansion modes             (default: none full caption caption-word)
#   ABL_ETAS   L1 weights η                 (default: 1e-2 1e-3 1e-4 1e-5, the paper's range)
#   ABL_FLAGS  train-head flags of every ablation head (default: the README schedule, 6 epochs;
#              16 heads take ~50 minutes on 2 CPU cores)
ABL_MODES ?= none full caption caption-word
ABL_ETAS  ?= 1e-2 1e-3 1e-4 1e-5
ABL_FLAGS ?= --epochs 6
ABL_HEADS := $(foreach m,$(ABL_MODES),$(foreach e,$(ABL_ETAS),abl-$(m)_$(e)))
# abl-caption-word_1e-3 -> --expansion caption-word --eta 1e-3
abl_eta  = $(word 2,$(subst _, ,$(1)))
abl_mode = $(patsubst abl-%,%,$(word 1,$(subst _, ,$(1))))
$(foreach h,$(ABL_HEADS),$(eval HEAD_FLAGS_$(h) = --expansion $(call abl_mode,$(h)) --eta $(call abl_eta,$(h)) $(ABL_FLAGS)))

.PHONY: ablation bench-train
ablation: $(WORK)/ablation/table.json

$(WORK)/ablation/table.json: $(foreach h,$(ABL_HEADS),$(WORK)/heads/$(h)/config.json) \
                             $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(PYTHON) -m mmsparse.metrics.ablation $(foreach h,$(ABL_HEADS),$(WORK)/heads/$(h)) \
	  --images $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 --captions $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 \
	  -o $@ --plot $(WORK)/ablation/flops_vs_R@1.png

# paper shapes (d=256, ω=768, |V|=30522), the issue's reference shape and this example's head
bench-train: $(WORK)/heads/$(HEAD)/config.json
	$(PYTHON) -m mmsparse.bench.train -o $(WORK)/bench/train-head.json --head $(WORK)/heads/$(HEAD) \
	  --images $(DENSE_DIR)/train-images.h5 --captions $(DENSE_DIR)/train-captions.h5
