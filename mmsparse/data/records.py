"""Plain records shared by the dataset readers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, require_file


@dataclass(frozen=True)
class ImageRecord:
    """One image: `id` (unique within the dataset, e.g. the filename stem) and its file `path`."""

    id: str
    path: Path


@dataclass(frozen=True)
class CaptionRecord:
    """One caption: `id` (unique string), `text` (raw caption), `image_id` (the image it describes,
    "" when unknown, e.g. a bare text file)."""

    id: str
    text: str
    image_id: str = ""


@dataclass
class SplitData:
    """Images and captions of one split, in file order."""

    images: list[ImageRecord] = field(default_factory=list)
    captions: list[CaptionRecord] = field(default_factory=list)

    def limit(self, n: int | None) -> "SplitData":
        """The first `n` images and only the captions of those images (all of them if n is None)."""
        if n is None:
            return self
        imgs = self.images[:n]
        keep = {r.id for r in imgs}
        return SplitData(imgs, [c for c in self.captions if c.image_id in keep])

    def qrels(self) -> dict[str, dict[str, int]]:
        """Caption id -> {image id: 1} for captions that name an image."""
        return {c.id: {c.image_id: 1} for c in self.captions if c.image_id}


def load_json(path: str | Path, what: str):
    """Parse a JSON file; InputError if it is missing or not JSON."""
    p = require_file(path, what)
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: not valid JSON ({e}); pass a {what}") from None

