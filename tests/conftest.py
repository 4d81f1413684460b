"""Shared fixtures: where the real Flickr8k data and model live (../shared by default)."""

from __future__ import annotations

import os
from pathlib import Path

import sys

import pytest

from mmsparse import cli, settings

# Tests never reach a hub: everything loads from local paths.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def flickr8k_dir() -> Path:
    d = settings.flickr8k_dir()
    if not (d / "dataset_flickr8k.json").is_file():
        pytest.skip(f"Flickr8k not found at {d} (set MMSPARSE_SHARED or MMSPARSE_FLICKR8K)")
    return d


@pytest.fixture(scope="session")
def dual_encoder_dir() -> Path:
    d = settings.dual_encoder_dir()
    if not (d / "config.json").is_file():
        pytest.skip(f"dual encoder not found at {d} (set MMSPARSE_SHARED or MMSPARSE_MODEL)")
    return d


@pytest.fixture
def run_cli(capfd):
    """run_cli(*args) -> (exit code, stdout, stderr) of `mmsparse ARGS`, in-process through
    cli.main, so exit codes and the one-line errors are those of the console script."""
    def run(*args) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["mmsparse", *map(str, args)]
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        finally:
            sys.argv = old
        out, err = capfd.readouterr()
        return code, out, err
    return run
