"""The `st` extra's check, in a module that imports nothing of sentence-transformers: `export` and
`import` call it before importing methods/st.py, whose imports (sparse_gates.py subclasses
sentence-transformers' Module) would otherwise fail first with a bare ModuleNotFoundError."""

from __future__ import annotations

from ..errors import InputError


def require_st():
    """The sentence_transformers module (>= 5.4: SparseEncoder, modules under base/). InputError (exit 2),
    one line naming the extra to install, when it is missing or older."""
    try:
        import sentence_transformers
        from sentence_transformers.base.modules import Router  # noqa: F401  (absent before 5.4)
    except ImportError:
        raise InputError("--format sentence-transformers needs sentence-transformers >= 5.4 (the st extra): "
                         "pip install 'mmsparse[st]'") from None
    return sentence_transformers
