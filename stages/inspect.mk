# inspect.mk — top terms of a few documents and queries of head NAME, and its index's term statistics.
#
#   make inspect-NAME   prints the top INSPECT_K terms of INSPECT_IMAGES (image ids) and
#                       INSPECT_CAPTIONS (caption ids) from the EVAL_SPLIT sparse files (each list
#                       optional, default empty: set them before or after including this file), then the
#                       document-frequency table and power-law fit of $(WORK)/index/NAME, with the
#                       rank-frequency plot in $(WORK)/plots/NAME-rank-frequency.png (BM25-V Fig. 1)
INSPECT_K ?= 10

.PHONY: inspect-%
inspect-%: $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.expand.h5 $(WORK)/index/%/mmsparse.json
	$(if $(INSPECT_IMAGES),$(MMSPARSE) inspect $< $(INSPECT_IMAGES) --k $(INSPECT_K))
	$(if $(INSPECT_CAPTIONS),$(MMSPARSE) inspect $(word 2,$^) $(INSPECT_CAPTIONS) --k $(INSPECT_K))
	$(MMSPARSE) inspect $(WORK)/index/$* --stats --stats-top 20 --png $(WORK)/plots/$*-rank-frequency.png
