# pipeline.mk — every stage fragment, in chain order: encode-dense -> train-head -> sparsify ->
# index -> search -> eval -> inspect. A pipeline sets WORK, BACKBONE, the dataset and model (see
# each fragment's header) and includes this one.
ROOT ?= $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)
include $(ROOT)/stages/common.mk
include $(ROOT)/stages/encode-dense.mk
include $(ROOT)/stages/train-head.mk
include $(ROOT)/stages/sparsify.mk
include $(ROOT)/stages/index.mk
include $(ROOT)/stages/search.mk
include $(ROOT)/stages/eval.mk
include $(ROOT)/stages/inspect.mk
