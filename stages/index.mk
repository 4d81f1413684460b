# index.mk — documents of EVAL_SPLIT -> an index directory.
#
#   $(WORK)/index/dense/   Faiss over $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 (DENSE_INDEX_FLAGS, e.g. --hnsw)
#   $(WORK)/index/NAME/    PISA over $(WORK)/sparse/NAME/$(EVAL_SPLIT)-images.h5 (INDEX_FLAGS)
# Each index directory carries mmsparse.json, which is the Make target.
INDEX_FLAGS       ?=
DENSE_INDEX_FLAGS ?=

$(WORK)/index/dense/mmsparse.json: $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< -o $(@D) $(DENSE_INDEX_FLAGS)

$(WORK)/index/%/mmsparse.json: $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< -o $(@D) $(INDEX_FLAGS)
