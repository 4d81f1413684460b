"""Atomic outputs: write into a temporary sibling, rename over the target only on success.

A killed or failed stage therefore leaves either the previous complete output or none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(target: str | Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on normal exit rename it onto `target`.

    With `directory=True` the yielded path is an (empty, existing) directory and an existing
    target directory is replaced. On an exception the temporary path is removed and the
    target is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=target.suffix, dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if directory:
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            _remove(old)
        else:
            os.replace(tmp, target)
    else:
        os.replace(tmp, target)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_text_atomic(target: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `target` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
