# eval.mk — run + qrels -> flat JSON of measures.
#
#   $(WORK)/eval/dense.json               from $(WORK)/runs/dense.trec
#   $(WORK)/eval/NAME.expand.json         from $(WORK)/runs/NAME.expand.trec (+ FLOPs from the sparse files)
#   $(WORK)/eval/NAME.caption-terms.json  likewise for caption-term queries
#   EVAL_FLAGS  extra flags (e.g. --measure nDCG@10)
EVAL_FLAGS ?=

$(WORK)/eval/dense.json: $(WORK)/runs/dense.trec $(QRELS)
	$(MMSPARSE) eval $< $(QRELS) -o $@ $(EVAL_FLAGS)

$(WORK)/eval/%.expand.json: $(WORK)/runs/%.expand.trec $(QRELS) $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) eval $< $(QRELS) -o $@ --queries $(word 3,$^) --docs $(word 4,$^) $(EVAL_FLAGS)

$(WORK)/eval/%.caption-terms.json: $(WORK)/runs/%.caption-terms.trec $(QRELS) $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.caption-terms.h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) eval $< $(QRELS) -o $@ --queries $(word 3,$^) --docs $(word 4,$^) $(EVAL_FLAGS)
