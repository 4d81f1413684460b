"""Plain records shared by the dataset readers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import InputError, require_file


@dataclass(frozen=True)
class ImageRecord:
    """One image: `id` (unique within the dataset, e.g. the filename stem) and its file `path`
    (for rows of a Hugging Face dataset a label "SOURCE:SPLIT[ROW]" used in messages, with the
    table row in `row`; `row` is left out of repr, which fingerprints encoded files)."""

    id: str
    path: Path
    row: int | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CaptionRecord:
    """One caption: `id` (unique string), `text` (raw caption), `image_id` (the image it describes,
    "" when unknown, e.g. a bare text file)."""

    id: str
    text: str
    image_id: str = ""


@dataclass
class SplitData:
    """Images and captions of one split, in file order. `loader`: picklable ImageRecord -> PIL
    image for images that are not files (rows of a Hugging Face dataset); None = open `path`."""

    images: list[ImageRecord] = field(default_factory=list)
    captions: list[CaptionRecord] = field(default_factory=list)
    loader: Callable | None = None

    def limit(self, n: int | None) -> "SplitData":
        """The first `n` images and only the captions of those images (all of them if n is None)."""
        if n is None:
            return self
        imgs = self.images[:n]
        keep = {r.id for r in imgs}
        return SplitData(imgs, [c for c in self.captions if c.image_id in keep], self.loader)

    def without_empty_captions(self) -> tuple["SplitData", list[str]]:
        """(this split without captions whose text is empty or blank, the ids dropped)."""
        empty = [c.id for c in self.captions if not str(c.text).strip()]
        if not empty:
            return self, []
        drop = set(empty)
        return SplitData(self.images, [c for c in self.captions if c.id not in drop], self.loader), empty

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

