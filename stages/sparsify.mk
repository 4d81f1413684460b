# sparsify.mk — head NAME + dense HDF5 of EVAL_SPLIT -> sparse HDF5.
#
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-images.h5                  documents (full head output)
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.expand.h5         expanded queries
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.caption-terms.h5  queries keeping only the caption's own terms
#   $(WORK)/sparse/NAME/$(EVAL_SPLIT)-captions.inference-free.h5 queries of an inference-free head: the
#                                                              captions' texts through its term-weight table
#   QUERY_MODES     the query modes these rules exist for (default: expand caption-terms inference-free)
#   SPARSIFY_FLAGS  extra flags (e.g. --batch-size 1024)
SPARSIFY_FLAGS ?=

$(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) sparsify $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-images.h5 -o $@ $(SPARSIFY_FLAGS)

QUERY_MODES ?= expand caption-terms inference-free

define SPARSIFY_QUERY_RULE
$(WORK)/sparse/%/$(EVAL_SPLIT)-captions.$(1).h5: $(WORK)/heads/%/config.json $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $$(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 -o $$@ --query-mode $(1) $(SPARSIFY_FLAGS)
endef
$(foreach m,$(QUERY_MODES),$(eval $(call SPARSIFY_QUERY_RULE,$(m))))
