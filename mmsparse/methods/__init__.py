"""Methods: each a package behind one interface (mmsparse.methods.base.Method).

The built-ins are listed here explicitly; other packages add methods through the entry-point
group "mmsparse.methods" (name = "pkg.module:MethodClass"). A new method is a new package:
config.py (options), head.py (the head), method.py (data, loss, validation, sparsify).

    get_method("d2s")          the Method class (imports torch)
    get_config_class("d2s")    its config dataclass only (no torch: fast --help)
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from ..errors import InputError

# name -> (config class, Method class), "module:attribute"
BUILTIN = {
    "d2s": ("mmsparse.methods.d2s.config:D2SConfig", "mmsparse.methods.d2s.method:D2S"),
    "joint": ("mmsparse.methods.joint.config:JointConfig", "mmsparse.methods.joint.method:Joint"),
    "vdr": ("mmsparse.methods.vdr.config:VDRConfig", "mmsparse.methods.vdr.method:VDR"),
    "bm25v": ("mmsparse.methods.bm25v.config:BM25VConfig", "mmsparse.methods.bm25v.method:BM25V"),
    "inference-free": ("mmsparse.methods.inference_free.config:InferenceFreeConfig",
                       "mmsparse.methods.inference_free.method:InferenceFree"),
    "dense": ("mmsparse.methods.dense.config:DenseConfig", "mmsparse.methods.dense.method:Dense"),
}
# names in head directories written by earlier versions
ALIASES = {"sae": "bm25v", "doc-only": "inference-free"}
GROUP = "mmsparse.methods"


def _load(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _plugins() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


def method_names() -> list[str]:
    """Built-in method names, then those of installed plugins."""
    return [*BUILTIN, *sorted(_plugins())]


def canonical(name: str, what: str = "method") -> str:
    """The registered name of `name` (aliases resolved); InputError naming the known ones."""
    name = ALIASES.get(name, name)
    if name not in BUILTIN and name not in _plugins():
        raise InputError(f"{what} {name!r} unknown; choose one of {', '.join(method_names())}")
    return name


def get_method(name: str, what: str = "method"):
    """The Method class registered as `name`."""
    name = canonical(name, what)
    return _load(BUILTIN[name][1]) if name in BUILTIN else _plugins()[name].load()


def get_config_class(name: str, what: str = "method"):
    """The config dataclass of method `name`, without importing its model code."""
    name = canonical(name, what)
    return _load(BUILTIN[name][0]) if name in BUILTIN else get_method(name).config_class
