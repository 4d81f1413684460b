"""train-head + sparsify end to end on small random dense files (real HDF5, real tokenizer)."""

from __future__ import annotations

import subprocess
from pathlib import Path
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mmsparse.cli import app
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import read_sparse
from mmsparse.formats.trec import write_qrels
from mmsparse.methods.head import load_head
from conftest import WORDS  # one word list for every test



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
                                 "--batch-size", "32", "--warmup-steps", "2", "--eta", "1e-3",
                                 "--vocab-min-df", "1"])
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
    # the saved weights are the chosen epoch's: they reproduce its recorded validation figures
    from mmsparse.methods.d2s.method import evaluate_head
    from mmsparse.methods.pairs import load_pairs

    dense = Path(t["val_images"]).parent
    val = load_pairs(dense / "val-images.h5", dense / "val-captions.h5", dense / "val.qrels")
    got = evaluate_head(head, val)
    assert {k: got[k] for k in ("R@1", "R@10", "FLOPs")} == {k: t["val"][k] for k in ("R@1", "R@10", "FLOPs")}
    assert t["history"][t["best_epoch"] - 1]["val"] == t["val"]


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


def test_sparsify_dim_mismatch_exits_2(head_dir, tmp_path, dual_encoder_dir):
    bad = tmp_path / "bad.h5"
    write_dense(bad, ["a", "b"], np.ones((2, 16), np.float32),   # the head's backbone and model, another d
                dict(modality="image", backbone="hf-dual", model=str(dual_encoder_dir), dataset="x", split="test",
                     normalized=False))
    out = tmp_path / "out.h5"
    p = subprocess.run([sys.executable, "-m", "mmsparse.cli", "sparsify", str(head_dir), str(bad), "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    # one error line (these synthetic files record no model_fingerprint: one warning line says so)
    lines = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith("mmsparse: warning:")]
    assert len(lines) == 1 and "d=16" in lines[0] and "d=32" in lines[0]
    assert not out.exists()


def test_backbone_workspace_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPARSE_WORK", str(tmp_path))
    r = CliRunner().invoke(app, ["train-head", "--backbone", "nope", "-o", str(tmp_path / "h")])
    assert r.exit_code != 0
    msg = str(r.exception)
    assert "train-images.h5" in msg and "val-captions.h5" in msg


def test_ablation_table_and_plot(head_dir, dense_dir, tmp_path):
    """The D2S ablation's rows (paper Table 3 / Fig. 2a) from real heads, matching evaluate_head."""
    import json

    from mmsparse.methods.d2s.ablation import main
    from mmsparse.methods.d2s.method import evaluate_head
    from mmsparse.methods.head import require_tokenizer
    from mmsparse.methods.pairs import load_pairs

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
    # Exact@20: a caption-term query's top 20 are all its own terms, an expanded query's at most as many
    assert 0 <= r["Exact@20_expand"] <= r["Exact@20_caption-terms"] <= 1
    n = len(load_pairs(dense_dir / "val-images.h5", dense_dir / "val-captions.h5", dense_dir / "val.qrels").cap_ids)
    assert r["SE_R@1"] == pytest.approx((r["R@1"] * (1 - r["R@1"]) / n) ** 0.5)   # binomial over the queries
    assert 0 < r["SE_FLOPs"] < r["FLOPs"] and 0 < r["SE_Exact@20"] < 0.05
    assert "±" in (out.with_suffix(".md")).read_text()
    assert (tmp_path / "ablation" / "fig.png").read_bytes()[:4] == b"\x89PNG"
    head = load_head(head_dir)
    data = load_pairs(dense_dir / "val-images.h5", dense_dir / "val-captions.h5", dense_dir / "val.qrels")
    data.tokenize(require_tokenizer(head, head_dir))
    data.set_columns(head.token_ids.numpy())
    for mode in ("expand", "caption-terms"):
        want = evaluate_head(head, data, mode)
        assert (r[f"R@1_{mode}"], r[f"RR@10_{mode}"], r[f"FLOPs_{mode}"]) == (want["R@1"], want["MRR@10"], want["FLOPs"])
