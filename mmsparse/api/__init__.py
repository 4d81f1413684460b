"""The library API: one function per stage, the same inputs, options and outputs as the commands.

    import mmsparse
    head = mmsparse.train_head("train-images.h5", "train-captions.h5", out="heads/d2s",
                               val_images="val-images.h5", val_captions="val-captions.h5")
    mmsparse.sparsify(head, "test-images.h5", out="sparse/test-images.h5")

Inputs are positional, the output is `out=`, and every command-line option is the keyword of
the same name (dashes -> underscores). Long calls take `progress=` (mmsparse.progress.Reporter).
No function here prints, parses a command line or exits; errors are `mmsparse.errors.InputError`.
Each stage lives in its own module; this package imports them only when a name is first used,
so `import mmsparse` stays light.

The stage modules are named for the stage's activity, as nouns: encoding, training,
sparsification, indexing, retrieval (search), evaluation, inspection, querying, exporting. The functions
keep the verbs. A module is never named after a function it defines: importing a submodule sets
it as an attribute of its package, so a module `api/search.py` would turn `mmsparse.api.search`
from the function into the module as soon as anything imported it. One name, one thing.
"""

from __future__ import annotations

import importlib

# public name -> module of mmsparse.api that defines it
_WHERE = {
    "encode_dense": "encoding",
    "train_head": "training",
    "load_head": "training",
    "sparsify": "sparsification",
    "build_index": "indexing",
    "search": "retrieval",
    "evaluate": "evaluation",
    "evaluate_table": "evaluation",
    "inspect_terms": "inspection",
    "inspect_provenance": "inspection",
    "query": "querying",
    "export": "exporting",
    "import_terms": "exporting",
    "import_head": "exporting",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'mmsparse.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
