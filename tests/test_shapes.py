"""Fixed batch shapes (backbones/shapes.py): on CUDA every batch is padded to one shape; the
padding must not change any real row's outputs. Checked here on the CPU with the padding forced on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmsparse.backbones import load_backbone, shapes
from mmsparse.backbones.encode import encode_captions_file, encode_images_file
from mmsparse.backbones.shapes import pad_token_batch
from mmsparse.data import read_karpathy
from mmsparse.formats import read_dense


def test_pad_token_batch_rounds_length_and_repeats_rows():
    batch = {"input_ids": torch.tensor([[101, 5, 6, 102, 0], [101, 7, 102, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
             "token_type_ids": torch.zeros(2, 5, dtype=torch.long)}
    out = pad_token_batch(batch, rows=4, max_length=64, pad_id=0, multiple=16)
    assert out["input_ids"].shape == (4, 16) and out["attention_mask"].shape == (4, 16)
    assert out["attention_mask"][:, 5:].sum() == 0 and (out["input_ids"][:2, :5] == batch["input_ids"]).all()
    assert (out["input_ids"][2:] == out["input_ids"][1]).all() and (out["input_ids"][1, :5] == batch["input_ids"][1]).all()
    # never past the model's max_length (CLIP: 77 positions), never shorter than the batch
    assert pad_token_batch(batch, 2, 12, 0, 16)["input_ids"].shape == (2, 12)
    assert pad_token_batch(batch, 2, 3, 0, 16)["input_ids"].shape == (2, 5)


@pytest.mark.parametrize("padded", [False, True])
def test_padded_batches_give_the_same_rows(flickr8k_dir, dual_encoder_dir, tmp_path, monkeypatch, padded):
    """Images in batches of 4 (the last one of 2) and captions in batches of 8, with the extras that
    store token arrays: padded to fixed shapes (as on CUDA) or not, the files hold the same rows."""
    split = read_karpathy(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")["test"]
    bb = load_backbone("hf-dual", dual_encoder_dir, "cpu")
    attrs_i = {"modality": "image", "dataset": "t", "split": "test"}
    attrs_c = {"modality": "text", "dataset": "t", "split": "test"}
    kw_i = {"batch_size": 4, "workers": 0, "pre_projection": True}
    kw_c = {"batch_size": 8, "token_states": True, "final_layer_inputs": True}
    ref_i = read_dense(encode_images_file(bb, split.images[:10], tmp_path / "i0.h5", attrs_i, **kw_i).path)
    ref_c = encode_captions_file(bb, split.captions[:21], tmp_path / "c0.h5", attrs_c, **kw_c).path
    calls = []
    pad = shapes.pad_token_batch
    monkeypatch.setattr(shapes, "fixed_shapes", lambda device: padded)
    monkeypatch.setattr(shapes, "pad_token_batch", lambda *a, **k: calls.append(a[0]["input_ids"].shape) or pad(*a, **k))
    got_i = read_dense(encode_images_file(bb, split.images[:10], tmp_path / "i1.h5", attrs_i, **kw_i).path)
    got_c = encode_captions_file(bb, split.captions[:21], tmp_path / "c1.h5", attrs_c, **kw_c).path
    assert bool(calls) == padded and all(n <= 8 for n, _ in calls)
    assert got_i.ids == ref_i.ids
    np.testing.assert_allclose(got_i.vectors, ref_i.vectors, atol=1e-5)
    import h5py
    with h5py.File(ref_c, "r") as a, h5py.File(got_c, "r") as b:
        assert sorted(a) == sorted(b)
        for k in ("token_mask", "token_ids", "final_mask"):
            np.testing.assert_array_equal(a[k][:], b[k][:])
        for k in ("vectors", "token_states", "final_input"):
            np.testing.assert_allclose(a[k][:].astype(np.float32), b[k][:].astype(np.float32),
                                       atol=2e-3 if k != "vectors" else 1e-5)  # states: float16
