"""Atomic outputs: write into a temporary sibling, rename over the target only on success.

A killed or failed stage therefore leaves either the previous complete output or none. A
SIGKILL cannot clean up, so the temporary sibling (`.NAME.tmp-PID-XXXX`) stays behind; the
next write of the same target removes siblings whose process is gone.

`kill_point()` is the test hook the long loops call once per batch: with the environment
variable MMSPARSE_TEST_KILL_AFTER=N the process SIGKILLs itself at the N-th call, so tests
can interrupt a stage at a deterministic point (tests/test_kill.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Iterator

_TMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)(?:-.*)?$")


@contextlib.contextmanager
def atomic_path(target: str | Path, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on normal exit rename it onto `target`.

    With `directory=True` the yielded path is an (empty, existing) directory and an existing
    target directory is replaced. On an exception the temporary path is removed and the
    target is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    prefix = f".{target.name}.tmp-{os.getpid()}-"
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
        if tmp.is_file():  # mkstemp makes it 0600; outputs get the usual umask permissions
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)


def remove_stale_temps(target: str | Path) -> list[Path]:
    """Remove `.NAME.tmp-PID-*` / `.NAME.old-PID` siblings of `target` left by a killed process
    (PID no longer running). Returns what was removed."""
    target = Path(target)
    removed = []
    if not target.parent.is_dir():
        return removed
    for p in target.parent.iterdir():
        m = _TMP.match(p.name)
        if m and m["name"] == target.name and not _alive(int(m["pid"])):
            _remove(p)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


_kill = {"after": None, "calls": 0}


def kill_point() -> None:
    """Test hook, called once per batch by the long loops (encode-dense, train-head, sparsify,
    index): with MMSPARSE_TEST_KILL_AFTER=N in the environment, SIGKILL this process at the
    N-th call. A no-op otherwise (one dict lookup)."""
    if _kill["after"] is None:
        v = os.environ.get("MMSPARSE_TEST_KILL_AFTER", "")
        _kill["after"] = int(v) if v.strip().isdigit() else 0
    if not _kill["after"]:
        return
    _kill["calls"] += 1
    if _kill["calls"] >= _kill["after"]:
        os.kill(os.getpid(), signal.SIGKILL)
