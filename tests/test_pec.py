"""Probabilistic expansion control (Algorithm 1, eq. 6): schedules and empirical keep rates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmsparse.methods.d2s.expansion import ExpansionControl

DF = np.array([0.0, 0.2, 0.5, 0.9, 1.0])


def _terms(b=4000):
    # caption b contains term 0 and term 3 only
    t = torch.zeros(b, len(DF))
    t[:, [0, 3]] = 1
    return t


def test_schedule_after_each_epoch():
    pec = ExpansionControl("caption-word", DF, epochs=4)
    assert pec.p_c == 0.0
    np.testing.assert_allclose(pec.p_v.numpy(), 1 - DF, atol=1e-6)
    for e in range(1, 6):
        pec.step_epoch()
        assert pec.p_c == pytest.approx(min(1.0, e / 4))
        np.testing.assert_allclose(pec.p_v.numpy(), np.minimum(1, 1 - DF + DF * e / 4), atol=1e-6)


@pytest.mark.parametrize("epoch", [1, 2])
def test_empirical_keep_rates(epoch):
    pec = ExpansionControl("caption-word", DF, epochs=4, mask_caption_terms=False)
    pec.set_epoch(epoch)
    g = torch.Generator().manual_seed(0)
    t = _terms(64)
    draws = torch.stack([pec.mask(t, g) for _ in range(4000)])     # [draws, B, V]
    pc, pv = pec.p_c, pec.p_v.numpy()
    # own terms (0, 3) always kept; others kept with p_c * p_v
    assert torch.all(draws[:, :, [0, 3]] == 1)
    rate = draws[:, :, [1, 2, 4]].mean((0, 1)).numpy()
    np.testing.assert_allclose(rate, pc * pv[[1, 2, 4]], atol=0.025)
    # one caption-level draw per batch (Algorithm 1): all captions of a batch expand or none does
    other = draws[:, :, [1, 2, 4]]
    assert torch.all(other.amin(1) == other.amax(1))
    e_c = other.amax(2)
    assert abs(float(e_c.mean()) - pc * (1 - np.prod(1 - pv[[1, 2, 4]]))) < 0.03


def test_mask_caption_terms_flag():
    pec = ExpansionControl("caption-word", DF, epochs=4, mask_caption_terms=True)
    g = torch.Generator().manual_seed(1)
    t = _terms(64)
    draws = torch.stack([pec.mask(t, g) for _ in range(4000)])
    own = draws[:, :, [0, 3]].mean((0, 1)).numpy()
    np.testing.assert_allclose(own, pec.p_v.numpy()[[0, 3]], atol=0.025)     # 1.0 and 0.1
    assert torch.all(draws[:, :, [1, 2, 4]] == 0)                         # p_c = 0 at epoch 0


def test_other_modes():
    t = _terms(8)
    g = torch.Generator().manual_seed(0)
    assert ExpansionControl("full", DF, 3).mask(t, g) is None
    assert torch.equal(ExpansionControl("none", DF, 3).mask(t, g), t)
    pec = ExpansionControl("caption", DF, 2)
    pec.set_epoch(1)                                           # p_c = 0.5, no word-level control
    m = torch.stack([pec.mask(t, g) for _ in range(4000)])
    assert torch.all(m[:, :, [0, 3]] == 1)
    rows = m[:, :, [1, 2, 4]]
    assert torch.all(rows.amin(2) == rows.amax(2))             # whole caption expands or not
    assert abs(float(rows.mean()) - 0.5) < 0.03


def test_state_round_trip():
    a = ExpansionControl("caption-word", DF, 5)
    a.step_epoch()
    a.step_epoch()
    b = ExpansionControl("caption-word", DF, 5)
    b.load_state_dict(a.state_dict())
    assert b.p_c == a.p_c and torch.equal(b.p_v, a.p_v) and b.epoch == 2


def test_schedule_endpoints_and_monotone():
    """Eq. 6: p_c 0 -> 1 and p_v 1 - df -> 1 in E steps of 1/E and df/E, never decreasing, capped at 1."""
    pec = ExpansionControl("caption-word", DF, epochs=3)
    seen = [(pec.p_c, pec.p_v.clone())]
    for _ in range(4):
        pec.step_epoch()
        seen.append((pec.p_c, pec.p_v.clone()))
    assert seen[0][0] == 0.0 and seen[3][0] == pytest.approx(1.0) and seen[4][0] == 1.0
    np.testing.assert_allclose(seen[3][1].numpy(), 1.0, atol=1e-6)
    for (pa, va), (pb, vb) in zip(seen, seen[1:]):
        assert pb >= pa and torch.all(vb >= va - 1e-7)
    np.testing.assert_allclose((seen[1][1] - seen[0][1]).numpy(), DF / 3, atol=1e-6)


def test_mask_on_column_subset_equals_full_mask_columns():
    pec = ExpansionControl("caption-word", DF, epochs=4)
    pec.set_epoch(2)
    t = _terms(16)
    cols = torch.tensor([4, 0, 2])
    for seed in range(20):
        full = pec.mask(t, torch.Generator().manual_seed(seed))
        sub = pec.mask(t[:, cols], torch.Generator().manual_seed(seed), cols)
        assert torch.equal(sub, full[:, cols])
