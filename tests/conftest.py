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


def pytest_sessionstart(session):
    """The tests run on real data: without it the suite stops at once with one message saying
    where the data is expected and how to point to it (skipping would report a green run)."""
    missing = [f"{what} at {p}" for what, p in (("Flickr8k (dataset_flickr8k.json)", settings.flickr8k_dir()
                                                 / "dataset_flickr8k.json"),
                                                ("the dual encoder (config.json)", settings.dual_encoder_dir()
                                                 / "config.json")) if not p.is_file()]
    if missing:
        pytest.exit(f"mmsparse tests need the shared data: missing {' and '.join(missing)}. Put shared/ beside "
                    "the repository, or set MMSPARSE_SHARED=/path/to/shared (or MMSPARSE_FLICKR8K and "
                    "MMSPARSE_MODEL one by one).", returncode=4)


@pytest.fixture(scope="session")
def flickr8k_dir() -> Path:
    """The Flickr8k folder (dataset_flickr8k.json + images/), checked at session start."""
    return settings.flickr8k_dir()


@pytest.fixture(scope="session")
def dual_encoder_dir() -> Path:
    """The offline dual encoder (a VisionTextDualEncoderModel directory), checked at session start."""
    return settings.dual_encoder_dir()


def mmsparse_main(*args) -> int:
    """Exit status of `mmsparse ARGS` run in this process through the console script's entry
    point (cli.main), so exit codes and one-line errors are those a user sees."""
    old = sys.argv
    sys.argv = ["mmsparse", *map(str, args)]
    try:
        cli.main()
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old


@pytest.fixture
def run_cli(capfd):
    """run_cli(*args) -> (exit code, stdout, stderr) of `mmsparse ARGS` (mmsparse_main), with the
    output captured at the file-descriptor level (engines such as PISA write there directly)."""
    def run(*args) -> tuple[int, str, str]:
        capfd.readouterr()
        code = mmsparse_main(*args)
        out, err = capfd.readouterr()
        return code, out, err
    return run


# -- tiny models (shared by test_backbones, test_encode_dense, test_joint_backbones) ---------------------------------

TINY_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "cat", "runs", "on", "the", "grass",
              "red", "ball", ".", "##s"]
TINY_TXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=16)
TINY_VIS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=8)


def _save_tiny(model, d: Path, image_processor, words: list[str]) -> Path:
    from transformers import BertTokenizer
    model.save_pretrained(d)
    BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(d)
    image_processor.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_words() -> list[str]:
    """The WordPiece vocabulary of the tiny models, in id order ([PAD]=0 ... [MASK]=4, 'a'=5, ...)."""
    return list(TINY_WORDS)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory, tiny_words) -> Path:
    """A randomly initialised CLIPModel (seed 0) saved with a BertTokenizer over `tiny_words` and a
    CLIPImageProcessor: hidden 32 in both towers, 2 layers, 32x32 images in 8x8 patches (P = 17
    with [CLS]), projection_dim 24, max_position_embeddings 16."""
    return save_tiny_clip(tiny_words, tmp_path_factory.mktemp("tiny-clip"))


def save_tiny_clip(words: list[str], out: Path) -> Path:
    """tiny_clip's model (seed 0) with a BertTokenizer over `words`, saved to `out`."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    txt = {**TINY_TXT, "vocab_size": len(words), "eos_token_id": 3, "pad_token_id": 0}
    return _save_tiny(CLIPModel(CLIPConfig(text_config=txt, vision_config=TINY_VIS, projection_dim=24)), out,
                      CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}), words)


@pytest.fixture(scope="session")
def tiny_blip(tmp_path_factory, tiny_words) -> Path:
    """A randomly initialised BlipForImageTextRetrieval (seed 0; towers as tiny_clip's, ITC space 16-d;
    vision weights drawn with std 0.02: BLIP's default 1e-10 gives hidden states of ~1e-9, which
    float16 stores as 0)."""
    import torch
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor
    torch.manual_seed(0)
    cfg = BlipConfig(text_config={**TINY_TXT, "vocab_size": len(tiny_words)},
                     vision_config={**TINY_VIS, "initializer_range": 0.02}, image_text_hidden_size=16)
    return _save_tiny(BlipForImageTextRetrieval(cfg), tmp_path_factory.mktemp("blip"),
                      BlipImageProcessor(size={"height": 32, "width": 32}), tiny_words)


@pytest.fixture(scope="session")
def tiny_siglip(tmp_path_factory, tiny_words) -> Path:
    """A randomly initialised SiglipModel (seed 0; towers as tiny_clip's, no [CLS]: P = 16)."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel
    torch.manual_seed(0)
    cfg = SiglipConfig(text_config={**TINY_TXT, "vocab_size": len(tiny_words)}, vision_config=TINY_VIS)
    return _save_tiny(SiglipModel(cfg), tmp_path_factory.mktemp("siglip"),
                      SiglipImageProcessor(size={"height": 32, "width": 32}), tiny_words)


def albef_checkpoint(tmp_path: Path, words: list[str], prefix: str = "text_encoder."):
    """A tiny checkpoint in the official ALBEF key layout (timm ViT + xbert BERT + momentum copies, seed
    0) saved as tmp_path/ALBEF.pth with a BertTokenizer over `words` and albef.json (2 heads):
    (tmp_path, the state dict, the BertModel of its text-only layers). Width 32, 2 ViT blocks, 32x32
    images in 8x8 patches, 2 text-only BERT layers (+ one fusion layer, unused), projections to 16."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer
    torch.manual_seed(0)
    C, depth, patch, grid = 32, 2, 8, 4
    sd = {"visual_encoder.cls_token": torch.randn(1, 1, C), "visual_encoder.pos_embed": torch.randn(1, grid * grid + 1, C),
          "visual_encoder.patch_embed.proj.weight": torch.randn(C, 3, patch, patch) * 0.1,
          "visual_encoder.patch_embed.proj.bias": torch.randn(C), "visual_encoder.norm.weight": torch.rand(C) + 0.5,
          "visual_encoder.norm.bias": torch.randn(C)}
    for i in range(depth):
        b = f"visual_encoder.blocks.{i}."
        for n, shape in (("norm1", (C,)), ("norm2", (C,)), ("attn.qkv", (3 * C, C)), ("attn.proj", (C, C)),
                         ("mlp.fc1", (64, C)), ("mlp.fc2", (C, 64))):
            sd[b + n + ".weight"] = torch.randn(shape) * (0.2 if len(shape) == 2 else 1) + (1 if len(shape) == 1 else 0)
            sd[b + n + ".bias"] = torch.randn(shape[0]) * 0.1
    bert = BertModel(BertConfig(vocab_size=len(words), hidden_size=C, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=40), add_pooling_layer=False).eval()
    sd.update({prefix + k: v for k, v in bert.state_dict().items()})
    sd[prefix + "encoder.layer.2.crossattention.self.query.weight"] = torch.randn(C, C)  # fusion layer: unused
    sd[prefix + "encoder.layer.2.attention.self.query.weight"] = torch.randn(C, C)
    for n, shape in (("vision_proj", (16, C)), ("text_proj", (16, C))):
        sd[n + ".weight"], sd[n + ".bias"] = torch.randn(shape), torch.randn(16)
        sd[n + "_m.weight"] = torch.randn(shape)
    sd.update({"temp": torch.tensor(0.07), "image_queue": torch.randn(16, 8), "itm_head.weight": torch.randn(2, C),
               "visual_encoder_m.cls_token": torch.randn(1, 1, C)})
    torch.save({"model": sd, "epoch": 3}, tmp_path / "ALBEF.pth")
    BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(tmp_path)
    (tmp_path / "albef.json").write_text('{"vision_heads": 2, "text_heads": 2}')
    return tmp_path, sd, bert


@pytest.fixture(scope="session")
def tiny_albef(tmp_path_factory, tiny_words) -> Path:
    """albef_checkpoint's model directory (an official-layout ALBEF checkpoint, tiny)."""
    return albef_checkpoint(tmp_path_factory.mktemp("albef"), tiny_words)[0]


# -- a small collection every method trains on ------------------------------------------------

WORDS = "dog cat man woman runs jumps on grass beach snow red blue ball water a the".split()


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


# -- a real small search setup (query, serve, PyTerrier, hub tests) ---------------------------

@pytest.fixture(scope="session")
def search_setup(tmp_path_factory, flickr8k_dir, dual_encoder_dir) -> dict:
    """Real Flickr8k through the real dual encoder: train (first 200 images, 1,000 captions) and
    test (first 100 images, 500 captions) encoded, a D2S head trained on train for 6 epochs over
    the training captions' vocabulary with the paper's settings and the CPU schedule of issue 35 (6 epochs, the
    FLOPs regulariser; the L1 warm-up scaled to 4 steps; no gates, word loss or floor), the test images sparsified and indexed with PISA, and their
    dense vectors indexed with Faiss. Keys: root, dense (encode-dense's directory), head,
    sparse_images, pisa, faiss (index directories), images (the Flickr8k image folder)."""
    import mmsparse

    root = tmp_path_factory.mktemp("search-setup")
    data = (flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")
    dense = root / "dense"
    for split, n in (("train", 200), ("test", 100)):
        mmsparse.encode_dense(*data, out=dense, model=dual_encoder_dir, split=[split], limit=n, workers=0)
    head = mmsparse.train_head(dense / "train-images.h5", dense / "train-captions.h5", out=root / "head",
                               preset="paper", epochs=6, batch_size=128, vocab_min_df=1, lr_warmup=0, vocab_lr=1e-3,
                               weight_decay=0.01, sparsity_loss="flops", eta=0.05, l1_warmup=4,
                               mask_caption_terms=False, l1_caption="raw", pec_end=1.0)
    docs = mmsparse.sparsify(head, dense / "test-images.h5", out=root / "sparse" / "test-images.h5")
    return {"root": root, "dense": dense, "head": head, "sparse_images": docs,
            "pisa": mmsparse.build_index(docs, out=root / "index" / "pisa"),
            "faiss": mmsparse.build_index(dense / "test-images.h5", out=root / "index" / "faiss"),
            "images": flickr8k_dir / "images"}


def write_without_final_inputs(src: Path, out: Path, split: str = "val") -> tuple[Path, Path]:
    """Copies of src/{split}-images.h5 and -captions.h5 holding the vectors and their identity
    attributes but not the final-layer inputs (the files a plain `encode-dense` writes): the
    (images, captions) paths under out."""
    from mmsparse.formats.dense import read_dense, write_dense
    paths = []
    for kind in ("images", "captions"):
        d = read_dense(src / f"{split}-{kind}.h5")
        keep = {k: d.attrs[k] for k in ("modality", "backbone", "model", "model_fingerprint", "dataset", "split",
                                         "normalized")}
        paths.append(out / f"{kind}.h5")
        write_dense(paths[-1], d.ids, d.vectors, keep, texts=d.texts, image_ids=d.image_ids)
    return paths[0], paths[1]


def check_query_is_the_sparsify_row(head: Path, dense: Path, tmp_path: Path) -> Path:
    """`mmsparse.query` of the first test caption's text through `head` gives that caption's
    `sparsify` row (same terms, weights within 1e-3 relative) over an index of the test images;
    returns the sparsified test images' path."""
    import mmsparse
    from mmsparse.formats.sparse import read_sparse
    docs = mmsparse.sparsify(head, dense / "test-images.h5", out=tmp_path / "docs.h5")
    caps = read_sparse(mmsparse.sparsify(head, dense / "test-captions.h5", out=tmp_path / "caps.h5"))
    idx = mmsparse.build_index(docs, out=tmp_path / "index")
    (r,) = mmsparse.query(idx, [caps.texts[0]], k=4)
    want = {caps.vocab[j]: w for j, w in zip(*(a.tolist() for a in caps.row(0)))}
    got = {t["term"]: t["weight"] for t in r["terms"]}
    assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < 1e-3 * max(1.0, want[t]) for t in want)
    return docs


def write_dense_pair(root: Path, model: Path, n_img: int, split: str = "train", d: int = 32, seed: int = 0) -> None:
    """`split`-images.h5 (n_img random unit vectors [n_img, d]) and `split`-captions.h5 (two noisy copies
    of each, with WORDS texts and image ids) in `root`: a small dense pair for the kill/resume tests."""
    import numpy as np

    from mmsparse.formats import write_dense

    rng = np.random.default_rng(seed)
    zi = rng.normal(size=(n_img, d)).astype(np.float32)
    zi /= np.linalg.norm(zi, axis=1, keepdims=True)
    ids = [f"c{i}-{j}" for i in range(n_img) for j in range(2)]
    img = [f"i{i}" for i in range(n_img) for _ in range(2)]
    zc = zi[np.repeat(np.arange(n_img), 2)] + 0.3 * rng.normal(size=(2 * n_img, d)).astype(np.float32) / np.sqrt(d)
    texts = [" ".join(rng.choice(WORDS, 5)) for _ in ids]
    base = dict(backbone="hf-dual", model=str(model), dataset="unit", split=split, normalized=True)
    write_dense(root / f"{split}-images.h5", [f"i{i}" for i in range(n_img)], zi, dict(base, modality="image"))
    write_dense(root / f"{split}-captions.h5", ids, zc, dict(base, modality="text"), texts=texts, image_ids=img)


@pytest.fixture(scope="session")
def inference_free_setup(search_setup) -> dict:
    """An inference-free head trained on search_setup's encoded train split (its dense files,
    not encoded again) for 3 epochs with D2S's small-setup flags, the test images sparsified by it
    and indexed with PISA. Keys: root, dense (search_setup's encode-dense directory), head,
    sparse_images, pisa, images."""
    import mmsparse

    s = search_setup
    root, dense = s["root"] / "inference-free", s["dense"]
    head = mmsparse.train_head(dense / "train-images.h5", dense / "train-captions.h5", out=root / "head",
                               method="inference-free", preset="paper", epochs=3, batch_size=128, vocab_min_df=1, eta=0.05,
                               l1_warmup=4, lr_warmup=0, vocab_lr=1e-3, weight_decay=0.01)
    docs = mmsparse.sparsify(head, dense / "test-images.h5", out=root / "sparse" / "test-images.h5")
    return {"root": root, "dense": dense, "head": head, "sparse_images": docs,
            "pisa": mmsparse.build_index(docs, out=root / "index" / "pisa"), "images": s["images"]}
