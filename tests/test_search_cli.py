"""`mmsparse index` + `mmsparse search` end to end through the real CLI entry point."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from mmsparse import cli
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import write_sparse
from mmsparse.formats.trec import read_run

V = 200
VOCAB = ["##ing", "Dog", ".", "[SEP]"] + [f"w{j}" for j in range(V - 4)]


def sparse_file(path, rng, n, nnz, modality, empty=(), vocab=VOCAB, prefix=None):
    rows = np.repeat(np.arange(n), nnz)
    m = sp.csr_matrix((rng.gamma(1.0, 0.6, n * nnz).astype(np.float32) + 0.05,  # none rounds to 0
                       (rows, rng.integers(0, len(vocab), n * nnz))), shape=(n, len(vocab))).tolil()
    for r in empty:
        m[r, :] = 0
    m = m.tocsr()
    m.eliminate_zeros()
    ids = [f"{prefix or modality}{i}" for i in range(n)]
    write_sparse(path, ids, m, vocab, {"modality": modality, "head": "h", "query_mode": "expand",
                                       "dataset": "synthetic", "split": "test"})
    return ids, m


def dense_file(path, rng, n, d, modality):
    x = rng.normal(size=(n, d)).astype(np.float32)
    ids = [f"{modality}{i}" for i in range(n)]
    write_dense(path, ids, x, {"modality": modality, "backbone": "hf-dual", "model": "m", "dataset": "synthetic",
                               "split": "test", "normalized": False})
    return ids, x


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(7)
    docs = sparse_file(d / "img.h5", rng, 150, 20, "image")
    qs = sparse_file(d / "txt.h5", rng, 12, 30, "text", empty=(4,))
    # first-stage queries: the same ids, a few terms each (caption terms)
    ct = sparse_file(d / "txt_ct.h5", rng, 12, 3, "text", empty=(4,), prefix="text")
    dense_docs = dense_file(d / "img_dense.h5", rng, 150, 16, "image")
    dense_qs = dense_file(d / "txt_dense.h5", rng, 12, 16, "text")
    return d, docs, qs, ct, dense_docs, dense_qs


@pytest.fixture(scope="module")
def pisa_dir(files, tmp_path_factory):
    d = files[0]
    code = cli.app(args=["index", str(d / "img.h5"), "-o", str(d / "pisa_idx"), "--quant-bits", "10"],
                   standalone_mode=False)
    assert code in (None, 0)
    return d / "pisa_idx"


def test_index_and_search_sparse(files, pisa_dir, run_cli):
    d, (_, D), (q_ids, Q), *_ = files
    meta = json.loads((pisa_dir / "mmsparse.json").read_text())
    assert meta["kind"] == "pisa" and meta["quantization"]["bits"] == 10 and meta["num_docs"] == 150
    before = {p: p.stat().st_mtime_ns for p in pisa_dir.rglob("*")}
    code, _, err = run_cli("search", pisa_dir, d / "txt.h5", "-o", d / "run.trec", "--k", 5)
    assert code == 0, err
    assert {p: p.stat().st_mtime_ns for p in pisa_dir.rglob("*")} == before  # search never writes the index
    assert "1 queries had empty sparse vectors" in err
    run = read_run(d / "run.trec")
    exact = (Q @ D.T).toarray()
    assert set(run) == set(q_ids) - {q_ids[4]}
    for i, q in enumerate(q_ids):
        if i == 4:
            continue
        got = sorted(run[q].values(), reverse=True)
        want = np.sort(exact[i])[::-1][:5]
        np.testing.assert_allclose(got, want, rtol=0.02)
    line = (d / "run.trec").read_text().splitlines()[0].split()
    assert line[1] == "Q0" and line[3] == "1" and line[5] == "mmsparse-pisa"


def test_search_dense_faiss(files, run_cli):
    d, *_, (doc_ids, X), (q_ids, Xq) = files
    code, _, err = run_cli("index", d / "img_dense.h5", "-o", d / "flat")
    assert code == 0, err
    code, _, err = run_cli("search", d / "flat", d / "txt_dense.h5", "-o", d / "dense.trec", "--k", 3)
    assert code == 0, err
    run = read_run(d / "dense.trec")
    exact = Xq @ X.T
    for i, q in enumerate(q_ids):
        top = np.argsort(-exact[i])[:3]
        assert set(run[q]) == {doc_ids[j] for j in top}
        np.testing.assert_allclose(sorted(run[q].values(), reverse=True), exact[i, top], rtol=1e-4)


def test_seismic_and_hnsw_engines(files, run_cli):
    pytest.importorskip("seismic")
    d, (doc_ids, D), (q_ids, Q), _, (_, X), (_, Xq) = files
    for args in (["index", d / "img.h5", "-o", d / "seis", "--engine", "seismic"],
                 ["search", d / "seis", d / "txt.h5", "-o", d / "seis.trec", "--k", 5, "--heap-factor", 1.0,
                  "--query-cut", 30],
                 ["index", d / "img_dense.h5", "-o", d / "hnsw", "--hnsw", "--hnsw-m", 8],
                 ["search", d / "hnsw", d / "txt_dense.h5", "-o", d / "hnsw.trec", "--k", 5, "--ef-search", 64]):
        code, _, err = run_cli(*args)
        assert code == 0, err
    seis, hnsw = read_run(d / "seis.trec"), read_run(d / "hnsw.trec")
    exact, dense = (Q @ D.T).toarray(), Xq @ X.T
    hits = []
    for i, q in enumerate(q_ids):
        if Q[i].nnz:
            hits.append(len(set(seis[q]) & {doc_ids[j] for j in np.argsort(-exact[i])[:5]}) / 5)
        hits.append(len(set(hnsw[q]) & {doc_ids[j] for j in np.argsort(-dense[i])[:5]}) / 5)
    assert np.mean(hits) >= 0.9
    assert json.loads((d / "seis" / "mmsparse.json").read_text())["kind"] == "seismic"


def test_two_stage_and_pruning(files, pisa_dir, run_cli):
    d, (doc_ids, D), (q_ids, Q), (_, CT), *_ = files
    code, _, err = run_cli("search", pisa_dir, d / "txt.h5", "-o", d / "two.trec", "--k", 5,
                           "--mode", "two-stage", "--first-stage", d / "txt_ct.h5", "--candidates", 1000)
    assert code == 0, err
    run = read_run(d / "two.trec")
    exact = (Q @ D.T).toarray()
    first = (CT @ D.T).toarray()
    for i, q in enumerate(q_ids):
        if CT[i].nnz == 0:
            assert q not in run
            continue
        # candidates = every document sharing a caption term; final = exact full-query top-5 among them
        cand = np.flatnonzero(first[i] > 0)
        for doc, score in run[q].items():
            j = doc_ids.index(doc)
            assert score == pytest.approx(exact[i, j], rel=1e-5)
        want = np.sort(exact[i, cand])[::-1][:5]
        np.testing.assert_allclose(sorted(run[q].values(), reverse=True), want, rtol=1e-5)
    code, _, err = run_cli("search", pisa_dir, d / "txt.h5", "-o", d / "few.trec", "--k", 5,
                           "--mode", "two-stage", "--first-stage", d / "txt_ct.h5", "--candidates", 3)
    assert code == 0, err
    assert max(len(r) for r in read_run(d / "few.trec").values()) == 3
    code, _, err = run_cli("search", pisa_dir, d / "txt.h5", "-o", d / "pruned.trec", "--k", 5,
                           "--query-top-n", 3, "--min-weight", 0.2)
    assert code == 0, err
    assert len(read_run(d / "pruned.trec")) == len(q_ids) - 1


def test_bad_inputs_exit_2_one_line(files, pisa_dir, tmp_path, run_cli):
    d = files[0]
    cases = [
        (["search", tmp_path / "nope", d / "txt.h5"], "index not found"),
        (["search", pisa_dir, d / "txt_dense.h5"], "dense query file"),
        (["search", d / "flat_missing", d / "txt_dense.h5"], "not found"),
        (["search", pisa_dir, d / "missing.h5"], "not found"),
        (["index", d / "txt.h5", "--engine", "faiss"], "sparse file"),
        (["search", pisa_dir, d / "txt.h5", "--mode", "two-stage"], "--first-stage"),
    ]
    for args, msg in cases:
        out = tmp_path / "out.trec"
        code, _, err = run_cli(*args, "-o", out)
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1 and msg in err, err
        assert not out.exists()
    # a query vocab that differs from the index vocab
    other = ["x"] + VOCAB[1:]
    sparse_file(tmp_path / "other.h5", np.random.default_rng(0), 3, 5, "text", vocab=other)
    code, _, err = run_cli("search", pisa_dir, tmp_path / "other.h5", "-o", tmp_path / "o.trec")
    assert code == 2 and "vocab" in err and not (tmp_path / "o.trec").exists()


def test_help_states_defaults(run_cli):
    for cmd in ("index", "search"):
        code, out, _ = run_cli(cmd, "--help")
        assert code == 0 and "default" in out.lower()
