"""BM25-V (issue 9): SAE top-k, streaming training, sum-pool + top-k_post, uint16 quantisation,
BM25 against the brute-force formula (also through a real PISA index), query self-exclusion,
dense rerank, and the class-folder reader."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mmsparse.data.folders import class_qrels, keyword_classes, read_class_folder
from mmsparse.errors import InputError
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.formats.trec import read_run
from mmsparse.indexes.bm25 import DenseReranker, binary, bm25_scores, bm25_weights, postprocess
from mmsparse.methods.bm25v.data import shuffled_batches
from mmsparse.methods.bm25v.head import SAEHead
from mmsparse.methods.bm25v.pooling import dequantize, pool_topk, quantize, to_csr_rows


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one torch thread avoids OpenMP spin-waits on a busy 2-core machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def patch_file(path, rng, n=37, p=4, d=8, clusters=3):
    """Dense image HDF5 with patch_states [n, p, d]: each image's patches near one of `clusters`
    centres (its class), so visual words carry the class."""
    centres = rng.normal(size=(clusters, d)) * 3
    labels = np.arange(n) % clusters
    ps = (centres[labels][:, None, :] + rng.normal(size=(n, p, d))).astype(np.float16)
    ids = [f"c{labels[i]}/img{i}" for i in range(n)]
    vec = ps.astype(np.float32).mean(1)
    write_dense(path, ids, vec, {"modality": "image", "backbone": "hf-dual", "model": "m", "dataset": "toy",
                                 "split": "all", "normalized": False})
    with h5py.File(path, "a") as f:
        f.create_dataset("patch_states", data=ps)
        f.attrs["patch_layer"] = -1
    return ids, ps, labels


# -- SAE ----------------------------------------------------------------------------------------

def test_sae_topk_keeps_exactly_k_per_patch():
    torch.manual_seed(0)
    head = SAEHead.create(dim=24, expansion=4, k=5)
    h = head(torch.randn(64, 24))
    assert h.shape == (64, 96)
    assert ((h > 0).sum(1) == 5).all()          # eq. 3: ||h||_0 = k
    assert (h >= 0).all()
    vals, idx = head.encode_topk(torch.randn(3, 24))
    assert vals.shape == idx.shape == (3, 5)
    with torch.no_grad():                        # no positive pre-activation: ReLU leaves none
        head.enc.bias.fill_(-1e3)
    assert (head(torch.randn(4, 24)) == 0).all()


def test_shuffled_batches_stream_every_patch_once(tmp_path):
    rng = np.random.default_rng(0)
    _, ps, _ = patch_file(tmp_path / "p.h5", rng, n=37, p=4, d=8)
    seen = list(shuffled_batches(tmp_path / "p.h5", 10, np.random.default_rng(1), buffer_images=8, chunk_images=4))
    assert all(len(b) <= 10 for b in seen) and sum(len(b) == 10 for b in seen) == len(seen) - 1
    got = np.concatenate(seen)
    want = ps.astype(np.float32).reshape(-1, 8)
    assert got.shape == want.shape               # 148 patches through a buffer of 8 images (32)
    assert np.array_equal(got[np.lexsort(got.T[::-1])], want[np.lexsort(want.T[::-1])])


def test_train_sae_streams_and_learns(tmp_path):
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.bm25v.method import BM25V
    from mmsparse.methods.head import load_head
    from mmsparse.trainer import fit

    rng = np.random.default_rng(0)
    patch_file(tmp_path / "p.h5", rng, n=60, p=4, d=8)
    m = BM25V(BM25V.config_class(epochs=4, batch_size=32, lr=1e-2, sae_buffer_images=16, sae_expansion=4, sae_k=4))
    head, train, _ = m.setup(TrainInputs(tmp_path / "p.h5"))
    hist = fit(m, head, train).history
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert m.training["patches"] == 240 and hist[-1]["step"] == 4 * 8     # 240 patches in batches of 32
    assert torch.allclose(head.w_dec.norm(dim=1), torch.ones(32), atol=1e-5)  # unit decoder columns
    head.save_pretrained(tmp_path / "sae")
    again = load_head(tmp_path / "sae")
    z = torch.randn(5, 8)
    assert torch.equal(again(z), head(z)) and again.vocab[7] == "vw00007"


# -- eq. 7, eq. 8, quantisation -------------------------------------------------------------------

def test_sum_pool_and_topk_post_match_brute_force():
    rng = np.random.default_rng(0)
    b, p, k, v, kpost = 3, 5, 4, 30, 6
    idx = np.stack([rng.choice(v, k, replace=False) for _ in range(b * p)])
    vals = rng.random((b * p, k)).astype(np.float32)
    pv, pi = pool_topk(torch.from_numpy(vals), torch.from_numpy(idx), p, v, kpost)
    for i in range(b):
        pooled = np.zeros(v)
        for r in range(i * p, (i + 1) * p):
            pooled[idx[r]] += vals[r]                                    # eq. 7
        top = np.argsort(-pooled)[:kpost]                                # eq. 8
        assert set(pi[i].tolist()) == set(top.tolist())
        np.testing.assert_allclose(pv[i].numpy(), pooled[top], rtol=1e-6)
    m = to_csr_rows(pv.numpy(), pi.numpy(), v)
    assert (np.diff(m.indptr) == kpost).all()


def test_quantisation_round_trip():
    v = np.array([0.0, 0.004, 0.005, 0.126, 1.0, 3.14159, 655.35, 700.0], dtype=np.float32)
    q = quantize(v)
    assert q.dtype == np.uint16
    assert q.tolist() == [0, 0, 0, 13, 100, 314, 65535, 65535]          # ×100, rounded, clipped
    back = dequantize(q)
    assert back.dtype == np.float32
    assert np.all(np.abs(back[:7] - v[:7]) <= 0.005 + 1e-6)              # steps of 0.01
    assert np.array_equal(quantize(back), q)                             # stable
    m = to_csr_rows(np.array([[2.5, 0.001]], np.float32), np.array([[3, 7]]), 10)
    assert m.indices.tolist() == [3] and m.data.tolist() == [2.5]        # rounds to 0 -> dropped


# -- BM25 ----------------------------------------------------------------------------------------

def brute_bm25(tf: np.ndarray, q: np.ndarray, k1=1.5, b=0.75) -> np.ndarray:
    """Eq. 1 with eq. 2/9, term by term."""
    n = tf.shape[0]
    dl = tf.sum(1)
    avgdl = dl.mean()
    out = np.zeros((q.shape[0], n))
    for qi in range(q.shape[0]):
        for d in range(n):
            s = 0.0
            for i in np.flatnonzero(q[qi] > 0):
                df = (tf[:, i] > 0).sum()
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                f = tf[d, i]
                s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * dl[d] / avgdl))
            out[qi, d] = s
    return out


def test_bm25_matches_brute_force():
    tf = sp.random(25, 40, density=0.2, random_state=1, format="csr", dtype=np.float32)
    tf.data = np.round(tf.data * 5 + 0.01, 2).astype(np.float32)
    q = sp.random(6, 40, density=0.15, random_state=2, format="csr", dtype=np.float32)
    w, info = bm25_weights(tf)
    assert info["N"] == 25 and w.nnz == tf.nnz and (w.data > 0).all()
    np.testing.assert_allclose(bm25_scores(q, w), brute_bm25(tf.toarray(), q.toarray()), rtol=1e-5)
    np.testing.assert_allclose(bm25_scores(q, bm25_weights(tf, k1=0.9, b=0.3)[0]),
                               brute_bm25(tf.toarray(), q.toarray(), 0.9, 0.3), rtol=1e-5)
    assert binary(q).data.tolist() == [1.0] * q.nnz


def test_index_bm25_search_exclude_self_and_rerank(tmp_path, run_cli):
    rng = np.random.default_rng(3)
    n, v = 40, 50
    tf = sp.random(n, v, density=0.15, random_state=4, format="csr", dtype=np.float32)
    tf.data = np.round(tf.data * 3 + 0.05, 2).astype(np.float32)
    for r in range(n):  # every image has >= 1 word
        if tf.indptr[r + 1] == tf.indptr[r]:
            tf = (tf + sp.csr_matrix(([1.0], ([r], [r % v])), shape=tf.shape, dtype=np.float32)).tocsr()
    ids = [f"c{i % 4}/img{i}" for i in range(n)]
    vocab = [f"vw{i:05d}" for i in range(v)]
    attrs = {"modality": "image", "head": "h", "method": "bm25v", "query_mode": "doc", "dataset": "toy",
             "split": "all"}
    write_sparse(tmp_path / "g.h5", ids, tf, vocab, attrs)
    dense = rng.normal(size=(n, 6)).astype(np.float32)
    write_dense(tmp_path / "d.h5", ids, dense, {"modality": "image", "backbone": "b", "model": "m",
                                                "dataset": "toy", "split": "all", "normalized": False})
    code, _, err = run_cli("index", tmp_path / "g.h5", "-o", tmp_path / "ix", "--weighting", "bm25",
                           "--quant-bits", "16")
    assert code == 0, err
    meta = json.loads((tmp_path / "ix" / "mmsparse.json").read_text())
    assert meta["weighting"]["scheme"] == "bm25" and meta["source"] == str((tmp_path / "g.h5").resolve())
    assert read_sparse(tmp_path / "ix" / "forward.h5").matrix.nnz == tf.nnz

    code, _, err = run_cli("search", tmp_path / "ix", tmp_path / "g.h5", "-o", tmp_path / "r.trec",
                           "--k", 5, "--exclude-self")
    assert code == 0, err
    run = read_run(tmp_path / "r.trec")
    brute = brute_bm25(tf.toarray(), tf.toarray())
    for qi, q in enumerate(ids):
        assert q not in run[q] and len(run[q]) == 5                      # query excluded, still k
        for d, s in run[q].items():
            assert s == pytest.approx(brute[qi, ids.index(d)], rel=2e-3)
        others = np.delete(brute[qi], qi)
        assert min(run[q].values()) >= np.sort(others)[-5] * (1 - 2e-3)

    code, _, err = run_cli("search", tmp_path / "ix", tmp_path / "g.h5", "-o", tmp_path / "rr.trec",
                           "--k", 3, "--exclude-self", "--rerank-dense", tmp_path / "d.h5", "--rerank-k", 10)
    assert code == 0, err
    rr = read_run(tmp_path / "rr.trec")
    unit = dense / np.linalg.norm(dense, axis=1, keepdims=True)
    for qi, q in enumerate(ids[:8]):
        pool = [d for d, _ in sorted(
            ((ids[j], brute[qi, j]) for j in range(n) if j != qi and brute[qi, j] > 0), key=lambda t: -t[1])][:10]
        want = sorted(pool, key=lambda d: -float(unit[qi] @ unit[ids.index(d)]))[:3]
        assert sorted(rr[q], key=lambda d: -rr[q][d]) == want             # the dense order of the pool
        for d, s in rr[q].items():
            assert s == pytest.approx(float(unit[qi] @ unit[ids.index(d)]), abs=1e-5)


def test_postprocess_and_reranker_errors(tmp_path):
    write_dense(tmp_path / "d.h5", ["a", "b", "c"], np.eye(3, dtype=np.float32),
                {"modality": "image", "backbone": "b", "model": "m", "dataset": "t", "split": "all",
                 "normalized": True})
    rr = DenseReranker([tmp_path / "d.h5"])
    out = dict(postprocess([("a", [("a", 9.0), ("b", 5.0), ("c", 4.0)])], 2, exclude_self=True))
    assert out["a"] == [("b", 5.0), ("c", 4.0)]
    with pytest.raises(InputError, match="lacks 1 document"):
        list(postprocess([("a", [("zz", 1.0)])], 2, reranker=rr, rerank_k=5))


# -- data: class folders ---------------------------------------------------------------------------

def test_class_folder_reader_and_qrels(tmp_path):
    from PIL import Image

    for c, names in {"dog": ["1", "2", "3"], "snow": ["4", "5"]}.items():
        (tmp_path / "set" / c).mkdir(parents=True)
        for nm in names:
            Image.new("RGB", (4, 4)).save(tmp_path / "set" / c / f"{nm}.jpg")
    recs, lab = read_class_folder(tmp_path / "set")
    assert lab == {"dog/1": "dog", "dog/2": "dog", "dog/3": "dog", "snow/4": "snow", "snow/5": "snow"}
    qr = class_qrels(lab)
    assert qr["dog/1"] == {"dog/2": 1, "dog/3": 1} and qr["snow/5"] == {"snow/4": 1}   # self excluded
    Image.new("RGB", (4, 4)).save(tmp_path / "set" / "loose.jpg")
    with pytest.raises(InputError, match="class sub-folder"):
        read_class_folder(tmp_path / "set")
    (tmp_path / "pets").mkdir()
    for nm in ("Abyssinian_1", "Abyssinian_2", "great_pyrenees_7"):
        Image.new("RGB", (4, 4)).save(tmp_path / "pets" / f"{nm}.jpg")
    _, lab = read_class_folder(tmp_path / "pets", labels="stem-prefix")
    assert lab["great_pyrenees_7"] == "great_pyrenees" and lab["Abyssinian_2"] == "Abyssinian"


def test_gather_dense_takes_rows_by_file_stem(tmp_path):
    from PIL import Image

    from mmsparse.data.folders import gather_dense
    from mmsparse.formats.dense import read_dense

    rng = np.random.default_rng(0)
    ids, ps, _ = patch_file(tmp_path / "p.h5", rng, n=6, p=2, d=4)
    stems = [i.replace("/", "_") for i in ids]
    with h5py.File(tmp_path / "p.h5", "a") as f:   # Karpathy-style ids: plain stems
        del f["ids"]
        f.create_dataset("ids", data=stems, dtype=h5py.string_dtype())
    for c, rows in {"x": [4, 1], "y": [2]}.items():
        (tmp_path / "set" / c).mkdir(parents=True)
        for r in rows:
            Image.new("RGB", (2, 2)).save(tmp_path / "set" / c / f"{stems[r]}.jpg")
    assert gather_dense(tmp_path / "set", [tmp_path / "p.h5"], tmp_path / "g.h5") == 3
    g = read_dense(tmp_path / "g.h5")
    assert g.ids == [f"x/{stems[1]}", f"x/{stems[4]}", f"y/{stems[2]}"] and g.attrs["split"] == "all"
    with h5py.File(tmp_path / "g.h5") as f:
        assert np.array_equal(f["patch_states"][()], ps[[1, 4, 2]])


def test_keyword_classes_rule():
    cls = {"dog": ("dog", "dogs"), "snow": ("snow",)}
    s = lambda *t: {"tokens": list(t)}  # noqa: E731
    imgs = [{"filename": "a.jpg", "sentences": [s("a", "dog"), s("two", "dogs"), s("grass")]},
            {"filename": "b.jpg", "sentences": [s("dog"), s("dog", "in", "snow")]},   # two classes -> out
            {"filename": "c.jpg", "sentences": [s("snow"), s("people")]},             # 1 caption < 2 -> out
            {"filename": "d.jpg", "sentences": [s("snow"), s("snow", "hill")]}]
    assert keyword_classes(imgs, cls, min_captions=2) == {"a.jpg": "dog", "d.jpg": "snow"}


# -- CLI: train-head --method sae, sparsify --method bm25v -------------------------------------------

def test_train_and_sparsify_cli(tmp_path, run_cli):
    rng = np.random.default_rng(5)
    ids, _, _ = patch_file(tmp_path / "p.h5", rng, n=30, p=4, d=8)
    code, _, err = run_cli("train-head", "--method", "bm25v", tmp_path / "p.h5", "-o", tmp_path / "sae",
                           "--sae-k", 3, "--sae-expansion", 4, "--epochs", 2, "--batch-size", 16,
                           "--sae-buffer-images", 8, "--threads", 1)
    assert code == 0, err
    cfg = json.loads((tmp_path / "sae" / "config.json").read_text())
    assert cfg["method"] == "bm25v" and cfg["vocab_size"] == 32 and cfg["k"] == 3
    code, _, err = run_cli("sparsify", tmp_path / "sae", tmp_path / "p.h5",
                           "-o", tmp_path / "g.h5", "--k-post", 5)
    assert code == 0, err
    col = read_sparse(tmp_path / "g.h5")
    assert col.ids == ids and col.vocab[7] == "vw00007" and col.attrs["method"] == "bm25v"
    assert (col.nnz_per_row <= 5).all() and (col.nnz_per_row >= 3).all()
    assert np.allclose(col.matrix.data * 100, np.rint(col.matrix.data * 100), atol=1e-3)  # uint16 ×100 grid
    code, _, err = run_cli("sparsify", tmp_path / "sae", tmp_path / "g.h5", "-o", tmp_path / "x.h5")
    assert code == 2 and "expected a dense file" in err and not (tmp_path / "x.h5").exists()
