"""Backbones: tiny randomly initialised BLIP / CLIP / SigLIP saved to disk and loaded through
load_backbone; the real Flickr8k dual encoder for vocab and feature equivalence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mmsparse.backbones import backbone_from_attrs, load_backbone
from mmsparse.backbones.hf_dual import features_tensor
from mmsparse.errors import InputError

from conftest import albef_checkpoint  # the tiny ALBEF checkpoint, shared with test_joint_backbones

TEXTS = ["a dog runs on the grass .", "a red ball", "cats"]


def _images(n=3):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (40 + 7 * i, 48, 3), dtype=np.uint8)) for i in range(n)]


def _l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_blip_itc_equals_projection_of_cls(tiny_blip, tiny_words):
    bb = load_backbone("blip", tiny_blip, "cpu")
    assert bb.dim == 16 and bb.normalized and bb.model == str(tiny_blip.resolve())
    pv = bb.preprocess_images(_images())
    assert tuple(pv.shape) == (3, 3, 32, 32)
    img = bb.encode_pixels(pv, ("pre_projection", "patch_states"))
    txt = bb.encode_tokens(bb.tokenize(TEXTS), ("pre_projection", "token_states"))
    assert img["vectors"].shape == (3, 16) and img["vectors"].dtype == np.float32
    assert img["pre_projection"].shape == (3, 32) and img["patch_states"].shape == (3, 17, 32)
    assert txt["vectors"].shape == (3, 16) and txt["token_states"].shape[:2] == txt["token_mask"].shape
    p = bb.projections()
    np.testing.assert_allclose(img["vectors"], _l2(img["pre_projection"] @ p["image_proj_weight"].T
                                                  + p["image_proj_bias"]), atol=1e-5)
    np.testing.assert_allclose(txt["vectors"], _l2(txt["pre_projection"] @ p["text_proj_weight"].T
                                                  + p["text_proj_bias"]), atol=1e-5)
    # the pre-projection state is the [CLS] state of each tower
    np.testing.assert_allclose(txt["pre_projection"], txt["token_states"][:, 0], atol=1e-5)
    # same similarities as the model's own ITC path (use_itm_head=False)
    batch = bb.tokenize(TEXTS)
    with torch.inference_mode():
        ref = bb.net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     pixel_values=pv, use_itm_head=False).itm_score.numpy()
    np.testing.assert_allclose(img["vectors"] @ txt["vectors"].T, ref, atol=1e-5)
    assert bb.word_embeddings().shape == (len(tiny_words), 32) and bb.vocab() == tiny_words


@pytest.mark.parametrize("name", ["clip", "siglip", "hf-dual"])
def test_dual_encoders_match_get_features(name, tiny_clip, tiny_siglip):
    path = tiny_siglip if name == "siglip" else tiny_clip
    bb = load_backbone(name, path, "cpu")
    pv = bb.preprocess_images(_images())
    batch = bb.tokenize(TEXTS)
    img = bb.encode_pixels(pv, ("pre_projection", "patch_states"), layer=1)
    txt = bb.encode_tokens(batch, ("pre_projection", "token_states"))
    with torch.inference_mode():
        ref_i = features_tensor(bb.net.get_image_features(pixel_values=pv)).numpy()
        ref_t = features_tensor(bb.net.get_text_features(**{k: v for k, v in batch.items()
                                                             if k != "token_type_ids"})).numpy()
    np.testing.assert_allclose(img["vectors"], _l2(ref_i), atol=1e-5)
    np.testing.assert_allclose(txt["vectors"], _l2(ref_t), atol=1e-5)
    assert img["vectors"].shape == (3, bb.dim) and txt["vectors"].shape == (3, bb.dim)
    assert img["patch_states"].shape[0] == 3 and img["patch_states"].shape[2] == 32
    p = bb.projections()
    if name == "siglip":
        assert bb.dim == 32 and bb.text_padding == "max_length"
        assert txt["token_mask"].shape == (3, bb.max_length)
        assert p.keys() == {"image_proj_weight", "text_proj_weight"}   # no projection layers: identities
        assert all(np.array_equal(w, np.eye(32, dtype=np.float32)) for w in p.values())
    else:
        assert bb.dim == 24
    # vectors = normalize(pre_projection @ Wᵀ) for every backbone
    np.testing.assert_allclose(img["vectors"], _l2(img["pre_projection"] @ p["image_proj_weight"].T), atol=1e-5)
    np.testing.assert_allclose(txt["vectors"], _l2(txt["pre_projection"] @ p["text_proj_weight"].T), atol=1e-5)


def test_wrong_class_and_missing_model(tiny_blip, tmp_path):
    with pytest.raises(InputError, match="lacks .* weight"):
        load_backbone("hf-dual", tiny_blip, "cpu")
    with pytest.raises(InputError, match="not found"):
        load_backbone("hf-dual", tmp_path / "nope", "cpu")
    with pytest.raises(InputError, match="unknown backbone"):
        load_backbone("nope", tiny_blip, "cpu")


def test_real_dual_encoder_vocab_and_rebuild(dual_encoder_dir):
    bb = backbone_from_attrs({"backbone": "hf-dual", "model": str(dual_encoder_dir)})
    assert bb.dim == 512 and bb.normalized
    emb = bb.word_embeddings()
    voc = bb.vocab()
    assert tuple(emb.shape) == (30522, 384) and emb.dtype == torch.float32
    assert len(voc) == 30522 and voc[0] == "[PAD]" and voc[bb.tokenizer.convert_tokens_to_ids("dog")] == "dog"
    v = bb.encode_texts(["a dog runs on the grass"])
    assert v.shape == (1, 512) and abs(float(np.linalg.norm(v)) - 1) < 1e-5


def _timm_vit_cls(sd, x, heads=2, depth=2, patch=8):
    """Reference forward of ALBEF's timm-style VisionTransformer -> final-norm [CLS] state."""
    import torch.nn.functional as F
    g = lambda k: sd["visual_encoder." + k]  # noqa: E731
    h = F.conv2d(x, g("patch_embed.proj.weight"), g("patch_embed.proj.bias"), stride=patch).flatten(2).transpose(1, 2)
    h = torch.cat([g("cls_token").expand(len(x), -1, -1), h], 1) + g("pos_embed")
    B, N, C = h.shape
    for i in range(depth):
        p = lambda n: (g(f"blocks.{i}.{n}.weight"), g(f"blocks.{i}.{n}.bias"))  # noqa: E731
        y = F.layer_norm(h, (C,), *p("norm1"), eps=1e-6)
        q, k, v = F.linear(y, *p("attn.qkv")).reshape(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * (C // heads) ** -0.5).softmax(-1)
        h = h + F.linear((a @ v).transpose(1, 2).reshape(B, N, C), *p("attn.proj"))
        h = h + F.linear(F.gelu(F.linear(F.layer_norm(h, (C,), *p("norm2"), eps=1e-6), *p("mlp.fc1"))), *p("mlp.fc2"))
    return F.layer_norm(h, (C,), g("norm.weight"), g("norm.bias"), eps=1e-6)[:, 0]


@pytest.mark.parametrize("prefix", ["text_encoder.", "text_encoder.bert."])
def test_albef_official_keys(tmp_path, tiny_words, prefix):
    from mmsparse.backbones.albef import pre_caption
    d, sd, bert = albef_checkpoint(tmp_path, tiny_words, prefix)
    bb = load_backbone("albef", d, "cpu")
    assert bb.dim == 16 and bb.word_embeddings().shape == (len(tiny_words), 32)
    pv = bb.preprocess_images(_images())
    assert tuple(pv.shape) == (3, 3, 32, 32)
    img = bb.encode_pixels(pv, ("pre_projection",))
    with torch.inference_mode():
        ref = _timm_vit_cls(sd, pv)
        np.testing.assert_allclose(img["pre_projection"], ref.numpy(), atol=1e-4)
        np.testing.assert_allclose(img["vectors"], _l2((ref @ sd["vision_proj.weight"].T + sd["vision_proj.bias"]).numpy()),
                                   atol=1e-4)
        assert pre_caption("A Dog, runs-on THE grass!") == "a dog runs on the grass"
        batch = bb.tokenize(["A Dog runs on the grass."])
        t = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
        ref_t = _l2((t @ sd["text_proj.weight"].T + sd["text_proj.bias"]).numpy())
    np.testing.assert_allclose(bb.encode_tokens(batch)["vectors"], ref_t, atol=1e-5)


def test_albef_bad_keys(tmp_path, tiny_words):
    d, sd, _ = albef_checkpoint(tmp_path, tiny_words)
    del sd["visual_encoder.blocks.1.mlp.fc2.bias"]
    torch.save({"model": sd}, d / "ALBEF.pth")
    with pytest.raises(InputError, match=r"vision encoder: missing \[.*1\..*bias"):
        load_backbone("albef", d, "cpu")
    d, sd, _ = albef_checkpoint(tmp_path, tiny_words)
    sd["visual_encoder.blocks.0.extra.weight"] = torch.zeros(1)
    torch.save({"model": sd}, d / "ALBEF.pth")
    with pytest.raises(InputError, match="unexpected checkpoint key.*extra"):
        load_backbone("albef", d, "cpu")
