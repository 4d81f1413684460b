"""A model is known by its content (provenance.model_fingerprint): a model moved or copied to
another path is the same model for every check, a model changed in place is not, old files
without a fingerprint still load. Real encodes with the tiny CLIP model, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from mmsparse import checks, provenance
from mmsparse.errors import InputError
from mmsparse.formats import read_dense

WORDS = ["a", "dog", "cat", "runs", "on", "the", "grass", "red", "ball"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Fingerprints cached under tmp, and every once-per-process note said again in each test."""
    monkeypatch.setenv("MMSPARSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(checks, "_said", set(), raising=False)
    monkeypatch.setattr(provenance, "_fingerprints", {})


@pytest.fixture
def model(tiny_clip, tmp_path) -> Path:
    """A private copy of the tiny CLIP model (tests change it in place)."""
    return Path(shutil.copytree(tiny_clip, tmp_path / "models" / "clip"))


@pytest.fixture
def data(tmp_path) -> tuple[Path, Path]:
    """A Karpathy JSON over 8 train and 6 test random images, 2 captions each of the tiny words."""
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    root.mkdir()
    images = []
    for i in range(14):
        name = f"im{i:02d}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / name)
        sents = [{"raw": " ".join(rng.choice(WORDS, 4)), "sentid": 2 * i + j} for j in range(2)]
        images.append({"filename": name, "split": "train" if i < 8 else "test", "sentences": sents})
    ann = tmp_path / "dataset_tiny.json"
    ann.write_text(json.dumps({"dataset": "tiny", "images": images}))
    return ann, root


def _perturb(model: Path) -> None:
    """Change the model's weights in place (same path, same file size, new content)."""
    from safetensors.torch import load_file, save_file

    f = model / "model.safetensors"
    w = load_file(f)
    k = next(k for k in sorted(w) if k.endswith("visual_projection.weight"))
    w[k] = w[k] + 0.5
    save_file(w, f, metadata={"format": "pt"})


def _error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("mmsparse: error:")]


# -- the fingerprint itself --------------------------------------------------------------------

def test_fingerprint_is_the_content_not_the_place(model, tmp_path):
    fp = provenance.model_fingerprint(model)
    assert fp.startswith("sha256:") and len(fp) == 7 + 64
    link = tmp_path / "link"
    link.symlink_to(model)
    copy = Path(shutil.copytree(model, tmp_path / "elsewhere" / "clip"))
    assert provenance.model_fingerprint(link) == provenance.model_fingerprint(copy) == fp
    (copy / "README.md").write_text("a model card does not change what the model computes\n")
    assert provenance.model_fingerprint(copy) == fp
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("\n", "\n\n", 1))
    assert provenance.model_fingerprint(copy) != fp
    _perturb(model)
    assert provenance.model_fingerprint(model) not in (fp, provenance.model_fingerprint(copy))


def test_fingerprint_cached_on_disk_beside_a_read_only_model(model, monkeypatch):
    os.chmod(model, 0o555)  # the model directory may be read-only (as ../shared is)
    try:
        fp = provenance.model_fingerprint(model)
        entries = list((Path(os.environ["MMSPARSE_CACHE"]) / "fingerprints").glob("*.json"))
        assert len(entries) == 1 and json.loads(entries[0].read_text())["fingerprint"] == fp
        with monkeypatch.context() as m:  # a new process (empty memory) reads the cache, not the weights
            m.setattr(provenance, "_fingerprints", {})
            m.setattr(provenance, "file_sha256", lambda p: pytest.fail(f"hashed {p} again"))
            assert provenance.model_fingerprint(model) == fp
    finally:
        os.chmod(model, 0o755)
    _perturb(model)  # a changed file (size or mtime) is hashed again
    monkeypatch.setattr(provenance, "_fingerprints", {})
    assert provenance.model_fingerprint(model) != fp


def test_hub_id_is_known_by_its_cached_commit(model, tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert provenance.model_fingerprint("org/tiny", cache_dir=tmp_path / "hub") == f"hf:org/tiny@{commit}"
    with pytest.raises(InputError, match="not found"):
        provenance.model_fingerprint("org/absent", cache_dir=tmp_path / "hub")
    with pytest.raises(InputError, match="not found"):
        provenance.model_fingerprint(tmp_path / "no-such-model")


# -- every check compares fingerprints ---------------------------------------------------------

def _encode(run_cli, data, model, out, split):
    code, _, err = run_cli("encode-dense", *data, "--backbone", "clip", "--model", model, "--split", split,
                           "--workers", "0", "--batch-size", "4", "-o", out)
    assert code == 0, err
    return err


def test_moved_model_accepted_changed_model_refused(run_cli, data, model, tmp_path):
    dense = tmp_path / "dense"
    _encode(run_cli, data, model, dense, "train")
    for f in ("train-images.h5", "train-captions.h5"):
        a = read_dense(dense / f).attrs
        assert a["model"] == str(model.resolve()) and a["model_fingerprint"] == provenance.model_fingerprint(model)
    code, _, err = run_cli("train-head", dense / "train-images.h5", dense / "train-captions.h5", "-o",
                           tmp_path / "head", "--epochs", "1", "--batch-size", "8", "--vocab-min-df", "1")
    assert code == 0, err
    head_cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    assert head_cfg["training"]["model_fingerprint"] == provenance.model_fingerprint(model)

    # the same model at another path: the test split encoded from a copy, the queries from the original
    moved = Path(shutil.copytree(model, tmp_path / "mounted" / "clip"))
    _encode(run_cli, data, moved, dense, "test")
    code, _, err = run_cli("sparsify", tmp_path / "head", dense / "test-images.h5", "-o", tmp_path / "docs.h5")
    assert code == 0 and "moved" in err and "note" in err, err
    q = tmp_path / "q"
    _encode(run_cli, data, model, q, "test")
    code, _, err = run_cli("sparsify", tmp_path / "head", q / "test-captions.h5", "-o", tmp_path / "queries.h5")
    assert code == 0, err
    code, _, err = run_cli("index", tmp_path / "docs.h5", "-o", tmp_path / "index")
    assert code == 0, err
    code, _, err = run_cli("search", tmp_path / "index", tmp_path / "queries.h5", "-o", tmp_path / "run.trec",
                           "--k", "5")
    assert code == 0, err
    code, _, err = run_cli("eval", tmp_path / "run.trec", q / "test.qrels", "--queries", tmp_path / "queries.h5",
                           "--docs", tmp_path / "docs.h5", "-o", tmp_path / "eval.json")
    assert code == 0, err
    meta = json.loads((tmp_path / "run.trec.meta.json").read_text())
    assert meta["queries"]["model_fingerprint"] == provenance.model_fingerprint(model)
    # encode-dense keeps an output of the moved model: same content, nothing to encode again
    err = _encode(run_cli, data, model, dense, "test")
    assert "already encoded" in err, err

    # the weights changed in place, same path: re-encoding is not skipped, and every check refuses
    _perturb(model)
    err = _encode(run_cli, data, model, q, "test")
    assert "already encoded" not in err, err
    code, _, err = run_cli("sparsify", tmp_path / "head", q / "test-images.h5", "-o", tmp_path / "new.h5")
    assert code == 2, err
    (line,) = _error_lines(err)
    assert "test-images.h5" in line and "head" in line and "changed in place" in line and "re-encode" in line
    assert "retrain" in line and not (tmp_path / "new.h5").exists()
    code, _, err = run_cli("sparsify", tmp_path / "head", q / "test-captions.h5", "-o", tmp_path / "newq.h5",
                           "--force")
    assert code == 0 and "changed in place" in err and "--force" in err, err
    # documents of the copy (old content), queries of the changed model: another model, refused
    code, _, err = run_cli("search", tmp_path / "index", tmp_path / "newq.h5", "-o", tmp_path / "run2.trec")
    assert code == 2 and "another model_fingerprint" in _error_lines(err)[0], err


def test_file_without_fingerprint_still_loads(run_cli, data, model, tmp_path):
    dense = tmp_path / "dense"
    _encode(run_cli, data, model, dense, "train")
    code, _, err = run_cli("train-head", dense / "train-images.h5", dense / "train-captions.h5", "-o",
                           tmp_path / "head", "--epochs", "1", "--batch-size", "8", "--vocab-min-df", "1")
    assert code == 0, err
    old = tmp_path / "old-images.h5"
    shutil.copy(dense / "train-images.h5", old)
    with h5py.File(old, "r+") as f:  # as written before fingerprints
        del f.attrs["model_fingerprint"]
    for out in ("a.h5", "b.h5"):
        code, _, err = run_cli("sparsify", tmp_path / "head", old, "-o", tmp_path / out)
        assert code == 0, err
        warned = [ln for ln in err.splitlines() if "no model_fingerprint" in ln]
        assert len(warned) == (1 if out == "a.h5" else 0), err  # one warning line per process
    # the path is still compared: an old file from another model directory is refused
    with h5py.File(old, "r+") as f:
        f.attrs["model"] = str(tmp_path / "other-model")
    code, _, err = run_cli("sparsify", tmp_path / "head", old, "-o", tmp_path / "c.h5")
    assert code == 2 and "other-model" in _error_lines(err)[0], err


def test_encode_keeps_outputs_made_before_fingerprints(run_cli, data, model, tmp_path):
    """An output whose `fingerprint` names the model by path (older mmsparse) is kept while the
    model's recorded input hash still matches, and encoded again once the model changed."""
    dense = tmp_path / "dense"
    _encode(run_cli, data, model, dense, "test")
    f = dense / "test-images.h5"
    with h5py.File(f, "r+") as h:
        fp = json.loads(h.attrs["fingerprint"])
        fp["model"] = str(model.resolve())
        del fp["model_fingerprint"], h.attrs["model_fingerprint"]
        h.attrs["fingerprint"] = json.dumps(fp, sort_keys=True)
    err = _encode(run_cli, data, model, dense, "test")
    assert "test images: 6 rows" in err and "already encoded" in err.split("test images")[1].splitlines()[0], err
    _perturb(model)
    err = _encode(run_cli, data, model, dense, "test")
    assert "already encoded" not in err.split("test images")[1].splitlines()[0], err
    assert read_dense(f).attrs["model_fingerprint"] == provenance.model_fingerprint(model)


# -- caches keyed by the model ------------------------------------------------------------------

def _views_file(path, model_fp, vectors):
    """A small bench.views-like dense file: 2 images x 3 single views."""
    from mmsparse.formats.dense import DenseWriter

    a = {"modality": "image", "backbone": "clip", "model": "/models/clip", "model_fingerprint": model_fp,
         "dataset": "t-views", "split": "views", "normalized": True}
    ids = [f"im{i}#v{v}" for i in range(2) for v in range(3)]
    with DenseWriter(path, vectors.shape[1], a) as w:
        w.append(ids, vectors)
        w.append_extra("sources", np.array([(i, -1) for i in range(2) for _ in range(3)], np.int32))


def test_bench_collections_rebuilt_when_the_model_changed_in_place(tmp_path):
    """The search benchmark's collections are keyed by the model's fingerprint, not by file names
    and sizes: views re-encoded by a changed model (same size) are not answered from the cache."""
    from mmsparse.bench.collection import write_collections
    from mmsparse.formats import write_dense

    rng = np.random.default_rng(0)
    vec = rng.normal(size=(6, 8)).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    orig = {"modality": "image", "backbone": "clip", "model": "/models/clip", "dataset": "t", "split": "test",
            "normalized": True}
    for fp, sign in (("sha256:old", 1), ("sha256:new", -1)):
        _views_file(tmp_path / "views.h5", fp, sign * vec)
        write_dense(tmp_path / "orig.h5", ["o0"], vec[:1], {**orig, "model_fingerprint": fp})
        paths = write_collections([tmp_path / "views.h5"], tmp_path / "orig.h5", tmp_path / "c", mixture=0, check=0,
                                  log=lambda *x: None)
        got = read_dense(paths["123k"])
        np.testing.assert_allclose(got.vectors[1:], sign * vec)  # the new views, not the cached old ones
        assert got.attrs["model_fingerprint"] == fp
    # views of another model than the originals: refused, one line
    write_dense(tmp_path / "orig.h5", ["o0"], vec[:1], {**orig, "model_fingerprint": "sha256:other"})
    with pytest.raises(SystemExit, match="changed in place"):
        write_collections([tmp_path / "views.h5"], tmp_path / "orig.h5", tmp_path / "c", mixture=0, check=0,
                          log=lambda *x: None)


def test_views_cache_made_before_fingerprints(model, tmp_path):
    """A views cache whose settings name the model by directory name is kept only while no model
    file is newer than the cache; the model's fingerprint keys every new cache."""
    from mmsparse.bench.views import _unchanged_since

    out = tmp_path / "views"
    (out / "shards").mkdir(parents=True)
    shard = out / "shards" / "shard-00000.h5"
    shard.write_bytes(b"")
    settings = {"dataset": "t", "views": 6, "backbone": "clip", "model_fingerprint": "sha256:x"}
    old = {"dataset": "t", "views": 6, "backbone": "clip", "model": model.name}
    t = max(f.stat().st_mtime_ns for f in model.iterdir()) + 10**9
    os.utime(shard, ns=(t, t))
    assert _unchanged_since(old, settings, str(model), out)
    assert not _unchanged_since({**old, "views": 7}, settings, str(model), out)
    _perturb(model)  # written now: newer than the cache
    os.utime(model / "model.safetensors", ns=(t + 1, t + 1))
    assert not _unchanged_since(old, settings, str(model), out)
