"""Interrupting `make` (Ctrl-C) while encode-dense works on its second split keeps the split it
finished: Make deletes a recipe's changed targets when interrupted unless they are .PRECIOUS, and
the stage fragments mark every split's files so (stages/encode-dense.mk). The rerun keeps it
(not encoded again) and encodes only the rest."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

MAKEFILE = """\
ROOT := {root}
WORK := {work}
BACKBONE := clip
MODEL := {model}
KARPATHY_JSON := {ann}
IMAGE_ROOT := {images}
SPLITS := train val test
MMSPARSE := {python} -m mmsparse.cli
include $(ROOT)/stages/pipeline.mk
"""


@pytest.fixture
def pipeline(flickr8k_dir, tiny_clip, tmp_path):
    """A Makefile over the stage fragments and a Karpathy JSON of 9 real Flickr8k images, 3 per split."""
    data = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text())
    ims = [im for im in data["images"] if im["split"] == "test"][:9]
    for im, split in zip(ims, ["train"] * 3 + ["val"] * 3 + ["test"] * 3):
        im["split"] = split
    (tmp_path / "images").mkdir()
    for im in ims:
        shutil.copy(flickr8k_dir / "images" / im["filename"], tmp_path / "images" / im["filename"])
    ann = tmp_path / "dataset_small.json"
    ann.write_text(json.dumps({"dataset": "small", "images": ims}))
    (tmp_path / "Makefile").write_text(MAKEFILE.format(root=REPO, work=tmp_path / "work", model=tiny_clip, ann=ann,
                                                       images=tmp_path / "images", python=sys.executable))
    return tmp_path


def _make(root: Path, env: dict) -> subprocess.Popen:
    """`make encode-dense` in its own process group, SIGINT handled as at a terminal (a shell's
    background jobs start with it ignored, and Make and Python keep it so)."""
    return subprocess.Popen(["make", "-C", str(root), "encode-dense", "ENCODE_FLAGS=--batch-size 2 --workers 0"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_interrupted_make_keeps_the_finished_split(pipeline):
    dense = pipeline / "work" / "dense" / "clip"
    go = pipeline / "go"
    # train: 2 image batches + 8 caption batches (kill points 1-10); paused at the 11th, val's first image batch
    p = _make(pipeline, {"MMSPARSE_TEST_PAUSE_UNTIL": str(go), "MMSPARSE_TEST_PAUSE_AFTER": "11"})
    deadline = time.monotonic() + 120
    while not (dense / "val-images.h5.partial").is_dir():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
        time.sleep(0.1)
    done = {f: ((dense / f).stat().st_ino, (dense / f).stat().st_mtime_ns, (dense / f).read_bytes())
            for f in ("train-images.h5", "train-captions.h5", "train.qrels")}
    os.killpg(p.pid, signal.SIGINT)   # Ctrl-C at the terminal: make and its recipe's processes
    log = p.communicate(timeout=60)[0]
    assert p.returncode != 0, log
    for f, (ino, mtime, data) in done.items():
        st = (dense / f).stat() if (dense / f).exists() else None
        assert st is not None, f"make deleted {f}:\n{log}"
        assert (st.st_ino, st.st_mtime_ns) == (ino, mtime) and (dense / f).read_bytes() == data, f
    assert not (dense / "val-images.h5").exists()
    rerun = _make(pipeline, {})
    log = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, log
    assert "train images: 3 rows -> {} (already encoded)".format(dense / "train-images.h5") in log, log
    assert "train captions: 15 rows -> {} (already encoded)".format(dense / "train-captions.h5") in log, log
    assert "val images: 3 rows" in log and "images/s" in log.split("val images: 3 rows", 1)[1].splitlines()[0]
    for f, (ino, _, data) in done.items():   # kept, not rewritten (their mtime is touched: checked, up to date)
        assert (dense / f).read_bytes() == data, f
        assert f.endswith(".qrels") or (dense / f).stat().st_ino == ino, f   # the qrels are written again
    assert all((dense / f"{s}-{k}.h5").is_file() for s in ("val", "test") for k in ("images", "captions"))
