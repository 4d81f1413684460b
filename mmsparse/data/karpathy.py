"""Karpathy split JSON reader (Flickr8k / Flickr30k / COCO `dataset_*.json`).

File shape: {"images": [{"filename", "split", "sentences": [{"raw", "tokens", "sentid"}], ...}]}.
Split "restval" is merged into "train" (the usual Karpathy convention). Image ids are filename
stems; caption ids are str(sentid); the image path is IMAGE_ROOT/filepath/filename (filepath is
present for COCO, absent for Flickr).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .records import CaptionRecord, ImageRecord, SplitData, load_json

SPLIT_ALIASES = {"restval": "train"}


def read_karpathy(path: str | Path, image_root: str | Path, data: dict | None = None) -> dict[str, SplitData]:
    """Read a Karpathy split JSON into {split: SplitData} (splits in first-seen order).
    `data`: the already-parsed JSON, if the caller has it.

    Raises InputError for a missing/unreadable file or a missing field (named with the image index),
    and for duplicate image ids or sentids.
    """
    p = Path(path)
    if data is None:
        data = load_json(p, "Karpathy split JSON")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise InputError(f"{p}: images: missing top-level 'images' list; is this a Karpathy split file?")
    root = Path(image_root)
    out: dict[str, SplitData] = {}
    seen_img: set[str] = set()
    seen_cap: set[str] = set()
    for i, im in enumerate(data["images"]):
        where = f"{p}: images[{i}]"
        for k in ("filename", "split", "sentences"):
            if k not in im:
                raise InputError(f"{where}: {k}: field missing")
        fname = str(im["filename"])
        iid = Path(fname).stem
        if iid in seen_img:
            raise InputError(f"{where}: filename: duplicate image id {iid!r}")
        seen_img.add(iid)
        split = SPLIT_ALIASES.get(im["split"], str(im["split"]))
        sd = out.setdefault(split, SplitData())
        sd.images.append(ImageRecord(iid, root / im.get("filepath", "") / fname))
        for j, s in enumerate(im["sentences"]):
            for k in ("raw", "sentid"):
                if k not in s:
                    raise InputError(f"{where}.sentences[{j}]: {k}: field missing")
            cid = str(s["sentid"])
            if cid in seen_cap:
                raise InputError(f"{where}.sentences[{j}]: sentid: duplicate caption id {cid!r}")
            seen_cap.add(cid)
            sd.captions.append(CaptionRecord(cid, str(s["raw"]).strip(), iid))
    return out
