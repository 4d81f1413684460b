# search.mk — index + queries -> TREC run.
#
#   $(WORK)/runs/dense.trec               dense captions against $(WORK)/index/dense
#   $(WORK)/runs/NAME.expand.trec         expanded sparse captions against $(WORK)/index/NAME
#   $(WORK)/runs/NAME.caption-terms.trec  caption-term sparse captions against $(WORK)/index/NAME
#   $(WORK)/runs/NAME.MODE.trec           likewise for every mode of QUERY_MODES (sparsify.mk)
#   K             results per query (default 1000)
#   SEARCH_FLAGS  extra flags
K            ?= 1000
SEARCH_FLAGS ?=

$(WORK)/runs/dense.trec: $(WORK)/index/dense/mmsparse.json $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) search $(<D) $(DENSE_DIR)/$(EVAL_SPLIT)-captions.h5 -o $@ --k $(K) $(SEARCH_FLAGS)

define SEARCH_QUERY_RULE
$(WORK)/runs/%.$(1).trec: $(WORK)/index/%/mmsparse.json $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.$(1).h5
	$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $(K) $(SEARCH_FLAGS)
endef
$(foreach m,$(QUERY_MODES),$(eval $(call SEARCH_QUERY_RULE,$(m))))
