"""The options of `mmsparse index`: one dataclass per engine, each in its own module (pisa,
seismic, bmp, kannolo, milvus; hnsw: the graph settings Faiss, Milvus' dense field and kANNolo
share; bm25: the weighting any sparse engine can index). The command's flags and --help are made
from their fields (commands/index.py), `build_index` takes the fields as keywords, and the index's
mmsparse.json records the engine's options under `options`. No third-party import.
"""

from __future__ import annotations

import dataclasses

from ...errors import InputError
from ...options import check_options
from .bm25 import Bm25Options
from .bmp import BmpOptions
from .hnsw import HnswOptions
from .kannolo import KannoloOptions
from .milvus import MilvusOptions
from .pisa import PisaOptions
from .seismic import SeismicOptions

ALL = (PisaOptions, SeismicOptions, BmpOptions, KannoloOptions, HnswOptions, MilvusOptions, Bm25Options)
ENGINE_OPTIONS = {"pisa": (PisaOptions,), "seismic": (SeismicOptions,), "bmp": (BmpOptions,),
                  "kannolo": (KannoloOptions, HnswOptions), "faiss": (HnswOptions,),
                  "milvus": (MilvusOptions, HnswOptions)}


def make_options(given: tuple = (), **values) -> dict[type, object]:
    """Every options class -> its instance: the one in `given` (or the defaults) with `values`
    replacing fields by name. InputError naming an unknown keyword or a value outside its field's
    bounds or choices."""
    names = {f.name: cls for cls in ALL for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise InputError(f"index: unknown option {unknown[0]!r}; known: {', '.join(sorted(names))}")
    out = {cls: next((g for g in given if isinstance(g, cls)), None) or cls() for cls in ALL}
    for cls in ALL:
        mine = {k: v for k, v in values.items() if names[k] is cls}
        out[cls] = dataclasses.replace(out[cls], **mine)
        check_options(out[cls])
    return out


def recorded(engine: str, opts: dict[type, object]) -> dict:
    """What mmsparse.json keeps of the options an `engine` build used: {class name: fields}, secret
    fields (tokens) left out; the BM25 weighting only when on."""
    classes = ENGINE_OPTIONS[engine] + ((Bm25Options,) if opts[Bm25Options].weighting != "none" else ())
    return {cls.__name__: {f.name: getattr(opts[cls], f.name) for f in dataclasses.fields(cls)
                           if not f.metadata.get("secret")} for cls in classes}
