"""The inference-free head's two training options: image dropout (drawn from the trainer's
generator, so runs are repeatable and resume exactly) and the expected-FLOPs term of the training
queries (it must shorten the posting lists the training queries walk)."""

from __future__ import annotations

import numpy as np
import pytest
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
    plain = _fit(method_data, image_dropout=0.0, eta_query_flops=0.5)   # the default drops 0.3
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


def test_loss_keeps_the_captions_sparse_and_equals_the_dense_product(method_data):
    """The loss scores captions against images with the captions as a sparse table lookup
    (gathered_scores): the loss, its parts and every gradient equal the dense q_Cᵀ s_I of the
    method's definition (module docstring), the table weights' gradient included."""
    from mmsparse.methods.d2s.head import top_k_rows
    from mmsparse.methods.d2s.loss import drop_coordinates, eta_at, soft_ce, sparsity
    from mmsparse.vocab import indicator_cols

    m, head, train, _ = _setup(method_data, image_dropout=0.2, eta_query_flops=0.5, query_lr=1e-2)
    with torch.no_grad():
        head.query_weight.mul_(torch.linspace(-0.5, 2.0, len(head.query_weight)))   # some weights <= 0
    idx = torch.arange(0, 64, 2)
    cfg = m.cfg

    def dense(gen):   # the definition, on [B, live columns] matrices
        uimg = torch.unique(train.cap_img[idx])
        zc, zi = train.z_cap[idx], train.z_img[uimg]
        s_img, cols = head.forward_live(drop_coordinates(head.centered(zi, "image"), cfg.image_dropout, gen))
        s_img = top_k_rows(s_img, head.top_k("image"))
        q = indicator_cols(train.tok[idx], cols, len(head.vocab)) * head.query_weight[cols].clamp(min=0)
        t = (zc @ zi.T) / cfg.temperature
        s = q @ s_img.T
        ci, ic = soft_ce(t, s), soft_ce(t.T, s.T)
        reg = sparsity(s_img, cfg.sparsity_loss)
        qf = (m.query_df[cols] * s_img.mean(0)).sum()
        loss = (1.0 - cfg.lam) * (ci + ic) + cfg.lam * eta_at(5, cfg.eta, m.l1_warm) * reg \
            + cfg.lam * eta_at(5, cfg.eta_query_flops, m.l1_warm) * qf
        flops = float(((q > 0).float().mean(0) * (s_img > 0).float().mean(0)).sum())
        return loss, {k: float(x.detach()) for k, x in (("ci", ci), ("ic", ic), ("l1_img", reg), ("query_flops", qf))} \
            | {"flops": flops}

    out = []
    for f in (dense, lambda gen: m.loss(head, (idx, train), 5, gen, "cpu")):
        head.zero_grad()
        loss, parts = f(torch.Generator().manual_seed(4))
        loss.backward()
        out.append((float(loss.detach()), parts, {k: p.grad.clone() for k, p in head.named_parameters() if p.grad is not None}))
    (l0, p0, g0), (l1, p1, g1) = out
    assert l1 == pytest.approx(l0, rel=1e-5)
    assert all(p1[k] == pytest.approx(p0[k], rel=1e-4, abs=1e-7) for k in p0)
    assert g0.keys() == g1.keys() and "query_weight" in g1
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-7)
