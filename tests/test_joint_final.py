"""Joint heads over the towers' final layers (--dense-side final-layer, the paper's §2): real
Flickr8k images and captions through the real dual encoder with `--final-layer-inputs`, the final
layers rebuilt from the stored description reproduce the model's vectors, train-head saves the tuned
layers with the head, sparsify recomputes the dense vectors through them, and files without the
stored states are refused with the flag that stores them."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import mmsparse
from mmsparse.backbones.base import backbone_from_attrs
from mmsparse.formats.dense import read_dense, read_dense_attrs
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods.head import load_head

from conftest import check_query_is_the_sparsify_row, write_without_final_inputs

TEXT_MODULES = ["text_model.encoder.layer.5", "text_model.pooler"]


@pytest.fixture(scope="module")
def final_run(tmp_path_factory, flickr8k_dir, dual_encoder_dir):
    """val (first 8 images, 40 captions) and test (first 4 images) encoded with final-layer
    inputs; a joint head trained 2 epochs on val (its own validation: a plumbing check, not a
    result) with a learning rate on the final layers large enough to move them."""
    root = tmp_path_factory.mktemp("joint-final")
    data = (flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")
    dense = root / "dense"
    for split, n in (("val", 8), ("test", 4)):
        mmsparse.encode_dense(*data, out=dense, model=dual_encoder_dir, split=[split], limit=n, workers=0,
                              final_layer_inputs=True)
    head = mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=root / "head",
                               method="joint", val_images=dense / "val-images.h5",
                               val_captions=dense / "val-captions.h5", epochs=2, batch_size=4, vocab_min_df=1,
                               final_lr=1e-3)
    return root, dense, head


def test_stored_inputs_and_rebuilt_layers_reproduce_the_vectors(final_run):
    _, dense, _ = final_run
    attrs = read_dense_attrs(dense / "val-captions.h5")
    bb = backbone_from_attrs(attrs)
    proj = bb.projections()
    with h5py.File(dense / "val-captions.h5", "r") as f:
        x, m, vec = f["final_input"][()], f["final_mask"][()], f["vectors"][()]
        spec = json.loads(f.attrs["final_layer"])
    assert x.dtype == np.float16 and x.shape == (40, 64, 384) and m.shape == (40, 64)   # L = max_length
    assert spec["modules"] == TEXT_MODULES and spec["kind"] == "bert"
    with h5py.File(dense / "val-images.h5", "r") as f:
        xi, vi = f["final_input"][()], f["vectors"][()]
    assert xi.dtype == np.float16 and xi.shape == (8, 320, 7, 7)         # what feeds the top convolution
    for side, inp, mask, want in (("text", x, m, vec), ("image", xi, None, vi)):
        layer = bb.final_layer_weights(side).eval()
        with torch.no_grad():
            p = layer(torch.from_numpy(inp), None if mask is None else torch.from_numpy(mask))
        h = torch.nn.functional.normalize(p @ torch.from_numpy(proj[f"{side}_proj_weight"]).T, dim=-1)
        assert np.abs(h.numpy() - want).max() < 2e-3, side                  # float16 states: ~1e-4


def test_head_saves_and_reloads_the_tuned_final_layers(final_run, dual_encoder_dir):
    _, dense, head_dir = final_run
    cfg = json.loads((head_dir / "config.json").read_text())
    assert cfg["final_layers"]["text"]["modules"] == TEXT_MODULES
    assert cfg["final_layers"]["image"]["modules"][0] == "vision_model.encoder.top_conv"
    assert cfg["final_layers_tuned"] is True and cfg["final_layers_source"]["model_fingerprint"].startswith("sha256:")
    w = load_file(str(head_dir / "model.safetensors"))
    bb = backbone_from_attrs(read_dense_attrs(dense / "val-captions.h5"))
    orig = bb.net.text_model.encoder.layer[5].output.dense.weight
    assert not torch.equal(w["text_final.layer.output.dense.weight"], orig)          # tuned
    assert torch.equal(w["image_final.bn.running_mean"], bb.net.vision_model.encoder.top_bn.running_mean)  # frozen BN
    head = load_head(head_dir)
    assert head.has_final and torch.equal(head.text_final.layer.output.dense.weight,
                                          w["text_final.layer.output.dense.weight"])


def test_sparsify_recomputes_dense_vectors_through_the_final_layers(final_run):
    root, dense, head_dir = final_run
    head = load_head(head_dir)
    for kind in ("captions", "images"):
        sp = mmsparse.sparsify(head_dir, dense / f"test-{kind}.h5", out=root / f"sp-{kind}.h5",
                               dense_out=root / f"tuned-{kind}.h5")
        tuned = read_dense(root / f"tuned-{kind}.h5")
        with h5py.File(dense / f"test-{kind}.h5", "r") as f:
            x = torch.from_numpy(f["final_input"][()])
            m = torch.from_numpy(f["final_mask"][()]) if "final_mask" in f else None
        with torch.no_grad():
            h = head.dense(x, "text" if kind == "captions" else "image", m)
            z = head(h).numpy()
        assert np.allclose(tuned.vectors, h.numpy(), atol=1e-5)
        assert np.allclose(read_sparse(sp).matrix.toarray(), z, atol=1e-5)
        assert not np.allclose(tuned.vectors, read_dense(dense / f"test-{kind}.h5").vectors, atol=1e-3)  # moved


def test_files_without_final_inputs_are_refused_with_the_flag(final_run, run_cli, tmp_path):
    _, dense, head_dir = final_run
    write_without_final_inputs(dense, tmp_path)
    code, _, err = run_cli("train-head", "--method", "joint", tmp_path / "images.h5", tmp_path / "captions.h5",
                             "-o", tmp_path / "head")
    assert code == 2 and "--final-layer-inputs" in err and "final_input" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "head").exists()
    code, _, err = run_cli("sparsify", head_dir, tmp_path / "images.h5", "-o", tmp_path / "x.h5")
    assert code == 2 and "--final-layer-inputs" in err and not (tmp_path / "x.h5").exists()


def test_frozen_final_layer_keeps_the_backbone_weights(final_run, tmp_path):
    _, dense, _ = final_run
    out = mmsparse.train_head(dense / "test-images.h5", dense / "test-captions.h5", out=tmp_path / "frozen",
                              method="joint", epochs=1, batch_size=4, vocab_min_df=1, tune_final_layer=False,
                              tune_projection=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["final_layers_tuned"] is False
    w = load_file(str(out / "model.safetensors"))
    bb = backbone_from_attrs(read_dense_attrs(dense / "test-captions.h5"))
    assert torch.equal(w["text_final.layer.output.dense.weight"], bb.net.text_model.encoder.layer[5].output.dense.weight)
    assert torch.equal(w["image_final.conv.weight"], bb.net.vision_model.encoder.top_conv.weight)


def test_query_encodes_through_the_final_layers(final_run, tmp_path):
    """`query` with a final-layer head: its text query is the caption's sparsify row (the query
    encoder stores final-layer inputs and the head runs its tuned layers on them)."""
    _, dense, head_dir = final_run
    check_query_is_the_sparsify_row(head_dir, dense, tmp_path)


def test_validation_curve_of_the_trained_head(final_run, tmp_path):
    """`python -m mmsparse.methods.joint curve`: the head records the backbone's validation dense
    figures before training and one validated epoch per epoch; the PNG is drawn from them."""
    import subprocess
    import sys

    from PIL import Image

    _, _, head_dir = final_run
    t = json.loads((head_dir / "config.json").read_text())["training"]
    assert 0 <= t["val_before"]["dense"]["R@1"] <= 1
    assert [e["epoch"] for e in t["history"]] == [1, 2] and all("dense" in e["val"] for e in t["history"])
    out = tmp_path / "curve.png"
    p = subprocess.run([sys.executable, "-m", "mmsparse.methods.joint", "curve", str(head_dir), "--reference",
                        str(head_dir), "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with Image.open(out) as im:
        assert im.size[0] > 500 and im.size[1] > 500
    p = subprocess.run([sys.executable, "-m", "mmsparse.methods.joint", "curve", str(tmp_path), "-o",
                        str(tmp_path / "x.png")], capture_output=True, text=True)
    assert p.returncode == 1 and "no train-head record" in p.stderr and not (tmp_path / "x.png").exists()
