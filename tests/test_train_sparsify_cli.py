"""train-head + sparsify end to end on small random dense files (real HDF5, real tokenizer)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mmsparse.cli import app
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import read_sparse
from mmsparse.formats.trec import write_qrels
from mmsparse.heads import load_head

WORDS = "dog cat man woman runs jumps on grass beach snow red blue ball water a the".split()


def _split(root, split, n_img, model, d=32, seed=0, image_ids=True):
    rng = np.random.default_rng(seed)
    zi = rng.normal(size=(n_img, d)).astype(np.float32)
    zi /= np.linalg.norm(zi, axis=1, keepdims=True)
    ids, img, texts, zc = [], [], [], []
    for i in range(n_img):
        for j in range(2):
            ids.append(f"{split}-c{i}-{j}")
            img.append(f"{split}-i{i}")
            texts.append(" ".join(rng.choice(WORDS, 5)))
            z = zi[i] + 0.3 * rng.normal(size=d) / np.sqrt(d)
            zc.append(z / np.linalg.norm(z))
    base = dict(backbone="hf-dual", model=str(model), dataset="unit", split=split, normalized=True)
    write_dense(root / f"{split}-images.h5", [f"{split}-i{i}" for i in range(n_img)], zi, dict(base, modality="image"))
    write_dense(root / f"{split}-captions.h5", ids, np.array(zc, np.float32), dict(base, modality="text"), texts=texts)
    write_qrels(root / f"{split}.qrels", {c: {i: 1} for c, i in zip(ids, img)})


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory, dual_encoder_dir):
    root = tmp_path_factory.mktemp("dense") / "dense" / "unitbb"
    root.mkdir(parents=True)
    _split(root, "train", 60, dual_encoder_dir, seed=0)
    _split(root, "val", 20, dual_encoder_dir, seed=1)
    _split(root, "test", 20, dual_encoder_dir, seed=2)
    return root


@pytest.fixture(scope="module")
def head_dir(dense_dir, tmp_path_factory, monkeypatch_module):
    out = tmp_path_factory.mktemp("heads") / "d2s"
    monkeypatch_module.setenv("MMSPARSE_WORK", str(dense_dir.parent.parent))
    r = CliRunner().invoke(app, ["train-head", "--backbone", "unitbb", "-o", str(out), "--epochs", "2",
                                 "--batch-size", "32", "--warmup-steps", "2", "--eta", "1e-3"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_train_head_writes_loadable_head(head_dir):
    head = load_head(head_dir)
    assert head.method == "d2s" and head.dim == 32
    t = head.config["training"]
    assert t["backbone"] == "hf-dual" and t["dataset"] == "unit" and t["best_epoch"] in (1, 2)
    assert t["train_images"].endswith("train-images.h5") and "R@1" in t["val"]
    assert set(head.vocab) <= set(WORDS)                    # --vocab-min-df 1: caption terms only
    assert (head_dir / "tokenizer").is_dir()
    assert not head_dir.with_name(head_dir.name + ".ckpt").exists()
    with torch.no_grad():
        assert (head(torch.randn(3, 32)) >= 0).all()


def test_sparsify_images_and_both_query_modes(head_dir, dense_dir, tmp_path):
    run = CliRunner()
    r = run.invoke(app, ["sparsify", str(head_dir), str(dense_dir / "test-images.h5"), "-o", str(tmp_path / "i.h5")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    docs = read_sparse(tmp_path / "i.h5")
    assert docs.attrs["query_mode"] == "doc" and docs.attrs["modality"] == "image"
    assert docs.attrs["split"] == "test" and docs.attrs["method"] == "d2s" and docs.attrs["backbone"] == "hf-dual"
    assert docs.matrix.shape == (20, len(docs.vocab))
    q = {}
    for mode in ("expand", "caption-terms"):
        r = run.invoke(app, ["sparsify", str(head_dir), str(dense_dir / "test-captions.h5"), "-o",
                             str(tmp_path / f"{mode}.h5"), "--query-mode", mode, "--batch-size", "7"])
        assert r.exit_code == 0, r.output + repr(r.exception)
        q[mode] = read_sparse(tmp_path / f"{mode}.h5")
        assert q[mode].attrs["query_mode"] == mode and q[mode].texts is not None
    e, c = q["expand"].matrix.toarray(), q["caption-terms"].matrix.toarray()
    assert np.all((c == 0) | np.isclose(c, e))               # caption-terms is a restriction of expand
    for i in range(5):                                       # ... to the caption's own words
        assert {t for t, _ in q["caption-terms"].terms(i)} <= set(q["caption-terms"].texts[i].split())


def test_resume_gives_same_result(dense_dir, dual_encoder_dir, tmp_path):
    from mmsparse.heads.d2s import D2SHead
    from mmsparse.training import TrainConfig, load_pairs, train_d2s
    from mmsparse.vocab import load_vocab_model

    voc = load_vocab_model(dual_encoder_dir)
    cfg = TrainConfig(epochs=3, batch_size=16, warmup_steps=3)
    results = []
    for stop in (None, 1):
        tr = load_pairs(dense_dir / "train-images.h5", dense_dir / "train-captions.h5", dense_dir / "train.qrels")
        tr.tokenize(voc.tokenizer)
        keep = np.zeros(len(voc.terms), bool)
        keep[np.concatenate(tr.raw_ids)] = True
        v = voc.restrict(keep)
        torch.manual_seed(0)
        head = D2SHead.from_vocab(32, v)
        tr.set_columns(head.token_ids.numpy())
        ck = tmp_path / f"ck{stop}"
        if stop is not None:       # interrupted after epoch 1, then a fresh process-like restart
            r = train_d2s(head, tr, None, cfg, ck, stop_after_epoch=stop)
            assert not r.finished and (ck / "last.pt").is_file()
            torch.manual_seed(123)
            head = D2SHead.from_vocab(32, v)
        results.append(train_d2s(head, tr, None, cfg, ck))
    a, b = results
    assert a.finished and b.finished and a.best_epoch == b.best_epoch == 3
    for k in a.state:
        assert torch.equal(a.state[k], b.state[k]), k


def test_sparsify_dim_mismatch_exits_2(head_dir, tmp_path, dual_encoder_dir):
    bad = tmp_path / "bad.h5"
    write_dense(bad, ["a", "b"], np.ones((2, 16), np.float32),
                dict(modality="image", backbone="x", model="x", dataset="x", split="test", normalized=False))
    out = tmp_path / "out.h5"
    p = subprocess.run([sys.executable, "-m", "mmsparse.cli", "sparsify", str(head_dir), str(bad), "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "d=16" in lines[0] and "d=32" in lines[0]
    assert not out.exists()


def test_backbone_workspace_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPARSE_WORK", str(tmp_path))
    r = CliRunner().invoke(app, ["train-head", "--backbone", "nope", "-o", str(tmp_path / "h")])
    assert r.exit_code != 0
    msg = str(r.exception)
    assert "train-images.h5" in msg and "val-captions.h5" in msg


def test_ablation_table_and_plot(head_dir, dense_dir, tmp_path):
    """metrics.ablation: the rows issue 4 asks for, from real heads, matching evaluate_head."""
    import json

    from mmsparse.metrics.ablation import main

    out = tmp_path / "ablation" / "table.json"
    assert main([str(head_dir), "--images", str(dense_dir / "val-images.h5"),
                 "--captions", str(dense_dir / "val-captions.h5"), "--qrels", str(dense_dir / "val.qrels"), "-o", str(out),
                 "--plot", str(tmp_path / "ablation" / "fig.png")]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 1
    r = rows[0]
    for k in ("expansion", "eta", "R@1", "R@5", "RR@10", "FLOPs", "query_terms", "doc_terms"):
        assert k in r, k
    assert r["expansion"] in ("none", "full", "caption", "caption-word") and r["eta"] > 0
    assert 0 <= r["R@1"] <= r["R@5"] <= 1 and r["FLOPs"] >= 0
    assert r["query_mode"] == ("caption-terms" if r["expansion"] == "none" else "expand")
    assert r["FLOPs_caption-terms"] <= r["FLOPs_expand"]               # own terms are a subset
    assert r["query_terms_caption-terms"] <= r["query_terms_expand"]
    assert (tmp_path / "ablation" / "fig.png").read_bytes()[:4] == b"\x89PNG"
