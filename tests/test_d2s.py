"""D2S head (eq. 4-5), its sparse-aware backward, persistence, and the eq. 7 loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmsparse.methods.d2s.expansion import ExpansionControl
from mmsparse.methods.d2s.head import D2SHead
from mmsparse.methods.d2s.loss import d2s_loss, eta_at
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


def test_indicator_cols_is_a_column_subset():
    from mmsparse.vocab import indicator_cols

    tok = pad_ids([np.array([1, 3]), np.array([4]), np.array([], dtype=np.int64)], 6)
    cols = torch.tensor([4, 1, 2])
    assert torch.equal(indicator_cols(tok, cols, 6), indicator(tok, 6)[:, cols])
    w = torch.tensor([[0.5, 2.0], [3.0, 9.0], [9.0, 9.0]])                    # values: weights, pad dropped
    assert torch.equal(indicator_cols(tok, cols, 6, values=w), torch.tensor([[0.0, 0.5, 0.0], [3.0, 0.0, 0.0],
                                                                           [0.0, 0.0, 0.0]]))


# -- paper-faithful defaults (issue 15) ----------------------------------------------------------

def test_defaults_are_the_papers_settings():
    from mmsparse.methods.d2s.config import D2SConfig

    c = D2SConfig()
    assert (c.epochs, c.batch_size, c.temperature, c.eta, c.lam) == (200, 512, 1e-3, 1e-3, 0.5)       # §5.1, Table 1
    assert (c.lr, c.vocab_lr, c.weight_decay, c.lr_warmup, c.l1_warmup) == (1e-3, 5e-5, 0.0, 0.2, 0.2)  # authors' code
    assert (c.vocab_min_df, c.l1_caption, c.expansion, c.pec_end) == (0, "masked", "caption-word", 0.95)
    assert (c.sparsity_loss, c.center) == ("l1", "none")


def test_optimiser_groups_and_schedule_endpoints():
    """W1 at --lr, the vocabulary LayerNorm and W2 at --vocab-lr, no weight decay; the learning
    rate warms up over 20 % of the steps, peaks, and reaches 0 at the last step; the sparsity
    weight ramps quadratically over its warm-up; p_c and p_v reach 1 at 95 % of training."""
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S
    from mmsparse.trainer import lr_factor, make_optimizer, warmup_steps

    head = _head()
    cfg = D2SConfig()
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

    m = D2S(make_config(D2S.config_class, {"epochs": 2, "batch_size": 40, "vocab_min_df": 1, **opts}))
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
    from mmsparse.methods.joint.config import JointConfig
    from mmsparse.methods.base import make_config
    from mmsparse.errors import InputError

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
    with pytest.raises(InputError, match="--doc-max-share"):
        make_config(JointConfig, {"doc_max_share": 0.5})


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
    assert "caption_terms" not in p0 and p1["caption_terms"] == pytest.approx(float(ct), rel=1e-4)
    assert float(l1) == pytest.approx(float(l0) + 0.5 * 2.0 * float(ct), rel=1e-4)


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
    assert "doc_words" not in p0 and p1["doc_words"] == pytest.approx(float(want), rel=1e-4)
    assert float(l1) == pytest.approx(float(l0) + 0.5 * float(want), rel=1e-4)


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
