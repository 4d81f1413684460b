# eval.mk — run + qrels -> flat JSON of measures.
#
#   $(WORK)/eval/dense.json               from $(WORK)/runs/dense.trec
#   $(WORK)/eval/NAME.expand.json         from $(WORK)/runs/NAME.expand.trec, plus FLOPs and terms per
#                                         vector (the sparse files), caption-side Exact@K / Semantic@K
#                                         (K = DEVIATION_K, static embeddings = head NAME's W2), image-side
#                                         doc_Exact@10 / doc_Exact@3 and doc_max_df, and vs the dense run:
#                                         pearson_*, overlap@10 (+ histogram) and paired t-test p-values
#   $(WORK)/eval/NAME.caption-terms.json  likewise for caption-term queries (and NAME.MODE.json for every
#                                         mode of QUERY_MODES, e.g. an inference-free head's queries)
#   DEVIATION_K        k of Exact@k / Semantic@k (default 20, as D2S Table 3)
#   DENSE_COMPARISONS  Bonferroni factor stored with the p-values vs dense (default 2: the expand and
#                      caption-terms runs of a head are both tested against the same dense run, so the
#                      family is those two runs; without it each eval would correct x1. `eval --table`
#                      recomputes the factor from the rows it shows)
#   EVAL_FLAGS         extra flags (e.g. --measure nDCG@10)
# Print several results as one table: mmsparse eval --table $(WORK)/eval/dense.json $(WORK)/eval/NAME.expand.json ...
EVAL_FLAGS        ?=
DEVIATION_K       ?= 20
DENSE_COMPARISONS ?= 2
SPARSE_EVAL_FLAGS  = --dense-run $(WORK)/runs/dense.trec --deviation-k $(DEVIATION_K) --head $(WORK)/heads/$* \
                     --n-comparisons $(DENSE_COMPARISONS)

$(WORK)/eval/dense.json: $(WORK)/runs/dense.trec $(QRELS)
	$(MMSPARSE) eval $< $(QRELS) -o $@ $(EVAL_FLAGS)

define EVAL_QUERY_RULE
$(WORK)/eval/%.$(1).json: $(WORK)/runs/%.$(1).trec $(QRELS) $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.$(1).h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5 $(WORK)/runs/dense.trec $(WORK)/heads/%/config.json
	$(MMSPARSE) eval $$< $(QRELS) -o $$@ --queries $$(word 3,$$^) --docs $$(word 4,$$^) $$(SPARSE_EVAL_FLAGS) $(EVAL_FLAGS)
endef
$(foreach m,$(QUERY_MODES),$(eval $(call EVAL_QUERY_RULE,$(m))))
