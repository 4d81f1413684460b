"""Head directories read without torch: config.json, vocab.txt, and hub ids resolved to a local
snapshot. What `mmsparse query` needs to tell which method a head is before deciding whether any
model must load (an inference-free head's queries need none); head.py re-exports these.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, require_dir

CARD = "README.md"
HEAD_FILES = ["config.json", "model.safetensors", "vocab.txt", "tokenizer/*", CARD]
_HUB_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"


def resolve_head_path(path: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                      token: str | bool | None = None) -> Path:
    """A local head directory: `path` itself when it exists; else, for a hub id "user/name", the
    snapshot huggingface_hub.snapshot_download(repo_id, revision=..., cache_dir=..., token=...,
    allow_patterns=HEAD_FILES) returns (from the hub cache when HF_HUB_OFFLINE=1). Raises
    InputError when `path` is neither an existing directory nor a fetchable hub id."""
    import re

    p = Path(path)
    if p.exists() or not re.match(_HUB_ID, str(path)) or str(path).startswith("."):
        return p
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(str(path), repo_type="model", revision=revision, cache_dir=cache_dir, token=token,
                                  allow_patterns=HEAD_FILES, library_name="mmsparse")
    except Exception as e:  # noqa: BLE001 — offline, not found, gated, network: one message
        raise InputError(f"{path}: not a local head directory, and the Hugging Face hub repository {path!r} could not "
                         f"be fetched ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check the "
                         "path or id, your network, or HF_HUB_OFFLINE") from None
    return Path(local)


def read_head_config(path: str | Path) -> tuple[dict, list[str]]:
    """(config dict, vocab list) of a head directory, without loading weights. InputError when
    a file is missing or config.json is not JSON."""
    p = require_dir(path, "head")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (p / name).is_file():
            raise InputError(f"{p}: not a head directory (no {name}); train one with `mmsparse train-head`")
    try:
        cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{p}/config.json: invalid JSON ({e})") from None
    vocab = (p / "vocab.txt").read_text(encoding="utf-8").split("\n")[: cfg.get("vocab_size", 0)]
    return cfg, vocab


def head_method(path: str | Path) -> str:
    """The registered method name of the head directory or hub id `path` (config.json's "method",
    old names resolved: mmsparse.methods.ALIASES), read without torch. InputError as read_head_config."""
    from . import canonical

    p = resolve_head_path(path)
    cfg, _ = read_head_config(p)
    return canonical(str(cfg.get("method", "")), f"{p}/config.json: method")


def read_training(path: str | Path) -> dict:
    """The `training` record train-head wrote into a head directory's config.json, plus the head's
    "method". InputError when there is none (not a directory train-head wrote)."""
    p = Path(path) / "config.json"
    try:
        cfg = json.loads(p.read_text())
        return {**cfg["training"], "method": cfg.get("method")}
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{p}: no train-head record ({type(e).__name__}: {e}); pass a head directory that "
                         "train-head wrote") from e


def validated_epochs(path: str | Path) -> tuple[dict, list[dict]]:
    """(read_training(path), the entries of its `history` that carry a `val` dict), for the validation
    curves. InputError when there is no train-head record or no validated epoch."""
    t = read_training(path)
    rows = [e for e in t.get("history", []) if isinstance(e.get("val"), dict)]
    if not rows:
        raise InputError(f"{path}: the head holds no validated epochs; train it with --val-images/--val-captions")
    return t, rows
