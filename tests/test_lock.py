"""One writer per output (atomic.output_lock): two real processes writing one output, the
second stops with one line (exit 2) or, with MMSPARSE_LOCK_WAIT, waits; the first finishes
intact; a killed writer's lock is free at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmsparse.atomic import atomic_path, output_lock
from mmsparse.errors import InputError
from mmsparse.formats import read_dense

ROOT = Path(__file__).resolve().parent.parent

# a process that takes the lock of argv[1], says so on stdout, and holds it until argv[2] exists
HOLDER = """
import os, sys, time
from mmsparse.atomic import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    if len(sys.argv) > 3:
        os.kill(os.getpid(), 9)
"""


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


def _holder(target: Path, release: Path, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(target), str(release), *extra], env=_env(),
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_second_process_refused_until_the_first_lets_go(tmp_path):
    out = tmp_path / "x.h5"
    p = _holder(out, tmp_path / "go")
    with pytest.raises(InputError) as e:
        with atomic_path(out) as tmp:
            tmp.write_text("second")
    assert str(e.value) == f"{out} is being written by process {p.pid}; wait for it or use another -o"
    assert not out.exists() and (out.parent / ".x.h5.lock").is_file()  # the holder's lock is left alone
    (tmp_path / "go").touch()
    assert p.wait(10) == 0
    assert not (out.parent / ".x.h5.lock").exists()  # released and removed
    with atomic_path(out) as tmp:
        tmp.write_text("second")
    assert out.read_text() == "second" and sorted(os.listdir(tmp_path)) == ["go", "x.h5"]


def test_killed_writer_releases_the_lock(tmp_path):
    out = tmp_path / "x.h5"
    (tmp_path / "go").touch()
    p = _holder(out, tmp_path / "go", "kill")
    assert p.wait(10) == -signal.SIGKILL
    assert (out.parent / ".x.h5.lock").is_file()  # left behind by SIGKILL, but no longer locked
    with output_lock(out):
        pass
    assert not (out.parent / ".x.h5.lock").exists()


def test_lock_is_reentrant_within_a_process(tmp_path):
    out = tmp_path / "x.h5"
    with output_lock(out):
        with atomic_path(out) as tmp:  # the stage holding the lock writes its output
            tmp.write_text("a")
        assert (tmp_path / ".x.h5.lock").is_file()
    assert out.read_text() == "a" and not (tmp_path / ".x.h5.lock").exists()


def test_waits_with_mmsparse_lock_wait(tmp_path, monkeypatch, capfd):
    out = tmp_path / "x.h5"
    p = _holder(out, tmp_path / "go")
    monkeypatch.setenv("MMSPARSE_LOCK_WAIT", "30")
    touch_later = "import time, pathlib, sys; time.sleep(1); pathlib.Path(sys.argv[1]).touch()"
    subprocess.Popen([sys.executable, "-c", touch_later, str(tmp_path / "go")])
    t0 = time.monotonic()
    with output_lock(out):
        assert p.poll() == 0 or p.wait(10) == 0
    assert 0.5 < time.monotonic() - t0 < 30
    assert f"waiting for process {p.pid}, which is writing {out}" in capfd.readouterr().err


# -- two real encode-dense processes of one output ----------------------------------------------

@pytest.fixture
def images(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(d / f"im{i}.png")
    return d


def _encode(images: Path, model: Path, out: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmsparse.cli", "encode-dense", str(images), "--format", "folder",
                             "--backbone", "clip", "--model", str(model), "--workers", "0", "--batch-size", "2",
                             "--limit", "6", "-o", str(out)],
                            env=_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_lock(lock: Path, pid: int, proc: subprocess.Popen) -> None:
    for _ in range(1200):
        if lock.is_file() and lock.read_text().strip() == str(pid):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail(f"{lock} never held by {pid}")


@pytest.mark.slow  # two encode-dense processes: ~20 s
def test_two_encode_dense_processes_of_one_output(images, tiny_clip, tmp_path):
    out = tmp_path / "dense"
    target = out / "all-images.h5"
    go = tmp_path / "go"
    first = _encode(images, tiny_clip, out, MMSPARSE_TEST_PAUSE_UNTIL=str(go))  # holds the lock mid-encode
    _wait_for_lock(out / ".all-images.h5.lock", first.pid, first)
    # the lock is taken before the first shard is started: wait for it (a loaded machine is slow)
    for _ in range(1200):
        if (out / "all-images.h5.partial").is_dir() or first.poll() is not None:
            break
        time.sleep(0.05)
    assert (out / "all-images.h5.partial").is_dir()
    second = _encode(images, tiny_clip, out)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 2, err
    assert err.strip().splitlines()[-1] == (f"mmsparse: error: {target} is being written by process {first.pid}; "
                                            "wait for it or use another -o")
    assert (out / "all-images.h5.partial").is_dir()  # the first writer's shards untouched
    go.touch()
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    d = read_dense(target)
    assert d.vectors.shape[0] == 6 and sorted(d.ids) == [f"im{i}" for i in range(6)]
    assert not (out / "all-images.h5.partial").exists() and not (out / ".all-images.h5.lock").exists()


@pytest.mark.slow  # two encode processes, one waiting: ~20 s
def test_second_encode_waits_and_keeps_the_first_ones_output(images, tiny_clip, tmp_path):
    out = tmp_path / "dense"
    go = tmp_path / "go"
    first = _encode(images, tiny_clip, out, MMSPARSE_TEST_PAUSE_UNTIL=str(go))
    _wait_for_lock(out / ".all-images.h5.lock", first.pid, first)
    second = _encode(images, tiny_clip, out, MMSPARSE_LOCK_WAIT="300")
    line = ""
    while "waiting for process" not in line:
        line = second.stderr.readline()
        assert line or second.poll() is None, second.communicate()
    go.touch()
    assert first.wait(300) == 0
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "already encoded" in err, err  # made by the first, kept by the second
    assert read_dense(out / "all-images.h5").vectors.shape[0] == 6


def test_train_head_refused_while_another_process_writes_the_head(run_cli, tmp_path):
    head = tmp_path / "head"
    p = _holder(head, tmp_path / "go")
    try:
        code, _, err = run_cli("train-head", tmp_path / "img.h5", tmp_path / "cap.h5", "-o", head)
    finally:
        (tmp_path / "go").touch()
        p.wait(10)
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"mmsparse: error: {head} is being written by process {p.pid}; wait for it or use another -o"), err
    assert not Path(str(head) + ".ckpt").exists()
