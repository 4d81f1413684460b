"""Sparse projection heads: one file per method, registered by name.

`load_head(dir)` reads `config.json` (its `method` key picks the class) and
`model.safetensors` (+ `vocab.txt`) from a head directory.
"""

from .base import HEADS, SparseHead, load_head, register_head

__all__ = ["HEADS", "SparseHead", "load_head", "register_head"]
