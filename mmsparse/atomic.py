"""Atomic outputs: write into a temporary sibling, rename over the target only on success.

A killed or failed stage therefore leaves either the previous complete output or none. A
SIGKILL cannot clean up, so the temporary sibling (`.NAME.tmp-PID-XXXX`) stays behind; the
next write of the same target removes siblings whose process is gone.

An output has one writer at a time. `output_lock(target)` takes an exclusive `fcntl.flock` on
`.NAME.lock` beside the target (it holds the writer's pid) for as long as the output is being
made: `atomic_path` holds it while it writes, and the writers that build an output over many steps
hold it throughout (`locks_output`: encode-dense with its `OUT.partial/` shards, train-head with its
`OUT.ckpt/` checkpoints, the Ray sharded writers). A second process writing the same output stops
at once with an InputError (exit 2) "OUT is being written by process PID; wait for it or use
another -o", or, with MMSPARSE_LOCK_WAIT=SECONDS, waits up to that long for it (saying so on
stderr) and then goes on (an encode finds the output made and keeps it). The kernel drops the
lock when its process dies, even by SIGKILL, so a killed writer never blocks the next one.

`kill_point()` is the test hook the long loops call once per batch: with the environment
variable MMSPARSE_TEST_KILL_AFTER=N the process SIGKILLs itself at the N-th call (SIGINT, as
Ctrl-C, with MMSPARSE_TEST_KILL_SIGNAL=INT), so tests can interrupt a stage at a deterministic
point (tests/test_kill.py, mmsparse.bench.faults); with
MMSPARSE_TEST_PAUSE_UNTIL=FILE it waits at each call until FILE exists (two writers at once,
tests/test_lock.py), from the N-th call on with MMSPARSE_TEST_PAUSE_AFTER=N (Make interrupted
mid-way, tests/test_make_interrupt.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from .errors import InputError

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
    with output_lock(target):
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


# -- one writer per output --------------------------------------------------------------------

_held: dict[str, list] = {}  # lock file -> [fd, depth]: the locks this process holds
_held_guard = threading.Lock()


@contextlib.contextmanager
def output_lock(target: str | Path) -> Iterator[None]:
    """Hold the exclusive write lock of output `target` (a file or directory, existing or not)
    for the block; see the module docstring. Re-entrant within a process, so a stage holding it
    writes the output through `atomic_path`. Creates the target's parent directory.

    Raises InputError "<target> is being written by process <pid>; wait for it or use another -o"
    when another process holds it (after waiting up to MMSPARSE_LOCK_WAIT seconds, default 0)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = str(target.parent.resolve() / f".{target.name}.lock")
    with _held_guard:
        mine = _held.get(lock)
        if mine is not None:
            mine[1] += 1
    if mine is None:
        fd = _acquire(lock, target)
        with _held_guard:
            _held[lock] = mine = [fd, 1]
    try:
        yield
    finally:
        with _held_guard:
            mine[1] -= 1
            last = mine[1] == 0
            if last:
                del _held[lock]
        if last:
            # unlink before unlocking: a process waiting on this file sees it gone and takes a new one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
            os.close(mine[0])


def _acquire(lock: str, target: Path) -> int:
    """flock `lock` (created if need be); returns its descriptor, holding our pid."""
    try:
        wait = float(os.environ.get("MMSPARSE_LOCK_WAIT") or 0)
    except ValueError:
        raise InputError(f"MMSPARSE_LOCK_WAIT={os.environ['MMSPARSE_LOCK_WAIT']!r}: give seconds (e.g. 600)") from None
    deadline, said = time.monotonic() + wait, False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = _holder(lock)
            if time.monotonic() >= deadline:
                raise InputError(f"{target} is being written by process {pid}; wait for it or use another -o") from None
            if not said:
                print(f"mmsparse: waiting for process {pid}, which is writing {target} (MMSPARSE_LOCK_WAIT={wait:g} s)",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(0.2)
            continue
        try:  # its last holder may have removed the file between our open and our lock: take the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd


def _holder(lock: str) -> str:
    """The pid written in a held lock file ("?" if its holder has not written it yet)."""
    for _ in range(20):
        try:
            pid = Path(lock).read_text().strip()
        except OSError:
            pid = ""
        if pid:
            return pid
        time.sleep(0.01)
    return "?"


def locks_output(param: str = "out") -> Callable:
    """Decorator for writers that build an output over many steps (resumable partial
    directories, checkpoints): the call holds `output_lock` of its `param` argument throughout."""
    def deco(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with output_lock(sig.bind_partial(*args, **kwargs).arguments[param]):
                return fn(*args, **kwargs)
        return run
    return deco


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


_kill = {"after": None, "calls": 0, "pause": None, "pause_after": 0, "count": None}


def kill_point() -> None:
    """Test hook, called once per batch by the long loops (encode-dense, train-head, sparsify,
    index): with MMSPARSE_TEST_KILL_AFTER=N in the environment, SIGKILL this process at the
    N-th call (SIGINT with MMSPARSE_TEST_KILL_SIGNAL=INT); with MMSPARSE_TEST_PAUSE_UNTIL=FILE,
    wait until FILE exists (from the MMSPARSE_TEST_PAUSE_AFTER-th call on, default the first);
    with MMSPARSE_TEST_COUNT_POINTS=FILE, write the number of calls so far to FILE. A no-op
    otherwise (two dict lookups)."""
    if _kill["after"] is None:
        num = (lambda v: int(v) if v.strip().isdigit() else 0)  # noqa: E731
        _kill["after"] = num(os.environ.get("MMSPARSE_TEST_KILL_AFTER", ""))
        _kill["pause"] = os.environ.get("MMSPARSE_TEST_PAUSE_UNTIL") or None
        _kill["pause_after"] = num(os.environ.get("MMSPARSE_TEST_PAUSE_AFTER", ""))
        _kill["count"] = os.environ.get("MMSPARSE_TEST_COUNT_POINTS") or None
    if not (_kill["after"] or _kill["pause"] or _kill["count"]):
        return
    _kill["calls"] += 1
    if _kill["count"]:
        Path(_kill["count"]).write_text(str(_kill["calls"]))
    while _kill["pause"] and _kill["calls"] >= _kill["pause_after"] and not os.path.exists(_kill["pause"]):
        time.sleep(0.05)
    if _kill["after"] and _kill["calls"] >= _kill["after"]:
        if os.environ.get("MMSPARSE_TEST_KILL_SIGNAL") == "INT":
            _kill["after"] = 0            # once: Python turns it into a KeyboardInterrupt that unwinds the stage
            os.kill(os.getpid(), signal.SIGINT)
            return
        os.kill(os.getpid(), signal.SIGKILL)
