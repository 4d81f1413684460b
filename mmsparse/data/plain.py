"""Plain inputs: an image folder (images only) and a captions file (captions only).

Image folder: every *.jpg/jpeg/png/webp/bmp/gif/tif(f) below the folder, sorted by relative
path; id = relative path without suffix ("a/b" for a/b.jpg); one split "all".
Captions file: .txt — one caption per non-empty line, id = line number (1-based);
.jsonl — one object per line with "text" (or "caption"), optional "id" (default: line number),
"image_id" (the image it describes) and "split" (default "all").
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, require_dir, require_file
from .records import CaptionRecord, ImageRecord, SplitData

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


def read_image_folder(path: str | Path) -> dict[str, SplitData]:
    """{"all": SplitData(images=...)} for the image files under `path` (recursive)."""
    root = require_dir(path, "image folder")
    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) found")
    recs, seen = [], set()
    for f in files:
        iid = f.relative_to(root).with_suffix("").as_posix()
        if iid in seen:
            raise InputError(f"{f}: image id {iid!r} is used by two files (same name, different suffix); rename one")
        seen.add(iid)
        recs.append(ImageRecord(iid, f))
    return {"all": SplitData(images=recs)}


def read_captions_file(path: str | Path) -> dict[str, SplitData]:
    """{split: SplitData(captions=...)} from a .txt or .jsonl captions file."""
    p = require_file(path, "captions file")
    out: dict[str, SplitData] = {}
    seen: set[str] = set()
    jsonl = p.suffix.lower() in (".jsonl", ".json")
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if jsonl:
                try:
                    o = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{p}:{n}: not a JSON object ({e})") from None
                text = o.get("text", o.get("caption")) if isinstance(o, dict) else None
                if text is None:
                    raise InputError(f"{p}:{n}: text: field missing (give 'text' or 'caption')")
                cid, iid, split = str(o.get("id", n)), str(o.get("image_id", "")), str(o.get("split", "all"))
            else:
                text, cid, iid, split = line, str(n), "", "all"
            if cid in seen:
                raise InputError(f"{p}:{n}: id: duplicate caption id {cid!r}")
            seen.add(cid)
            out.setdefault(split, SplitData()).captions.append(CaptionRecord(cid, str(text).strip(), iid))
    if not out:
        raise InputError(f"{p}: no captions found")
    return out
