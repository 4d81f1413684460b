"""Dataset readers: each returns {split: SplitData(images, captions)}."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .coco import read_coco
from .hf import read_hf
from .karpathy import read_karpathy
from .plain import read_captions_file, read_image_folder
from .records import CaptionRecord, ImageRecord, SplitData, load_json

__all__ = ["CaptionRecord", "ImageRecord", "SplitData", "read_karpathy", "read_coco", "read_hf",
           "read_image_folder", "read_captions_file", "read_dataset", "FORMATS"]

FORMATS = ("auto", "karpathy", "coco", "folder", "captions", "hf")


def read_dataset(path: str | Path, image_root: str | Path | None = None, fmt: str = "auto",
                 **hf_options) -> tuple[dict[str, SplitData], str, str]:
    """Read any supported input -> ({split: SplitData}, dataset name, format read).

    fmt: auto | karpathy | coco | folder | captions | hf. auto: a directory is an image folder; a
    .txt/.jsonl file a captions file; a .json with images[].sentences Karpathy, with
    annotations[] COCO. Karpathy and COCO need `image_root`. hf: a Hugging Face dataset id or
    directory (never chosen by auto), read by `read_hf` with `hf_options` (image_column,
    caption_column, id_column, split_column).
    """
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    p = Path(path)
    name = p.stem if p.is_file() else p.name
    if fmt == "hf":
        return read_hf(path, image_root=image_root, **hf_options), name or str(path), fmt
    if fmt == "auto":
        if p.is_dir():
            fmt = "folder"
        elif p.suffix.lower() in (".txt", ".jsonl"):
            fmt = "captions"
        else:
            data = load_json(p, "annotation JSON (Karpathy or COCO)")
            if isinstance(data, dict) and "annotations" in data:
                fmt = "coco"
            elif isinstance(data, dict) and isinstance(data.get("images"), list):
                fmt = "karpathy"
            else:
                raise InputError(f"{p}: neither a Karpathy split file (images[].sentences) nor COCO captions "
                                 f"(annotations[]); pass --format")
            return _read_json(p, image_root, fmt, data), _name(data, name), fmt
    if fmt == "folder":
        return read_image_folder(p), name, fmt
    if fmt == "captions":
        return read_captions_file(p), name, fmt
    data = load_json(p, f"{fmt} JSON")
    return _read_json(p, image_root, fmt, data), _name(data, name), fmt


def _name(data, default: str) -> str:
    return str(data.get("dataset", default)) if isinstance(data, dict) else default


def _read_json(p: Path, image_root, fmt: str, data):
    if image_root is None:
        raise InputError(f"{p}: IMAGE_ROOT is required for a {fmt} annotation file (the directory of its images)")
    if not Path(image_root).is_dir():
        raise InputError(f"{image_root}: image root directory not found")
    return read_karpathy(p, image_root, data) if fmt == "karpathy" else read_coco(p, image_root, data)
