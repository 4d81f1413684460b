"""VDR (issue 7): elu1p, gating, contrastive mask, both loss entries on a hand-checked batch, the
max-pool gradient, and train-head/sparsify --method vdr end to end on small real HDF5 files with
token and patch states (real tokenizer)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from mmsparse.cli import app
from mmsparse.errors import InputError
from mmsparse.formats.dense import DenseWriter
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods.head import load_head
from mmsparse.methods.vdr.head import DSTHead, elu1p, gate, topk_mask
from mmsparse.methods.vdr.loss import contrastive_mask, vdr_loss
from conftest import WORDS  # one word list for every test


def test_elu1p_values_positive_and_smooth_at_zero():
    u = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.0], requires_grad=True)
    y = elu1p(u)
    assert torch.allclose(y, torch.tensor([math.exp(-3), math.exp(-1), 1.0, 1.5, 3.0]))
    assert bool((elu1p(torch.tensor([-80.0, -1e3])) >= 0).all())
    y.sum().backward()   # d/du: e^u below 0, 1 from 0 on (continuous at 0)
    assert torch.allclose(u.grad, torch.tensor([math.exp(-3), math.exp(-1), 1.0, 1.0, 1.0]))


def test_gate_is_exactly_k_plus_bag_of_words():
    v = torch.tensor([[0.9, 0.1, 0.8, 0.3, 0.7, 0.2], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    bow = torch.tensor([[1.0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])   # term 0 is already in row 0's top-3
    g = gate(v, 3, bow)
    assert g.tolist() == [[1, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert g.sum(1).tolist() == [3 + 1, 3]          # k plus the bag-of-words terms outside the top-k
    assert gate(v, 3).sum(1).tolist() == [3, 3]      # images: no bag of words
    assert topk_mask(v, 99).sum().item() == 12       # k > |V|: everything


def test_contrastive_mask_partitions_the_unused_dimensions():
    torch.manual_seed(0)
    g = (torch.rand(5, 40) > 0.9).float()
    unused = ~(g > 0).any(0)
    m = contrastive_mask(g, torch.Generator().manual_seed(1))
    assert bool((m.sum(0) <= 1).all())                                  # rows are disjoint
    assert torch.equal(m.sum(0) > 0, unused)                            # union = V \ T(B), exactly
    assert not bool((m * g).any())                                      # never a gated dimension
    n = int(unused.sum())
    assert set(m.sum(1).long().tolist()) <= {n // 5, -(-n // 5)}       # |V \ T(B)| / |B| each
    m2 = contrastive_mask(g, torch.Generator().manual_seed(1))
    assert torch.equal(m, m2)                                           # seeded: reproducible


def _sce(logits):
    n = len(logits)
    rows = sum(-math.log(math.exp(logits[i][i]) / sum(math.exp(x) for x in logits[i])) for i in range(n)) / n
    cols = sum(-math.log(math.exp(logits[j][j]) / sum(math.exp(logits[i][j]) for i in range(n))) for j in range(n)) / n
    return rows + cols


def test_both_loss_entries_on_a_hand_checked_batch():
    # |V| = 4, k = 1. q0: top-1 = {0}, bow {1}; q1: top-1 = {2}, bow {2}. T(B) = {0, 1, 2}: the one
    # unused dimension 3 goes to caption 0 (round-robin), opened in q0 and closed in image 0.
    v_q = torch.tensor([[3.0, 1, 1, 1], [1, 1, 2, 1]])
    v_p = torch.tensor([[1.0, 1, 1, 1], [1, 2, 2, 1]])
    bow = torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]])
    loss, parts = vdr_loss(v_q, v_p, bow, torch.tensor([0, 1]), 1, torch.tensor(1.0))
    # q0 = [3,1,0,1]/√11, q1 = [0,0,1,0]; p0 = [1,1,1,0]/√3, p1 = [1,2,2,1]/√10
    param = [[4 / math.sqrt(33), 6 / math.sqrt(110)], [1 / math.sqrt(3), 2 / math.sqrt(10)]]
    nonparam = [[1 / math.sqrt(3), 2 / math.sqrt(10)], [1 / math.sqrt(3), 2 / math.sqrt(10)]]
    assert parts["param"] == pytest.approx(_sce(param), rel=1e-5)
    assert parts["nonparam"] == pytest.approx(_sce(nonparam), rel=1e-5)
    assert parts["unused"] == 1
    assert float(loss) == pytest.approx(_sce(param) + _sce(nonparam), rel=1e-5)
    # ablations: no mask -> p0 = [1,1,1,1]/2 and q0 = [3,1,0,0]/√10; no nonparametric entry
    _, p2 = vdr_loss(v_q, v_p, bow, torch.tensor([0, 1]), 1, torch.tensor(1.0), cts_mask=False, np_entry=False)
    plain = [[4 / (2 * math.sqrt(10)), 5 / math.sqrt(100)], [1 / 2, 2 / math.sqrt(10)]]
    assert p2["param"] == pytest.approx(_sce(plain), rel=1e-5) and p2["nonparam"] == 0.0


def test_max_pool_head_matches_autograd_reference():
    torch.manual_seed(0)
    h = DSTHead(8, 50)
    h.chunk = 2                                    # several padded chunks
    x = torch.randn(5, 7, 8)
    mask = (torch.rand(5, 7) > 0.4).float()
    mask[:, 0] = 1
    mask[3, 5] = 1                                 # a hole: real positions need not be a prefix
    g = torch.randn(5, 50) * (torch.rand(5, 50) > 0.5)
    (h(x, mask) * g).sum().backward()
    w = h.proj.weight.detach().clone().requires_grad_()
    b = h.proj.bias.detach().clone().requires_grad_()
    u = F.layer_norm(x, (8,)) @ w.T + b
    ref = elu1p(u.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).amax(1))
    (ref * g).sum().backward()
    assert torch.allclose(h(x, mask), ref.detach(), atol=1e-6)
    assert torch.allclose(h.proj.weight.grad, w.grad, atol=1e-5)
    assert torch.allclose(h.proj.bias.grad, b.grad, atol=1e-5)


# -- end to end ------------------------------------------------------------------------------



def _write_split(root, split, n_img, model, tok, seed):
    """n_img images (4 patches, h=8) and two captions each (token states h=32, the real tokenizer's ids)."""
    rng = np.random.default_rng(seed)
    base = dict(backbone="hf-dual", model=str(model), dataset="unit", split=split, normalized=True)
    protos = rng.normal(size=(len(WORDS), 8)).astype(np.float32)
    with DenseWriter(root / f"{split}-images.h5", 16, dict(base, modality="image")) as w:
        w.append([f"{split}-i{i}" for i in range(n_img)], rng.normal(size=(n_img, 16)).astype(np.float32))
        texts = [[str(x) for x in rng.choice(WORDS, 4, replace=False)] for _ in range(n_img)]
        patches = np.stack([[protos[WORDS.index(t[j])] + 0.1 * rng.normal(size=8) for j in range(4)] for t in texts])
        w.append_extra("patch_states", patches.astype(np.float16))
    ids, img, caps = [], [], []
    for i, t in enumerate(texts):
        for j in range(2):
            ids.append(f"{split}-c{i}-{j}")
            img.append(f"{split}-i{i}")
            caps.append(" ".join(rng.permutation(t)[:3]))
    enc = tok(caps, padding="max_length", max_length=10, truncation=True)
    mask = np.asarray(enc["attention_mask"], dtype=np.uint8)
    states = rng.normal(size=(len(caps), 10, 32)).astype(np.float16) * mask[..., None]
    with DenseWriter(root / f"{split}-captions.h5", 16, dict(base, modality="text"), with_texts=True) as w:
        w.append(ids, rng.normal(size=(len(ids), 16)).astype(np.float32), caps, img)
        w.append_extra("token_states", states)
        w.append_extra("token_mask", mask)
        w.append_extra("token_ids", np.asarray(enc["input_ids"], dtype=np.int32))


@pytest.fixture(scope="module")
def vdr_run(tmp_path_factory, dual_encoder_dir):
    from transformers import AutoTokenizer
    from transformers import BertConfig, BertModel
    tok = AutoTokenizer.from_pretrained(str(dual_encoder_dir))
    root = tmp_path_factory.mktemp("vdr")
    # the real WordPiece tokenizer with a tiny text model (ω = 32 = the token states' width, so the
    # text tower is initialised from its embeddings; the images' h = 8 gets the random init)
    torch.manual_seed(0)
    tiny = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=37))
    tiny.save_pretrained(str(root / "vocab-model"))
    tok.save_pretrained(str(root / "vocab-model"))
    _write_split(root, "train", 40, dual_encoder_dir, tok, 0)
    _write_split(root, "val", 10, dual_encoder_dir, tok, 1)
    head = root / "head"
    r = CliRunner().invoke(app, ["train-head", str(root / "train-images.h5"), str(root / "train-captions.h5"),
                                 "--val-images", str(root / "val-images.h5"), "--val-captions",
                                 str(root / "val-captions.h5"), "-o", str(head), "--method", "vdr", "--epochs", "2",
                                 "--vocab-model", str(root / "vocab-model"), "--vocab-min-df", "1",
                                 "--batch-size", "16", "--vdr-train-k", "4", "--vdr-query-k", "3", "--vdr-doc-k", "5"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return root, head, tok


def test_train_and_sparsify_vdr(vdr_run):
    root, head_dir, tok = vdr_run
    head = load_head(head_dir)
    assert head.method == "vdr" and head.config["text_input"] == "token_states"
    assert head.config["image_input"] == "patch_states" and head.config["training"]["best_epoch"] in (1, 2)
    v = head.config["vocab_size"]
    assert v <= len(WORDS) + 2                     # --vocab-min-df 1: only the captions' terms
    run = CliRunner()
    for args, name in ((["--vdr-doc-k", "4"], "img.h5"), ([], "q.h5"), (["--query-mode", "bow"], "bow.h5")):
        src = root / ("val-images.h5" if name == "img.h5" else "val-captions.h5")
        r = run.invoke(app, ["sparsify", str(head_dir), str(src), "-o", str(root / name), *args])
        assert r.exit_code == 0, r.output + repr(r.exception)
    img, q, bow = (read_sparse(root / n) for n in ("img.h5", "q.h5", "bow.h5"))
    assert (np.diff(img.matrix.indptr) == 4).all()                       # exactly k per document
    bm = bow.matrix.toarray()
    assert set(np.unique(bm)) <= {0.0, 1.0}                              # VDR^α: binary bag of words
    vocab = head.vocab
    for row, text in zip(bm[:5], bow.texts[:5]):
        assert {vocab[i] for i in np.flatnonzero(row)} == set(text.split())
    qm = q.matrix.toarray()
    assert ((qm > 0).sum(1) >= 3).all() and ((qm > 0).sum(1) <= 3 + (bm > 0).sum(1)).all()
    assert ((bm > 0) <= (qm > 0)).all()                                  # the bag of words is always open
    r = run.invoke(app, ["sparsify", str(head_dir), str(root / "val-captions.h5"), "-o", str(root / "x.h5"),
                         "--query-mode", "caption-terms"])
    assert isinstance(r.exception, InputError) and "vdr" in str(r.exception)


def test_max_pool_sends_each_terms_gradient_to_its_arg_max_position():
    """With a frozen-free input (tuned final layers), dx of the max pool equals autograd's on the
    dense reference, for padded text rows and for equal-length image rows (one product)."""
    torch.manual_seed(1)
    for mask_rows in (True, False):
        h = DSTHead(8, 50)
        h.chunk = 2
        x = torch.randn(5, 7, 8, requires_grad=True)
        mask = None
        if mask_rows:
            mask = (torch.rand(5, 7) > 0.4).float()
            mask[:, 0] = 1
        g = torch.randn(5, 50) * (torch.rand(5, 50) > 0.5)
        (h(x, mask) * g).sum().backward()
        x2 = x.detach().clone().requires_grad_()
        u = F.layer_norm(x2, (8,)) @ h.proj.weight.detach().T + h.proj.bias.detach()
        keep = torch.ones(5, 7, dtype=torch.bool) if mask is None else mask.bool()
        (elu1p(u.masked_fill(~keep.unsqueeze(-1), float("-inf")).amax(1)) * g).sum().backward()
        assert torch.allclose(x.grad, x2.grad, atol=1e-6)


def test_mean_pooling_head_matches_its_definition():
    torch.manual_seed(2)
    h = DSTHead(8, 20, pool="mean")
    x = torch.randn(3, 6, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    ln = F.layer_norm(x, (8,))
    mean = (ln * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    want = elu1p(mean @ h.proj.weight.detach().T + h.proj.bias.detach())
    assert torch.allclose(h(x, mask), want, atol=1e-6)
    with pytest.raises(ValueError):
        DSTHead(8, 20, pool="sum")


def test_batches_by_image_bring_each_image_with_all_its_captions():
    """--batch-by image: a batch holds each of its images' captions together (5 per image here);
    --batch-by caption (the default): the captions of a batch name distinct images where possible.
    Both epochs visit every caption once."""
    from mmsparse.methods.vdr.data import Split, batches

    class Rows:
        def __init__(self, n, p):
            self.n, self.fixed, self.p = n, False, p

        def read_rows(self, rows):
            return np.asarray(rows, dtype=np.float32)[:, None, None].repeat(self.p, 1), None

    n_img = 40
    cap_img = np.repeat(np.arange(n_img), 5)
    split = Split(Rows(len(cap_img), 2), Rows(n_img, 3), cap_img, [], [], [])
    for by_image in (True, False):
        seen = []
        for rows, _, _, xi, local, _ in batches(split, 20, torch.Generator().manual_seed(0), block=50,
                                                buffer_rows=100, by_image=by_image):
            seen += list(rows)
            imgs = cap_img[rows]
            if by_image:
                assert len(set(imgs)) == 4 and all((imgs == i).sum() == 5 for i in set(imgs))
            else:
                assert len(set(imgs)) == len(rows)              # 20 distinct images of the 20 in the buffer
            assert np.array_equal(xi[local][:, 0, 0], imgs)        # each caption's image column
        assert sorted(seen) == list(range(len(cap_img)))


def test_k_per_side_is_read_from_the_head_at_call_time(vdr_run):
    """A FLOPs controller moves k between epochs by writing the head's config: the training gate
    reads k_train when the loss runs (more unused dimensions V \\ T(B) at a smaller k), validation
    reads k_query / k_doc (terms per query and image)."""
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.vdr.config import VDRConfig
    from mmsparse.methods.vdr.method import VDR

    root, _, _ = vdr_run
    method = VDR(VDRConfig(vocab_model=str(root / "vocab-model"), vocab_min_df=1, vdr_train_k=4, batch_size=2))
    head, train, val = method.setup(TrainInputs(root / "train-images.h5", root / "train-captions.h5",
                                                root / "val-images.h5", root / "val-captions.h5"))
    assert head.config["k_train"] == 4
    batch = next(iter(method.batches(train, torch.Generator().manual_seed(0), 0)))
    unused = {}
    for k in (1, 8):
        head.config["k_train"] = k
        unused[k] = method.loss(head, batch, 0, torch.Generator().manual_seed(0), "cpu")[1]["unused"]
    assert unused[1] > unused[8]
    for kq, kd in ((2, 3), (5, 7)):
        head.config.update(k_query=kq, k_doc=kd)
        r = method.validate(head, val)
        assert r["d_nnz"] == kd and kq <= r["q_nnz"] <= kq + 3


def test_ungated_vectors_gate_to_the_validation_vectors(vdr_run):
    """ungated_vectors: every term of l2n(V) per row (queries, images) and the bags of words; gated
    at any k they are the vectors validation and sparsify use (encode_split), and their figures
    are validation's."""
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.vdr.config import VDRConfig
    from mmsparse.methods.vdr.method import VDR, encode_split, evaluate, ungated_vectors

    root, head_dir, _ = vdr_run
    head = load_head(head_dir)
    fresh, _, val = VDR(VDRConfig(vocab_model=str(root / "vocab-model"), vocab_min_df=1)).setup(
        TrainInputs(root / "train-images.h5", root / "train-captions.h5", root / "val-images.h5",
                    root / "val-captions.h5"))
    assert torch.equal(fresh.token_ids, head.token_ids)     # val.bows are the saved head's columns
    u = ungated_vectors(head, val)
    v = head.config["vocab_size"]
    assert u.queries.shape == (val.captions.n, v) and u.images.shape == (val.images.n, v)
    assert u.queries.dtype == u.images.dtype == np.float32 and u.queries.nnz == val.captions.n * v
    assert np.allclose(np.linalg.norm(u.images.toarray(), axis=1), 1, atol=1e-5)
    for kq, kd in ((1, 2), (3, 5)):
        q, d = u.gated(kq, kd)
        want_q = encode_split(head, val.captions, "text", kq, "vdr", val.bows).toarray()
        want_d = encode_split(head, val.images, "image", kd).toarray()
        assert np.allclose(q.toarray(), want_q, atol=1e-6) and np.allclose(d.toarray(), want_d, atol=1e-6)
        assert u.figures(kq, kd, val.cap_img)["R@10"] == evaluate(head, val, kq, kd)["R@10"]
    small = ungated_vectors(head, val, keep=3)
    assert np.allclose(small.gated(2, 3)[0].toarray(), u.gated(2, 3)[0].toarray(), atol=1e-6)
    assert (np.diff(small.images.indptr) == 3).all()


def test_ksweep_grid_is_validation_at_each_k_and_chooses_under_the_limits(vdr_run, tmp_path):
    """`python -m mmsparse.methods.vdr ksweep`: every grid point's figures are validation's at that
    k_query / k_doc (evaluate), VDR^α's those of bag-of-words queries; the chosen point is the best R@10
    under the FLOPs limit whose VDR^α keeps the asked share; a bad --ks is refused with exit 2."""
    import json
    import subprocess
    import sys

    from mmsparse.methods.vdr.ksweep import choose, open_head_split
    from mmsparse.methods.vdr.method import evaluate

    root, head_dir, _ = vdr_run
    out = tmp_path / "ks.json"
    cmd = [sys.executable, "-m", "mmsparse.methods.vdr", "ksweep", str(head_dir), str(root / "val-images.h5"),
           str(root / "val-captions.h5"), "-o", str(out), "--ks", "2,5", "--max-flops", "1e9", "--min-alpha", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [(x["k_query"], x["k_doc"]) for x in res["rows"]] == [(2, 2), (5, 2), (2, 5), (5, 5)]
    head = load_head(head_dir)
    val = open_head_split(head, head_dir, root / "val-images.h5", root / "val-captions.h5")
    for x in res["rows"]:
        want = evaluate(head, val, x["k_query"], x["k_doc"])
        assert (x["R@10"], x["R@1"], x["d_nnz"]) == (want["R@10"], want["R@1"], x["k_doc"])
        assert x["FLOPs"] == pytest.approx(want["FLOPs"]) and x["bow_R@10"] == want["bow"]["R@10"]
    best = max(res["rows"], key=lambda x: (x["R@10"], -x["FLOPs"]))
    assert res["chosen"] == best and out.with_suffix(".md").is_file()
    rows = [{"R@10": 0.6, "FLOPs": 12.0, "bow_R@10": 0.5}, {"R@10": 0.58, "FLOPs": 9.0, "bow_R@10": 0.4},
            {"R@10": 0.57, "FLOPs": 8.0, "bow_R@10": 0.45}, {"R@10": 0.57, "FLOPs": 7.0, "bow_R@10": 0.45}]
    assert choose(rows, 10, 0.75) == rows[3] and choose(rows, 10, 0.0) == rows[1] and choose(rows, 5) is None
    r = subprocess.run(cmd[:-6] + ["--ks", "0,4"], capture_output=True, text=True)
    assert r.returncode == 2 and "--ks '0,4'" in r.stderr


SMALL_KS = (2, 3, 5, 8)   # the tiny vocabulary (~20 terms) saturates ksweep.KS (16 ... 512)


def _budget_head(vdr_run, out, monkeypatch, val=True, **options):
    """A 1-epoch VDR head of vdr_run's files trained with `options` through the API, one thread, the
    budget sweeping SMALL_KS; returns (head, its log lines)."""
    import mmsparse
    from mmsparse.methods.vdr import ksweep
    from mmsparse.progress import Reporter

    class Lines(Reporter):
        def __init__(self):
            self.lines = []

        def log(self, message):
            self.lines.append(message)

    root, _, _ = vdr_run
    monkeypatch.setattr(ksweep, "KS", SMALL_KS)
    rep = Lines()
    vals = dict(val_images=root / "val-images.h5", val_captions=root / "val-captions.h5") if val else {}
    mmsparse.train_head(root / "train-images.h5", root / "train-captions.h5", out=out, method="vdr", threads=1,
                        epochs=1, batch_size=16, vocab_model=str(root / "vocab-model"), vocab_min_df=1, vdr_train_k=4,
                        vdr_query_k=3, vdr_doc_k=5, progress=rep, **vals, **options)
    return load_head(out), rep.lines


def test_target_flops_sets_inference_k_on_validation_under_the_budget(vdr_run, tmp_path, monkeypatch):
    """--target-flops F: the saved head's k_query / k_doc are ksweep.choose's point under F on the
    validation files (the VDR^α share rule at 0.75), their validation FLOPs (evaluate: the vectors
    sparsify writes) are <= F, k_train is untouched, training.flops_budget records it, one log line."""
    from mmsparse.methods.vdr.ksweep import choose, open_head_split, run
    from mmsparse.methods.vdr.method import evaluate

    root, fixture_head, _ = vdr_run
    flops = sorted(r["FLOPs"] for r in run(fixture_head, root / "val-images.h5", root / "val-captions.h5",
                                          SMALL_KS, 1e9, 0.0)["rows"])
    target = float(flops[len(flops) // 2])          # a budget inside the grid's range: some points fit, some not
    head_dir = tmp_path / "head"
    head, lines = _budget_head(vdr_run, head_dir, monkeypatch, target_flops=target)
    rec = head.config["training"]["flops_budget"]
    res = run(head_dir, root / "val-images.h5", root / "val-captions.h5", SMALL_KS, target, 0.75)
    want = res["chosen"] or choose(res["rows"], target, 0.0)
    assert want is not None and (rec["rule"] == "choose") == (res["chosen"] is not None)
    assert (head.config["k_query"], head.config["k_doc"]) == (rec["k_query"], rec["k_doc"]) \
        == (want["k_query"], want["k_doc"])
    assert head.config["k_train"] == 4 and rec["train_gates"]["k_query"] == 3 and rec["train_gates"]["k_doc"] == 5
    assert rec["split"] == "val" and rec["target"] == target and rec["within"] and rec["grid"] == list(SMALL_KS)
    assert (rec["images"], rec["captions"]) == (10, 20) and rec["point"] == want
    val = open_head_split(head, head_dir, root / "val-images.h5", root / "val-captions.h5")
    got = evaluate(head, val, head.config["k_query"], head.config["k_doc"])
    assert got["FLOPs"] <= target and got["FLOPs"] == pytest.approx(rec["point"]["FLOPs"])
    assert got["R@10"] == rec["point"]["R@10"] and got["d_nnz"] == head.config["k_doc"]
    said = [x for x in lines if x.startswith(f"--target-flops {target:g}: validation (10 images, 20 captions)")]
    assert len(said) == 1 and f"k_query {rec['k_query']} / k_doc {rec['k_doc']}" in said[0], lines


def test_target_flops_out_of_reach_warns_and_without_validation_the_training_sample_decides(
        vdr_run, tmp_path, monkeypatch, capsys):
    """No grid point under F: one warning naming the smallest FLOPs reached, and the head keeps that
    point (not a silent miss). Without validation files the record and the line say the training
    sample decided (all 40 training images of this tiny set, with their 80 captions)."""
    from mmsparse.methods.vdr.ksweep import run

    root, _, _ = vdr_run
    head_dir = tmp_path / "head"
    head, _ = _budget_head(vdr_run, head_dir, monkeypatch, val=False, target_flops=1e-3)
    rec = head.config["training"]["flops_budget"]
    assert rec["split"] == "train_sample" and (rec["images"], rec["captions"]) == (40, 80)
    assert rec["rule"] == "fewest_flops" and not rec["within"]
    rows = run(head_dir, root / "train-images.h5", root / "train-captions.h5", SMALL_KS, 1e9, 0.0)["rows"]
    low = min(rows, key=lambda r: (r["FLOPs"], -r["R@10"]))
    assert (head.config["k_query"], head.config["k_doc"]) == (low["k_query"], low["k_doc"])
    assert rec["point"]["FLOPs"] == pytest.approx(low["FLOPs"]) and low["FLOPs"] > 1e-3
    err = [x for x in capsys.readouterr().err.splitlines() if "--target-flops" in x]
    assert len(err) == 1 and "warning" in err[0] and "the training sample decided" in err[0]
    assert f"the smallest reached is {low['FLOPs']:.2f}" in err[0]


def test_seeds_table_means_spreads_and_tests(tmp_path):
    """`python -m mmsparse.methods.vdr seeds`: mean ± sd (ddof 1) over seeds, the share of the reference's
    R@10, Welch's t-test over seeds (scipy's), and each seed's per-query p that its evaluation recorded
    against the other row's run of that seed."""
    import json
    import subprocess
    import sys

    from scipy.stats import ttest_ind

    def write(name, r10, r1, run, **extra):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"R@1": r1, "R@5": 0.4, "R@10": r10, "FLOPs": 9.0, "run": str(tmp_path / run),
                                 **extra}))
        return str(p)

    dense = [write(f"d{s}", r, 0.2, f"d{s}.trec") for s, r in ((1, 0.63), (2, 0.64), (3, 0.62))]
    vdr = [write(f"v{s}", r, 0.18, f"v{s}.trec", dense_run=str(tmp_path / f"d{s}.trec"),
                 **{"p_vs_dense_corrected_R@10": p, "p_vs_dense_corrected_R@1": 0.5})
           for s, r, p in ((1, 0.60, 0.01), (2, 0.61, 0.02), (3, 0.59, 0.03))]
    out = tmp_path / "t.md"
    r = subprocess.run([sys.executable, "-m", "mmsparse.methods.vdr", "seeds", f"dense={','.join(dense)}",
                        f"VDR (k = 4/8)={','.join(vdr)}", "--reference", "dense", "--versus", "VDR (k = 4/8)=dense",
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.with_suffix(".json").read_text())
    row = data["rows"][1]["R@10"]
    assert row["mean"] == pytest.approx(0.60) and row["sd"] == pytest.approx(0.01) and row["seeds"] == [0.6, 0.61, 0.59]
    v = data["versus"][0]["R@10"]
    assert v["p_seeds"] == pytest.approx(ttest_ind([0.6, 0.61, 0.59], [0.63, 0.64, 0.62], equal_var=False).pvalue)
    assert v["p_per_query"] == [0.01, 0.02, 0.03] and v["diff"] == pytest.approx(-0.03)
    md = out.read_text()
    assert "| VDR (k = 4/8) | 3 | 18.0 ± 0.0 | 40.0 ± 0.0 | 60.0 ± 1.0 | 0.952 | 9.00 ± 0.00 |" in md
    r = subprocess.run([sys.executable, "-m", "mmsparse.methods.vdr", "seeds", f"dense={dense[0]}", "--versus",
                        "VDR=dense", "-o", str(tmp_path / "x.md")], capture_output=True, text=True)
    assert r.returncode == 2 and "--versus 'VDR=dense': no such pair" in r.stderr and not (tmp_path / "x.md").exists()


def test_make_vdr_trains_each_seed_and_tests_against_its_dense_run(tmp_path):
    """`make -n vdr` in the Flickr8k example: a VDR and a dense head per seed (--seed S), every point's
    runs evaluated against the same seed's dense run, one seeds table over them."""
    import shlex
    import subprocess

    from mmsparse import settings
    p = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(settings.REPO_ROOT / "examples" / "flickr8k"),
                        "vdr", f"WORK={tmp_path}", "VDR_POINTS=8/16 512/512"], capture_output=True, text=True,
                       env={**__import__("os").environ, "MAKEFLAGS": ""})
    assert p.returncode == 0, p.stderr
    cmds = [shlex.split(c) for c in p.stdout.replace("\\\n", " ").splitlines() if c.strip()]

    def flag(c, name):
        return [c[i + 1] for i, w in enumerate(c[:-1]) if w == name]
    train = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in cmds if c[1:2] == ["train-head"]}
    assert sorted(train) == ["vdr-dense-s1", "vdr-dense-s2", "vdr-dense-s3", "vdr-s1", "vdr-s2", "vdr-s3"]
    for name, c in train.items():
        assert flag(c, "--seed") == [name[-1]] and flag(c, "--method") == ["dense" if "dense" in name else "vdr"]
    assert flag(train["vdr-s2"], "--vdr-query-k") == ["8"] and flag(train["vdr-s2"], "--vdr-doc-k") == ["16"]
    evals = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in cmds if c[1:2] == ["eval"]}
    for s in (1, 2, 3):
        for name in (f"vdr-s{s}-q8-d16.json", f"vdr-bow-s{s}-d16.json", f"vdr-s{s}-q512-d512.json"):
            assert flag(evals[name], "--dense-run") == [f"{tmp_path}/runs/vdr-dense-s{s}.trec"]
    table = [c for c in cmds if c[1:4] == ["-m", "mmsparse.methods.vdr", "seeds"]]
    assert len(table) == 1 and f"VDR (k = 8/16)={tmp_path}/eval/vdr-s1-q8-d16.json,{tmp_path}/eval/vdr-s2-q8-d16.json," \
        f"{tmp_path}/eval/vdr-s3-q8-d16.json" in table[0]
    assert flag(table[0], "--versus")[0] == "VDR (k = 8/16)=dense trained alike"
