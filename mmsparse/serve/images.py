"""Which file `GET /image/{id}` may send: only image files inside the image root.

An image id maps to IMAGE_ROOT/<id><suffix> for the image suffixes of the folder reader
(mmsparse/data/plain.py: .jpg, .jpeg, .png, ...), the way encode-dense names images (the file
name without suffix, or the relative path without suffix for a folder). Refused (None, which
the app answers with 404): an empty id, a NUL or backslash, an absolute path, a `.`/`..`
component, an id the index does not hold, and a file whose real path (symlinks resolved) lies
outside the real path of the root.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..data.plain import IMAGE_SUFFIXES

MAX_ID_CHARS = 512
MEDIA_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
               ".bmp": "image/bmp", ".gif": "image/gif", ".tif": "image/tiff", ".tiff": "image/tiff"}


def safe_image_path(root: Path, image_id: str, known_ids=None) -> Path | None:
    """The real path of the image of `image_id` under `root`, or None when it is refused or
    missing (module docstring). known_ids: a set of ids the index holds (None: any id)."""
    if not image_id or len(image_id) > MAX_ID_CHARS or "\x00" in image_id or "\\" in image_id:
        return None
    pure = PurePosixPath(image_id)
    if pure.is_absolute() or image_id.startswith("~") or any(p in ("..", ".") for p in image_id.split("/")):
        return None
    if known_ids is not None and image_id not in known_ids:
        return None
    try:
        real_root = Path(root).resolve(strict=True)
    except OSError:
        return None
    names = [image_id + x for s in sorted(IMAGE_SUFFIXES) for x in (s, s.upper())]
    if pure.suffix.lower() in IMAGE_SUFFIXES:
        names.insert(0, image_id)
    for name in names:
        cand = real_root / name
        if not (cand.is_file() or cand.is_symlink()):
            continue
        try:
            real = cand.resolve(strict=True)
        except OSError:
            return None
        if not real.is_relative_to(real_root) or not real.is_file() or real.suffix.lower() not in IMAGE_SUFFIXES:
            return None           # a symlink out of the root (or to something that is not an image)
        return real
    return None
