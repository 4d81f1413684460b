"""The search benchmark's synthetic collections and harness, on small real components."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from mmsparse.bench.synthetic import collection_stats, synthesize
from mmsparse.metrics.efficiency import term_df

V = 3000


def zipf_csr(rng, n, lo, hi):
    p = 1 / np.arange(1, V + 1) ** 1.1
    p = p[rng.permutation(V)] / p.sum()
    lens = rng.integers(lo, hi, n)
    m = sp.csr_matrix((rng.gamma(1.0, 0.5, lens.sum()).astype(np.float32) + 0.01,
                       (np.repeat(np.arange(n), lens), rng.choice(V, lens.sum(), p=p))), shape=(n, V))
    m.sum_duplicates()
    return m


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
    # per-term df scales with N (common terms), weights come from the term's own real weights
    df0, df1 = term_df(real) / 400, term_df(syn) / 4000
    common = df0 >= 0.05
    np.testing.assert_allclose(df1[common], df0[common], rtol=0.15, atol=0.01)
    assert not set(np.flatnonzero(df1)) - set(np.flatnonzero(df0))
    t = int(np.argmax(df0))
    assert set(syn.tocsc()[:, t].data.tolist()) <= set(real.tocsc()[:, t].data.tolist())


def test_bench_harness_small(tmp_path):
    """run the benchmark at the real scale and one synthetic scale on a tiny workspace."""
    pytest.importorskip("seismic")
    from mmsparse.bench.search import main
    from mmsparse.formats.dense import write_dense
    from mmsparse.formats.sparse import write_sparse
    from mmsparse.formats.trec import write_qrels
    from mmsparse.indexes.rescore import prune_rows

    rng = np.random.default_rng(1)
    vocab = [f"w{j}" for j in range(V)]
    docs, q = zipf_csr(rng, 150, 20, 60), zipf_csr(rng, 40, 10, 30)
    dids, qids = [f"img{i}" for i in range(150)], [f"cap{i}" for i in range(40)]
    a = {"head": "h", "dataset": "tiny", "split": "test"}
    sd, dd = tmp_path / "sparse" / "d2s", tmp_path / "dense" / "hf-dual"
    write_sparse(sd / "test-images.h5", dids, docs, vocab, {**a, "modality": "image", "query_mode": "doc"})
    write_sparse(sd / "test-captions.expand.h5", qids, q, vocab, {**a, "modality": "text", "query_mode": "expand"})
    write_sparse(sd / "test-captions.caption-terms.h5", qids, prune_rows(q, top_n=4), vocab,
                 {**a, "modality": "text", "query_mode": "caption-terms"})
    da = {"backbone": "hf-dual", "model": "m", "dataset": "tiny", "split": "test", "normalized": True}
    write_dense(dd / "test-images.h5", dids, rng.normal(size=(150, 8)).astype(np.float32), {**da, "modality": "image"})
    write_dense(dd / "test-captions.h5", qids, rng.normal(size=(40, 8)).astype(np.float32), {**da, "modality": "text"})
    write_qrels(dd / "test.qrels", {c: {f"img{i % 150}": 1} for i, c in enumerate(qids)})
    out = tmp_path / "bench" / "search.json"
    main(["--work", str(tmp_path), "--scales", "flickr8k,300", "--ks", "10,100", "--synthetic-queries", "15", "--queries", "25",
          "--warmup", "2", "--ef-search", "16", "--ef-sweep", "32", "--candidates", "100", "--query-top-n", "5",
          "--seismic", "10:0.7", "--seismic-postings", "200", "--build-threads", "1",
          "--dense-synthetic", "random,gaussian"])
    rows = json.loads(out.read_text())
    keys = {"engine", "mode", "docs", "k", "qps", "mean_ms", "p50_ms", "p99_ms", "R@1", "R@10", "RR@10", "overlap",
            "build_s", "index_bytes"}
    assert all(keys <= set(r) for r in rows)
    got = {(r["scale"], r["engine"], r["mode"], r["k"]): r for r in rows}
    for scale in ("flickr8k", "300"):
        assert got[(scale, "exhaustive", "exp (scipy)", 10)]["overlap"] == 1.0
        assert got[(scale, "faiss-flat", "exact", 100)]["overlap"] == 1.0
        assert got[(scale, "pisa", "exp", 10)]["overlap"] >= 0.9  # exact up to 8-bit quantisation
        assert got[(scale, "pisa", "exp taat", 10)]["overlap"] >= 0.9
        assert got[(scale, "two-stage", "c=100", 10)]["overlap"] > 0
        assert got[(scale, "faiss-hnsw", "ef=16", 100)]["overlap"] >= 0.9
        assert got[(scale, "seismic", "qc=10 hf=0.7", 10)]["overlap"] >= 0.8
    assert got[("300", "faiss-hnsw", "ef=16 [gaussian]", 10)]["overlap"] >= 0.9
    assert ("flickr8k", "faiss-hnsw", "ef=16 [gaussian]", 10) not in got
    real = got[("flickr8k", "pisa", "exp", 10)]
    assert real["R@10"] is not None and got[("300", "pisa", "exp", 10)]["R@10"] is None
    assert real["index_bytes"] > 0 and real["docs"] == 150
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["scales"]["300"]["synthetic"]["docs"] == 300
    assert "| engine |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("state", ["init", "sparse"])
def test_train_bench_row(state):
    """bench.train.measure times a real train_step and the bare projection on a tiny shape."""
    from mmsparse.bench.train import measure

    r = measure("tiny", dict(d=16, omega=8, vocab=300, batch=32), state, steps=1, warmup=0, active=5, live=60)
    assert r["step_s"] > 0 and r["bare_projection_s"] > 0 and r["peak_rss_mb"] > 0
    assert r["pairs_per_s"] == pytest.approx(32 / r["step_s"], rel=0.01)
    assert r["live_columns"] <= (60 if state == "sparse" else 300)
