# vdr-common.mk — what examples/flickr8k/vdr.mk and stages/paper-vdr.mk share: the dense rows VDR is judged
# against and the figures. The dense rows:
# the dense model trained alike (`train-head --method dense`: CLIP's loss on the same final layers and projections,
# data and schedule as VDR; its sparsify writes the tuned dense vectors) and the backbone's own dense model (the
# final-layer files' `vectors`), both served by Faiss and evaluated; the backbone's row is tested against the
# dense model trained alike. The including file sets VDR_STATES, VDR_INPUTS, VDR_QRELS, VDR_SCHEDULE,
# VDR_DENSE_FLAGS, VDR_DENSE_RUN (the backbone row's reference run), VDR_BACKBONE_ROW (the backbone row's name)
# and a rule for $(WORK)/sparse/HEAD/$(EVAL_SPLIT)-images.all.h5 (V(x) of the test images, ungated); optionally
#   VDR_DENSE_HEADS   the dense heads trained alike (default: vdr-dense), each with its own VDR_DENSE_VARIANT_<head>
#                     flags after VDR_DENSE_FLAGS (e.g. --seed S)
#   VDR_CLOUD_HEADS   the two heads of Fig. 7, with and without the bag-of-words entry (default: vdr vdr-nobow)
#   VDR_CURVE_HEADS   the heads of the validation curve (default: vdr vdr-dense)
VDR_DENSE_HEADS ?= vdr-dense
VDR_CLOUD_HEADS ?= vdr vdr-nobow
VDR_CURVE_HEADS ?= vdr vdr-dense

# dense head $(1): trained, its tuned test vectors, indexed, searched, evaluated
define VDR_DENSE_RULES
$(WORK)/heads/$(1)/config.json: $(VDR_INPUTS)
	$$(MMSPARSE) train-head --method dense $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
	  --val-images $(VDR_STATES)/val-images.h5 --val-captions $(VDR_STATES)/val-captions.h5 \
	  -o $$(@D) $$(VDR_SCHEDULE) $$(VDR_DENSE_FLAGS) $$(VDR_DENSE_VARIANT_$(1)) $$(TRAIN_FLAGS)

$(WORK)/dense/$(1)/$(EVAL_SPLIT)-%.h5: $(WORK)/heads/$(1)/config.json $(VDR_STATES)/$(EVAL_SPLIT)-%.h5
	$$(MMSPARSE) sparsify $$(<D) $$(word 2,$$^) -o $$@

$(WORK)/index/$(1)/mmsparse.json: $(WORK)/dense/$(1)/$(EVAL_SPLIT)-images.h5
	$$(MMSPARSE) index $$< -o $$(@D) $$(DENSE_INDEX_FLAGS)

$(WORK)/runs/$(1).trec: $(WORK)/index/$(1)/mmsparse.json $(WORK)/dense/$(1)/$(EVAL_SPLIT)-captions.h5
	$$(MMSPARSE) search $$(<D) $$(word 2,$$^) -o $$@ --k $$(K) $$(SEARCH_FLAGS)

$(WORK)/eval/$(1).json: $(WORK)/runs/$(1).trec
	$$(MMSPARSE) eval $$< $(VDR_QRELS) -o $$@ $$(EVAL_FLAGS)
endef
$(foreach h,$(VDR_DENSE_HEADS),$(eval $(call VDR_DENSE_RULES,$(h))))

$(WORK)/index/$(VDR_BACKBONE_ROW)/mmsparse.json: $(VDR_STATES)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< -o $(@D) $(DENSE_INDEX_FLAGS)
$(WORK)/runs/$(VDR_BACKBONE_ROW).trec: $(WORK)/index/$(VDR_BACKBONE_ROW)/mmsparse.json $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $(K) $(SEARCH_FLAGS)
$(WORK)/eval/$(VDR_BACKBONE_ROW).json: $(WORK)/runs/$(VDR_BACKBONE_ROW).trec $(VDR_DENSE_RUN)
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --dense-run $(VDR_DENSE_RUN) $(EVAL_FLAGS)

# Fig. 7: mean term weights over the test images, with and without the bag-of-words entry
vdr-clouds: $(WORK)/plots/vdr-clouds.png
$(WORK)/plots/vdr-clouds.png: $(foreach h,$(VDR_CLOUD_HEADS),$(WORK)/sparse/$(h)/$(EVAL_SPLIT)-images.all.h5)
	$(PYTHON) -m mmsparse.methods.vdr clouds "VDR (w/ BoW)=$<" "VDR (w/o BoW)=$(word 2,$^)" -o $@

# validation R@10 per epoch: VDR (parametric and bag-of-words queries) and the dense model trained alike
vdr-curve: $(WORK)/plots/vdr-curve.png
$(WORK)/plots/vdr-curve.png: $(foreach h,$(VDR_CURVE_HEADS),$(WORK)/heads/$(h)/config.json)
	$(PYTHON) -m mmsparse.methods.vdr curve $(^D) -o $@
