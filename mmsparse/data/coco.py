"""COCO captions JSON reader (captions_{split}.json: images[] + annotations[]).

images[]: {"id", "file_name"}; annotations[]: {"id", "image_id", "caption"}. One split, named
from the file name (captions_val2014.json -> "val2014"; otherwise "all"). Image ids are
file_name stems, caption ids str(annotation id), image paths IMAGE_ROOT/file_name.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .records import CaptionRecord, ImageRecord, SplitData, load_json


def coco_split_name(path: str | Path) -> str:
    stem = Path(path).stem
    return stem[len("captions_"):] if stem.startswith("captions_") and len(stem) > 9 else "all"


def read_coco(path: str | Path, image_root: str | Path, data: dict | None = None) -> dict[str, SplitData]:
    """{split: SplitData} from a COCO captions JSON. InputError names a missing field and its index."""
    p = Path(path)
    if data is None:
        data = load_json(p, "COCO captions JSON")
    for k in ("images", "annotations"):
        if not isinstance(data.get(k), list):
            raise InputError(f"{p}: {k}: missing top-level list; is this a COCO captions file?")
    root = Path(image_root)
    sd = SplitData()
    by_num: dict = {}
    for i, im in enumerate(data["images"]):
        for k in ("id", "file_name"):
            if k not in im:
                raise InputError(f"{p}: images[{i}]: {k}: field missing")
        iid = Path(im["file_name"]).stem
        if im["id"] in by_num or iid in by_num.values():
            raise InputError(f"{p}: images[{i}]: duplicate image id {im['id']!r} / {iid!r}")
        by_num[im["id"]] = iid
        sd.images.append(ImageRecord(iid, root / im["file_name"]))
    seen: set[str] = set()
    for j, a in enumerate(data["annotations"]):
        for k in ("id", "image_id", "caption"):
            if k not in a:
                raise InputError(f"{p}: annotations[{j}]: {k}: field missing")
        if a["image_id"] not in by_num:
            raise InputError(f"{p}: annotations[{j}]: image_id: {a['image_id']!r} is not in images[]")
        cid = str(a["id"])
        if cid in seen:
            raise InputError(f"{p}: annotations[{j}]: id: duplicate caption id {cid!r}")
        seen.add(cid)
        sd.captions.append(CaptionRecord(cid, str(a["caption"]).strip(), by_num[a["image_id"]]))
    return {coco_split_name(p): sd}
