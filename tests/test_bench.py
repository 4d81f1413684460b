"""The search benchmark: each engine's top-k against exhaustive scoring computed here by numpy, the
collection builders (views, mixture model, synthetic) and their figures, and the harness end to
end on a tiny workspace; plus the train-head benchmark rows."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from mmsparse.bench.collection import ViewMixture, collection_stats, unit
from mmsparse.bench.search import _top, exact_sparse, overlap, prune_relative
from mmsparse.bench.synthetic import synthesize
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.metrics.efficiency import term_df

V = 3000


def zipf_csr(rng, n, lo, hi, v=V, hub=None):
    """n rows of lo..hi Zipf-distributed terms with gamma weights; `hub` term in every row."""
    p = 1 / np.arange(1, v + 1) ** 1.1
    p = p[rng.permutation(v)] / p.sum()
    lens = rng.integers(lo, hi, n)
    rows, cols = np.repeat(np.arange(n), lens), rng.choice(v, lens.sum(), p=p)
    if hub is not None:
        rows, cols = np.concatenate([rows, np.arange(n)]), np.concatenate([cols, np.full(n, hub)])
    m = sp.csr_matrix((rng.gamma(1.0, 0.5, len(rows)).astype(np.float32) + 0.01, (rows, cols)), shape=(n, v))
    m.sum_duplicates()
    m.sort_indices()
    return m


def brute_sparse(docs, queries, k):
    """Exact top-k by a dense numpy product: doc rows with score > 0, by score then row."""
    s = queries.toarray().astype(np.float64) @ docs.toarray().T.astype(np.float64)
    out = []
    for r in s:
        pos = np.flatnonzero(r > 0)
        out.append(pos[np.lexsort((pos, -r[pos]))][:k])
    return out, s


def exact_within(got, scores_row, k, tol):
    """True when the returned rows are a valid exact top-k: k (or all positive) rows whose true
    scores are all >= the k-th best true score - tol (ties may be broken either way)."""
    pos = np.sort(scores_row[scores_row > 0])[::-1]
    want = min(k, len(pos))
    if len(got) != want:
        return False
    return want == 0 or bool((scores_row[got] >= pos[want - 1] - tol).all())


# ---------------------------------------------------------------- figures

def test_collection_stats_by_hand():
    # 4 documents over 5 terms; term 0 is in 3 of 4 documents (share 0.75)
    d = sp.csr_matrix(np.array([[1, 2, 0, 0, 0], [3, 0, 0, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 2]], np.float32))
    q = sp.csr_matrix(np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], np.float32))
    s = collection_stats(d, q, ["a", "b", "c", "d", "e"])
    assert s["docs"] == 4 and s["nnz"] == 7 and s["doc_terms"] == 1.75 and s["doc_terms_max"] == 3
    assert s["active_terms"] == 5 and s["postings_max"] == 3 and s["postings_p50"] == 1
    assert s["top_term"] == "a" and s["top_term_share"] == 0.75
    # query 0 shares 'a' with docs 0,1,2 and 'b' with doc 0 (4 pairs); query 1 'e' with doc 3: 5 / (2 x 4)
    assert s["flops"] == pytest.approx(5 / 8)
    assert s["postings_per_query"] == pytest.approx(2.5)  # (4 + 1) postings / 2 queries


def test_synthetic_keeps_df_weights_lengths_and_flops():
    rng = np.random.default_rng(0)
    real, queries = zipf_csr(rng, 400, 20, 120), zipf_csr(rng, 200, 5, 30)
    syn = synthesize(real, 4000, seed=1, bins=8)
    assert syn.shape == (4000, V) and syn.has_sorted_indices and syn.data.min() > 0
    a, b = collection_stats(real, queries), collection_stats(syn, queries)
    assert b["flops"] == pytest.approx(a["flops"], rel=0.05)
    assert b["doc_terms"] == pytest.approx(a["doc_terms"], rel=0.05)
    assert b["doc_terms_p10"] == pytest.approx(a["doc_terms_p10"], rel=0.2)
    assert b["doc_terms_p90"] == pytest.approx(a["doc_terms_p90"], rel=0.1)
    df0, df1 = term_df(real) / 400, term_df(syn) / 4000
    common = df0 >= 0.05
    np.testing.assert_allclose(df1[common], df0[common], rtol=0.15, atol=0.01)
    assert not set(np.flatnonzero(df1)) - set(np.flatnonzero(df0))
    t = int(np.argmax(df0))
    assert set(syn.tocsc()[:, t].data.tolist()) <= set(real.tocsc()[:, t].data.tolist())


def test_view_mixture_recovers_a_known_mixture():
    """Views drawn from a known mixture: the fit recovers the means, the within-image covariance
    and the collage share, and its samples have the views' spread around their image."""
    rng = np.random.default_rng(0)
    n_img, per, d = 300, 8, 16
    mu = unit(rng.standard_normal((n_img, d)))
    root = np.diag(np.linspace(0.02, 0.2, d)).astype(np.float32)
    src, z = [], []
    for a in range(n_img):
        for _ in range(per):
            if rng.random() < 0.25:
                b = (a + 1 + rng.integers(n_img - 1)) % n_img
                src.append((a, b))
                z.append(unit(mu[a] + mu[b]) + 0.05 + rng.standard_normal(d) @ root.T)
            else:
                src.append((a, -1))
                z.append(mu[a] + rng.standard_normal(d) @ root.T)
    z = np.asarray(z, np.float32)
    mix = ViewMixture.fit(z, np.asarray(src))
    assert mix.collage_share == pytest.approx(0.25, abs=0.03)
    np.testing.assert_allclose(mix.single_root @ mix.single_root.T, root @ root.T, atol=4e-3)
    np.testing.assert_allclose(mix.collage_mean, 0.05, atol=0.02)
    # each mean averages ~6 views of spread sigma_j: RMS error ~ sqrt(mean sigma^2 / 6) = 0.05
    assert np.sqrt(((mix.means - mu[mix.images]) ** 2).mean()) < 0.08
    kinds, x = next(mix.sample(5000, seed=3))
    # a draw is the same whatever the sample's size and start (chunk-seeded stream)
    whole = np.concatenate([v for _, v in mix.sample(20, seed=2, chunk=4)])
    part = np.concatenate([v for _, v in mix.sample(9, seed=2, start=5, chunk=4)])
    np.testing.assert_array_equal(part, whole[5:14])
    assert x.shape == (5000, d) and np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    assert kinds.mean() == pytest.approx(0.25, abs=0.03)
    # spread: cosine of a single-view sample to its nearest image mean matches the real views'
    real_single = unit(z[np.asarray(src)[:, 1] < 0])
    cos_real = (real_single @ unit(mu).T).max(1).mean()
    cos_mix = (x[kinds == 0] @ unit(mu).T).max(1).mean()
    assert cos_mix == pytest.approx(cos_real, abs=0.02)
    with pytest.raises(ValueError):
        ViewMixture.fit(z[:1], np.array([[0, -1]]))


def test_collections_drop_views_of_the_originals(tmp_path):
    """write_collections: no view showing an original (single or either collage part) enters the
    collections or the mixture fit; a second view set tops up to max_views in file order; 123k is
    filled to its size with mixture draws and 1m continues the same draws; the check sample has as
    many draws as real views; another recipe rebuilds."""
    from mmsparse.bench.collection import write_collections
    from mmsparse.formats.dense import DenseWriter, read_dense

    rng = np.random.default_rng(4)
    d, names = 16, [f"im{i}" for i in range(30)]  # dataset order; im0..im4 are the "test" originals
    mu = unit(rng.standard_normal((30, d)))
    mu[:5] = unit(np.eye(d, dtype=np.float32)[:5] * 10 + 0.01)  # test images: far from the others
    a = {"modality": "image", "backbone": "b", "model": "m", "dataset": "t", "split": "views", "normalized": True}

    def views_file(path, seed, images):
        r = np.random.default_rng(seed)
        ids, vec, src = [], [], []
        for j, i in enumerate(images):
            for v in range(4):
                if v == 3:  # one collage per image, partner the next image of the list
                    o = images[(j + 1) % len(images)]
                    ids.append(f"{names[i]}+{names[o]}#{'s%d' % seed if seed else ''}c{v}")
                    vec.append(unit(mu[i] + mu[o] + 0.05 * r.standard_normal(d)))
                    src.append((i, o))
                else:
                    ids.append(f"{names[i]}#{'s%d' % seed if seed else ''}v{v}")
                    vec.append(unit(mu[i] + 0.05 * r.standard_normal(d)))
                    src.append((i, -1))
        with DenseWriter(path, d, a) as w:
            w.append(ids, np.asarray(vec, np.float32))
            w.append_extra("sources", np.asarray(src, np.int32))
        return ids

    all_ids = views_file(tmp_path / "v0.h5", 0, list(range(30)))   # every image, test ones included
    top_ids = views_file(tmp_path / "v1.h5", 1, list(range(5, 30)))  # non-test images only
    write_dense(tmp_path / "orig.h5", names[:5], mu[:5], {**a, "split": "test"})
    clean0 = [x for x in all_ids if not any(p in names[:5] for p in x.split("#")[0].split("+"))]
    # 30 x 4 views; the 20 singles+collage of im0..im4 and im29's collage with im0 show a test image
    assert len(clean0) == 120 - 21
    # 5 originals + 110 real views + 20 draws = size 135; 1m adds 40 more draws of the same stream
    paths = write_collections([tmp_path / "v0.h5", tmp_path / "v1.h5"], tmp_path / "orig.h5", tmp_path / "c",
                              size=135, mixture=40, max_views=110, log=lambda *x: None)
    c = read_dense(paths["123k"])
    assert c.ids[:115] == names[:5] + clean0 + top_ids[:110 - len(clean0)]
    assert c.ids[115:] == [f"mix{i:07d}" for i in range(20)]
    big = read_dense(paths["1m"])
    assert big.ids[:135] == c.ids and big.ids[135:] == [f"mix{i:07d}" for i in range(20, 60)]
    np.testing.assert_array_equal(big.vectors[:135], c.vectors)  # the same draws, continued
    chk = read_dense(paths["check"])
    assert len(chk.ids) == 110 and chk.ids[0] == "chk0000000"  # as many draws as real views, another seed
    assert (np.abs(chk.vectors[:20] - c.vectors[115:]).max(axis=1) > 1e-3).all()
    want = {"123k": {"originals": 5, "views": 110, "draws": 20, "docs": 135},
            "1m": {"originals": 5, "views": 110, "draws": 60, "docs": 175},
            "mixture-check": {"originals": 0, "views": 0, "draws": 110, "docs": 110}}
    assert paths["counts"] == want and json.loads((tmp_path / "c" / "collections.json").read_text())["counts"] == want
    assert read_dense(paths["123k"]).attrs["bench_views"] == 110
    mix = ViewMixture.load(tmp_path / "c" / "mixture.npz")
    assert not set(mix.images.tolist()) & set(range(5))  # no test image has a mean in the model
    assert (unit(big.vectors[115:]) @ mu[:5].T).max() < 0.9  # no mixture draw lands on a test image
    # a size that leaves room for 50 views only: the first 50 kept views, no draws; rebuilt, not kept
    paths = write_collections([tmp_path / "v0.h5", tmp_path / "v1.h5"], tmp_path / "orig.h5", tmp_path / "c",
                              size=55, mixture=40, check=0, log=lambda *x: None)
    assert read_dense(paths["123k"]).ids == names[:5] + clean0[:50]
    assert paths["counts"]["1m"]["draws"] == 40 and not (tmp_path / "c" / "mixture-check.dense.h5").exists()
    assert "mixture-check" not in paths["counts"]


@pytest.mark.slow  # real images through the backbone
def test_views_of_real_images(tmp_path, flickr8k_dir, dual_encoder_dir):
    """bench.views on 6 real images: ids, sources, unit vectors, resume gives the same rows, and a
    view is closer to its own image's encoding than to the other images'."""
    from mmsparse.backbones import load_backbone
    from mmsparse.bench.views import all_images, encode_views
    from mmsparse.formats.dense import read_dense

    out = tmp_path / "views"
    kw = dict(views=18, model=dual_encoder_dir, shard_images=3, limit_images=6, threads=1, log=lambda *a: None)
    f = encode_views(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out, collage=0.3, **kw)
    v = read_dense(f)
    with h5py.File(f, "r") as h:
        src = h["sources"][()]
    assert len(v.ids) == 18 and len(set(v.ids)) == 18 and src.shape == (18, 2)
    assert np.allclose(np.linalg.norm(v.vectors, axis=1), 1, atol=1e-4)
    assert ((src[:, 1] >= 0) == np.array(["#c" in i for i in v.ids])).all()
    assert np.bincount(src[:, 0], minlength=6).tolist() == [3] * 6
    # resume: drop one shard and the merged file, run again -> identical rows
    (out / "shards" / "shard-00001.h5").unlink()
    f.unlink()
    v2 = read_dense(encode_views(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out,
                                 collage=0.3, **kw))
    assert v2.ids == v.ids and np.allclose(v2.vectors, v.vectors, atol=1e-5)
    # views resemble their source image
    recs = all_images(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")[:6]
    from PIL import Image
    bb = load_backbone("hf-dual", dual_encoder_dir, "cpu")
    orig = bb.encode_images([Image.open(r.path).convert("RGB") for r in recs])
    single = src[:, 1] < 0
    sims = v.vectors[single] @ orig.T
    own = sims[np.arange(single.sum()), src[single, 0]]
    other = (sims.sum(1) - own) / 5
    assert (own > other).mean() >= 0.8


# ---------------------------------------------------------------- engines against exhaustive scoring

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """2,000 documents / 40 queries over 3,000 terms with a hub term in every document (as in the
    real head), written as sparse HDF5."""
    rng = np.random.default_rng(5)
    d = tmp_path_factory.mktemp("small")
    docs, q = zipf_csr(rng, 2000, 20, 60, hub=7), zipf_csr(rng, 40, 10, 40, hub=7)
    vocab = [f"w{j}" for j in range(V)]
    write_sparse(d / "docs.h5", [f"d{i}" for i in range(2000)], docs, vocab,
                 {"modality": "image", "head": "h", "query_mode": "doc"})
    return d, docs, q


@pytest.fixture(scope="module")
def pisa16(small):
    from mmsparse.indexes.pisa import build_pisa_index

    d = small[0]
    build_pisa_index(d / "docs.h5", d / "pisa16", quant_bits=16)
    return d / "pisa16"


def test_exhaustive_matches_numpy(small):
    _, docs, q = small
    got = exact_sparse(docs, q, 10, chunk=7)
    want, _ = brute_sparse(docs, q, 10)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("algo", ["block_max_wand", "block_max_maxscore", "maxscore", "wand", "ranked_or",
                                  "ranked_or_taat"])
def test_pisa_algorithms_are_exact(small, pisa16, algo):
    """PISA with 16-bit quantisation returns an exact top-10 (up to quantisation error) by every
    algorithm; k = 100 too."""
    from mmsparse.indexes.pisa import PisaSearcher

    d, docs, q = small
    ps = PisaSearcher(pisa16, query_algorithm=algo, query_bits=16)
    _, s = brute_sparse(docs, q, 10)
    tol = 1e-3 * s.max()
    for k in (10, 100):
        for i in range(q.shape[0]):
            a, b = q.indptr[i], q.indptr[i + 1]
            rows = ps.search_one(q.indices[a:b], q.data[a:b], k)[0]
            assert exact_within(rows, s[i], k, tol), (algo, k, i)


def test_two_stage_and_pruning(small, tmp_path):
    """Two-stage re-scoring is exact over its candidates: with caption terms = the full query and
    c = N it equals exhaustive scoring; query pruning keeps the largest weights."""
    from mmsparse.indexes.pisa import PisaSearcher, build_pisa_index
    from mmsparse.indexes.rescore import rescore_one

    d, docs, q = small
    build_pisa_index(d / "docs.h5", tmp_path / "pisa", quant_bits=8)
    ps = PisaSearcher(tmp_path / "pisa")
    want, _ = brute_sparse(docs, q, 10)
    for i in range(q.shape[0]):
        a, b = q.indptr[i], q.indptr[i + 1]
        cand = ps.search_one(q.indices[a:b], q.data[a:b], docs.shape[0])[0]
        rows = rescore_one(q.indices[a:b], q.data[a:b], docs, cand, 10)[0]
        assert np.array_equal(rows, want[i])
    p = prune_relative(q, 0.5)
    for i in range(q.shape[0]):
        w = q.data[q.indptr[i]:q.indptr[i + 1]]
        assert sorted(p.data[p.indptr[i]:p.indptr[i + 1]]) == sorted(w[w >= 0.5 * w.max()])


def test_seismic_recall_bound(small, tmp_path):
    """Seismic is approximate: overlap@10 with exhaustive scoring >= 0.9 with a generous query_cut and
    heap_factor, and a k-NN graph build searched with n_knn does not lose recall."""
    pytest.importorskip("seismic")
    from mmsparse.indexes.seismic import SeismicSearcher, build_seismic_index

    d, docs, q = small
    want, _ = brute_sparse(docs, q, 10)
    build_seismic_index(d / "docs.h5", tmp_path / "s", n_postings=1000, knn=10)
    ss = SeismicSearcher(tmp_path / "s", query_cut=40, heap_factor=0.7)
    got = [ss.search_one(q.indices[q.indptr[i]:q.indptr[i + 1]], q.data[q.indptr[i]:q.indptr[i + 1]], 10)[0]
           for i in range(q.shape[0])]
    assert overlap(got, want, 10) >= 0.9
    ss.n_knn = 10
    got_knn = [ss.search_one(q.indices[q.indptr[i]:q.indptr[i + 1]], q.data[q.indptr[i]:q.indptr[i + 1]], 10)[0]
               for i in range(q.shape[0])]
    assert overlap(got_knn, want, 10) >= overlap(got, want, 10) - 0.02
    ss_cut = SeismicSearcher(tmp_path / "s", query_cut=1, heap_factor=1.0)
    got_cut = [ss_cut.search_one(q.indices[q.indptr[i]:q.indptr[i + 1]], q.data[q.indptr[i]:q.indptr[i + 1]], 10)[0]
               for i in range(q.shape[0])]
    assert overlap(got_cut, want, 10) < overlap(got, want, 10)  # the bound is Seismic's, not trivial


def test_faiss_flat_exact_and_hnsw_recall(tmp_path):
    from mmsparse.bench.search import exact_dense
    from mmsparse.indexes.faiss_index import FaissSearcher, build_faiss_index

    rng = np.random.default_rng(2)
    centres = unit(rng.standard_normal((40, 32)))
    x = unit(centres[rng.integers(0, 40, 3000)] + 0.3 * rng.standard_normal((3000, 32)).astype(np.float32))
    qv = unit(centres[rng.integers(0, 40, 50)] + 0.3 * rng.standard_normal((50, 32)).astype(np.float32))
    a = {"modality": "image", "backbone": "b", "model": "m", "dataset": "t", "split": "t", "normalized": True}
    write_dense(tmp_path / "d.h5", [f"d{i}" for i in range(3000)], x, a)
    build_faiss_index(tmp_path / "d.h5", tmp_path / "flat")
    build_faiss_index(tmp_path / "d.h5", tmp_path / "hnsw", hnsw=True, hnsw_m=16, ef_construction=200)
    want = exact_dense(x, qv, 10)
    s = qv @ x.T
    flat = FaissSearcher(tmp_path / "flat")
    for i in range(50):
        assert exact_within(flat.search_one(qv[i], 10)[0], s[i] + 10, 10, 1e-5)  # +10: every score "positive"
    hs = FaissSearcher(tmp_path / "hnsw", ef_search=128)
    assert overlap([hs.search_one(qv[i], 10)[0] for i in range(50)], want, 10) >= 0.95
    hs.index.hnsw.efSearch = 1
    assert overlap([hs.search_one(qv[i], 10)[0] for i in range(50)], want, 10) < 1.0


# ---------------------------------------------------------------- the harness end to end

def tiny_workspace(root, rng, n_docs=150, n_q=40):
    """Two heads over one dense workspace: d2s (documents, expanded and caption-term queries) and
    if (its own documents, inference-free queries: short rows, as a term-weight table makes)."""
    from mmsparse.formats.trec import write_qrels
    from mmsparse.indexes.rescore import prune_rows

    vocab = [f"w{j}" for j in range(V)]
    docs, q = zipf_csr(rng, n_docs, 20, 60, hub=3), zipf_csr(rng, n_q, 10, 30, hub=3)
    dids, qids = [f"img{i}" for i in range(n_docs)], [f"cap{i}" for i in range(n_q)]
    a = {"head": "h", "dataset": "tiny", "split": "test"}
    sd, dd = root / "sparse" / "d2s", root / "dense" / "hf-dual"
    write_sparse(sd / "test-images.h5", dids, docs, vocab, {**a, "modality": "image", "query_mode": "doc"})
    write_sparse(sd / "test-captions.expand.h5", qids, q, vocab, {**a, "modality": "text", "query_mode": "expand"})
    qc = prune_rows(q, top_n=4)
    write_sparse(sd / "test-captions.caption-terms.h5", qids, qc, vocab,
                 {**a, "modality": "text", "query_mode": "caption-terms"})
    fd, fq = zipf_csr(rng, n_docs, 30, 80, hub=5), zipf_csr(rng, n_q, 4, 12)
    write_sparse(root / "sparse" / "if" / "test-images.h5", dids, fd, vocab,
                 {**a, "modality": "image", "query_mode": "doc"})
    # the query file in another row order than the dense captions: the harness aligns by id
    order = rng.permutation(n_q)
    write_sparse(root / "sparse" / "if" / "test-captions.inference-free.h5", [qids[i] for i in order], fq[order],
                 vocab, {**a, "modality": "text", "query_mode": "inference-free"})
    da = {"backbone": "hf-dual", "model": "m", "dataset": "tiny", "split": "test", "normalized": True}
    xd, xq = unit(rng.normal(size=(n_docs, 8)).astype(np.float32)), unit(rng.normal(size=(n_q, 8)).astype(np.float32))
    write_dense(dd / "test-images.h5", dids, xd, {**da, "modality": "image"})
    write_dense(dd / "test-captions.h5", qids, xq, {**da, "modality": "text"})
    write_qrels(dd / "test.qrels", {c: {f"img{i % n_docs}": 1} for i, c in enumerate(qids)})
    return docs, q, qc, xd, xq, fd, fq


@pytest.mark.slow  # every engine's job process: ~40 s
def test_bench_harness_small(tmp_path):
    """The harness on a tiny workspace (real PISA, Seismic, Faiss): its exact references equal numpy's,
    two-stage's overlap equals the one computed here from its candidate set, R@10 matches the qrels."""
    pytest.importorskip("seismic")
    from mmsparse.bench.search import main

    rng = np.random.default_rng(1)
    docs, q, qc, xd, xq, fd, fq = tiny_workspace(tmp_path, rng)
    main(["--work", str(tmp_path), "--scales", "synthetic-300", "--jobs", "exhaustive,pisa,faiss-flat,faiss-hnsw",
          "--queries", "*:15", "--warmup", "2", "--ef-search", "16", "--candidates", "100", "--query-top-n", "5",
          "--query-min-weight", "0.2", "--query-bits", "6", "--prune-algorithms", "maxscore",
          "--pisa-algorithms", "block_max_wand", "--build-threads", "1", "--dense-synthetic", "gaussian"])
    main(["--work", str(tmp_path), "--heads", "d2s,if", "--scales", "flickr8k", "--ks", "10,100",
          "--jobs", "exhaustive,pisa,pisa-levers,seismic,seismic-levers,bmp,kannolo,faiss-flat,faiss-hnsw",
          "--bmp-blocks", "8", "--bmp-alphas", "1.0,0.5", "--bmp-betas", "1.0", "--kannolo-m", "8",
          "--kannolo-efc", "50", "--kannolo-ef", "8,64",
          "--queries", "flickr8k:25", "--warmup", "2", "--ef-search", "16,128", "--candidates", "20,1000",
          "--query-top-n", "5", "--query-min-weight", "0.2", "--query-bits", "6", "--prune-algorithms",
          "maxscore", "--pisa-algorithms", "block_max_wand,ranked_or_taat", "--seismic-cuts", "10",
          "--seismic-heaps", "0.7", "--seismic-at-k", "10:0.7", "--seismic-build", "*:n_postings=200",
          "--build-threads", "1", "--lever-scales", "flickr8k", "--pisa-levers", "bits=6",
          "--lever-algorithms", "maxscore", "--seismic-levers", "knn=5", "--lever-seismic-cuts", "10",
          "--seismic-n-knn", "5"])
    bench = tmp_path / "bench"
    out = bench / "d2s"
    rows = json.loads((bench / "search.json").read_text())
    got = {(r["scale"], r["engine"], r["mode"], r["k"]): r for r in rows if r["head"] in ("d2s", None)}
    sample = np.load(out / "flickr8k" / "exact-sparse.npz")["sample"]
    assert len(sample) == 25 and all(r["queries"] == 25 for r in rows if r["scale"] == "flickr8k")
    # the sparse reference is numpy's exact top-100 of the sampled queries
    ex = np.load(out / "flickr8k" / "exact-sparse.npz")["rows"]
    want, s = brute_sparse(docs, q[sample], 100)
    assert all(np.array_equal(e[e >= 0], w) for e, w in zip(ex, want))
    exd = np.load(bench / "dense" / "flickr8k" / "exact-dense-real.npz")["rows"]
    assert all(np.array_equal(e[:10], w) for e, w in zip(exd, exact_dense_np(xd, xq[sample], 10)))
    # two-stage c=1000 (> N) re-ranks exactly every document sharing a caption term
    exp = []
    for j, i in enumerate(sample):
        cand = np.flatnonzero((qc[i].toarray() @ docs.T.toarray()).ravel() > 0)
        top = cand[np.lexsort((cand, -s[j, cand]))][:10]
        if len(want[j]):
            exp.append(len(set(top.tolist()) & set(want[j][:10].tolist())) / min(10, len(want[j])))
    assert got[("flickr8k", "two-stage", "c=1000", 10)]["overlap@10"] == pytest.approx(np.mean(exp), abs=1e-3)
    assert got[("flickr8k", "two-stage", "c=20", 10)]["overlap@10"] <= got[("flickr8k", "two-stage", "c=1000", 10)]["overlap@10"]
    # R@10 of the exhaustive row: the qrels hold img(i % 150) for cap(i)
    hit = [f"img{int(i) % 150}" in {f"img{r}" for r in w[:10]} for i, w in zip(sample, want)]
    assert got[("flickr8k", "exhaustive", "exp (scipy)", 10)]["R@10"] == pytest.approx(100 * np.mean(hit), abs=0.01)
    for key in [("flickr8k", "pisa", "exp block_max_wand", 10), ("flickr8k", "pisa", "exp ranked_or_taat", 100),
                ("flickr8k", "pisa", "exp maxscore bits=6", 10), ("flickr8k", "seismic", "qc=10 hf=0.7", 100),
                ("flickr8k", "seismic", "qc=10 hf=0.7 knn=5 [knn=5]", 10), ("flickr8k", "faiss-hnsw", "ef=128", 100),
                ("flickr8k", "pisa", "exp top=5 maxscore", 10), ("flickr8k", "pisa", "exp w>=0.2max maxscore", 10),
                ("flickr8k", "pisa", "exp qbits=6 maxscore", 10), ("synthetic-300", "faiss-hnsw", "ef=16 [gaussian]", 10)]:
        r = got[key]
        assert r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"] and r["qps_2t"] > 0 and r["rss_mb"] > 0, key
    assert got[("flickr8k", "pisa", "exp block_max_wand", 10)]["overlap@10"] >= 0.95  # exact up to 8-bit quantisation
    assert got[("flickr8k", "kannolo", "flat", 10)]["overlap@10"] >= 0.99   # exhaustive on float weights
    assert got[("flickr8k", "bmp", "block=8 a=1.0 b=1.0", 10)]["overlap@10"] >= 0.95   # exact on integer weights
    assert got[("flickr8k", "kannolo", "M=8 ef=64", 10)]["build"] == {"index_type": "hnsw", "m": 8}
    assert got[("flickr8k", "pisa", "exp block_max_wand", 10)]["build_rss_mb"] > 0
    assert got[("synthetic-300", "pisa", "exp block_max_wand", 10)]["R@10"] is None
    meta = json.loads((bench / "search.meta.json").read_text())
    assert meta["jobs"]["flickr8k"]["d2s/exhaustive"]["stats"]["docs"] == 150
    from importlib.metadata import version
    assert meta["engine_versions"]["bmp"] == version("bmp") and meta["engine_versions"]["kannolo"]
    b = got[("flickr8k", "bmp", "block=8 a=1.0 b=1.0", 10)]   # timed per call like the others: no own timer
    assert "engine_mean_ms" not in b and b["fallbacks"] >= 0 and b["completions"] >= 0
    assert (bench / "frontier.png").stat().st_size > 0 and (bench / "frontier-synthetic.png").stat().st_size > 0
    assert "| head | engine |" in (bench / "search.md").read_text()
    # the inference-free head: its own reference (its queries, aligned by id, against its documents)
    ifr = {(r["engine"], r["mode"], r["k"]): r for r in rows if r["head"] == "if" and r["scale"] == "flickr8k"}
    pos = {c: i for i, c in enumerate(f"cap{i}" for i in range(40))}  # the dense captions' order
    want_if, _ = brute_sparse(fd, fq[[pos[f"cap{i}"] for i in sample]], 100)
    ex_if = np.load(bench / "if" / "flickr8k" / "exact-sparse.npz")["rows"]
    assert all(np.array_equal(e[e >= 0], w) for e, w in zip(ex_if, want_if))
    assert {r["query_mode"] for r in ifr.values()} == {"inference-free"}
    assert ifr[("exhaustive", "if (scipy)", 10)]["overlap@10"] == 1.0
    assert ifr[("pisa", "if block_max_wand", 10)]["overlap@10"] >= 0.95
    hit = [f"img{int(i) % 150}" in {f"img{r}" for r in w[:10]} for i, w in zip(sample, want_if)]
    assert ifr[("exhaustive", "if (scipy)", 10)]["R@10"] == pytest.approx(100 * np.mean(hit), abs=0.01)
    assert not [key for key in ifr if key[0] == "two-stage" or key[1].startswith("no-exp")]  # D2S's modes only
    assert ("pisa", "no-exp ranked_or_taat", 100) in {k[1:] for k in got}  # every algorithm on caption terms
    assert {r["head"] for r in rows if r["engine"] == "faiss-hnsw"} == {None}  # the dense jobs ran once
    assert "| if | pisa | if block_max_wand |" in (bench / "search.md").read_text()
    # the collection rewritten since (each document's weights on the next document's terms reversed
    # in order: a different collection with the same ids) is indexed anew, not served by the old index
    src = tmp_path / "sparse" / "d2s" / "test-images.h5"
    old = read_sparse(src)
    write_sparse(src, old.ids, old.matrix[::-1], old.vocab, old.attrs)
    main(["--work", str(tmp_path), "--scales", "flickr8k", "--ks", "10", "--queries", "flickr8k:25",
          "--warmup", "2", "--jobs", "exhaustive,pisa", "--pisa-algorithms", "block_max_wand", "--query-top-n", "5",
          "--query-min-weight", "0.2", "--query-bits", "6", "--candidates", "20", "--build-threads", "1"])
    rows = json.loads((bench / "search.json").read_text())
    again = {(r["scale"], r["head"], r["engine"], r["mode"], r["k"]): r for r in rows}
    assert again[("flickr8k", "d2s", "pisa", "exp block_max_wand", 10)]["overlap@10"] >= 0.95
    # rows of d2s jobs measured on its old documents are left out of the table, not mixed in; the
    # dense side and the other head, whose documents did not change, keep theirs
    assert not [key for key in again if key[:3] == ("flickr8k", "d2s", "seismic")]
    assert again[("flickr8k", None, "faiss-hnsw", "ef=16", 10)]
    assert again[("flickr8k", "if", "seismic", "qc=10 hf=0.7", 10)]
    assert again[("synthetic-300", None, "faiss-hnsw", "ef=16 [gaussian]", 10)]  # a scale not re-run keeps its rows


@pytest.mark.slow  # a Milvus Lite job process
def test_bench_milvus_job(tmp_path):
    """The Milvus Lite job on the tiny workspace: its sparse rows (Lite scores exhaustively) agree
    with numpy's exact top-10, its dense HNSW rows reach a recall bound against exact dense."""
    pytest.importorskip("milvus_lite")
    from mmsparse.bench.search import main

    rng = np.random.default_rng(3)
    docs, q, qc, xd, xq, _, _ = tiny_workspace(tmp_path, rng, n_docs=120, n_q=20)
    main(["--work", str(tmp_path), "--scales", "flickr8k", "--ks", "10", "--queries", "flickr8k:20",
          "--warmup", "2", "--jobs", "exhaustive,faiss-flat,milvus", "--ef-search", "64", "--build-threads", "1"])
    out = tmp_path / "bench" / "d2s"
    got = {(r["engine"], r["mode"]): r for r in json.loads((tmp_path / "bench" / "search.json").read_text())}
    sample = np.load(out / "flickr8k" / "exact-sparse.npz")["sample"]
    want, _ = brute_sparse(docs, q[sample], 10)
    # overlap@10 of the Lite rows is computed by the harness; check it against numpy's exact lists
    sp_row = got[("milvus-sparse", "Lite TAAT_NAIVE (exact)")]
    assert sp_row["queries"] == 20 and sp_row["overlap@10"] >= 0.99
    hit = [f"img{int(i) % 120}" in {f"img{r}" for r in w[:10]} for i, w in zip(sample, want)]
    assert sp_row["R@10"] == pytest.approx(100 * np.mean(hit), abs=0.01)
    assert got[("milvus-dense", "Lite HNSW ef=64")]["overlap@10"] >= 0.9
    assert sp_row["bytes_per_doc"] > 0 and sp_row["p50_ms"] > 0


def test_endtoend_encoders_make_the_sparsify_queries(tmp_path, search_setup):
    """The end-to-end job's D2S encoders (text -> text tower -> head) give, caption by caption, the
    rows `sparsify` writes, for a head whose query side has a top-k gate (k = 4 here, below the
    captions' own term counts): expanded queries keep the gate's k terms, caption-term queries every
    own term (they skip the gate). Real Flickr8k captions, the real text tower and a real head."""
    import shutil
    from types import SimpleNamespace

    import mmsparse
    from mmsparse.bench.search import endtoend

    head = tmp_path / "head"
    shutil.copytree(search_setup["head"], head)
    cfg = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**cfg, "query_top_k": 4}))
    dq = search_setup["dense"] / "test-captions.h5"
    sc = SimpleNamespace(head_dir=head, dq=dq, settings={})
    for mode in ("expand", "caption-terms"):
        f = read_sparse(mmsparse.sparsify(head, dq, query_mode=mode, out=tmp_path / f"{mode}.h5"))
        encode = endtoend.ENCODERS[mode](sc, mode)
        rows = [encode(t) for t in f.texts[:20]]
        got = endtoend._csr(rows, f.matrix.shape[1])
        assert endtoend.file_match(got, f.matrix[:20]) == 1.0, mode
        nnz = np.diff(got.indptr)
        assert (nnz <= 4).all() if mode == "expand" else (nnz > 4).mean() > 0.5, (mode, nnz)


@pytest.mark.slow  # end-to-end job on real heads: ~50 s
def test_endtoend_real_heads(tmp_path, search_setup):
    """The end-to-end job on real text: search_setup's 100 Flickr8k test images, 500 captions, the
    real dual encoder and its D2S head, plus an inference-free head trained here for one epoch.
    Rows for dense, D2S expanded, D2S caption terms and inference-free queries; the encoders make
    the queries the search-only jobs read (file_match); the encoder's time is in every row; the
    inference-free path never imports torch; its PISA rankings are the search-only ones."""
    pytest.importorskip("seismic")
    import mmsparse
    from mmsparse.bench.search import main

    dense, work = search_setup["dense"], tmp_path / "work"
    (work / "dense").mkdir(parents=True)
    (work / "dense" / "hf-dual").symlink_to(dense)
    (work / "heads").mkdir()
    (work / "heads" / "d2s").symlink_to(search_setup["head"])
    mmsparse.train_head(dense / "train-images.h5", dense / "train-captions.h5", out=work / "heads" / "if",
                        method="inference-free", epochs=1, batch_size=128, vocab_min_df=1, lr_warmup=0,
                        vocab_lr=1e-3, weight_decay=0.01, eta=0.05, l1_warmup=4)
    for h, modes in (("d2s", ("expand", "caption-terms")), ("if", ("inference-free",))):
        mmsparse.sparsify(work / "heads" / h, dense / "test-images.h5", out=work / "sparse" / h / "test-images.h5")
        for m in modes:
            mmsparse.sparsify(work / "heads" / h, dense / "test-captions.h5", query_mode=m,
                              out=work / "sparse" / h / f"test-captions.{m}.h5")
    main(["--work", str(work), "--heads", "d2s,if", "--scales", "flickr8k", "--ks", "10", "--queries", "flickr8k:30",
          "--warmup", "3", "--jobs", "exhaustive,pisa,seismic,faiss-flat,faiss-hnsw,endtoend",
          "--pisa-algorithms", "maxscore,block_max_wand", "--query-top-n", "", "--query-min-weight", "",
          "--query-bits", "", "--candidates", "", "--seismic-cuts", "3,20", "--seismic-heaps", "0.9",
          "--seismic-at-k", "", "--seismic-build", "*:n_postings=200", "--ef-search", "16,64", "--build-threads", "1"])
    rows = json.loads((work / "bench" / "search.json").read_text())
    e2e = {(r["query_mode"], r["engine"]): r for r in rows if r.get("endtoend")}
    assert set(e2e) == {("dense", "faiss-hnsw"), ("expand", "pisa"), ("expand", "seismic"), ("caption-terms", "pisa"),
                        ("caption-terms", "seismic"), ("inference-free", "pisa"), ("inference-free", "seismic")}
    for key, r in e2e.items():
        assert r["queries"] == 30 and r["k"] == 10 and r["docs"] == 100, key
        assert 0 < r["encode_p50_ms"] and 0 < r["search_p50_ms"] and r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"], key
        assert r["encode_mean_ms"] + r["search_mean_ms"] == pytest.approx(r["mean_ms"], abs=2e-3), key
        assert r["qps_1t"] == pytest.approx(1000 / r["mean_ms"], rel=0.01), key
        assert r["torch_loaded"] == (key[0] != "inference-free"), key  # no torch in the inference-free process
    # the text tower costs milliseconds, the table lookup does not
    assert e2e[("inference-free", "pisa")]["encode_p50_ms"] < e2e[("dense", "faiss-hnsw")]["encode_p50_ms"] / 5
    assert e2e[("inference-free", "pisa")]["file_match"] == 1.0  # the table encodes exactly as sparsify does
    assert e2e[("caption-terms", "pisa")]["file_match"] >= 0.9 and e2e[("expand", "pisa")]["file_match"] >= 0.9
    assert e2e[("dense", "faiss-hnsw")]["file_match"] >= 0.9
    for mode in ("expand", "caption-terms", "inference-free"):  # PISA is exact up to 8-bit quantisation
        assert e2e[(mode, "pisa")]["overlap@10"] >= 0.9, mode
    # the same queries and index as the search-only row of the chosen algorithm: the same rankings
    so = {(r["head"], r["mode"]): r for r in rows if not r.get("endtoend") and r["k"] == 10}
    r = e2e[("inference-free", "pisa")]
    fast = min(("maxscore", "block_max_wand"), key=lambda a: so[("if", f"if {a}")]["p50_ms"])
    assert r["algorithm"] == fast and r["choice"].startswith("pisa job's fastest")
    assert r["R@10"] == so[("if", f"if {fast}")]["R@10"] and r["overlap@10"] == so[("if", f"if {fast}")]["overlap@10"]
    ok = [x for x in so.values() if x["head"] == "if" and x["engine"] == "seismic" and x["overlap@10"] >= 0.95]
    assert e2e[("inference-free", "seismic")]["choice"].startswith("seismic job's fastest" if ok else "default")
    md = (work / "bench" / "search.md").read_text()
    assert "## end to end" in md and "| inference-free | if | pisa |" in md
    # --e2e-seismic none: PISA alone, no Seismic build (what the 1M run needs)
    main(["--work", str(work), "--heads", "if", "--scales", "flickr8k", "--ks", "10", "--queries", "flickr8k:30",
          "--warmup", "3", "--jobs", "endtoend", "--e2e-seismic", "none", "--build-threads", "1"])
    rows = json.loads((work / "bench" / "if" / "flickr8k" / "endtoend.json").read_text())["rows"]
    assert [(r["query_mode"], r["engine"]) for r in rows] == [("inference-free", "pisa")]
    assert rows[0]["R@10"] == r["R@10"] and rows[0]["overlap@10"] == r["overlap@10"]


def test_goals_of_issue_25():
    """goals(): the end-to-end bounds (p50, overlap, speedup over dense) and the search-only ratio
    at 1M on expanded or inference-free rows only, each met or not by hand-made rows."""
    from mmsparse.bench.search import goals

    def row(scale, mode, engine, p50, ov, e2e=False, head="if"):
        return {"scale": scale, "k": 10, "head": None if mode == "dense" else head, "query_mode": mode,
                "engine": engine, "mode": "m", "p50_ms": p50, "overlap@10": ov, "R@10": 1.0, "endtoend": e2e}
    rows = [row("123k", "dense", "faiss-hnsw", 9.0, 0.98, True), row("123k", "inference-free", "pisa", 0.8, 0.99, True),
            row("123k", "inference-free", "seismic", 0.3, 0.90, True),      # faster, but below the overlap
            row("1m", "dense", "faiss-hnsw", 9.5, 0.98, True), row("1m", "inference-free", "seismic", 3.2, 0.96, True),
            row("1m", "dense", "faiss-hnsw", 0.3, 0.97), row("1m", "expand", "seismic", 1.0, 0.95, head="d2s"),
            row("1m", "caption-terms", "pisa", 0.1, 0.99, head="d2s"),      # not a query type of the goal
            row("1m", "inference-free", "pisa", 0.95, 0.99)]
    g = goals(rows)
    e = g["endtoend_123k"]
    assert e["inference_free"]["engine"] == "pisa" and e["speedup_vs_dense"] == 11.2 and e["met"] is True
    assert g["endtoend_1m"]["met"] is False                                 # 3.2 ms > 3 ms
    s = g["search_1m"]
    assert (s["sparse"]["head"], s["sparse"]["query_mode"]) == ("if", "inference-free")
    assert (s["ratio_p50"], s["met"]) == (3.17, False)
    assert s["by_head"]["d2s"]["p50_ms"] == 1.0
    slow_dense = goals([dict(r, p50_ms=5.0) if r["query_mode"] == "dense" else r for r in rows])
    assert slow_dense["endtoend_123k"]["met"] is False                      # 0.8 ms but only 6x faster
    assert goals([r for r in rows if r["overlap@10"] < 0.95])["endtoend_123k"]["met"] is False
    assert goals([])["endtoend_123k"].get("met") is None and goals([])["search_123k"]["sparse"] is None


def test_edges_and_ratios_of_issue_50():
    """edges(): each engine's fastest row at overlap@10 >= 0.95, its ratio to the fastest HNSW row,
    and whether a faster setting was measured below the overlap (a measured edge) or not (the
    grid's corner); ratio_goals(): issue 50's three ratios, met or not."""
    from mmsparse.bench.search import edges, ratio_goals

    def row(engine, mode, p50, ov, qm="expand", head="d2s", e2e=False):
        return {"scale": "1m", "k": 10, "head": head, "query_mode": qm, "engine": engine, "mode": mode,
                "p50_ms": p50, "overlap@10": ov, "R@10": 5.0, "endtoend": e2e}
    rows = [row("faiss-hnsw", "ef=96", 0.40, 0.95, "dense", None), row("faiss-hnsw", "ef=80", 0.35, 0.94, "dense", None),
            row("seismic", "qc=2 hf=1.2", 0.50, 0.96), row("seismic", "qc=1 hf=1.5", 0.30, 0.90),
            row("bmp", "block=32 a=1.0 b=1.0", 0.70, 0.99),   # the fastest BMP row holds: the grid's corner
            row("bmp", "block=32 a=1.0 b=1.0", 0.35, 0.97, "inference-free", "if"),
            row("faiss-hnsw", "ef=96", 9.0, 0.95, "dense", None, True),
            row("bmp", "block=32 a=1.0 b=1.0", 1.5, 0.97, "inference-free", "if", True)]
    e = {(r["head"], r["engine"]): r for r in edges(rows, "1m")}
    assert e[("d2s", "seismic")]["mode"] == "qc=2 hf=1.2" and e[("d2s", "seismic")]["x_hnsw"] == 1.25
    assert e[("d2s", "seismic")]["edge"].startswith("measured: qc=1 hf=1.5") and "0.9" in e[("d2s", "seismic")]["edge"]
    assert e[("d2s", "bmp")]["edge"].startswith("grid corner")
    assert e[(None, "faiss-hnsw")]["mode"] == "ef=96" and e[(None, "faiss-hnsw")]["edge"].startswith("measured")
    g = ratio_goals(rows, "1m")
    assert (g["expand_vs_hnsw"]["ratio"], g["expand_vs_hnsw"]["met"]) == (1.25, True)
    assert (g["inference_free_vs_hnsw"]["ratio"], g["inference_free_vs_hnsw"]["met"]) == (0.87, True)
    assert g["endtoend_inference_free_vs_dense"]["ratio"] == 0.167 and g["endtoend_inference_free_vs_dense"]["met"]
    assert ratio_goals([], "1m")["expand_vs_hnsw"].get("met") is None


def exact_dense_np(x, qv, k):
    s = qv @ x.T
    return [np.lexsort((np.arange(len(r)), -r))[:k] for r in s]


# ---------------------------------------------------------------- train-head benchmark rows

@pytest.mark.parametrize("state", ["init", "sparse-simulated"])
def test_train_bench_row(state):
    """bench.train.measure times a real train_step and the bare projection on a tiny shape; its
    live-column count is the head's own on the measured batch."""
    import time

    from mmsparse.bench.train import measure

    t0 = time.perf_counter()
    r = measure("tiny", dict(d=16, omega=8, vocab=300, batch=32), state, steps=3, warmup=1, active=5, live=60)
    wall = time.perf_counter() - t0
    # the medians are real timings: (warm-up + timed) steps of each kind fit in the call's wall time
    assert 0 < 4 * (r["step_s"] + r["bare_projection_s"]) < wall
    if state == "sparse-simulated":  # only the 60 un-biased columns can fire
        assert r["simulated"] and 0 < r["live_columns"] <= 60 and r["active_terms_per_row"] <= 60
    else:  # init: about half of the 300 outputs fire, far beyond the sparse state's 60
        assert not r["simulated"] and r["live_columns"] > 100


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads child pids from /proc (Linux)")
def test_job_processes_end_with_the_benchmark(tmp_path):
    """A benchmark killed by a signal leaves no job process running (it would skew later timings)."""
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c", "import time; from mmsparse.bench.search import in_child; "
                               "in_child(time.sleep, 120)"])
    kids: list[int] = []
    for _ in range(100):  # wait for the spawned job process
        time.sleep(0.2)
        f = f"/proc/{parent.pid}/task/{parent.pid}/children"
        kids = [int(x) for x in open(f).read().split()] if os.path.exists(f) else []
        if kids:
            break
    assert kids, "no job process started"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    time.sleep(3)
    alive = [k for k in kids if os.path.exists(f"/proc/{k}") and "Z" not in open(f"/proc/{k}/stat").read().split()[2]]
    assert not alive, f"job processes {alive} outlived the benchmark"
