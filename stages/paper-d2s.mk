# paper-d2s.mk — the D2S paper's pipeline (Table 1: one D2S head per η, exp = c, the paper's
# settings) over any dataset and backbone: encode -> train -> sparsify -> index -> search -> eval ->
# inspect -> the table with significance marks against dense (and, by stages/paper-joint.mk, the joint
# paper's `joint` and `joint-ablation` targets; by stages/paper-vdr.mk, the VDR paper's `vdr` and
# `vdr-ablation`). Included by examples/mscoco-blip and
# examples/flickr30k-albef, which set ROOT, WORK, DATA, MODEL, BACKBONE, DATASET and the annotation
# files first (see their headers for every variable and its default).
COCO_TRAIN_JSON   ?= $(DATA)/annotations/captions_train2017.json
COCO_TRAIN_IMAGES ?= $(DATA)/train2017
COCO_TEST_JSON    ?= $(DATA)/annotations/captions_val2017.json
COCO_TEST_IMAGES  ?= $(DATA)/val2017
ANNOTATION_FORMAT ?= $(if $(wildcard $(KARPATHY_JSON)),karpathy,$(if $(wildcard $(COCO_TRAIN_JSON)),coco,karpathy))

DEVICE       ?= cuda
WORKERS      ?= 8
PRECISION    ?= fp32
ENCODE_FLAGS ?= --device $(DEVICE) --workers $(WORKERS) --precision $(PRECISION) --batch-size 256
TRAIN_FLAGS  ?= --device $(DEVICE)

# D2S at the paper's settings (§5.1): batch 512, 200 epochs, τ = 0.001, η per head, exp = c
ETAS         ?= 1e-3 1e-5
EPOCHS       ?= 200
BATCH_SIZE   ?= 512
TAU          ?= 0.001
VOCAB_MIN_DF ?= 0
D2S_FLAGS    ?=
HEADS        := $(foreach e,$(ETAS),d2s-eta$(e))
$(foreach e,$(ETAS),$(eval HEAD_FLAGS_d2s-eta$(e) = --epochs $$(EPOCHS) --batch-size $$(BATCH_SIZE) --eta $(e) \
  --expansion caption --temperature $$(TAU) --vocab-min-df $$(VOCAB_MIN_DF) --preset paper $$(D2S_FLAGS)))

# each D2S head is compared with dense (one t-test per head: the Bonferroni factor)
DENSE_COMPARISONS ?= $(words $(ETAS))

include $(ROOT)/stages/pipeline.mk
# the joint paper's heads over the towers' final layers: `make joint`, `make joint-ablation`
include $(ROOT)/stages/paper-joint.mk
# the VDR paper's runs over the same final-layer inputs: `make vdr`, `make vdr-ablation`
include $(ROOT)/stages/paper-vdr.mk

# test images shown by `inspect` (default: the first INSPECT_N images of the test qrels, read when
# the qrels exist)
INSPECT_N      ?= 3
INSPECT_IMAGES ?= $(shell awk '!seen[$$3]++ {print $$3}' $(QRELS) 2>/dev/null | head -n $(INSPECT_N))

.DEFAULT_GOAL := all
.PHONY: all eval table clean
# the table is printed last: by `all` itself, after its prerequisites (Make builds inspect-% pattern
# targets after the others because .SECONDARY makes them intermediate)
all: $(foreach h,$(HEADS),inspect-$(h)) eval
	$(TABLE)

eval: $(WORK)/eval/dense.json $(foreach h,$(HEADS),$(WORK)/eval/$(h).expand.json)

# dense vs each D2S head (expanded queries): R@1, R@5, R@10, MRR@10 (RR@10), FLOPs; † = p < 0.05
# vs dense, paired two-tailed t-test with Bonferroni correction, as in Table 1
TABLE = $(MMSPARSE) eval --table $(WORK)/eval/dense.json $(foreach h,$(HEADS),$(WORK)/eval/$(h).expand.json) \
  --label dense $(addprefix --label ,$(HEADS)) --plot $(WORK)/plots -o $(WORK)/eval/table.md
table: eval
	$(TABLE)

clean:
	rm -rf $(WORK)
