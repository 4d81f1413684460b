"""mmsparse: multimodal learned sparse retrieval from dense vision-language vectors.

Library layer (importable without the CLI):
  mmsparse.formats   dense/sparse HDF5, TREC runs and qrels
  mmsparse.data      dataset readers (Karpathy split JSON, ...)
  mmsparse.backbones dense encoders (hf-dual, blip, ...)
  mmsparse.heads     sparse projection heads and their losses (D2S, ...)
  mmsparse.indexes   PISA (sparse) and Faiss (dense) indexes
  mmsparse.metrics   ir-measures effectiveness, FLOPs and sparsity
"""

__version__ = "0.1.0"
