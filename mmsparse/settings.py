"""Where shared data and models live, overridable by environment variables.

MMSPARSE_SHARED   root holding datasets/ and models/ (default: ../shared beside the
                  repository checkout, i.e. <repo>/../shared)
MMSPARSE_CACHE    mmsparse's own cache, e.g. model fingerprints (default: $XDG_CACHE_HOME/mmsparse,
                  else ~/.cache/mmsparse)
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_root() -> Path:
    return Path(os.environ.get("MMSPARSE_SHARED", REPO_ROOT.parent / "shared"))


def flickr8k_dir() -> Path:
    return Path(os.environ.get("MMSPARSE_FLICKR8K", shared_root() / "datasets" / "flickr8k"))


def dual_encoder_dir() -> Path:
    return Path(os.environ.get("MMSPARSE_MODEL", shared_root() / "models" / "flickr8k-dual-encoder"))


def cache_dir() -> Path:
    """mmsparse's user cache directory (may not exist yet): $MMSPARSE_CACHE, else
    $XDG_CACHE_HOME/mmsparse, else ~/.cache/mmsparse."""
    if os.environ.get("MMSPARSE_CACHE"):
        return Path(os.environ["MMSPARSE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmsparse"
