"""Shared fixtures: where the real Flickr8k data and model live (../shared by default)."""

from __future__ import annotations

import os
from pathlib import Path

import sys

import pytest

from mmsparse import cli, settings

# Tests never reach a hub: everything loads from local paths.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def flickr8k_dir() -> Path:
    d = settings.flickr8k_dir()
    if not (d / "dataset_flickr8k.json").is_file():
        pytest.skip(f"Flickr8k not found at {d} (set MMSPARSE_SHARED or MMSPARSE_FLICKR8K)")
    return d


@pytest.fixture(scope="session")
def dual_encoder_dir() -> Path:
    d = settings.dual_encoder_dir()
    if not (d / "config.json").is_file():
        pytest.skip(f"dual encoder not found at {d} (set MMSPARSE_SHARED or MMSPARSE_MODEL)")
    return d


@pytest.fixture
def run_cli(capfd):
    """run_cli(*args) -> (exit code, stdout, stderr) of `mmsparse ARGS`, in-process through
    cli.main, so exit codes and the one-line errors are those of the console script."""
    def run(*args) -> tuple[int, str, str]:
        old = sys.argv
        sys.argv = ["mmsparse", *map(str, args)]
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code or 0
        finally:
            sys.argv = old
        out, err = capfd.readouterr()
        return code, out, err
    return run


# -- tiny models (shared by test_backbones, test_encode_dense) ---------------------------------

TINY_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "cat", "runs", "on", "the", "grass",
              "red", "ball", ".", "##s"]


@pytest.fixture(scope="session")
def tiny_words() -> list[str]:
    """The WordPiece vocabulary of the tiny models, in id order ([PAD]=0 ... [MASK]=4, 'a'=5, ...)."""
    return list(TINY_WORDS)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory, tiny_words) -> Path:
    """A randomly initialised CLIPModel (seed 0) saved with a BertTokenizer over `tiny_words` and a
    CLIPImageProcessor: hidden 32 in both towers, 2 layers, 32x32 images in 8x8 patches (P = 17
    with [CLS]), projection_dim 24, max_position_embeddings 16."""
    import torch
    from transformers import BertTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-clip")
    txt = dict(vocab_size=len(tiny_words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=16, eos_token_id=3, pad_token_id=0)
    vis = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               image_size=32, patch_size=8)
    CLIPModel(CLIPConfig(text_config=txt, vision_config=vis, projection_dim=24)).save_pretrained(d)
    BertTokenizer(vocab={w: i for i, w in enumerate(tiny_words)}).save_pretrained(d)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(d)
    return d


# -- a small collection every method trains on ------------------------------------------------

WORDS = "dog cat man woman runs jumps on grass beach snow red blue ball water".split()


def write_method_split(root: Path, split: str, n_img: int, model: Path, seed: int, d: int = 16) -> None:
    """Dense image and caption files of `split` holding what every method reads, as encode-dense
    --pre-projection --token-states --patch-states writes it: vectors [N, d] = normalize(pre_projection
    @ Wᵀ) with the projection weights, caption texts of WORDS and each caption's image, token states /
    mask / ids (the real tokenizer's ids of the texts), and patch states whose patches resemble the
    image's words. Two captions per image; related images and captions are close in every space."""
    import numpy as np
    from transformers import AutoTokenizer

    from mmsparse.formats.dense import DenseWriter

    tok = AutoTokenizer.from_pretrained(str(model))
    rng = np.random.default_rng(seed)
    words = np.random.default_rng(7).normal(size=(len(WORDS), 24)).astype(np.float32)   # fixed word features
    w_i = np.random.default_rng(99).normal(size=(d, 24)).astype(np.float32)
    w_t = np.random.default_rng(98).normal(size=(d, 24)).astype(np.float32)
    norm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    base = dict(backbone="hf-dual", model=str(model), dataset="unit", split=split, normalized=True)
    img_ids = [f"{split}-i{i}" for i in range(n_img)]
    bags = [rng.choice(len(WORDS), 4, replace=False) for _ in range(n_img)]
    p_i = np.stack([words[b].sum(0) for b in bags]) + 0.2 * rng.normal(size=(n_img, 24)).astype(np.float32)
    patches = np.stack([words[b] + 0.1 * rng.normal(size=(4, 24)) for b in bags])[:, :, :8].astype(np.float16)
    with DenseWriter(root / f"{split}-images.h5", d, dict(base, modality="image")) as w:
        w.append(img_ids, norm(p_i @ w_i.T))
        w.append_extra("pre_projection", p_i.astype(np.float32))
        w.append_extra("patch_states", patches)
        w.set_extra("image_proj_weight", w_i)
        w.set_extra("text_proj_weight", w_t)
    cap_ids, caps, of = [], [], []
    for i, b in enumerate(bags):
        for j in range(2):
            cap_ids.append(f"{split}-c{i}-{j}")
            caps.append(" ".join(WORDS[k] for k in rng.permutation(b)[:3]))
            of.append(img_ids[i])
    p_c = np.stack([words[[WORDS.index(t) for t in c.split()]].sum(0) for c in caps]).astype(np.float32)
    p_c += 0.2 * rng.normal(size=p_c.shape).astype(np.float32)
    enc = tok(caps, padding="max_length", max_length=8, truncation=True)
    mask = np.asarray(enc["attention_mask"], dtype=np.uint8)
    states = (rng.normal(size=(len(caps), 8, 32)) * mask[..., None]).astype(np.float16)
    with DenseWriter(root / f"{split}-captions.h5", d, dict(base, modality="text"), with_texts=True) as w:
        w.append(cap_ids, norm(p_c @ w_t.T), caps, of)
        w.append_extra("pre_projection", p_c)
        w.append_extra("token_states", states)
        w.append_extra("token_mask", mask)
        w.append_extra("token_ids", np.asarray(enc["input_ids"], dtype=np.int32))
        w.set_extra("image_proj_weight", w_i)
        w.set_extra("text_proj_weight", w_t)


@pytest.fixture(scope="session")
def method_data(tmp_path_factory, dual_encoder_dir) -> Path:
    """A directory with train (40 images, 80 captions), val and test (12 images each) splits of
    write_method_split: the inputs of every registered method."""
    root = tmp_path_factory.mktemp("method-data")
    for split, n, seed in (("train", 40, 0), ("val", 12, 1), ("test", 12, 2)):
        write_method_split(root, split, n, dual_encoder_dir, seed)
    return root
