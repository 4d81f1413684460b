# encode-dense.mk — images and captions -> dense HDF5 + qrels, for every split in SPLITS.
#
# From a Karpathy split JSON (ANNOTATION_FORMAT = karpathy, the default):
#   KARPATHY_JSON  Karpathy split JSON (dataset_coco.json, dataset_flickr30k.json, ...)  [required]
#   IMAGE_ROOT     folder the JSON's filepath/filename are relative to                   [required]
#   SPLITS         splits to encode (default: train val test)
# From the official COCO caption annotations (ANNOTATION_FORMAT = coco): one file per split,
# encoded with `--split` naming its one split (captions_train2017.json -> train):
#   COCO_TRAIN_JSON, COCO_TRAIN_IMAGES  e.g. annotations/captions_train2017.json, train2017/  -> train
#   COCO_TEST_JSON,  COCO_TEST_IMAGES   e.g. annotations/captions_val2017.json,   val2017/    -> test
#   COCO_VAL_JSON,   COCO_VAL_IMAGES    a held-out validation file -> val (optional; default
#                                       empty: val-* link to test-*, the 2017 release has no third split)
# Both:
#   MODEL          hub id or local path of the backbone                                  [required]
#   DATASET        dataset name recorded in the files (default: basename of IMAGE_ROOT's parent)
#   ENCODE_FLAGS   extra flags, e.g. --batch-size 256 --device cuda --workers 8 --precision bf16
#
# Outputs: $(DENSE_DIR)/{split}-images.h5, {split}-captions.h5, {split}.qrels (remade when the
# annotation file changes; a missing one is reported by encode-dense, so `make -n` works without data)
# Target:  encode-dense
ANNOTATION_FORMAT ?= karpathy
SPLITS       ?= train val test
DATASET      ?= $(notdir $(abspath $(dir $(IMAGE_ROOT))))
ENCODE_FLAGS ?=
ENCODE_ARGS   = --backbone $(BACKBONE) --model $(MODEL) --dataset $(DATASET)

# $(call ENCODE_RULES,DIR,FLAGS): the rules writing $(call dense_files,DIR) with `encode-dense ... FLAGS`
# (stages/paper-joint.mk encodes a second directory with --final-layer-inputs); recipes expand late.
ifeq ($(ANNOTATION_FORMAT),coco)
SPLITS       := train val test
COCO_VAL_JSON ?=
dense_split   = $(1)/$(2)-images.h5 $(1)/$(2)-captions.h5 $(1)/$(2).qrels
dense_files   = $(call dense_split,$(1),train) $(call dense_split,$(1),val) $(call dense_split,$(1),test)

define ENCODE_RULES
$(call dense_split,$(1),train) &: $(wildcard $(COCO_TRAIN_JSON))
	$$(MMSPARSE) encode-dense $$(COCO_TRAIN_JSON) $$(COCO_TRAIN_IMAGES) -o $(1) $$(ENCODE_ARGS) --split train $(2) $$(ENCODE_FLAGS)

$(call dense_split,$(1),test) &: $(wildcard $(COCO_TEST_JSON))
	$$(MMSPARSE) encode-dense $$(COCO_TEST_JSON) $$(COCO_TEST_IMAGES) -o $(1) $$(ENCODE_ARGS) --split test $(2) $$(ENCODE_FLAGS)

ifneq ($(strip $(COCO_VAL_JSON)),)
$(call dense_split,$(1),val) &: $(wildcard $(COCO_VAL_JSON))
	$$(MMSPARSE) encode-dense $$(COCO_VAL_JSON) $$(COCO_VAL_IMAGES) -o $(1) $$(ENCODE_ARGS) --split val $(2) $$(ENCODE_FLAGS)
else
$(1)/val-images.h5: $(1)/test-images.h5
	ln -sf $$(<F) $$@
$(1)/val-captions.h5: $(1)/test-captions.h5
	ln -sf $$(<F) $$@
$(1)/val.qrels: $(1)/test.qrels
	ln -sf $$(<F) $$@
endif
endef
else
dense_files   = $(foreach s,$(SPLITS),$(1)/$(s)-images.h5 $(1)/$(s)-captions.h5 $(1)/$(s).qrels)

define ENCODE_RULES
$(call dense_files,$(1)) &: $(wildcard $(KARPATHY_JSON))
	$$(MMSPARSE) encode-dense $$(KARPATHY_JSON) $$(IMAGE_ROOT) -o $(1) $$(ENCODE_ARGS) \
	  $$(addprefix --split ,$$(SPLITS)) $(2) $$(ENCODE_FLAGS)
endef
endif

DENSE_FILES  := $(call dense_files,$(DENSE_DIR))
$(eval $(call ENCODE_RULES,$(DENSE_DIR),))

# An interrupted encode-dense resumes, and every split it finished is complete: Make must not delete them
# when interrupted (or when a later split fails), as it does with a recipe's targets otherwise.
.PRECIOUS: $(DENSE_FILES)

.PHONY: encode-dense
encode-dense: $(DENSE_FILES)
