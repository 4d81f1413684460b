# inspect.mk — top terms of a few documents and queries of head NAME, and its index's term statistics.
#
#   make inspect-NAME   prints the top INSPECT_K terms of INSPECT_IMAGES (image ids) and
#                       INSPECT_CAPTIONS (caption ids) from the EVAL_SPLIT sparse files (each list
#                       optional, default empty: set them before or after including this file), then the
#                       document-frequency table and power-law fit of $(WORK)/index/NAME, with the
#                       rank-frequency plot in $(WORK)/plots/NAME-rank-frequency.png (BM25-V Fig. 1),
#                       and the images' faithfulness to their own captions: doc_Exact@10 / doc_Exact@3
#                       (share of an image's top terms found in its relevant captions, per the qrels),
#                       doc_max_df (share of images holding the most common term) and the captions'
#                       Exact@20 / Semantic@20. Image rows mark (✓) the terms their captions hold.
INSPECT_K ?= 10
INSPECT_FAITHFULNESS = --captions $(WORK)/sparse/$*/$(EVAL_SPLIT)-captions.expand.h5 --qrels $(QRELS)

.PHONY: inspect-%
inspect-%: $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/index/%/mmsparse.json $(QRELS)
	$(if $(INSPECT_IMAGES),$(MMSPARSE) inspect $< $(INSPECT_IMAGES) --k $(INSPECT_K) $(INSPECT_FAITHFULNESS))
	$(if $(INSPECT_CAPTIONS),$(MMSPARSE) inspect $(word 2,$^) $(INSPECT_CAPTIONS) --k $(INSPECT_K))
	$(MMSPARSE) inspect $(WORK)/index/$* --stats --stats-top 20 --png $(WORK)/plots/$*-rank-frequency.png \
	  $(INSPECT_FAITHFULNESS)
