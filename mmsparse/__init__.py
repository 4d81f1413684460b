"""mmsparse: multimodal learned sparse retrieval.

The stages are importable functions (see mmsparse.api): encode_dense, train_head, load_head,
sparsify, build_index, search, evaluate, evaluate_table, inspect_terms, inspect_provenance,
query, export, import_terms, import_head. They load on first use, so importing the package is cheap.
"""

from ._version import __version__
from .runtime import tune_allocator

# Before any large allocation: keep freed activation memory in the process instead of returning it
# to the kernel after every batch (mmsparse/runtime.py; MMSPARSE_MALLOC=system to leave glibc's defaults).
tune_allocator()

_API = ("encode_dense", "train_head", "load_head", "sparsify", "build_index", "search", "evaluate",
        "inspect_terms", "evaluate_table", "inspect_provenance", "query", "export", "import_terms", "import_head")

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'mmsparse' has no attribute {name!r}")
