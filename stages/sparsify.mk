# sparsify.mk — head NAME + dense HDF5 of EVAL_SPLIT -> sparse HDF5.
#
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-images.h5                  documents (full head output)
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.expand.h5         expanded queries
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.caption-terms.h5  queries keeping only the caption's own terms
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.inference-free.h5 queries of an inference-free head (its table)
#   SPARSIFY_FLAGS  extra flags (e.g. --batch-size 1024)
SPARSIFY_FLAGS ?=

$(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) sparsify $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 -o $@ $(SPARSIFY_FLAGS)

$(WORK)/sparse/%/$(EVAL_SPLIT)-captions.expand.h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 -o $@ --query-mode expand $(SPARSIFY_FLAGS)

$(WORK)/sparse/%/$(EVAL_SPLIT)-captions.caption-terms.h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 -o $@ --query-mode caption-terms $(SPARSIFY_FLAGS)

# inference-free heads: captions become queries from their text through the head's term-weight table
$(WORK)/sparse/%/$(EVAL_SPLIT)-captions.inference-free.h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 -o $@ --query-mode inference-free $(SPARSIFY_FLAGS)
