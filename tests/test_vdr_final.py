"""VDR over the towers' final layers (issue 42) and the dense baseline trained alike: real Flickr8k
images and captions through the real dual encoder with `--final-layer-inputs` (and token / patch
states, to compare with VDR on stored states), a head's final layers reproduce the stored states
before any step, a frozen-final-layer head is today's VDR on those states, gradients reach the
final layers, sparsify and the dense baseline run, and files without the inputs are refused."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import mmsparse
from mmsparse.backbones.base import backbone_from_attrs
from mmsparse.formats.dense import read_dense, read_dense_attrs
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods.head import load_head
from mmsparse.methods.vdr.data import States
from mmsparse.methods.vdr.method import encode_split

from conftest import check_query_is_the_sparsify_row, write_without_final_inputs

VDR = dict(method="vdr", epochs=1, batch_size=8, vocab_min_df=1, vdr_train_k=8, vdr_query_k=8, vdr_doc_k=16)


@pytest.fixture(scope="module")
def states(tmp_path_factory, flickr8k_dir, dual_encoder_dir):
    """val (first 8 images, 40 captions) and test (first 4 images) with final-layer inputs and the
    towers' token / patch states in the same files."""
    root = tmp_path_factory.mktemp("vdr-final")
    data = (flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")
    for split, n in (("val", 8), ("test", 4)):
        mmsparse.encode_dense(*data, out=root / "dense", model=dual_encoder_dir, split=[split], limit=n, workers=0,
                              final_layer_inputs=True, token_states=True, patch_states=True)
    return root, root / "dense"


@pytest.fixture(scope="module")
def tuned(states):
    """A VDR head with tuned final layers, 1 epoch on val (a plumbing check, not a result), the
    final layers at a learning rate large enough to move them."""
    root, dense = states
    return mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=root / "tuned", lr=1e-3,
                               final_lr=1e-3, val_images=dense / "test-images.h5",
                               val_captions=dense / "test-captions.h5", **VDR)


def _inputs(path):
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(f["final_input"][()])
        m = torch.from_numpy(f["final_mask"][()].astype(np.int64)) if "final_mask" in f else None
        st = f["token_states"][()] if "token_states" in f else f["patch_states"][()]
        sm = f["token_mask"][()] if "token_mask" in f else None
    return x, m, st, sm


def test_final_layers_reproduce_the_stored_states_before_any_step(states):
    """positions() of the rebuilt final layers = the towers' token / patch states; pool() projected
    = the stored vectors (float16 inputs: within float16 rounding)."""
    _, dense = states
    bb = backbone_from_attrs(read_dense_attrs(dense / "val-captions.h5"))
    proj = bb.projections()
    for side, kind in (("text", "captions"), ("image", "images")):
        x, m, st, sm = _inputs(dense / f"val-{kind}.h5")
        layer = bb.final_layer_weights(side).eval()
        with torch.no_grad():
            h, hm = layer.positions(x, m)
            p = layer.pool(h, hm)
        if side == "text":
            n = h.shape[1]
            keep = sm[:, :n].astype(bool)
            assert np.abs(h.numpy()[keep] - st[:, :n][keep].astype(np.float32)).max() < 2e-2   # float16 states
        else:
            assert h.shape == (8, 49, 1280)
            assert np.abs(h.numpy() - st.astype(np.float32)).max() < 2e-2
        v = F.normalize(p @ torch.from_numpy(proj[f"{side}_proj_weight"]).T, dim=-1).numpy()
        assert np.abs(v - read_dense(dense / f"val-{kind}.h5").vectors).max() < 2e-3, side


def test_frozen_final_layer_head_is_vdr_on_the_stored_states(states, tmp_path):
    """--freeze-final-layer on final-layer files: the layers keep the backbone's weights, and the
    head's V(x) equals its two DST towers applied to the stored token / patch states (the frozen
    method) within float16 rounding."""
    _, dense = states
    out = mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=tmp_path / "frozen",
                              tune_final_layer=False, **VDR)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["final_layers_tuned"] is False and cfg["text_input"] == cfg["image_input"] == "final_input"
    w = load_file(str(out / "model.safetensors"))
    bb = backbone_from_attrs(read_dense_attrs(dense / "val-captions.h5"))
    assert torch.equal(w["text_final.layer.output.dense.weight"], bb.net.text_model.encoder.layer[5].output.dense.weight)
    assert torch.equal(w["image_final.conv.weight"], bb.net.vision_model.encoder.top_conv.weight)
    head = load_head(out)
    for side, kind in (("text", "captions"), ("image", "images")):
        x, m, st, sm = _inputs(dense / f"test-{kind}.h5")
        with torch.no_grad():
            v_final = head(x, m, side)
            v_states = head.tower(side)(torch.from_numpy(st.astype(np.float32)),
                                        None if sm is None else torch.from_numpy(sm.astype(np.float32)))
        assert torch.allclose(v_final, v_states, rtol=2e-2, atol=2e-2), side
        assert float((v_final - v_states).abs().max()) < 0.05


def test_gradient_reaches_the_final_layers(states, tuned):
    """One backward of the VDR loss sends gradient through the max pool's arg-max positions into
    both final layers; train-head then saves layers that moved from the backbone's."""
    _, dense = states
    head = load_head(tuned)
    head.train()
    x, m, _, _ = _inputs(dense / "val-captions.h5")
    xi, _, _, _ = _inputs(dense / "val-images.h5")
    v_q, v_p = head(x[:8], m[:8], "text"), head(xi[:8], None, "image")
    (F.normalize(v_q, dim=-1) @ F.normalize(v_p, dim=-1).T).diagonal().sum().backward()
    # the text pooler is the dense tower's, not VDR's: VDR pools the token states itself
    for name, mod in (("text", head.text_final.layer), ("image", head.image_final.conv)):
        grads = [p.grad for p in mod.parameters() if p.requires_grad]
        assert grads and all(g is not None for g in grads), name
        assert sum(float(g.abs().sum()) for g in grads) > 0, name
    w = load_file(str(tuned / "model.safetensors"))
    bb = backbone_from_attrs(read_dense_attrs(dense / "val-captions.h5"))
    assert not torch.equal(w["text_final.layer.output.dense.weight"], bb.net.text_model.encoder.layer[5].output.dense.weight)
    assert not torch.equal(w["image_final.conv.weight"], bb.net.vision_model.encoder.top_conv.weight)
    assert torch.equal(w["image_final.bn.running_mean"], bb.net.vision_model.encoder.top_bn.running_mean)  # frozen BN


def test_sparsify_recomputes_through_the_tuned_layers(states, tuned, tmp_path):
    """sparsify of final-layer files = the head's own encoding of their final_input (documents:
    top-k_doc of l2n(V_p); parametric queries: top-k_query ∪ bag of words)."""
    _, dense = states
    head = load_head(tuned)
    for kind, side in (("images", "image"), ("captions", "text")):
        sp = mmsparse.sparsify(tuned, dense / f"test-{kind}.h5", out=tmp_path / f"{kind}.h5")
        st = States(dense / f"test-{kind}.h5", side, "final_input")
        bows = None
        if side == "text":
            from mmsparse.methods.vdr.data import caption_token_sets
            from mmsparse.vocab import to_columns
            raw = caption_token_sets(dense / f"test-{kind}.h5", head.tokenizer, set(head.config["special_ids"]))
            bows = to_columns(raw, head.token_ids.numpy())
        want = encode_split(head, st, side, 16 if side == "image" else 8, "vdr", bows).toarray()
        st.close()
        assert np.allclose(read_sparse(sp).matrix.toarray(), want, atol=1e-6), kind


def test_dense_baseline_trains_and_writes_tuned_vectors(states, tmp_path):
    """--method dense: CLIP's loss on the same final layers and projections; its head recomputes
    the vectors from final_input (moved from the backbone's after training), and the vectors
    before training equal the stored ones."""
    _, dense = states
    out = mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=tmp_path / "dense",
                              method="dense", epochs=2, batch_size=8, lr=1e-3,
                              val_images=dense / "val-images.h5", val_captions=dense / "val-captions.h5")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["method"] == "dense" and cfg["vocab_size"] == 0 and cfg["training"]["val_before"]["R@1"] > 0
    tuned = mmsparse.sparsify(out, dense / "test-images.h5", out=tmp_path / "test-images.h5")
    d, orig = read_dense(tuned), read_dense(dense / "test-images.h5")
    assert d.ids == orig.ids and d.vectors.shape == orig.vectors.shape
    assert np.allclose(np.linalg.norm(d.vectors, axis=1), 1, atol=1e-5)
    assert not np.allclose(d.vectors, orig.vectors, atol=1e-3)                # tuned
    idx = mmsparse.build_index(tuned, out=tmp_path / "index")
    assert json.loads((idx / "mmsparse.json").read_text())["kind"] == "faiss"


def test_files_without_final_inputs_are_refused_in_one_line(states, run_cli, tmp_path):
    _, dense = states
    write_without_final_inputs(dense, tmp_path)
    code, _, err = run_cli("train-head", "--method", "dense", tmp_path / "images.h5", tmp_path / "captions.h5",
                           "-o", tmp_path / "head")
    assert code == 2 and "--final-layer-inputs" in err and "final_input" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "head").exists()


def test_image_head_starts_from_the_dense_models_word_vectors(states):
    """--vdr-image-init words: before any step each image-head row is P_imgᵀ t_v (t_v the term's
    dense text vector), all rows scaled alike; the default (the paper's) is random."""
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.vdr.config import VDRConfig
    from mmsparse.methods.vdr.method import VDR

    _, dense = states
    inputs = TrainInputs(dense / "val-images.h5", dense / "val-captions.h5")
    head, _, _ = VDR(VDRConfig(vocab_min_df=1, vdr_image_init="words")).setup(inputs)
    bb = backbone_from_attrs(read_dense_attrs(dense / "val-captions.h5"))
    terms = [1, 7, len(head.vocab) - 1]
    t = torch.from_numpy(bb.encode_texts([head.vocab[i].removeprefix("##") for i in terms]))
    want = F.normalize(t, dim=-1) @ torch.from_numpy(bb.projections()["image_proj_weight"])
    w = head.image.proj.weight.detach()[terms]
    c = float((w * want).sum() / (want * want).sum())       # the one scale of every row
    assert c > 0 and float((w - c * want).abs().max()) < 1e-4 * float(w.abs().max())
    assert head.config["image_init"] == "words" and float(head.image.proj.bias.abs().max()) == 0
    rand, _, _ = VDR(VDRConfig(vocab_min_df=1)).setup(inputs)
    assert "image_init" not in rand.config and float(rand.image.proj.weight.std()) == pytest.approx(0.02, rel=0.05)


def test_query_and_figures_of_a_final_layer_head(states, tuned, tmp_path):
    """`query` encodes free text through the head's tuned text layer (its query is the caption's
    sparsify row); the validation curve and the word clouds are drawn from the head and its files."""
    import subprocess
    import sys

    from PIL import Image

    _, dense = states
    docs = check_query_is_the_sparsify_row(tuned, dense, tmp_path)
    for args in (["curve", str(tuned)], ["clouds", f"VDR={docs}"]):
        out = tmp_path / f"{args[0]}.png"
        p = subprocess.run([sys.executable, "-m", "mmsparse.methods.vdr", *args, "-o", str(out)], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        with Image.open(out) as im:
            assert im.size[0] > 500 and im.size[1] > 300
    p = subprocess.run([sys.executable, "-m", "mmsparse.methods.vdr", "curve", str(tmp_path), "-o",
                        str(tmp_path / "x.png")], capture_output=True, text=True)
    assert p.returncode != 0 and "no train-head record" in p.stderr and not (tmp_path / "x.png").exists()
