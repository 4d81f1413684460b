# train-head.mk — dense train/val HDF5 -> a sparse head directory per NAME.
#
#   $(WORK)/heads/NAME/config.json is built by
#     mmsparse train-head train-images train-captions --val-images ... -o $(WORK)/heads/NAME $(HEAD_FLAGS_NAME)
#   HEAD_FLAGS_NAME   the flags of head NAME (e.g. HEAD_FLAGS_d2s = --eta 1e-3 --expansion caption)
#   TRAIN_FLAGS       flags added to every head (e.g. --device cuda)
TRAIN_FLAGS ?=
TRAIN_INPUTS = $(DENSE_DIR)/train-images.h5 $(DENSE_DIR)/train-captions.h5 \
               $(DENSE_DIR)/val-images.h5 $(DENSE_DIR)/val-captions.h5

$(WORK)/heads/%/config.json: $(TRAIN_INPUTS)
	$(MMSPARSE) train-head $(DENSE_DIR)/train-images.h5 $(DENSE_DIR)/train-captions.h5 \
	  --val-images $(DENSE_DIR)/val-images.h5 --val-captions $(DENSE_DIR)/val-captions.h5 \
	  -o $(@D) $(HEAD_FLAGS_$*) $(TRAIN_FLAGS)
