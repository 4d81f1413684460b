"""mmsparse: multimodal learned sparse retrieval.

The stages are importable functions (see mmsparse.api): encode_dense, train_head, load_head,
sparsify, build_index, search, evaluate, inspect_terms. They load on first use, so importing
the package is cheap.
"""

from ._version import __version__

_API = ("encode_dense", "train_head", "load_head", "sparsify", "build_index", "search", "evaluate",
        "inspect_terms", "evaluate_table", "inspect_provenance", "query")

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        from . import api
        # from the stage's module itself: once a stage module such as mmsparse.api.search is
        # imported, the package attribute of that name is the module, not the function
        return getattr(importlib.import_module(f".api.{api._WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'mmsparse' has no attribute {name!r}")
