"""Inference-free: image search with no model at query time.

Images are expanded once, offline, by D2S's head on their dense vectors; a caption query is its
WordPiece tokens weighted by a learned per-term table (initialised from IDF), looked up without
torch, transformers or the backbone. config.py (options), head.py (D2S head + table),
queries.py (the torch-free query encoder), method.py (training with the dense teacher, sparsify).
"""
