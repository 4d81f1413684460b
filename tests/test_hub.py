"""Shareable heads: save_pretrained / from_pretrained round trip, the generated model card, hub ids
through a local Hugging Face cache, and push_to_hub's upload folder. The network is never
touched: the tests run with HF_HUB_OFFLINE=1 (conftest) and check that it is on."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.dense import read_dense
from mmsparse.methods.head import SparseHead, _same_weights, model_card, push_folder


@pytest.fixture(scope="module")
def trained_head(method_data, tmp_path_factory):
    """A D2S head trained (2 epochs, with validation) on the conftest method data over the real
    tokenizer's vocabulary (terms of the training captions)."""
    out = tmp_path_factory.mktemp("hub") / "d2s"
    return mmsparse.train_head(method_data / "train-images.h5", method_data / "train-captions.h5", out=out,
                               val_images=method_data / "val-images.h5", val_captions=method_data / "val-captions.h5",
                               epochs=2, batch_size=32, l1_warmup=2, eta=1e-3, vocab_min_df=1)


def _outputs(head, method_data):
    z = torch.from_numpy(read_dense(method_data / "test-images.h5").vectors)
    with torch.no_grad():
        return head(z, side="image").numpy()


def test_model_card_describes_the_head(trained_head, dual_encoder_dir, tmp_path):
    card = (trained_head / "README.md").read_text(encoding="utf-8")
    cfg = json.loads((trained_head / "config.json").read_text(encoding="utf-8"))
    tr = cfg["training"]
    assert card.startswith("---\nlibrary_name: mmsparse\n") and "tags: [mmsparse, learned-sparse-retrieval" in card
    assert "| method | `d2s` |" in card and "| backbone | `hf-dual` |" in card
    assert f"| vocabulary size | {cfg['vocab_size']} terms |" in card
    assert cfg["vocab_size"] == len((trained_head / "vocab.txt").read_text(encoding="utf-8").split("\n")) - 1
    assert f"| vocabulary source | `{dual_encoder_dir.name}` |" in card
    assert "- dataset: unit" in card and "- train images: `train-images.h5`" in card
    assert "- val captions: `val-captions.h5`" in card
    # the chosen epoch's validation figures, as recorded
    assert f"Chosen epoch {tr['best_epoch']} (by `R@1`)" in card
    lines = card.splitlines()
    at = lines.index(f"Chosen epoch {tr['best_epoch']} (by `R@1`):")
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    shown = dict(zip(cells(lines[at + 2]), cells(lines[at + 4])))
    assert set(shown) == set(tr["val"]) and shown["R@1"] == f"{tr['val']['R@1']:.4f}"
    assert shown["FLOPs"] == f"{tr['val']['FLOPs']:.4f}"
    assert card.count("\n| 1 | ") == 1 and card.count("\n| 2 | ") == 1          # one row per epoch
    # the resolved config, as JSON that train-head --config could read back
    block = re.search(r"```json\n(.*?)```", card, re.S).group(1)
    assert json.loads(block) == tr["config"] and json.loads(block)["eta"] == 1e-3
    # never the training machine's paths
    assert str(trained_head.parent) not in card and str(dual_encoder_dir) not in card
    assert not re.search(r"(?<![\w`])/(work|root|home|tmp)/", card)
    # a card from a config without validation says so instead of inventing figures
    bare = model_card({"method": "bm25v", "dim": 8, "vocab_size": 32, "training": {"backbone": "clip"}})
    assert "No validation figures were recorded" in bare and "learned (no text vocabulary)" in bare


def test_save_load_round_trip(trained_head, method_data, tmp_path):
    head = mmsparse.load_head(trained_head)
    assert head.source_dir == trained_head
    again = head.save_pretrained(tmp_path / "copy")
    assert {p.name for p in again.iterdir()} >= {"config.json", "model.safetensors", "vocab.txt", "README.md"}
    loaded = SparseHead.from_pretrained(again)
    assert type(loaded) is type(head) and loaded.vocab == head.vocab and loaded.config == head.config
    np.testing.assert_array_equal(_outputs(loaded, method_data), _outputs(head, method_data))
    assert (again / "README.md").read_text(encoding="utf-8") == (trained_head / "README.md").read_text(encoding="utf-8")


def test_hub_id_loads_from_the_local_hub_cache(trained_head, method_data, tmp_path):
    """A hub id resolves through huggingface_hub.snapshot_download; offline it reads the cache,
    laid out here as the hub client lays it out (models--OWNER--NAME/snapshots/COMMIT + refs/main)."""
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE, "tests must run with HF_HUB_OFFLINE=1"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--mmsparse-test--d2s-flickr"
    shutil.copytree(trained_head, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    head = SparseHead.from_pretrained("mmsparse-test/d2s-flickr", cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(_outputs(head, method_data), _outputs(mmsparse.load_head(trained_head), method_data))
    with pytest.raises(InputError, match="Hugging Face hub repository 'mmsparse-test/missing' could not be fetched"):
        SparseHead.from_pretrained("mmsparse-test/missing", cache_dir=tmp_path / "cache")
    with pytest.raises(InputError, match="head not found"):                    # a path, not a hub id
        SparseHead.from_pretrained(tmp_path / "no" / "such" / "dir")


def test_push_to_hub_uploads_the_head_directory_and_fails_cleanly_offline(trained_head, tmp_path):
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE, "tests must run with HF_HUB_OFFLINE=1"
    head = mmsparse.load_head(trained_head)
    # the folder push_to_hub uploads for an unchanged loaded head: the directory as trained (its
    # training provenance intact), with its card
    up = push_folder(trained_head, tmp_path / "up")
    assert json.loads((up / "config.json").read_text()) == json.loads((trained_head / "config.json").read_text())
    assert (up / "README.md").is_file() and _same_weights(head, trained_head)
    (up / "README.md").unlink()                                     # a head saved before cards existed
    again = push_folder(up, tmp_path / "up2")
    assert (again / "README.md").read_text(encoding="utf-8").startswith("---\nlibrary_name: mmsparse")
    with torch.no_grad():
        next(head.parameters()).add_(1.0)
    assert not _same_weights(head, trained_head)                    # changed weights: saved afresh
    with pytest.raises(InputError, match="upload to the Hugging Face hub failed .*HF_HUB_OFFLINE"):
        head.push_to_hub("mmsparse-test/d2s-flickr", token="hf_not_a_token")
