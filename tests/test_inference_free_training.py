"""The inference-free head's two training options: image dropout (drawn from the trainer's
generator, so runs are repeatable and resume exactly) and the expected-FLOPs term of the training
queries (it must shorten the posting lists the training queries walk)."""

from __future__ import annotations

import numpy as np
import torch

from mmsparse.methods import get_method
from mmsparse.methods.base import TrainInputs, make_config
from mmsparse.methods.d2s.method import encode_sparse
from mmsparse.trainer import fit

BASE = dict(epochs=3, batch_size=32, l1_warmup=2, eta=1e-3, vocab_min_df=1, lr_warmup=0)


def _setup(data, **extra):
    cls = get_method("inference-free")
    m = cls(make_config(cls.config_class, {**BASE, **extra}))
    ins = TrainInputs(train_images=data / "train-images.h5", train_captions=data / "train-captions.h5",
                      val_images=data / "val-images.h5", val_captions=data / "val-captions.h5")
    head, train, val = m.setup(ins)
    return m, head, train, val


def _fit(data, stop=None, ckpt=None, **extra):
    m, head, train, val = _setup(data, **extra)
    return fit(m, head, train, val, ckpt_dir=ckpt, stop_after_epoch=stop)


def test_image_dropout_is_repeatable_resumes_exactly_and_changes_the_head(method_data, tmp_path):
    opts = dict(image_dropout=0.3, eta_query_flops=0.5)
    whole = _fit(method_data, **opts)
    again = _fit(method_data, **opts)
    for k in whole.state:
        assert torch.equal(whole.state[k], again.state[k]), k
    _fit(method_data, stop=1, ckpt=tmp_path / "ckpt", **opts)
    resumed = _fit(method_data, ckpt=tmp_path / "ckpt", **opts)
    for k in whole.state:
        assert torch.equal(resumed.state[k], whole.state[k]), k
    plain = _fit(method_data, eta_query_flops=0.5)
    assert any(not torch.equal(plain.state[k], whole.state[k]) for k in whole.state)


def test_expected_flops_term_shortens_the_postings_queries_walk(method_data):
    """Σ_t p_q(t)·df_t(images): the postings a training query walks per image, on the training
    images; a large η_q must cut it well below the run without the term."""

    def walked(eta_q: float) -> float:
        m, head, train, _ = _setup(method_data, eta_query_flops=eta_q, epochs=6)
        res = fit(m, head, train, None)
        head.load_state_dict(res.state)
        docs = encode_sparse(head, train.z_img, side="image")
        df = np.asarray((docs > 0).mean(0)).ravel()
        return float((m.query_df.numpy() * df).sum())

    off, on = walked(0.0), walked(100.0)   # measured 1.54 vs 0.97 postings per image
    assert on < 0.75 * off, (on, off)
