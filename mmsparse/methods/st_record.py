"""The head's record as an export folder holds it: no path of the machine that wrote it.

An export is published (the Hugging Face hub, a colleague's disk), so its SparseGates config
(`mmsparse.config`) and its card name what the head was trained on by what it *is*, not where it
lay: the dual encoder by hub id when it has one (a local copy in the hub cache,
`.../models--ORG--NAME/snapshots/...`, is that hub id) and always by `model_fingerprint`
(provenance.model_fingerprint: what `mmsparse sparsify` compares with the dense files' own, so an
imported head still refuses vectors of another model); other files (training and validation
vectors, the vocabulary source) by their file name and, where known, `<key>_sha256` of their
content (the head's own provenance record, else the file when it still exists).
"""

from __future__ import annotations

import re
from pathlib import Path

MACHINE_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")       # POSIX, home, Windows drive or UNC
HUB_CACHE = re.compile(r"models--([^/\\]+)--([^/\\]+)[/\\]snapshots[/\\]")


def is_machine_path(v) -> bool:
    """Whether `v` is a string naming an absolute (or home-relative) path."""
    return isinstance(v, str) and bool(MACHINE_PATH.match(v))


def hub_id(path: str) -> str | None:
    """The hub id "org/name" of a path inside the Hugging Face cache, else None."""
    m = HUB_CACHE.search(path)
    return f"{m.group(1)}/{m.group(2)}" if m else None


def _fingerprint(model: str) -> str | None:
    from ..errors import InputError
    from ..provenance import model_fingerprint

    try:
        return model_fingerprint(model)
    except (InputError, OSError):
        return None


def _file_sha256(path: str, known: dict[str, str]) -> str | None:
    from ..provenance import file_sha256

    if path in known:
        return known[path]
    p = Path(path).expanduser()
    try:
        return file_sha256(p) if p.is_file() else None
    except OSError:
        return None


def portable(obj, known: dict[str, str] | None = None):
    """A copy of config `obj` (dicts, lists, scalars) without machine paths (module docstring).
    known: {absolute path: sha256} already recorded (the head's provenance inputs). A dict's "model"
    that is a path becomes "model" = its hub id (or none), "model_name" = its last component and
    "model_fingerprint"; any other path value becomes its last component, with "<key>_sha256" beside
    it when the file's content hash is known; paths inside lists become their last component (a path
in the hub cache: its hub id, whatever the key)."""
    known = known or {}
    if isinstance(obj, list):
        return [portable(v, known) for v in obj]
    if is_machine_path(obj):
        return hub_id(obj) or Path(obj).name
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        if k == "model" and is_machine_path(v):
            hub = hub_id(v)
            if hub:
                out["model"] = hub
            out["model_name"] = hub or Path(v).name
            fp = obj.get("model_fingerprint") or _fingerprint(v)
            if fp:
                out["model_fingerprint"] = fp
        elif is_machine_path(v):
            out[k] = hub_id(v) or Path(v).name
            sha = _file_sha256(v, known)
            if sha and f"{k}_sha256" not in obj:
                out[f"{k}_sha256"] = sha
        elif k not in out:   # (a fingerprint computed above is not overwritten by a missing one)
            out[k] = portable(v, known)
    return out


def known_hashes(head_dir: Path | None) -> dict[str, str]:
    """{absolute path: sha256} of the inputs the head's config.json provenance recorded."""
    import json

    if head_dir is None or not (Path(head_dir) / "config.json").is_file():
        return {}
    try:
        prov = json.loads((Path(head_dir) / "config.json").read_text(encoding="utf-8")).get("provenance") or {}
    except ValueError:
        return {}
    return {r["path"]: r["sha256"] for r in prov.get("inputs") or [] if r.get("path") and r.get("sha256")}
