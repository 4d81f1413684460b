"""Issue 16: `encode-dense --ray` and `sparsify --ray` (Ray Data, mmsparse/distributed.py) write
sharded outputs (part files + manifest.json, mmsparse/formats/sharded.py) with the rows of the
single-process run; a killed sharded encode resumes redoing only missing or corrupt parts; the
other stages read the directory like the file.

Ray runs locally in this process (one session for the module) or in a subprocess; a starved Ray
Data pipeline waits forever without an error, so every Ray call is bounded (`bounded`, or the
subprocess's timeout=).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats import read_dense, read_sparse, write_dense
from mmsparse.formats.sharded import (
    MANIFEST,
    part_name,
    read_manifest,
    sha256_file,
    write_manifest,
)

# Ray starts, sharded encodes of real images: ~3 minutes on 2 cores (CI runs -m slow)
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="the 'scale' extra (pip install -e '.[scale]') is not installed")

N_IMAGES = 200
PART_ROWS = 64  # 200 images -> 4 parts, 200 captions -> 4 parts


@contextlib.contextmanager
def bounded(seconds: int):
    """Raise TimeoutError in the block after `seconds` (a hung Ray pipeline fails the test)."""
    def alarm(*_):
        raise TimeoutError(f"Ray call did not finish in {seconds} s (starved pipeline?)")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray session for the module (4 logical CPUs, no dashboard)."""
    from mmsparse.distributed import init_ray

    with bounded(120):
        init_ray("local", workers=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def encoded(ray_local, flickr8k_dir, dual_encoder_dir, tmp_path_factory) -> dict:
    """The first 200 Flickr8k test images with their first caption each (a Karpathy JSON subset),
    encoded plainly and with Ray (parts of 64 records)."""
    root = tmp_path_factory.mktemp("distributed")
    full = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text())
    images = [dict(im, sentences=im["sentences"][:1], sentids=im["sentids"][:1])
              for im in full["images"] if im["split"] == "test"][:N_IMAGES]
    subset = root / "dataset_flickr8k.json"
    subset.write_text(json.dumps({"dataset": full["dataset"], "images": images}))
    data = (subset, flickr8k_dir / "images")
    kw = dict(model=dual_encoder_dir, split=["test"])
    mmsparse.encode_dense(*data, out=root / "plain", workers=0, **kw)
    with bounded(300):
        mmsparse.encode_dense(*data, out=root / "ray", ray="local", workers=1, part_rows=PART_ROWS, **kw)
    return {"root": root, "plain": root / "plain", "ray": root / "ray", "data": data, "kw": kw}


def _same_dense(a: Path, b: Path, exact: bool = False) -> None:
    x, y = read_dense(a), read_dense(b)
    assert x.ids == y.ids and x.texts == y.texts and x.image_ids == y.image_ids
    assert x.vectors.shape == y.vectors.shape
    if exact:
        assert np.array_equal(x.vectors, y.vectors)
    else:
        np.testing.assert_allclose(x.vectors, y.vectors, atol=1e-5, rtol=0)
    for k in ("modality", "backbone", "model", "dataset", "split", "normalized", "dim"):
        assert x.attrs[k] == y.attrs[k], k


def test_sharded_encode_equals_the_plain_run(encoded):
    plain, sharded = encoded["plain"], encoded["ray"]
    for name, parts, rows in (("test-images.h5", 4, N_IMAGES), ("test-captions.h5", 4, N_IMAGES)):
        d = sharded / name
        assert d.is_dir() and not (d / ".parts.jsonl").exists()
        m = read_manifest(d, "dense")
        assert [p["name"] for p in m["parts"]] == [part_name(k) for k in range(parts)]
        assert m["rows"] == rows == sum(p["rows"] for p in m["parts"])
        assert all(sha256_file(d / p["name"]) == p["sha256"] for p in m["parts"])
        assert read_dense(d / part_name(1)).ids == read_dense(plain / name).ids[PART_ROWS:2 * PART_ROWS]
        _same_dense(d, plain / name)
    assert (sharded / "test.qrels").read_text() == (plain / "test.qrels").read_text()


def test_sparsify_with_ray_equals_the_plain_run(ray_local, method_data, tmp_path, run_cli):
    head = mmsparse.train_head(method_data / "train-images.h5", method_data / "train-captions.h5",
                               out=tmp_path / "head", method="d2s", val_images=method_data / "val-images.h5",
                               val_captions=method_data / "val-captions.h5", epochs=1, batch_size=80,
                               l1_warmup=2, eta=1e-3, vocab_min_df=1)
    dense = method_data / "train-captions.h5"  # 80 captions -> 5 parts of 16
    code, _, err = run_cli("sparsify", head, dense, "-o", tmp_path / "plain.h5")
    assert code == 0, err
    with bounded(180):
        code, _, err = run_cli("sparsify", head, dense, "-o", tmp_path / "ray.h5", "--ray", "local",
                               "--workers", "2", "--part-rows", "16")
    assert code == 0, err
    assert len(read_manifest(tmp_path / "ray.h5", "sparse")["parts"]) == 5
    a, b = read_sparse(tmp_path / "plain.h5"), read_sparse(tmp_path / "ray.h5")
    assert a.ids == b.ids and a.vocab == b.vocab and a.texts == b.texts
    assert a.attrs["query_mode"] == b.attrs["query_mode"] and a.attrs["method"] == b.attrs["method"]
    assert a.matrix.shape == b.matrix.shape and a.matrix.nnz > 0
    np.testing.assert_allclose(a.matrix.toarray(), b.matrix.toarray(), atol=1e-6, rtol=0)
    # the sharded sparse output is an input like the file: PISA indexes it, eval reads it
    code, _, err = run_cli("index", tmp_path / "ray.h5", "-o", tmp_path / "pisa")
    assert code == 0, err
    assert json.loads((tmp_path / "pisa" / "mmsparse.json").read_text())["num_docs"] == 80


def _stamp(d: Path) -> dict:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in d.glob("part-*.h5")}


def test_killed_sharded_encode_resumes_only_missing_and_corrupt_parts(encoded, tmp_path):
    out = tmp_path / "out"
    json_path, images = encoded["data"]
    args = [sys.executable, "-m", "mmsparse.cli", "encode-dense", json_path, images, "-o", out,
            "--model", encoded["kw"]["model"], "--split", "test", "--ray", "local",
            "--workers", "1", "--part-rows", PART_ROWS]
    env = {**os.environ, "MMSPARSE_TEST_KILL_AFTER": "3"}  # the driver dies after journaling 3 parts
    log = tmp_path / "killed.log"  # a file, not a pipe: Ray's own processes must not hold the test's pipe
    with open(log, "w") as f:
        p = subprocess.run([str(a) for a in args], env=env, stdout=f, stderr=subprocess.STDOUT, timeout=240)
    assert p.returncode == -signal.SIGKILL, (p.returncode, log.read_text()[-2000:])
    dirs = [out / "test-images.h5", out / "test-captions.h5"]
    done = {}  # directory -> parts journaled before the kill
    for d in dirs:
        j = d / ".parts.jsonl"
        done[d] = [json.loads(x)["name"] for x in j.read_text().splitlines()[1:]] if j.is_file() else []
        assert not (d / MANIFEST).exists()
    assert sum(map(len, done.values())) >= 3 and all(len(n) < 4 for n in done.values())
    with pytest.raises(InputError, match="manifest.json"):  # an unfinished directory is no input
        read_dense(dirs[0])
    # a journaled part whose bytes changed fails its checksum: redone with the missing ones
    (bad_dir, bad_names), = [(d, n) for d, n in done.items() if n][:1]
    bad = bad_dir / bad_names[0]
    raw = bytearray(bad.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 16] = bytes(b ^ 0xFF for b in raw[mid:mid + 16])
    bad.write_bytes(bytes(raw))
    before = {d: _stamp(d) for d in dirs}
    with bounded(300):  # the rerun (same settings, this process's Ray session) finishes it
        mmsparse.encode_dense(*encoded["data"], out=out, ray="local", workers=1, part_rows=PART_ROWS,
                              **encoded["kw"])
    for d in dirs:
        after = _stamp(d)
        assert set(after) == {part_name(k) for k in range(4)}
        kept = [n for n in done[d] if d / n != bad]
        assert all(after[n] == before[d][n] for n in kept), "a good journaled part was redone"
        redone = {n for n in after if after[n] != before[d].get(n)}
        assert redone == {part_name(k) for k in range(4)} - set(kept)
        assert (d / ".parts.jsonl").exists() is False and (d / MANIFEST).is_file()
    for name in ("test-images.h5", "test-captions.h5"):
        _same_dense(out / name, encoded["ray"] / name, exact=True)


def test_stages_read_a_sharded_dense_directory(encoded, method_data, tmp_path, run_cli):
    # Faiss indexes the sharded test images; searching it gives the run of the plain file's index
    runs = {}
    for kind in ("plain", "ray"):
        code, _, err = run_cli("index", encoded[kind] / "test-images.h5", "-o", tmp_path / f"faiss-{kind}")
        assert code == 0, err
        code, _, err = run_cli("search", tmp_path / f"faiss-{kind}", encoded["ray"] / "test-captions.h5",
                               "-o", tmp_path / f"{kind}.trec", "--k", "5")
        assert code == 0, err
        runs[kind] = [line.split()[:3] for line in (tmp_path / f"{kind}.trec").read_text().splitlines()]
    assert len(runs["plain"]) == 5 * N_IMAGES and runs["ray"] == runs["plain"]
    # a hand-made sharded directory of the method data's captions: D2S sparsify reads it (texts too)
    src = read_dense(method_data / "train-captions.h5")
    shard = tmp_path / "captions-sharded.h5"
    shard.mkdir()
    attrs = {k: src.attrs[k] for k in ("modality", "backbone", "model", "dataset", "split", "normalized")}
    parts = []
    for k, (a, b) in enumerate(((0, 30), (30, 31), (31, 80))):
        write_dense(shard / part_name(k), src.ids[a:b], src.vectors[a:b], attrs, texts=src.texts[a:b],
                    image_ids=src.image_ids[a:b])
        parts.append({"name": part_name(k), "rows": b - a, "sha256": sha256_file(shard / part_name(k))})
    write_manifest(shard, "dense", parts)
    _same_dense(shard, method_data / "train-captions.h5", exact=True)
    head = mmsparse.train_head(method_data / "train-images.h5", shard,  # train-head reads it too
                               out=tmp_path / "head", method="d2s", epochs=1, batch_size=80, l1_warmup=2,
                               eta=1e-3, vocab_min_df=1)
    for q in ("expand", "caption-terms"):
        a = read_sparse(mmsparse.sparsify(head, method_data / "train-captions.h5", out=tmp_path / f"a-{q}.h5",
                                          query_mode=q))
        b = read_sparse(mmsparse.sparsify(head, shard, out=tmp_path / f"b-{q}.h5", query_mode=q))
        assert a.ids == b.ids and a.texts == b.texts
        np.testing.assert_array_equal(a.matrix.toarray(), b.matrix.toarray())
    # a part whose rows disagree with the manifest is refused with the part named
    parts[1]["rows"] = 2
    write_manifest(shard, "dense", parts)
    code, _, err = run_cli("sparsify", head, shard, "-o", tmp_path / "c.h5")
    assert code == 2 and part_name(1) in err and "manifest.json" in err
    assert not (tmp_path / "c.h5").exists()


def test_an_address_where_no_ray_answers_is_one_line_and_exit_2(flickr8k_dir, tmp_path, run_cli):
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                           "-o", tmp_path / "out", "--split", "test", "--limit", "2", "--ray", "ray://127.0.0.1:1")
    assert code == 2 and "127.0.0.1:1" in err and "--ray local" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
