"""VDR over the final layers of ViT towers (the paper examples' BLIP and ALBEF): tiny random models
(conftest) on real Flickr8k images. The image head pools the patch positions only by default, as
the paper's image encoder (no [CLS]: App. A, 49 positions), or [CLS] and the patches with
--vdr-image-cls; the `words` image init works through BLIP's and ALBEF's projections; a head trains
through the ViT block and sparsify recomputes the documents through the tuned layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mmsparse
from mmsparse.backbones.base import backbone_from_attrs
from mmsparse.backbones.final_layer import FinalLayer
from mmsparse.formats.dense import read_dense_attrs
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods.base import TrainInputs
from mmsparse.methods.head import load_head
from mmsparse.methods.vdr.config import VDRConfig
from mmsparse.methods.vdr.head import elu1p, l2n, topk_mask
from mmsparse.methods.vdr.method import VDR

K_DOC = 8


@pytest.fixture(scope="module")
def states(tmp_path_factory, flickr8k_dir, tiny_blip, tiny_albef):
    """{backbone: dense dir} of the first 6 val and 3 test Flickr8k images with final-layer inputs."""
    out = {}
    for name, model in (("blip", tiny_blip), ("albef", tiny_albef)):
        d = tmp_path_factory.mktemp(f"vdr-{name}") / "dense"
        for split, n in (("val", 6), ("test", 3)):
            mmsparse.encode_dense(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out=d,
                                  model=model, backbone=name, split=[split], limit=n, workers=0,
                                  final_layer_inputs=True)
        out[name] = d
    return out


def _image_v(head, x: torch.Tensor, cls: bool) -> torch.Tensor:
    """V_p by hand: the head's ViT block on the stored inputs, [CLS] (position 0) kept or dropped,
    LayerNorm without affine, W h + b, max over positions, elu1p."""
    h, _ = FinalLayer.positions(head.image_final, x)
    h = h if cls else h[:, 1:]
    u = F.linear(F.layer_norm(h, (h.shape[-1],), eps=head.image.eps), head.image.proj.weight, head.image.proj.bias)
    return elu1p(u.amax(1))


@pytest.mark.parametrize("name", ["blip", "albef"])
def test_image_head_pools_the_patches_and_starts_from_word_vectors(name, states):
    """Before any step: the default head drops the ViT's [CLS] position, --vdr-image-cls keeps it
    (their V_p differ); `--vdr-image-init words` gives W_img[v] ∝ P_imgᵀ t_v through the backbone's
    own image projection."""
    d = states[name]
    inputs = TrainInputs(d / "val-images.h5", d / "val-captions.h5")
    x = torch.from_numpy(_final_input(d / "val-images.h5"))
    heads = {}
    for cls in (False, True):
        head, _, _ = VDR(VDRConfig(vocab_min_df=1, vdr_image_init="words", vdr_image_cls=cls)).setup(inputs)
        head.eval()
        assert head.config.get("image_skip_cls", False) is (not cls)
        with torch.no_grad():
            full, _ = FinalLayer.positions(head.image_final, x)        # [B, P, h], [CLS] first
            pos, _ = head.positions(x, "image")
            assert torch.equal(pos, full if cls else full[:, 1:])
            v = head(x, None, "image")
            assert torch.allclose(v, _image_v(head, x, cls), atol=1e-5)
        assert v.shape == (x.shape[0], len(head.vocab))
        heads[cls] = v
    assert not torch.allclose(heads[False], heads[True], atol=1e-3)
    bb = backbone_from_attrs(read_dense_attrs(d / "val-captions.h5"))
    terms = [0, 3, len(head.vocab) - 1]
    t = F.normalize(torch.from_numpy(bb.encode_texts([head.vocab[i].removeprefix("##") for i in terms])), dim=-1)
    want = t @ torch.as_tensor(np.asarray(bb.projections()["image_proj_weight"]), dtype=torch.float32)
    w = head.image.proj.weight.detach()[terms]
    c = float((w * want).sum() / (want * want).sum())
    assert c > 0 and float((w - c * want).abs().max()) < 1e-4 * float(w.abs().max())


def _final_input(path) -> np.ndarray:
    import h5py
    with h5py.File(path, "r") as f:
        return f["final_input"][()].astype(np.float32)


@pytest.mark.parametrize("name", ["blip", "albef"])
def test_vdr_trains_the_vit_block_and_sparsify_recomputes_through_it(name, states, tmp_path):
    """One epoch moves the ViT block's weights away from the backbone's (the gradient crossed the max
    pool's arg-max patches into the block); sparsify of the test images = top-k_doc of l2n(V_p)
    computed by hand through the tuned block, patches only."""
    d = states[name]
    out = mmsparse.train_head(d / "val-images.h5", d / "val-captions.h5", out=tmp_path / "vdr", method="vdr",
                              epochs=1, batch_size=10, vocab_min_df=1, vdr_train_k=4, vdr_query_k=4, vdr_doc_k=K_DOC,
                              lr=1e-2, final_lr=1e-2, vdr_image_init="words")
    head = load_head(out).eval()
    assert {k: v["kind"] for k, v in head.config["final_layers"].items()} == {"text": "bert", "image": "vit"}
    assert head.config["image_skip_cls"] is True and head.config["image_init"] == "words"
    bb = backbone_from_attrs(read_dense_attrs(d / "val-images.h5"))
    before = bb.final_layer_weights("image").state_dict()
    moved = [k for k, v in head.image_final.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("layer.") for k in moved), moved
    sp = read_sparse(mmsparse.sparsify(out, d / "test-images.h5", out=tmp_path / "docs.h5"))
    with torch.no_grad():
        p = l2n(_image_v(head, torch.from_numpy(_final_input(d / "test-images.h5")), cls=False))
    want = (p * topk_mask(p, K_DOC)).numpy()
    assert np.allclose(sp.matrix.toarray(), want, atol=1e-5)
    assert (sp.matrix.getnnz(axis=1) == min(K_DOC, len(head.vocab))).all() and len(head.vocab) > K_DOC
