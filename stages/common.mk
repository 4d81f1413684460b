# common.mk — variables every stage fragment uses. Include it first.
#
#   MMSPARSE   the command to run (default: mmsparse)
#   WORK       where every output goes (default: work)
#   BACKBONE   backbone name as `encode-dense --backbone` takes it (default: hf-dual)
#   EVAL_SPLIT the split that is indexed, searched and evaluated (default: test)
#   DENSE_DIR  dense HDF5 + qrels of this backbone (default: $(WORK)/dense/$(BACKBONE));
#              this is also the workspace convention `train-head --backbone NAME` reads
#              (MMSPARSE_WORK=$(WORK)).
MMSPARSE   ?= mmsparse
WORK       ?= work
BACKBONE   ?= hf-dual
EVAL_SPLIT ?= test
DENSE_DIR  ?= $(WORK)/dense/$(BACKBONE)
QRELS      ?= $(DENSE_DIR)/$(EVAL_SPLIT).qrels
export MMSPARSE_WORK := $(abspath $(WORK))

# Make deletes a target whose recipe failed; the stages also write atomically.
.DELETE_ON_ERROR:

# Two Make runs that need the same output (`make joint` and `make bm25v` at once) share it: the
# second waits for the first writer and keeps what it wrote. Exiting 2 at once instead (what the
# command does outside Make) would let .DELETE_ON_ERROR delete files the first had just finished.
export MMSPARSE_LOCK_WAIT ?= 3600

# Keep every file a chain of pattern rules builds (heads, sparse files, indexes, runs): without
# this, Make deletes such "intermediate" files at the end of the run, e.g. a trained head's config.json.
.SECONDARY:
