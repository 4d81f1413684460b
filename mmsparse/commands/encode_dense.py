"""`mmsparse encode-dense`: run a frozen dual encoder over a dataset's images and captions.

Writes per split: OUT/{split}-images.h5 and OUT/{split}-captions.h5 (dense HDF5, see
mmsparse/formats/dense.py; extra datasets in mmsparse/backbones/encode.py) and OUT/{split}.qrels
(caption id -> the image it describes, relevance 1). A thin layer over mmsparse.api.encoding: the
options are not written out here but made from the fields of EncodeOptions
(mmsparse/backbones/options.py), so a new option is one field there.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import List, Optional

import typer

from ..backbones.options import EncodeOptions

TYPES = (("list", List[str]), ("bool", bool), ("int", int), ("float", float), ("str", str))


def _param(f: dataclasses.Field) -> inspect.Parameter:
    meta = f.metadata
    kind = next(t for k, t in TYPES if k in str(f.type))
    flag = meta.get("flag") or "--" + f.name.replace("_", "-")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if kind is bool and default and "/" not in flag:   # a switch that is on by default can be turned off
        flag = f"{flag}/--no-{flag[2:]}"
    opt = typer.Option(default, flag, *meta.get("aliases", ()), help=meta["help"], rich_help_panel=meta.get("panel"),
                       min=meta.get("min"), max=meta.get("max"), show_default=default is not None)
    optional = "None" in str(f.type)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt,
                             annotation=Optional[kind] if optional else kind)


def _build():
    base = [
        inspect.Parameter("annotations", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default=typer.Argument(
            ..., help="Dataset annotations: a Karpathy split JSON (dataset_*.json), a COCO captions JSON, a captions "
            ".txt/.jsonl file, an image folder, or (--format hf) a Hugging Face dataset id or directory (see --format).")),
        inspect.Parameter("image_root", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Optional[Path],
                          default=typer.Argument(None, help="Directory the annotation file's image filenames are "
                                                 "relative to (not needed for an image folder, a captions file or "
                                                 "a dataset holding its images).")),
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path, default=typer.Option(
            ..., "-o", "--out", help="Output directory (created; files are replaced atomically).")),
    ]
    params = base + [_param(f) for f in dataclasses.fields(EncodeOptions)]

    def main(**kw) -> None:
        """Encode images and captions with a frozen dual encoder into dense HDF5 files + qrels."""
        from ..api.encoding import encode_dense
        from ..cli_ui import RichReporter

        encode_dense(kw.pop("annotations"), kw.pop("image_root"), out=kw.pop("out"), progress=RichReporter(), **kw)

    main.__signature__ = inspect.Signature(params)
    return main


main = _build()
