# encode-dense.mk — images and captions -> dense HDF5 + qrels, for every split in SPLITS.
#
#   KARPATHY_JSON  Karpathy split JSON (dataset_coco.json, dataset_flickr30k.json, ...)  [required]
#   IMAGE_ROOT     folder the JSON's filenames are relative to                           [required]
#   MODEL          hub id or local path of the backbone                                  [required]
#   DATASET        dataset name recorded in the files (default: basename of IMAGE_ROOT's parent)
#   SPLITS         splits to encode (default: train val test)
#   ENCODE_FLAGS   extra flags, e.g. --batch-size 128 --device cuda
#
# Outputs: $(DENSE_DIR)/{split}-images.h5, {split}-captions.h5, {split}.qrels
# Target:  encode-dense
SPLITS       ?= train val test
DATASET      ?= $(notdir $(abspath $(dir $(IMAGE_ROOT))))
ENCODE_FLAGS ?=
DENSE_FILES  := $(foreach s,$(SPLITS),$(DENSE_DIR)/$(s)-images.h5 $(DENSE_DIR)/$(s)-captions.h5 $(DENSE_DIR)/$(s).qrels)

$(DENSE_FILES) &: $(KARPATHY_JSON)
	$(MMSPARSE) encode-dense $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(DENSE_DIR) --backbone $(BACKBONE) \
	  --model $(MODEL) --dataset $(DATASET) $(addprefix --split ,$(SPLITS)) $(ENCODE_FLAGS)

.PHONY: encode-dense
encode-dense: $(DENSE_FILES)
