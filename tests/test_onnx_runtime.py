"""--runtime onnx (backbones/onnx_towers.py): the towers exported once per model, cached by the model's
content fingerprint, run by ONNX Runtime: PyTorch's vectors (cosine >= 0.9999 per row) on real Flickr8k
images and captions, a new graph for a model changed in place, and a one-line refusal for a backbone
that does not export."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

MIN_COSINE = 0.9999


@pytest.fixture
def model_copy(dual_encoder_dir, tmp_path, monkeypatch):
    """A copy of the real dual encoder in tmp_path/model, with graphs cached in tmp_path/cache."""
    monkeypatch.setenv("MMSPARSE_CACHE", str(tmp_path / "cache"))
    return shutil.copytree(dual_encoder_dir, tmp_path / "model")


def _real(flickr8k_dir, n=8):
    """The first n validation images (PIL) and the captions of the first two."""
    from mmsparse.backbones.encode import load_image
    from mmsparse.data import read_karpathy
    split = read_karpathy(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")["val"]
    ims = split.images[:n]
    texts = [c.text for c in split.captions if c.image_id in {ims[0].id, ims[1].id}]
    return [load_image(r.path) for r in ims], texts


def _vectors(bb, images, texts, runtime, threads=2):
    assert bb.set_runtime(runtime, threads) == runtime
    pv = bb.preprocess_images(images)
    tok = bb.tokenize(texts)
    ex = ("pre_projection", "patch_states")
    return bb.encode_pixels(pv, ex), bb.encode_tokens(tok, ("pre_projection", "token_states"))


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_onnx_vectors_match_torch_and_a_changed_model_gets_a_new_graph(model_copy, flickr8k_dir):
    import torch
    from safetensors.torch import load_file, save_file

    from mmsparse.backbones import load_backbone

    images, texts = _real(flickr8k_dir)
    bb = load_backbone("hf-dual", model_copy, "cpu")
    t_img, t_txt = _vectors(bb, images, texts, "torch")
    o_img, o_txt = _vectors(bb, images, texts, "onnx")
    first = bb.onnx.dir
    for t, o in ((t_img, o_img), (t_txt, o_txt)):
        assert o["vectors"].shape == t["vectors"].shape and o["vectors"].dtype == np.float32
        assert _cos(t["vectors"], o["vectors"]).min() >= MIN_COSINE
        assert _cos(t["pre_projection"], o["pre_projection"]).min() >= MIN_COSINE
    assert np.abs(o_img["patch_states"] - t_img["patch_states"]).max() < 1e-3
    assert np.abs(o_txt["token_states"] - t_txt["token_states"]).max() < 1e-3
    assert np.array_equal(o_txt["token_mask"], t_txt["token_mask"])

    # the same model loaded again: the cached graph, no export
    told = []
    again = load_backbone("hf-dual", model_copy, "cpu")
    again.set_runtime("onnx", 2, told.append)
    assert again.onnx.dir == first and told == []

    # the model changed in place (noise on its two projection matrices): a new graph, the new model's vectors
    f = model_copy / "model.safetensors"
    sd = load_file(f)
    torch.manual_seed(0)
    for k in ("visual_projection.weight", "text_projection.weight"):
        sd[k] = sd[k] + 0.05 * torch.randn_like(sd[k])
    save_file(sd, f, metadata={"format": "pt"})
    changed = load_backbone("hf-dual", model_copy, "cpu")
    c_img, c_txt = _vectors(changed, images, texts, "torch")
    told = []
    changed.set_runtime("onnx", 2, told.append)
    assert changed.onnx.dir != first and len(told) == 1 and "exporting" in told[0]
    n_img = changed.encode_pixels(changed.preprocess_images(images))["vectors"]
    n_txt = changed.encode_tokens(changed.tokenize(texts))["vectors"]
    assert _cos(c_img["vectors"], n_img).min() >= MIN_COSINE and _cos(c_txt["vectors"], n_txt).min() >= MIN_COSINE
    assert _cos(o_img["vectors"], n_img).min() < 0.999   # the stale graph would have given these


@pytest.fixture
def fnet_dual(tmp_path):
    """A tiny random VisionTextDualEncoderModel whose text tower is FNet: its Fourier transform
    (aten::fft_fftn) has no ONNX export."""
    import torch
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, FNetConfig, VisionTextDualEncoderConfig,
                              VisionTextDualEncoderModel)

    from conftest import TINY_VIS, TINY_WORDS, _save_tiny
    torch.manual_seed(0)
    txt = FNetConfig(vocab_size=len(TINY_WORDS), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                     max_position_embeddings=16)
    cfg = VisionTextDualEncoderConfig.from_vision_text_configs(CLIPVisionConfig(**TINY_VIS), txt, projection_dim=8)
    return _save_tiny(VisionTextDualEncoderModel(cfg), tmp_path / "fnet-dual",
                      CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}), TINY_WORDS)


def test_unexportable_backbone_refused_in_one_line_and_auto_falls_back(run_cli, fnet_dual, tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPARSE_CACHE", str(tmp_path / "cache"))
    caps = tmp_path / "caps.txt"
    caps.write_text("a dog runs\na red ball\n")
    code, out, err = run_cli("encode-dense", caps, "--model", fnet_dual, "--runtime", "onnx", "-o", tmp_path / "o1")
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 2 and not list(tmp_path.glob("o1/*.h5"))
    msg = [x for x in lines if "cannot run in ONNX Runtime" in x]
    assert len(msg) == 1 and str(fnet_dual) in msg[0] and "--runtime torch" in msg[0] and "fft" in msg[0]
    assert "graph" not in out + err   # the exporter's graph dump stays off the terminal

    # --precision fp32: auto tries ONNX Runtime on every CPU (with --precision auto it keeps PyTorch where bf16 is native)
    code, out, err = run_cli("encode-dense", caps, "--model", fnet_dual, "--runtime", "auto", "--precision", "fp32",
                             "-o", tmp_path / "o2")
    assert code == 0, err
    assert sum("--runtime auto: torch" in x for x in err.splitlines()) == 1
    assert not list((tmp_path / "cache" / "onnx").glob("*/*.onnx"))   # nothing half-exported is kept
