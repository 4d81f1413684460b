"""Where shared data and models live, overridable by environment variables.

MMSPARSE_SHARED   root holding datasets/ and models/ (default: ../shared beside the
                  repository checkout, i.e. <repo>/../shared)
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
