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
from typing import Optional

import typer

from ..backbones.options import EncodeOptions
from ..cli_fields import param as _param

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
