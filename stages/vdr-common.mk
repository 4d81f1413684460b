# vdr-common.mk — what examples/flickr8k/vdr.mk and stages/paper-vdr.mk share: the two dense rows VDR is judged
# against and the figures. The dense rows:
# the dense model trained alike (`train-head --method dense`: CLIP's loss on the same final layers and projections,
# data and schedule as VDR; its sparsify writes the tuned dense vectors) and the backbone's own dense model (the
# final-layer files' `vectors`), both served by Faiss and evaluated; the backbone's row is tested against the
# dense model trained alike. The including file sets VDR_STATES, VDR_INPUTS, VDR_QRELS, VDR_SCHEDULE,
# VDR_DENSE_FLAGS, VDR_DENSE_RUN ($(WORK)/runs/vdr-dense.trec), VDR_BACKBONE_ROW (the backbone row's name) and a
# rule for $(WORK)/sparse/HEAD/$(EVAL_SPLIT)-images.all.h5 (V(x) of the test images, ungated).
$(WORK)/heads/vdr-dense/config.json: $(VDR_INPUTS)
	$(MMSPARSE) train-head --method dense $(VDR_STATES)/train-images.h5 $(VDR_STATES)/train-captions.h5 \
	  --val-images $(VDR_STATES)/val-images.h5 --val-captions $(VDR_STATES)/val-captions.h5 \
	  -o $(@D) $(VDR_SCHEDULE) $(VDR_DENSE_FLAGS) $(TRAIN_FLAGS)

$(WORK)/dense/vdr-dense/$(EVAL_SPLIT)-%.h5: $(WORK)/heads/vdr-dense/config.json $(VDR_STATES)/$(EVAL_SPLIT)-%.h5
	$(MMSPARSE) sparsify $(<D) $(word 2,$^) -o $@

$(WORK)/index/vdr-dense/mmsparse.json: $(WORK)/dense/vdr-dense/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< -o $(@D) $(DENSE_INDEX_FLAGS)
$(WORK)/index/$(VDR_BACKBONE_ROW)/mmsparse.json: $(VDR_STATES)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) index $< -o $(@D) $(DENSE_INDEX_FLAGS)

$(WORK)/runs/vdr-dense.trec: $(WORK)/index/vdr-dense/mmsparse.json $(WORK)/dense/vdr-dense/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $(K) $(SEARCH_FLAGS)
$(WORK)/runs/$(VDR_BACKBONE_ROW).trec: $(WORK)/index/$(VDR_BACKBONE_ROW)/mmsparse.json $(VDR_STATES)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) search $(<D) $(word 2,$^) -o $@ --k $(K) $(SEARCH_FLAGS)

$(WORK)/eval/vdr-dense.json: $(WORK)/runs/vdr-dense.trec
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ $(EVAL_FLAGS)
$(WORK)/eval/$(VDR_BACKBONE_ROW).json: $(WORK)/runs/$(VDR_BACKBONE_ROW).trec $(VDR_DENSE_RUN)
	$(MMSPARSE) eval $< $(VDR_QRELS) -o $@ --dense-run $(VDR_DENSE_RUN) $(EVAL_FLAGS)

# Fig. 7: mean term weights over the test images, with and without the bag-of-words entry
vdr-clouds: $(WORK)/plots/vdr-clouds.png
$(WORK)/plots/vdr-clouds.png: $(WORK)/sparse/vdr/$(EVAL_SPLIT)-images.all.h5 $(WORK)/sparse/vdr-nobow/$(EVAL_SPLIT)-images.all.h5
	$(PYTHON) -m mmsparse.methods.vdr clouds "VDR (w/ BoW)=$<" "VDR (w/o BoW)=$(word 2,$^)" -o $@

# validation R@10 per epoch: VDR (parametric and bag-of-words queries) and the dense model trained alike
vdr-curve: $(WORK)/plots/vdr-curve.png
$(WORK)/plots/vdr-curve.png: $(WORK)/heads/vdr/config.json $(WORK)/heads/vdr-dense/config.json
	$(PYTHON) -m mmsparse.methods.vdr curve $(^D) -o $@
