"""D2S head (eq. 4-5), its sparse-aware backward, persistence, and the eq. 7 loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmsparse.methods.d2s.expansion import ExpansionControl
from mmsparse.methods.d2s.head import D2SHead
from mmsparse.methods.d2s.loss import d2s_loss, drop_coordinates, eta_at
from mmsparse.methods.head import load_head
from mmsparse.vocab import Vocab, document_frequency, indicator, pad_ids, to_columns


def _head(d=8, v=50, omega=6, seed=0, bias=0.0):
    g = torch.Generator().manual_seed(seed)
    voc = Vocab([f"t{i}" for i in range(v)], torch.randn(v, omega, generator=g), None, "random")
    torch.manual_seed(seed)
    return D2SHead.from_vocab(d, voc, {"dataset": "unit"}, init_bias=bias)


def _reference(head, z):
    return torch.log1p(torch.relu(head.w2(head.norm(head.w1(z)))))


def test_shapes_nonnegative_and_w2_init():
    head = _head()
    z = torch.randn(5, 8)
    s = head(z)
    assert s.shape == (5, 50) and s.dtype == torch.float32
    assert (s >= 0).all() and (s > 0).any() and (s == 0).any()
    assert head.config["omega"] == 6 and head.config["vocab_size"] == 50 and head.config["dim"] == 8
    assert torch.equal(head.token_ids, torch.arange(50))
    torch.testing.assert_close(s, _reference(head, z))


@pytest.mark.parametrize("bias", [0.0, -2.5])   # dense path / live-columns-only path
def test_sparse_backward_matches_autograd(bias):
    head = _head(v=200, bias=bias)
    z = torch.randn(7, 8)
    mask = (torch.rand(7, 200) < 0.3).float()
    w = torch.rand(7, 200)
    out = {}
    for name, fn in (("fast", head), ("ref", lambda x: _reference(head, x))):
        head.zero_grad()
        ((fn(z) * mask * w).sum() + fn(z).pow(2).mean()).backward()
        out[name] = {k: p.grad.clone() for k, p in head.named_parameters()}
    for k in out["ref"]:
        torch.testing.assert_close(out["fast"][k], out["ref"][k], rtol=1e-4, atol=1e-6)


def test_save_load_round_trip(tmp_path):
    head = _head()
    with torch.no_grad():
        head.w2.bias.uniform_(-1, 1)
    head.save_pretrained(tmp_path / "h")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        assert (tmp_path / "h" / name).is_file()
    back = load_head(tmp_path / "h")
    assert isinstance(back, D2SHead) and back.vocab == head.vocab
    assert back.config["training"] == {"dataset": "unit"}
    z = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(z), head(z))


def test_loss_hand_checked():
    # two captions of two images; sparse vectors on 2 terms
    s_cap = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    s_img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_cap = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, parts = d2s_loss(s_cap, s_img, z_cap, z_img, tau=1.0, lam=0.5, eta=0.1)
    # teacher rows softmax([1, 0]) and softmax([0, 1]); student S = [[1, 0], [0, 2]]
    pt = [math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1)]
    ls = lambda a, b: [a - math.log(math.exp(a) + math.exp(b)), b - math.log(math.exp(a) + math.exp(b))]
    r0, r1 = ls(1, 0), ls(0, 2)
    ci = -(pt[0] * r0[0] + pt[1] * r0[1] + pt[1] * r1[0] + pt[0] * r1[1]) / 2
    # I->C uses the transposed scores: image rows [1, 0] and [0, 2] again (S is diagonal)
    ic = ci
    l1 = (1 + 1) / 2 + (1 + 2) / 2
    assert parts["ci"] == pytest.approx(ci, rel=1e-6) and parts["ic"] == pytest.approx(ic, rel=1e-6)
    assert parts["l1_img"] == pytest.approx(1.0) and parts["l1_cap"] == pytest.approx(1.5)
    assert float(loss) == pytest.approx(0.5 * (ci + ic) + 0.5 * 0.1 * l1, rel=1e-6)


def test_loss_teacher_has_no_gradient():
    z_cap = torch.randn(3, 4, requires_grad=True)
    s = torch.rand(3, 5, requires_grad=True)
    loss, _ = d2s_loss(s, torch.rand(3, 5), z_cap, torch.randn(3, 4))
    loss.backward()
    assert z_cap.grad is None and s.grad is not None


def test_eta_warmup_quadratic():
    assert eta_at(0, 1e-3, 100) == 0.0
    assert eta_at(50, 1e-3, 100) == pytest.approx(0.25e-3)
    assert eta_at(100, 1e-3, 100) == pytest.approx(1e-3)
    assert eta_at(500, 1e-3, 100) == pytest.approx(1e-3)
    assert eta_at(0, 1e-3, 0) == pytest.approx(1e-3)


def test_vocab_helpers():
    ids = [np.array([1, 3]), np.array([3]), np.array([], dtype=np.int64)]
    assert document_frequency(ids, 5).tolist() == [0, 1 / 3, 0, 2 / 3, 0]
    cols = to_columns(ids, np.array([3, 4, 1]))           # head keeps tokenizer ids 3, 4, 1
    assert [c.tolist() for c in cols] == [[0, 2], [0], []]
    ind = indicator(pad_ids(cols, 3), 3)
    assert ind.tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("state", ["init", "sparse"])
def test_live_columns_training_forward_is_exact(state):
    """The D2S loss's forward_live + column-restricted expansion mask == the full-|V| computation."""
    from mmsparse.vocab import indicator_cols

    head = _head(d=32, v=400, omega=16, bias=-9.0 if state == "sparse" else 0.0)
    g = np.random.default_rng(0)
    zi = torch.nn.functional.normalize(torch.randn(32, 32), dim=1)
    zc = torch.nn.functional.normalize(zi.repeat_interleave(2, 0) + 0.5 * torch.randn(64, 32), dim=1)
    token_ids = [np.unique(np.minimum(g.zipf(1.3, 12) - 1, 399)) for _ in range(64)]
    tok = torch.from_numpy(pad_ids(token_ids, 400))
    pec = ExpansionControl("caption-word", document_frequency(token_ids, 400), 6)
    pec.set_epoch(3)
    idx = torch.arange(64)
    out = []
    for live in (False, True):
        head.zero_grad()
        g = torch.Generator().manual_seed(1)
        if live:
            s, cols = head.forward_live(torch.cat([zc, zi]))
            m = pec.mask(indicator_cols(tok[idx], cols, 400), g, cols)
            assert len(cols) < 400 if state == "sparse" else len(cols) == 400
        else:
            s = head(torch.cat([zc, zi]))
            m = pec.mask(indicator(tok[idx], 400), g)
        loss, _ = d2s_loss(s[:64] * m, s[64:], zc, zi, 1e-3, 0.5, 1e-3, s_cap_l1=s[:64])
        loss.backward()
        out.append((loss.detach(), {k: p.grad.clone() for k, p in head.named_parameters()}))
    torch.testing.assert_close(out[0][0], out[1][0])
    for k in out[0][1]:
        torch.testing.assert_close(out[1][1][k], out[0][1][k], rtol=1e-5, atol=1e-7)


def _synthetic_pairs(v: int, n_img: int = 40, pieces: bool = False):
    """(PairData, vocab, token_ids): n_img unit image vectors [n_img, 16], 3 noisy captions each
    with Zipf-drawn terms of a v-term vocabulary of letter pairs (every fifth a "##" piece with
    `pieces`); seeded."""
    from mmsparse.methods.pairs import PairData

    g = np.random.default_rng(0)
    rng = torch.Generator().manual_seed(0)
    zi = torch.nn.functional.normalize(torch.randn(n_img, 16, generator=rng), dim=1)
    cap_img = torch.arange(n_img).repeat_interleave(3)
    zc = torch.nn.functional.normalize(zi[cap_img] + 0.5 * torch.randn(len(cap_img), 16, generator=rng), dim=1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = [("##" if pieces and i % 5 == 0 else "") + letters[i // 26] + letters[i % 26] for i in range(v)]
    token_ids = [np.unique(np.minimum(g.zipf(1.3, 10) - 1, v - 1)) for _ in range(len(cap_img))]
    train = PairData(zi, zc, cap_img, [f"i{i}" for i in range(n_img)], [f"c{i}" for i in range(len(cap_img))],
                     [""] * len(cap_img), {}, {}, tok=torch.from_numpy(pad_ids(token_ids, v)), token_ids=token_ids)
    return train, vocab, token_ids


@pytest.mark.parametrize("options", [
    dict(expansion="caption-word", mask_caption_terms=False, l1_caption="raw", sparsity_loss="flops",
         caption_terms_weight=1.0, doc_words_weight=3.0),
    dict(expansion="caption-word", sparsity_loss="l1", doc_words_weight=1.0, doc_words_temperature=0.2),
    dict(expansion="caption", l1_caption="masked", caption_terms_weight=0.5),
    dict(expansion="full", sparsity_loss="flops"),
    dict(expansion="none")])
@pytest.mark.parametrize("bias", [0.0, -1.5])
def test_gated_training_loss_equals_the_dense_one(options, bias):
    """A head gated on both sides trains on the entries its gates keep (_gated_loss, a sparse
    backward): the loss, its parts and every gradient equal the [B + U, live columns] computation
    (_dense_loss) on the same batch, with the same random draws (dropout, expansion masks)."""
    from mmsparse.methods.base import make_config
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S, image_words

    v = 300
    train, vocab, token_ids = _synthetic_pairs(v, pieces=True)
    zc, zi, cap_img = train.z_cap, train.z_img, train.cap_img
    cfg = make_config(D2SConfig, dict(epochs=4, image_dropout=0.2, doc_top_k=24, query_top_k=12, eta=0.05,
                                      **options))
    m = D2S(cfg)
    m.pec = ExpansionControl(cfg.expansion, document_frequency(token_ids, v), cfg.epochs, cfg.mask_caption_terms)
    m.pec.set_epoch(2)
    m.l1_warm = 0
    if cfg.doc_words_weight > 0:
        m.img_words, m.word_weight = image_words(train, vocab, cfg.doc_words_target, cfg.doc_words_max_df)
    voc = Vocab(vocab, torch.randn(v, 8, generator=torch.Generator().manual_seed(3)), None, "random")
    torch.manual_seed(0)
    head = D2SHead.from_vocab(16, voc, {}, init_bias=bias, doc_top_k=24, query_top_k=12)
    idx = torch.randperm(len(cap_img), generator=torch.Generator().manual_seed(1))[:48]
    out = []
    for path in (m._dense_loss, m._gated_loss):
        head.zero_grad()
        gen = torch.Generator().manual_seed(5)
        uimg = torch.unique(cap_img[idx])
        z = torch.cat([zc[idx], drop_coordinates(zi[uimg], cfg.image_dropout, gen)])
        loss, parts = path(head, z, idx, uimg, zc[idx], zi[uimg], train, 7, gen)
        loss.backward()
        out.append((loss.detach(), parts, {k: p.grad.clone() for k, p in head.named_parameters()}))
    (l0, p0, g0), (l1, p1, g1) = out
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    assert p0.keys() == p1.keys() and all(p1[k] == pytest.approx(p0[k], rel=1e-4, abs=1e-6) for k in p0)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-6)
    assert any(float(x.abs().sum()) > 0 for x in g1.values())


def test_encode_csr_equals_the_dense_output():
    """encode_csr (the gated sides from their top-k pre-activations, no dense output) gives the
    CSR of forward's output: gated and ungated, both sides, with a posting floor, and no gate."""
    import scipy.sparse as sp

    z = torch.randn(70, 8)
    for top in ((0, 0), (5, 9), (60, 60)):
        head = _head(bias=-0.2)
        head.config.update(doc_top_k=top[0], query_top_k=top[1])
        if top[0]:
            head.prune_postings(torch.randn(40, 8), 0.3)
        for side in ("image", "text"):
            for gate in (True, False):
                got = head.encode_csr(z, side=side, gate=gate)
                want = sp.csr_matrix(head(z, side=side, gate=gate).detach().numpy())
                assert got.dtype == np.float32 and got.indices.dtype == np.int32 and got.has_sorted_indices
                assert (got != want).nnz == 0 and got.nnz == want.nnz and got.nnz > 0


def test_indicator_cols_is_a_column_subset():
    from mmsparse.vocab import indicator_cols

    tok = pad_ids([np.array([1, 3]), np.array([4]), np.array([], dtype=np.int64)], 6)
    cols = torch.tensor([4, 1, 2])
    assert torch.equal(indicator_cols(tok, cols, 6), indicator(tok, 6)[:, cols])
    w = torch.tensor([[0.5, 2.0], [3.0, 9.0], [9.0, 9.0]])                    # values: weights, pad dropped
    assert torch.equal(indicator_cols(tok, cols, 6, values=w), torch.tensor([[0.0, 0.5, 0.0], [3.0, 0.0, 0.0],
                                                                           [0.0, 0.0, 0.0]]))


# -- paper-faithful defaults (issue 15) ----------------------------------------------------------

def test_preset_paper_gives_the_papers_settings():
    """--preset paper: D2S §5.1, Table 1, Algorithm 1 and the authors' code wherever the defaults (the
    settings validation chose) differ; flags given beside it win; an unknown preset is refused."""
    from mmsparse.api.training import resolve_config
    from mmsparse.errors import InputError
    from mmsparse.methods.base import make_config, preset_values
    from mmsparse.methods.d2s.config import D2SConfig

    c = make_config(D2SConfig, {**preset_values(D2SConfig, "paper"), **resolve_config(None, {"eta": 1e-5})})
    assert (c.epochs, c.batch_size, c.temperature, c.eta, c.lam) == (200, 512, 1e-3, 1e-5, 0.5)       # §5.1, Table 1
    assert (c.lr, c.vocab_lr, c.weight_decay, c.lr_warmup, c.l1_warmup) == (1e-3, 5e-5, 0.0, 0.2, 0.2)  # authors' code
    assert (c.vocab_min_df, c.l1_caption, c.expansion, c.pec_end) == (0, "masked", "caption-word", 0.95)
    assert (c.sparsity_loss, c.center, c.mask_caption_terms) == ("l1", "none", True)
    assert (c.doc_top_k, c.query_top_k, c.caption_terms_weight, c.doc_words_weight, c.image_dropout,
            c.doc_max_share) == (0, 0, 0.0, 0.0, 0.0, 1.0)                                            # no gate, no extra
    d = D2SConfig()                                                                                   # the defaults
    assert (d.epochs, d.eta, d.sparsity_loss, d.doc_top_k, d.query_top_k, d.vocab_min_df) == (30, 0.05, "flops", 128,
                                                                                              64, 1)
    assert preset_values(D2SConfig, "default") == {}
    with pytest.raises(InputError, match="--preset 'fast'"):
        preset_values(D2SConfig, "fast")


def test_optimiser_groups_and_schedule_endpoints():
    """W1 at --lr, the vocabulary LayerNorm and W2 at --vocab-lr, no weight decay; the learning
    rate warms up over 20 % of the steps, peaks, and reaches 0 at the last step; the sparsity
    weight ramps quadratically over its warm-up; p_c and p_v reach 1 at 95 % of training."""
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S
    from mmsparse.trainer import lr_factor, make_optimizer, warmup_steps

    head = _head()
    cfg = D2SConfig(**D2SConfig.PAPER)
    opt = make_optimizer(D2S(cfg).param_groups(head), cfg.lr, cfg.weight_decay)
    groups = {id(p): g for g in opt.param_groups for p in g["params"]}
    assert {groups[id(p)]["lr"] for p in head.w1.parameters()} == {1e-3}
    assert {groups[id(p)]["lr"] for p in (*head.norm.parameters(), *head.w2.parameters())} == {5e-5}
    assert {g["weight_decay"] for g in opt.param_groups} == {0.0} and len(groups) == len(list(head.parameters()))
    total = 1000
    assert warmup_steps(0.2, total) == 200 and warmup_steps(60, total) == 60 and warmup_steps(0, total) == 0
    assert lr_factor(0, total, 0.2, "linear") == pytest.approx(1 / 200)
    assert lr_factor(199, total, 0.2, "linear") == pytest.approx(1.0)
    assert lr_factor(600, total, 0.2, "linear") == pytest.approx(0.5)
    assert lr_factor(total, total, 0.2, "linear") == 0.0
    assert eta_at(0, 1e-3, 200) == 0.0 and eta_at(100, 1e-3, 200) == pytest.approx(0.25e-3)
    assert eta_at(200, 1e-3, 200) == pytest.approx(1e-3)
    df = np.array([0.0, 0.5, 1.0])
    pec = ExpansionControl("caption-word", df, 20, end=0.95)
    pec.set_progress(0.5)
    assert pec.p_c == pytest.approx(0.5 / 0.95)
    pec.set_progress(0.95)
    assert pec.p_c == 1.0 and torch.equal(pec.p_v, torch.ones(3))
    literal = ExpansionControl("caption-word", df, 6, end=1.0)        # eq. 6 as printed
    literal.set_epoch(5)
    assert literal.p_c == pytest.approx(5 / 6) and literal.p_v.tolist() == pytest.approx([1.0, 1 - 0.5 / 6, 5 / 6])


def _method(data_dir, **opts):
    from mmsparse.methods.base import TrainInputs, make_config
    from mmsparse.methods.d2s.method import D2S

    m = D2S(make_config(D2S.config_class, {**D2S.config_class.PAPER, "epochs": 2, "batch_size": 40, "vocab_min_df": 1,
                                           **opts}))
    head, train, val = m.setup(TrainInputs(data_dir / "train-images.h5", data_dir / "train-captions.h5",
                                           data_dir / "val-images.h5", data_dir / "val-captions.h5"))
    return m, head, train, val


def test_masked_l1_sees_only_the_masked_caption_vectors(method_data):
    """Algorithm 1 feeds s̄_C (expansion-masked) to the loss, L1 included: with expansion none a
    caption's L1 counts only its own terms; --l1-caption raw counts every term of s_C."""
    from mmsparse.methods.d2s.method import encode_sparse

    for kind in ("masked", "raw"):
        m, head, train, _ = _method(method_data, expansion="none", l1_caption=kind, l1_warmup=0)
        m.start_epoch(0)
        idx = torch.arange(40)
        _, parts = m.loss(head, (idx, train), 0, torch.Generator().manual_seed(0), "cpu")
        s = encode_sparse(head, train.z_cap[idx], side="text").toarray()
        own = s * indicator(train.tok[idx], s.shape[1]).numpy()
        want = (own if kind == "masked" else s).sum(1).mean()
        assert parts["l1_cap"] == pytest.approx(float(want), rel=1e-5)
        assert (own.sum() < s.sum())                                    # expansion terms exist to leave out


def test_selection_validates_in_the_heads_own_query_mode(method_data):
    """A head trained without expansion (exp=0) is used with caption-term queries, so the epoch
    it saves is chosen on caption-term queries; other heads on expanded queries."""
    from mmsparse.methods.d2s.method import evaluate_head

    for expansion, mode in (("none", "caption-terms"), ("caption-word", "expand")):
        m, head, _, val = _method(method_data, expansion=expansion)
        got = m.validate(head, val)
        want = evaluate_head(head, val, mode)
        assert got["query_mode"] == mode and {k: got[k] for k in want} == want
    other = evaluate_head(head, val, "caption-terms")
    assert other["FLOPs"] < want["FLOPs"]                              # the two modes really differ


def test_flops_regulariser_penalises_terms_in_every_row():
    """SPLADE's FLOPs term Σ_t (mean_b s_bt)²: the same total weight costs more spread over every
    row of one term than over distinct terms; L1 cannot tell them apart."""
    from mmsparse.methods.d2s.loss import sparsity

    hub = torch.zeros(4, 8)
    hub[:, 0] = 1.0                    # one term in all 4 rows
    spread = torch.eye(4, 8)           # 4 terms, one row each
    assert sparsity(hub, "l1") == sparsity(spread, "l1") == 1.0
    assert sparsity(hub, "flops") == pytest.approx(1.0) and sparsity(spread, "flops") == pytest.approx(4 / 16)


def test_centred_head_subtracts_the_modality_mean(method_data):
    m, head, train, _ = _method(method_data, center="mean")
    assert torch.allclose(head.center_image, train.z_img.mean(0)) and torch.allclose(head.center_text, train.z_cap.mean(0))
    z = train.z_img[:3]
    ref = torch.log1p(torch.relu(head.w2(head.norm(head.w1(z - head.center_image)))))
    torch.testing.assert_close(head(z, side="image"), ref)
    assert not torch.allclose(head(z, side="image"), head(z, side="text"))


def test_top_k_gate_keeps_each_rows_largest_weights_and_their_gradient():
    from mmsparse.methods.d2s.head import top_k_rows

    s = torch.tensor([[0.5, 0.0, 2.0, 1.0], [3.0, 0.2, 0.1, 0.0]], requires_grad=True)
    out = top_k_rows(s, 2)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 2.0, 1.0], [3.0, 0.2, 0.0, 0.0]]))
    out.sum().backward()
    assert s.grad.tolist() == [[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]   # cut weights get no gradient
    assert top_k_rows(s, 0) is s and top_k_rows(s, 9) is s                   # 0 = off; k >= |V|: nothing cut


def test_top_k_gates_documents_and_expanded_queries_not_caption_terms(method_data, tmp_path):
    """--doc-top-k / --query-top-k bound the terms of images and expanded queries in training,
    validation and sparsify (recorded in the head); caption-term queries keep every own term."""
    from mmsparse.methods.d2s.method import encode_sparse

    m, head, train, _ = _method(method_data, doc_top_k=5, query_top_k=1)
    assert (head.config["doc_top_k"], head.config["query_top_k"]) == (5, 1)
    docs = encode_sparse(head, train.z_img, side="image")
    queries = encode_sparse(head, train.z_cap, side="text")
    assert np.diff(docs.indptr).max() == 5 and np.diff(queries.indptr).max() == 1
    own = encode_sparse(head, train.z_cap, side="text", keep=train.tok)
    assert own.nnz > 0 and np.diff(own.indptr).max() > 1                     # more than 1 own term survives
    m.start_epoch(0)
    loss, _ = m.loss(head, (torch.arange(40), train), 0, torch.Generator().manual_seed(0), "cpu")
    loss.backward()                                                          # the gate trains
    head.save_pretrained(tmp_path / "h")
    again = load_head(tmp_path / "h")
    assert np.diff(encode_sparse(again, train.z_img, side="image").indptr).max() == 5


def test_doc_max_share_caps_every_posting_list_at_the_smallest_weights(method_data, tmp_path):
    """--doc-max-share 0.4: after training (Method.finish) each term keeps at most 40 % of the
    training images, dropping its smallest weights there; queries are untouched; the floor is saved."""
    from mmsparse.methods.d2s.method import encode_sparse

    m, head, train, _ = _method(method_data, doc_max_share=0.4)
    before = encode_sparse(head, train.z_img, side="image").toarray()
    queries = encode_sparse(head, train.z_cap, side="text")
    cap = int(0.4 * before.shape[0])
    assert ((before > 0).sum(0) > cap).any()                                 # something to prune
    m.finish(head, train)
    after = encode_sparse(head, train.z_img, side="image").toarray()
    assert ((after > 0).sum(0) <= cap).all()
    assert np.array_equal(after[after > 0], before[after > 0])               # kept weights unchanged
    for j in np.flatnonzero(((before > 0) & (after == 0)).any(0)):           # dropped: the column's smallest
        assert before[(before[:, j] > 0) & (after[:, j] == 0), j].max() < after[after[:, j] > 0, j].min(initial=np.inf)
    assert (encode_sparse(head, train.z_cap, side="text") != queries).nnz == 0
    head.save_pretrained(tmp_path / "h")
    assert np.array_equal(encode_sparse(load_head(tmp_path / "h"), train.z_img, side="image").toarray(), after)
    head.prune_postings(train.z_img, 0.4)                                    # again: same floor, not a re-cut
    assert np.array_equal(encode_sparse(head, train.z_img, side="image").toarray(), after)
    plain, phead, ptrain, _ = _method(method_data)
    plain.finish(phead, ptrain)
    assert not hasattr(phead, "doc_floor") and "doc_max_share" not in phead.config
    phead.prune_postings(ptrain.z_img, 0.4)                                  # a trained head, after the fact
    phead.save_pretrained(tmp_path / "p")
    assert ((encode_sparse(load_head(tmp_path / "p"), ptrain.z_img, side="image") > 0).sum(0) <= cap).all()


def _loss_with_and_without(method_data, idx, **option):
    """(the option-0 method tuple, its (loss, parts), the option's (loss, parts)) on batch `idx`,
    both heads with the same weights (expansion full, no sparsity warm-up)."""
    (name, w), = option.items()
    base, other = (_method(method_data, expansion="full", l1_warmup=0, **{name: x}) for x in (0.0, w))
    for m in (base[0], other[0]):
        m.start_epoch(0)
    other[1].load_state_dict(base[1].state_dict())
    return base, *(m.loss(h, (idx, t), 0, torch.Generator().manual_seed(0), "cpu") for m, h, t, _ in (base, other))


def test_caption_terms_weight_adds_the_caption_term_loss(method_data):
    """--caption-terms-weight w adds (1-λ)·w·[ℓ(C→I) + ℓ(I→C)] with caption vectors cut to their own
    terms; w = 0 is eq. 7 alone."""
    from mmsparse.methods.d2s.loss import soft_ce

    idx = torch.arange(40)
    base, (l0, p0), (l1, p1) = _loss_with_and_without(method_data, idx, caption_terms_weight=2.0)
    train, head = base[2], base[1]
    uimg = torch.unique(train.cap_img[idx])
    s_cap = head(train.z_cap[idx], side="text") * indicator(train.tok[idx], len(head.vocab))
    s_img = head(train.z_img[uimg], side="image")
    t = train.z_cap[idx] @ train.z_img[uimg].T / base[0].cfg.temperature
    ct = soft_ce(t, s_cap @ s_img.T) + soft_ce(t.T, s_img @ s_cap.T)
    assert "caption_terms" not in p0 and p1["caption_terms"] == pytest.approx(float(ct.detach()), rel=1e-4)
    assert float(l1.detach()) == pytest.approx(float(l0.detach()) + 0.5 * 2.0 * float(ct.detach()), rel=1e-4)


def test_doc_words_weight_adds_the_image_word_loss(method_data):
    """--doc-words-weight w adds w·CE(p, softmax(s_I / τ_w)) over the whole vocabulary, p the image's
    training-caption words weighted by image IDF ('##' pieces and words of every image weigh 0);
    w = 0 is eq. 7 alone."""
    from mmsparse.methods.d2s.method import image_words

    idx = torch.arange(40)
    base, (l0, p0), (l1, p1) = _loss_with_and_without(method_data, idx, doc_words_weight=0.5)
    train, head = base[2], base[1]
    words, idf = image_words(train, head.vocab, base[0].cfg.doc_words_target, base[0].cfg.doc_words_max_df)
    v = len(head.vocab)
    assert idf[v] == 0 and all(idf[i] == 0 for i, t in enumerate(head.vocab) if t.startswith("##"))
    uimg = torch.unique(train.cap_img[idx])
    s_img = head(train.z_img[uimg], side="image")                            # [U, |V|], zeros included
    target = torch.zeros(len(uimg), v + 1).scatter_add_(1, words[uimg], idf[words[uimg]])[:, :v]
    keep = target.sum(1) > 0
    p = target[keep] / target[keep].sum(1, keepdim=True)
    want = -(p * torch.log_softmax(s_img[keep] / base[0].cfg.doc_words_temperature, dim=1)).sum(1).mean()
    assert "doc_words" not in p0 and p1["doc_words"] == pytest.approx(float(want.detach()), rel=1e-4)
    assert float(l1.detach()) == pytest.approx(float(l0.detach()) + 0.5 * float(want.detach()), rel=1e-4)


def test_doc_words_targets_and_max_df():
    """--doc-words-target uniform weighs a word 1, idf log(Ni / df); a '##' piece, punctuation, the pad
    and (--doc-words-max-df) a word in the captions of more than that share of the images weigh 0."""
    from types import SimpleNamespace

    from mmsparse.methods.d2s.method import image_words

    vocab = ["a", "dog", "##s", "cat", "runs", "unused", ","]
    caps = [[0, 1], [0, 3], [0, 1, 4], [0, 3], [1, 2, 6]]     # "a" in all 4 images, dog/cat in 2, runs in 1
    train = SimpleNamespace(token_ids=caps, cap_img=torch.tensor([0, 1, 2, 3, 0]), z_img=torch.zeros(4, 8))
    words, weight = image_words(train, vocab, "uniform", 0.5)
    assert weight.tolist() == [0, 1, 0, 1, 1, 0, 0, 0]
    assert image_words(train, vocab, "uniform", 0.25)[1].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert image_words(train, vocab, "uniform", 1.0)[1].tolist() == [1, 1, 0, 1, 1, 0, 0, 0]
    assert words[0].tolist()[:2] == [0, 1] and set(words[0].tolist()[2:]) <= {7}   # no "##s", no ","
    _, idf = image_words(train, vocab)
    assert idf.tolist() == pytest.approx([0, np.log(2), 0, np.log(2), np.log(4), 0, 0, 0])
    with pytest.raises(ValueError, match="doc_words_target"):
        image_words(train, vocab, "tf")


def _amp_setup(gated: bool, method_name: str = "d2s"):
    """A D2S (or inference-free) method and head over a 300-term vocabulary on synthetic pairs."""
    from mmsparse.methods import get_method
    from mmsparse.methods.base import make_config
    from mmsparse.methods.d2s.method import image_words

    v = 300
    train, vocab, token_ids = _synthetic_pairs(v)
    cls = get_method(method_name)
    extra = dict(doc_top_k=24, query_top_k=12, doc_words_weight=1.0, caption_terms_weight=1.0) \
        if gated and method_name == "d2s" else {}
    cfg = make_config(cls.config_class, dict(epochs=4, eta=0.05, sparsity_loss="flops", **extra))
    m = cls(cfg)
    if method_name == "d2s":
        m.pec = ExpansionControl(cfg.expansion, document_frequency(token_ids, v), cfg.epochs)
        m.pec.set_epoch(2)
        if cfg.doc_words_weight > 0:
            m.img_words, m.word_weight = image_words(train, vocab, "uniform", 0.5)
    else:
        m.query_df = torch.as_tensor(document_frequency(token_ids, v), dtype=torch.float32)
    m.l1_warm = 0
    voc = Vocab(vocab, torch.randn(v, 8, generator=torch.Generator().manual_seed(3)), None, "random")
    torch.manual_seed(0)
    head = m.head_class.from_vocab(16, voc, {}, doc_top_k=extra.get("doc_top_k", 0),
                                   query_top_k=extra.get("query_top_k", 0))
    return m, head, train


@pytest.mark.parametrize("method_name,gated", [("d2s", True), ("d2s", False), ("inference-free", False)])
def test_bf16_autocast_trains_like_fp32(method_name, gated):
    """Under bf16 autocast (train-head --amp bf16) the heads' custom backward passes return
    gradients in their parameters' dtypes (they crashed: "expected mat1 and mat2 to have the same
    dtype"), close to fp32's; a few AdamW steps on one batch lower its loss as in fp32. On this CPU's autocast
    (emulated where the CPU has no bf16 unit: slower, same rounding) and on CUDA when present."""
    from mmsparse.trainer import make_optimizer

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else [])
    for device in devices:
        runs = {}
        for amp in (False, True):
            m, head, train = _amp_setup(gated, method_name)
            head.to(device)
            train.to(device)
            opt = make_optimizer(m.param_groups(head), 1e-2, 0.0)
            losses, first = [], None
            idx = torch.randperm(len(train.cap_ids), generator=torch.Generator().manual_seed(1))[:48]
            for step in range(6):   # one batch, the same draws: the loss on it must fall
                gen = torch.Generator().manual_seed(7)
                with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                    loss, _ = m.loss(head, (idx, train), 10, gen, device)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if first is None:
                    first = {k: p.grad.detach().float().cpu().clone() for k, p in head.named_parameters()
                             if p.grad is not None}
                    assert all(p.grad.dtype == p.dtype for p in head.parameters() if p.grad is not None)
                opt.step()
                losses.append(float(loss.detach()))
            runs[amp] = losses, first
        (l32, g32), (l16, g16) = runs[False], runs[True]
        assert np.isfinite(l16).all() and l16[-1] < l16[0] and l32[-1] < l32[0], (l32, l16)
        np.testing.assert_allclose(l16, l32, rtol=0.01)
        for k in g32:   # bf16 products: the same direction (0.94-1.0 here), not the same bits
            cos = torch.nn.functional.cosine_similarity(g16[k].flatten(), g32[k].flatten(), dim=0)
            assert cos > 0.9, (device, k, float(cos))


def test_amp_on_a_cpu_without_bf16_is_refused_saying_why(monkeypatch):
    from mmsparse import runtime
    from mmsparse.errors import InputError
    from mmsparse.trainer import fit

    m, head, train = _amp_setup(True)
    m.cfg.amp = "bf16"
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: None)
    with pytest.raises(InputError, match=r"--amp bf16: this CPU .* has no bf16 matrix unit \(AMX or AVX512-BF16\)"):
        fit(m, head, train, None, device="cpu")
    m.cfg.amp = "auto"   # auto: fp32 here, and the run says so
    monkeypatch.setattr(m, "steps_per_epoch", lambda t: 1)
    monkeypatch.setattr(m, "batches", lambda t, g, e: iter([(torch.arange(48), train)]))
    res = fit(m, head, train, None, device="cpu")
    assert res.precision == "fp32" and res.finished


def test_gated_backward_builds_sorted_duplicate_free_csr(monkeypatch):
    """Every CSR tensor the gated forward / backward and gathered_scores build has, in each row,
    strictly rising columns (sorted, no duplicates), checked on the structure itself (torch's own check
    was switched off there), on a batch whose captions list own terms among their top ones (a column
    twice in a row), pads and top-k columns in value order (unsorted); the gradients still equal the
    dense computation's, and torch's check_invariants accepts the tensors."""
    from mmsparse.methods.d2s.loss import ScoreSide, gathered_scores

    made = []
    plain = torch.sparse_csr_tensor

    def record(crow, col, *args, **kwargs):
        made.append((crow.clone(), col.clone()))
        return plain(crow, col, *args, **kwargs)

    monkeypatch.setattr(torch, "sparse_csr_tensor", record)
    v, n_cap = 50, 4
    torch.manual_seed(0)
    head = D2SHead.from_vocab(16, Vocab([f"t{i}" for i in range(v)], torch.randn(v, 8), None, "random"), {},
                              init_bias=0.5, doc_top_k=6, query_top_k=5)
    z = torch.randn(10, 16)
    with torch.no_grad():
        top = head.w2(head.norm(head.w1(z)))[:n_cap].topk(5, dim=1).indices
    own = torch.cat([top[:, :2], torch.full((n_cap, 3), v)], 1)     # two own terms among the top ones, 3 pads
    gc, gi = torch.randn(n_cap, 10), torch.randn(6, 6)
    with torch.sparse.check_sparse_tensor_invariants():
        s_cap, s_img, cap_top, img_top, _ = head.forward_gated(z, n_cap, own)
        loss = (s_cap * gc).sum() + (s_img * gi).sum() + gathered_scores(s_cap[:, :5], cap_top,
                                                                          ScoreSide(s_img, img_top, v)).sum()
        loss.backward()
    assert made
    for crow, col in made:
        for i in range(crow.numel() - 1):
            c = col[crow[i]:crow[i + 1]]
            assert bool((c[1:] > c[:-1]).all()), f"row {i}: columns {c.tolist()} not sorted and distinct"
    got = {k: p.grad.clone() for k, p in head.named_parameters()}
    # the dense reference: the same weighted sum over s = log(1 + ReLU(x)) at the listed entries
    head.zero_grad()
    s = torch.log1p(torch.relu(head.w2(head.norm(head.w1(z)))))
    weight = torch.zeros(10, v + 1)
    weight[:n_cap].scatter_add_(1, torch.cat([cap_top, own], 1), gc)
    weight[n_cap:].scatter_add_(1, img_top, gi)
    dense_img = torch.zeros(6, v + 1).scatter(1, img_top, s[n_cap:].gather(1, img_top))[:, :v]
    dense_cap = torch.zeros(n_cap, v + 1).scatter(1, cap_top, s[:n_cap].gather(1, cap_top))[:, :v]
    ((s * weight[:, :v]).sum() + (dense_cap @ dense_img.T).sum()).backward()
    for k, p in head.named_parameters():
        torch.testing.assert_close(got[k], p.grad, rtol=1e-4, atol=1e-6)
