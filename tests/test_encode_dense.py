"""encode-dense: the CLI end to end on real Flickr8k (--limit), broken images, and resuming."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from mmsparse.backbones import load_backbone
from mmsparse.backbones.encode import encode_images_file
from mmsparse.data import read_image_folder
from mmsparse.errors import InputError
from mmsparse.formats import read_dense, read_qrels

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "cat", "runs", "on", "the", "grass"]


class _Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run `mmsparse ARGS` in-process through the real entry point (exit code + stderr)."""
    from mmsparse import cli as cli_mod

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["mmsparse", *map(str, args)])
        capsys.readouterr()
        try:
            cli_mod.main()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        return _Result(code, capsys.readouterr().err)
    return run


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    from transformers import BertTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("clip")
    txt = dict(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=16, eos_token_id=3)
    vis = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
               image_size=16, patch_size=8)
    CLIPModel(CLIPConfig(text_config=txt, vision_config=vis, projection_dim=8)).save_pretrained(d)
    BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(d)
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(d)
    return d


@pytest.fixture
def image_dir(tmp_path):
    rng = np.random.default_rng(1)
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(10):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(d / f"im{i:02d}.png")
    return d


def test_cli_real_flickr8k(cli, flickr8k_dir, dual_encoder_dir, tmp_path):
    out = tmp_path / "dense"
    r = cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", "-o", out,
             "--model", dual_encoder_dir, "--split", "test", "--limit", "20", "--workers", "0",
             "--batch-size", "16")
    assert r.returncode == 0, r.stderr
    assert "images/s" in r.stderr and "captions/s" in r.stderr
    im, cap = read_dense(out / "test-images.h5"), read_dense(out / "test-captions.h5")
    assert im.vectors.shape == (20, 512) and cap.vectors.shape == (100, 512)
    for c in (im, cap):
        assert c.attrs["backbone"] == "hf-dual" and c.attrs["model"] == str(dual_encoder_dir.resolve())
        assert c.attrs["dataset"] == "flickr8k" and c.attrs["split"] == "test" and c.attrs["normalized"]
        np.testing.assert_allclose(np.linalg.norm(c.vectors, axis=1), 1, atol=1e-5)
    assert im.modality == "image" and cap.modality == "text" and len(cap.texts) == 100
    qrels = read_qrels(out / "test.qrels")
    assert len(qrels) == 100 and all(list(v)[0] in im.ids for v in qrels.values())
    assert cap.image_ids == [list(qrels[c])[0] for c in cap.ids]
    # a trained model ranks the right image above chance (20 candidates: chance mean rank 10.5)
    rank = (cap.vectors @ im.vectors.T > (cap.vectors * im.vectors[[im.ids.index(i) for i in cap.image_ids]])
            .sum(1, keepdims=True)).sum(1) + 1
    assert rank.mean() < 8


def test_cli_errors(cli, flickr8k_dir, tmp_path):
    r = cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", "-o", tmp_path,
             "--split", "nope")
    assert r.returncode == 2 and "split(s) nope not found" in r.stderr
    r = cli("encode-dense", tmp_path / "missing.json", tmp_path, "-o", tmp_path)
    assert r.returncode == 2 and "not found" in r.stderr


def test_broken_images_skip_or_strict(cli, tiny_clip, image_dir, tmp_path):
    (image_dir / "im03.png").write_bytes(b"not an image")
    r = cli("encode-dense", image_dir, "-o", tmp_path / "o", "--backbone", "clip", "--model", tiny_clip,
             "--workers", "1", "--batch-size", "4", "--patch-states", "--pre-projection")
    assert r.returncode == 0, r.stderr
    assert "skipped 1 unreadable image" in r.stderr
    c = read_dense(tmp_path / "o" / "all-images.h5")
    assert len(c.ids) == 9 and "im03" not in c.ids
    # the stored vectors are what the backbone gives for the same images (worker path == direct path)
    bb = load_backbone("clip", tiny_clip, "cpu")
    imgs = [Image.open(image_dir / f"{i}.png") for i in c.ids[:4]]
    np.testing.assert_allclose(c.vectors[:4], bb.encode_images(imgs), atol=1e-5)
    with h5py.File(tmp_path / "o" / "all-images.h5") as f:
        assert f["patch_states"].shape == (9, 5, 16) and f["patch_states"].dtype == np.float16
        assert f["pre_projection"].shape == (9, 16) and f["image_proj_weight"].shape == (8, 16)
    # a rerun with the same settings keeps the finished file
    r = cli("encode-dense", image_dir, "-o", tmp_path / "o", "--backbone", "clip", "--model", tiny_clip,
            "--workers", "0", "--batch-size", "4", "--patch-states", "--pre-projection")
    assert r.returncode == 0 and "already encoded" in r.stderr and "skipped 1" in r.stderr, r.stderr
    r = cli("encode-dense", image_dir, "-o", tmp_path / "s", "--backbone", "clip", "--model", tiny_clip,
             "--workers", "0", "--strict")
    assert r.returncode == 2 and "im03.png: cannot read image" in r.stderr


def test_interrupted_encode_resumes_to_same_file(tiny_clip, image_dir, tmp_path):
    bb = load_backbone("clip", tiny_clip, "cpu")
    recs = read_image_folder(image_dir)["all"].images
    attrs = {"modality": "image", "dataset": "t", "split": "all"}
    kw = dict(batch_size=2, workers=0, shard_rows=3, extras=("pre_projection",), log=lambda m: logs.append(m))
    logs: list[str] = []
    full = encode_images_file(bb, recs, tmp_path / "full.h5", attrs, **kw)
    assert full.rows == 10 and full.encoded == 10
    good = (image_dir / "im07.png").read_bytes()
    (image_dir / "im07.png").write_bytes(b"broken")  # the run dies in shard 2 (rows 6-8)
    with pytest.raises(InputError, match="im07.png"):
        encode_images_file(bb, recs, tmp_path / "r.h5", attrs, strict=True, **kw)
    assert not (tmp_path / "r.h5").exists()
    assert len(list((tmp_path / "r.h5.partial").glob("shard-*.h5"))) == 2
    (image_dir / "im07.png").write_bytes(good)
    res = encode_images_file(bb, recs, tmp_path / "r.h5", attrs, **kw)
    assert res.encoded == 4 and any("resuming" in m for m in logs)
    assert not (tmp_path / "r.h5.partial").exists()
    a, b = read_dense(tmp_path / "full.h5"), read_dense(tmp_path / "r.h5")
    assert a.ids == b.ids
    np.testing.assert_array_equal(a.vectors, b.vectors)
    with h5py.File(tmp_path / "full.h5") as fa, h5py.File(tmp_path / "r.h5") as fb:
        np.testing.assert_array_equal(fa["pre_projection"][()], fb["pre_projection"][()])


def test_captions_file_with_token_states(cli, tiny_clip, tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "q1", "text": "a dog runs"}\n{"id": "q2", "text": "the cat on the grass"}\n'
                 '{"id": "q3", "text": "a cat"}\n')
    r = cli("encode-dense", q, "-o", tmp_path / "o", "--backbone", "clip", "--model", tiny_clip,
            "--token-states", "--pre-projection", "--batch-size", "2", "--dtype", "float16")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "o" / "all-images.h5").exists() and not (tmp_path / "o" / "all.qrels").exists()
    c = read_dense(tmp_path / "o" / "all-captions.h5")
    assert c.ids == ["q1", "q2", "q3"] and c.texts[1] == "the cat on the grass"
    with h5py.File(tmp_path / "o" / "all-captions.h5") as f:
        assert f["vectors"].dtype == np.float16
        L = int(f.attrs["max_length"])
        assert f["token_states"].shape == (3, L, 16) and f["token_mask"].shape == (3, L)
        assert f["token_mask"][()].sum(1).tolist() == [5, 7, 4]  # [CLS] words [SEP]
        assert f["token_ids"][0, :5].tolist() == [2, 5, 6, 8, 3] and f["text_proj_weight"].shape == (8, 16)
        assert "image_proj_weight" not in f
