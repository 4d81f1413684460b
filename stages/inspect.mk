# inspect.mk — top terms of a few documents and queries of head NAME.
#
#   make inspect-NAME   prints the top INSPECT_K terms of INSPECT_IMAGES (image ids) and
#                       INSPECT_CAPTIONS (caption ids) from the EVAL_SPLIT sparse files
INSPECT_K        ?= 10
INSPECT_IMAGES   ?=
INSPECT_CAPTIONS ?=

.PHONY: inspect-%
inspect-%: $(WORK)/sparse/%/$(EVAL_SPLIT)-images.h5 $(WORK)/sparse/%/$(EVAL_SPLIT)-captions.expand.h5
	$(if $(INSPECT_IMAGES),$(MMSPARSE) inspect $< $(INSPECT_IMAGES) --k $(INSPECT_K))
	$(if $(INSPECT_CAPTIONS),$(MMSPARSE) inspect $(word 2,$^) $(INSPECT_CAPTIONS) --k $(INSPECT_K))
