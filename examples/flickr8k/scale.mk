# scale.mk — the test split through Ray (docs/ray.md) and then Milvus (docs/milvus.md, milvus.mk):
# Ray Data encode -> Ray Data sparsify with the main job's head -> Milvus Lite (sparse, dense,
# hybrid) -> eval. Needs `pip install -e '.[scale]'`. Everything goes under $(SCALE_WORK), apart
# from the main job's outputs, so the two can be compared.
#
#   make -C examples/flickr8k scale
#     -> $(SCALE_WORK)/dense/$(BACKBONE)/$(EVAL_SPLIT)-{images,captions}.h5/   sharded dense (Ray encode)
#        $(SCALE_WORK)/dense/$(BACKBONE)/$(EVAL_SPLIT).qrels
#     -> $(SCALE_WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-images.h5/                 sharded sparse (Ray sparsify)
#        $(SCALE_WORK)/sparse/$(HEAD)/$(EVAL_SPLIT)-captions.expand.h5/
#     -> $(SCALE_WORK)/eval/milvus-sparse.json, milvus-dense.json, milvus-hybrid.json
#        (milvus.mk's rules, run by a sub-make with WORK=$(SCALE_WORK) on the Ray-made inputs)
#   Compare with the single-process chain:
#     mmsparse eval --table $(WORK)/eval/dense.json $(WORK)/eval/sparse.json $(SCALE_WORK)/eval/milvus-*.json
#
#   SCALE_WORK   outputs of this chain                                (default: $(WORK)/scale)
#   RAY          where Ray runs: local, auto (this machine's cluster) or ray://HOST:10001
#                                                                     (default: local)
#   RAY_WORKERS  model replicas (Ray actors) of each stage            (default: 1)
#   RAY_FLAGS    more flags of both stages, e.g. --num-gpus-per-worker 1 --cpus-per-worker 4
#                --part-rows 4096                                     (default: none)
# The head is the main job's ($(WORK)/heads/$(HEAD)), trained by `make -C examples/flickr8k`.
SCALE_WORK   ?= $(WORK)/scale
RAY          ?= local
RAY_WORKERS  ?= 1
RAY_FLAGS    ?=
SCALE_DENSE  := $(SCALE_WORK)/dense/$(BACKBONE)
SCALE_SPARSE := $(SCALE_WORK)/sparse/$(HEAD)
SCALE_RAY     = --ray $(RAY) --workers $(RAY_WORKERS) $(RAY_FLAGS)
SCALE_INPUTS := $(SCALE_DENSE)/$(EVAL_SPLIT)-images.h5 $(SCALE_DENSE)/$(EVAL_SPLIT)-captions.h5 \
                $(SCALE_DENSE)/$(EVAL_SPLIT).qrels $(SCALE_SPARSE)/$(EVAL_SPLIT)-images.h5 \
                $(SCALE_SPARSE)/$(EVAL_SPLIT)-captions.expand.h5

.PHONY: scale scale-encode scale-sparsify
scale: $(SCALE_INPUTS)
	$(MAKE) -f $(HERE)/Makefile milvus WORK=$(SCALE_WORK) DENSE_DIR=$(SCALE_DENSE) HEAD=$(HEAD) \
	  $(addprefix -o ,$(SCALE_INPUTS))
scale-encode: $(filter $(SCALE_DENSE)/%,$(SCALE_INPUTS))
scale-sparsify: $(filter $(SCALE_SPARSE)/%,$(SCALE_INPUTS))

$(SCALE_DENSE)/$(EVAL_SPLIT)-images.h5 $(SCALE_DENSE)/$(EVAL_SPLIT)-captions.h5 $(SCALE_DENSE)/$(EVAL_SPLIT).qrels &: $(wildcard $(KARPATHY_JSON))
	$(MMSPARSE) encode-dense $(KARPATHY_JSON) $(IMAGE_ROOT) -o $(SCALE_DENSE) --backbone $(BACKBONE) --model $(MODEL) \
	  --dataset $(DATASET) --split $(EVAL_SPLIT) $(SCALE_RAY)

$(SCALE_SPARSE)/$(EVAL_SPLIT)-images.h5: $(WORK)/heads/$(HEAD)/config.json $(SCALE_DENSE)/$(EVAL_SPLIT)-images.h5
	$(MMSPARSE) sparsify $(<D) $(word 2,$^) -o $@ $(SCALE_RAY)

$(SCALE_SPARSE)/$(EVAL_SPLIT)-captions.expand.h5: $(WORK)/heads/$(HEAD)/config.json $(SCALE_DENSE)/$(EVAL_SPLIT)-captions.h5
	$(MMSPARSE) sparsify $(<D) $(word 2,$^) -o $@ --query-mode expand $(SCALE_RAY)
