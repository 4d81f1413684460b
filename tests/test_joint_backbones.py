"""Final layers of the clip, siglip, blip and albef backbones (--final-layer-inputs, joint heads):
tiny random models of each (conftest) on real Flickr8k images and captions. The rebuilt final
layer is the tower's own (per-position outputs = the stored token/patch states, pooled = the
pre-projection state); stored float16 inputs reproduce encode-dense's vectors; a joint head trains
every tuned module; sparsify equals the backbone itself run with the tuned weights written back."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import mmsparse
from mmsparse.backbones import load_backbone
from mmsparse.backbones.encode import encode_captions_file, encode_images_file
from mmsparse.data import read_dataset
from mmsparse.errors import InputError
from mmsparse.formats.dense import read_dense, read_dense_attrs
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods.head import load_head

BACKBONES = ("clip", "siglip", "blip", "albef")
# backbone -> (image modules, text modules) the final layers copy
MODULES = {"clip": (["vision_model.encoder.layers.1", "vision_model.post_layernorm"],
                    ["text_model.encoder.layers.1", "text_model.final_layer_norm"]),
           "siglip": (["vision_model.encoder.layers.1", "vision_model.post_layernorm", "vision_model.head"],
                      ["text_model.encoder.layers.1", "text_model.final_layer_norm", "text_model.head"]),
           "blip": (["vision_model.encoder.layers.1", "vision_model.post_layernorm"], ["text_encoder.encoder.layer.1"]),
           "albef": (["vit.layers.1", "vit.layernorm"], ["bert.encoder.layer.1"])}
KINDS = {"clip": ("vit", "clip-text"), "siglip": ("vit", "siglip-text"), "blip": ("vit", "bert"), "albef": ("vit", "bert")}


@pytest.fixture(scope="module")
def models(tiny_clip, tiny_siglip, tiny_blip, tiny_albef):
    return {"clip": tiny_clip, "siglip": tiny_siglip, "blip": tiny_blip, "albef": tiny_albef}


@pytest.fixture(scope="module")
def flickr(flickr8k_dir):
    """The Flickr8k test split (SplitData) and its annotation paths."""
    data, _, _ = read_dataset(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")
    return data["test"], (flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")


def _encode(bb, flickr, n: int = 3):
    """(image result, caption result) of encode_pixels / encode_tokens with every extra, for the
    first n test images and captions of different lengths (so captions are padded)."""
    split, _ = flickr
    ims = [Image.open(r.path).convert("RGB") for r in split.images[:n]]
    texts = sorted((c.text for c in split.captions[:10]), key=len)[::4][:n]
    img = bb.encode_pixels(bb.preprocess_images(ims), ("pre_projection", "patch_states", "final_input"))
    txt = bb.encode_tokens(bb.tokenize(texts), ("pre_projection", "token_states", "final_input"))
    return img, txt


def _l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("name", [*BACKBONES, "siglip-no-mask"])
def test_final_layer_is_the_towers_own(name, models, flickr):
    """positions() = the stored token/patch states, pool() = the pre-projection state, and through the
    projection the vectors; "siglip-no-mask": SigLIP's tokenizer gives no attention mask, so its text
    tower attends to the padding and the final layer must too."""
    backbone = name.split("-")[0]
    bb = load_backbone(backbone, models[backbone], "cpu")
    if name == "siglip-no-mask":
        bb.tokenizer.model_input_names = ["input_ids"]
    img, txt = _encode(bb, flickr)
    proj = bb.projections()
    for (side, res, states, mask), kind, modules in zip(
            (("image", img, img["patch_states"], None), ("text", txt, txt["token_states"], txt["token_mask"])),
            KINDS[backbone], MODULES[backbone]):
        spec = bb.final_layer_spec(side)
        assert spec["kind"] == kind and spec["modules"] == modules
        layer = bb.final_layer_weights(side).eval()
        x = torch.from_numpy(res["final_input"])
        m = torch.from_numpy(res["final_mask"]) if side == "text" else None
        with torch.no_grad():
            h, hm = layer.positions(x, m)
            p = layer.pool(h, hm)
        if mask is None:
            np.testing.assert_allclose(h.numpy(), states, atol=1e-5)
        else:   # real tokens (the batch's longest row; SigLIP keeps every position)
            n = h.shape[1]
            assert n == (states.shape[1] if backbone == "siglip" else int(mask.sum(1).max()))
            np.testing.assert_allclose(h.numpy() * mask[:, :n, None], states[:, :n] * mask[:, :n, None], atol=1e-5)
            assert np.array_equal(hm.numpy(), mask[:, :n])
        np.testing.assert_allclose(p.numpy(), res["pre_projection"], atol=1e-5)
        w, b = proj[f"{side}_proj_weight"], proj.get(f"{side}_proj_bias", 0.0)
        np.testing.assert_allclose(_l2(p.numpy() @ w.T + b), res["vectors"], atol=1e-5)
    assert bb.final_layer_spec("text").get("attend_padding", False) == (name == "siglip-no-mask")
    if backbone == "blip":   # the text layer's cross-attention (ITM only) is not part of the dual encoder
        assert not any("crossattention" in k for k in bb.final_layer_weights("text").state_dict())


def test_clip_pooling_another_token_is_refused(tiny_clip):
    """The clip-text layer pools each caption's last token (where CLIP's tokenizer puts EOS);
    encode-dense refuses a model whose text tower pools another one."""
    bb = load_backbone("clip", tiny_clip, "cpu")
    bb.net.text_model.eos_token_id = 5   # "a": the tower now pools the first "a", not the last token
    with pytest.raises(InputError, match="pools a token other than each caption's last"):
        bb.encode_tokens(bb.tokenize(["a dog runs on the grass", "a red ball"]), ("final_input",))


@pytest.fixture(scope="module", params=BACKBONES)
def joint_run(request, models, flickr, tmp_path_factory):
    """val and test (4 images, 20 captions each) encoded with --final-layer-inputs by one tiny
    backbone, and a joint head trained 2 epochs on val with learning rates large enough to move every
    tuned weight: (backbone name, model, dense dir, head dir, root)."""
    name = request.param
    root = tmp_path_factory.mktemp(f"joint-{name}")
    dense = root / "dense"
    # one torch thread: these tiny models run 4x faster so on a shared 2-core machine
    mmsparse.encode_dense(*flickr[1], out=dense, backbone=name, model=models[name], split=["val", "test"], limit=4,
                          workers=0, threads=1, final_layer_inputs=True)
    head = mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=root / "head", method="joint",
                               epochs=2, batch_size=4, vocab_min_df=1, final_lr=1e-2, proj_lr=1e-2, threads=1)
    return name, models[name], dense, head, root


def test_stored_inputs_reproduce_the_vectors(joint_run):
    """float16 final_input through the rebuilt layers and the projections = `vectors` (float16 rounding)."""
    name, model, dense, _, _ = joint_run
    bb = load_backbone(name, model, "cpu")
    proj = bb.projections()
    for kind, side in (("images", "image"), ("captions", "text")):
        with h5py.File(dense / f"val-{kind}.h5", "r") as f:
            x, vec = f["final_input"][()], f["vectors"][()]
            m = f["final_mask"][()] if side == "text" else None
            assert f.attrs["final_layer"] and x.dtype == np.float16 and x.shape[-1] == 32
        layer = bb.final_layer_weights(side).eval()
        with torch.no_grad():
            p = layer(torch.from_numpy(x), None if m is None else torch.from_numpy(m)).numpy()
        h = _l2(p @ proj[f"{side}_proj_weight"].T + proj.get(f"{side}_proj_bias", 0.0))
        assert np.abs(h - vec).max() < 3e-3, (name, side)


def test_joint_head_tunes_every_module(joint_run):
    """Every parameter of both final layers and both projections moved from the backbone's: gradients
    reach each tuned module."""
    name, model, _, head_dir, _ = joint_run
    bb = load_backbone(name, model, "cpu")
    w = load_file(str(head_dir / "model.safetensors"))
    for side in ("text", "image"):
        orig = dict(bb.final_layer_weights(side).named_parameters())
        assert orig and all(not torch.equal(w[f"{side}_final.{k}"], v) for k, v in orig.items()), side
        key = f"{side}_proj.weight"
        assert not torch.equal(w[key], torch.from_numpy(bb.projections()[f"{side}_proj_weight"]))


def _tuned_backbone(name, model, head):
    """The backbone with the head's tuned final layers and projections written into it."""
    bb = load_backbone(name, model, "cpu")
    for side, layer in (("text", head.text_final), ("image", head.image_final)):
        layer.copy_to(bb.final_tower(side)[1])
    if name == "siglip":   # no projection layers: the head's (identity-initialised) ones, applied by hf-dual
        bb.vproj, bb.tproj = head.image_proj, head.text_proj
    else:
        vp, tp = (bb.net.vision_proj, bb.net.text_proj) if name == "blip" else (bb.vproj, bb.tproj)
        vp.load_state_dict(head.image_proj.state_dict())
        tp.load_state_dict(head.text_proj.state_dict())
    return bb


def test_sparsify_equals_the_backbone_with_the_tuned_weights(joint_run, flickr, tmp_path):
    name, model, dense, head_dir, _ = joint_run
    head = load_head(head_dir).eval()
    bb = _tuned_backbone(name, model, head)
    split, _ = flickr
    images = split.images[:4]
    captions = [c for c in split.captions if c.image_id in {r.id for r in images}]
    direct = {"images": encode_images_file(bb, images, tmp_path / "i.h5", {"modality": "image", "dataset": "t", "split": "test"},
                                         workers=0).path,
              "captions": encode_captions_file(bb, captions, tmp_path / "c.h5", {"modality": "text", "dataset": "t", "split": "test"}).path}
    for kind in ("images", "captions"):
        sp = mmsparse.sparsify(head_dir, dense / f"test-{kind}.h5", out=tmp_path / f"sp-{kind}.h5",
                               dense_out=tmp_path / f"tuned-{kind}.h5")
        tuned, ref = read_dense(tmp_path / f"tuned-{kind}.h5"), read_dense(direct[kind])
        assert list(tuned.ids) == list(ref.ids)
        assert np.abs(tuned.vectors - ref.vectors).max() < 3e-3, (name, kind)      # float16 stored inputs
        assert not np.allclose(tuned.vectors, read_dense(dense / f"test-{kind}.h5").vectors, atol=1e-3)  # tuned
        with torch.no_grad():
            z = head(torch.from_numpy(ref.vectors)).numpy()
        assert np.abs(read_sparse(sp).matrix.toarray() - z).max() < 2e-2 * max(1.0, float(z.max())), (name, kind)
    assert read_dense_attrs(tmp_path / "tuned-images.h5")["backbone"] == name


def test_unknown_towers_are_refused_before_any_file(tiny_words, flickr8k_dir, run_cli, tmp_path):
    """hf-dual over a Swin image tower (no known final layer): one error line, no file written,
    though its BERT text tower would do."""
    from transformers import (BertConfig, SwinConfig, ViTImageProcessor, VisionTextDualEncoderConfig,
                              VisionTextDualEncoderModel)

    from conftest import _save_tiny
    torch.manual_seed(0)
    cfg = VisionTextDualEncoderConfig.from_vision_text_configs(
        SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 1], window_size=4),
        BertConfig(vocab_size=len(tiny_words), hidden_size=16, num_hidden_layers=1, num_attention_heads=1,
                   intermediate_size=32), projection_dim=8)
    model = _save_tiny(VisionTextDualEncoderModel(cfg), tmp_path / "swin", ViTImageProcessor(size=32), tiny_words)
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                             "--model", model, "--split", "test", "--limit", "2", "--final-layer-inputs",
                             "-o", tmp_path / "d")
    errors = [x for x in err.splitlines() if x.startswith("mmsparse: error")]
    assert code == 2 and len(errors) == 1 and "SwinModel: no known final layer for an image tower" in errors[0]
    assert not list((tmp_path / "d").glob("*.h5")) if (tmp_path / "d").exists() else True
