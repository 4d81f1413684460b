"""Real PISA / Faiss / Seismic indexes over small seeded collections vs brute-force scoring."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import seismic  # noqa: F401  (a required dependency: missing is an import error, not a skip)

from mmsparse.errors import InputError
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import write_sparse
from mmsparse.indexes import open_index
from mmsparse.indexes.faiss_index import build_faiss_index
from mmsparse.indexes.pisa import PISA_DIR, build_pisa_index, quantize_rows, row_scales
from mmsparse.indexes.rescore import prune_rows, rescore, rescore_one
from mmsparse.indexes.seismic import build_seismic_index

# Terms PISA's text path would split, lower-case or drop: they must survive via t<j> tokens.
TRICKY = ["##ing", "Dog", "dog", ".", "[CLS]", "naïve", "a b", "t1", "-", "##s"]
V = 400


def vocab() -> list[str]:
    return TRICKY + [f"w{j}" for j in range(V - len(TRICKY))]


def random_csr(rng, n: int, nnz: int, empty_rows=()) -> sp.csr_matrix:
    rows = np.repeat(np.arange(n), nnz)
    cols = rng.integers(0, V, n * nnz)
    cols[::7] = rng.integers(0, len(TRICKY), len(cols[::7]))  # make the tricky terms common
    m = sp.csr_matrix((rng.gamma(1.0, 0.6, n * nnz).astype(np.float32) + 1e-3, (rows, cols)), shape=(n, V))
    m = m.tolil()
    for r in empty_rows:
        m[r, :] = 0
    m = m.tocsr()
    m.eliminate_zeros()
    return m


def make_sparse(path, rng, n, nnz, modality, empty_rows=()):
    m = random_csr(rng, n, nnz, empty_rows)
    ids = [f"{modality[0]}{i:04d}.jpg" for i in range(n)]
    write_sparse(path, ids, m, vocab(), {"modality": modality, "head": "test-head", "query_mode": "expand",
                                         "backbone": "hf-dual", "model": "m", "dataset": "synthetic",
                                         "split": "test"})
    return ids, m


@pytest.fixture(scope="module")
def sparse_setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("sparse")
    rng = np.random.default_rng(0)
    doc_ids, D = make_sparse(d / "docs.h5", rng, 300, 25, "image", empty_rows=(5,))
    q_ids, Q = make_sparse(d / "queries.h5", rng, 25, 12, "text", empty_rows=(3,))
    meta = build_pisa_index(d / "docs.h5", d / "idx", quant_bits=8)
    return d, doc_ids, D, q_ids, Q, meta


def test_pisa_metadata(sparse_setup):
    d, doc_ids, D, _, _, meta = sparse_setup
    on_disk = json.loads((d / "idx" / "mmsparse.json").read_text())
    assert on_disk["kind"] == "pisa" and on_disk["num_docs"] == len(doc_ids) == meta["num_docs"]
    assert on_disk["source_attrs"]["modality"] == "image" and on_disk["source_attrs"]["split"] == "test"
    assert on_disk["quantization"]["scale"] == pytest.approx(255 / D.data.max())
    assert on_disk["settings"]["query_algorithm"] == "block_max_wand"
    assert not list(d.glob(".idx.tmp-*"))  # atomic build left no temporary directory


def test_pisa_index_round_trips_exactly(sparse_setup):
    """Reconstruct the CSR from PISA's own posting files: equals the quantised input exactly."""
    d, _, D, _, _, meta = sparse_setup
    p = d / "idx" / PISA_DIR
    docs = np.fromfile(p / "inv.docs", dtype=np.uint32)
    freqs = np.fromfile(p / "inv.freqs", dtype=np.uint32)
    terms = (p / "fwd.terms").read_text().split("\n")[:-1]
    assert docs[0] == 1 and docs[1] == D.shape[0]
    rows, cols, vals = [], [], []
    i, j = 2, 0
    for term in terms:
        n = docs[i]
        assert freqs[j] == n
        rows.append(docs[i + 1:i + 1 + n])
        vals.append(freqs[j + 1:j + 1 + n])
        cols.append(np.full(n, int(term[1:])))
        i, j = i + 1 + n, j + 1 + n
    got = sp.csr_matrix((np.concatenate(vals).astype(np.float32), (np.concatenate(rows), np.concatenate(cols))),
                        shape=D.shape)
    want = quantize_rows(D, meta["quantization"]["scale"])
    assert (got != want).nnz == 0
    assert meta["postings"] == want.nnz


@pytest.mark.parametrize("algorithm", ["block_max_wand", "maxscore", "ranked_or", "ranked_or_taat"])
def test_pisa_topk_equals_brute_force(sparse_setup, algorithm):
    d, _, D, _, Q, meta = sparse_setup
    k = 10
    s = open_index(d / "idx", query_algorithm=algorithm)
    res = s.search(Q, k)
    sd = meta["quantization"]["scale"]
    sq = row_scales(Q, 8)
    qi = quantize_rows(Q, sq)
    exact_int = (qi @ quantize_rows(D, sd).T).toarray()  # what PISA computes, in integers
    exact = (Q @ D.T).toarray()
    for i in range(Q.shape[0]):
        if Q[i].nnz == 0:
            assert res[i] == []
            continue
        want = np.sort(exact_int[i][exact_int[i] > 0])[::-1][:k]
        got_int = np.array([sc for _, sc in res[i]]) * sd * sq[i]
        np.testing.assert_allclose(got_int, want, rtol=1e-5)  # same top-k scores (ties may swap ids)
        for doc, sc in res[i]:
            assert exact_int[i, doc] == pytest.approx(sc * sd * sq[i], rel=1e-5)
            assert sc == pytest.approx(exact[i, doc], rel=0.05, abs=0.05)  # ~ float inner product
    import pyterrier as pt

    assert not pt.java.started()  # the learned-sparse path never starts the JVM


def test_pisa_empty_collection_rejected(tmp_path):
    write_sparse(tmp_path / "e.h5", ["a"], sp.csr_matrix((1, V), dtype=np.float32), vocab(),
                 {"modality": "image", "head": "h", "query_mode": "doc"})
    with pytest.raises(InputError, match="no positive weight"):
        build_pisa_index(tmp_path / "e.h5", tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_faiss_flat_exact_and_hnsw(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 32)).astype(np.float32)
    Xq = rng.normal(size=(20, 32)).astype(np.float32)
    attrs = {"modality": "image", "backbone": "hf-dual", "model": "m", "dataset": "synthetic", "split": "test",
             "normalized": False}
    write_dense(tmp_path / "d.h5", [f"d{i}" for i in range(500)], X, attrs)
    build_faiss_index(tmp_path / "d.h5", tmp_path / "flat")
    build_faiss_index(tmp_path / "d.h5", tmp_path / "hnsw", hnsw=True, hnsw_m=16, ef_construction=100,
                      ef_search=200)
    exact = Xq @ X.T
    flat = open_index(tmp_path / "flat").search(Xq, 10)
    hnsw = open_index(tmp_path / "hnsw").search(Xq, 10)
    recall = []
    for i in range(20):
        top = np.argsort(-exact[i], kind="stable")[:10]
        assert [r for r, _ in flat[i]] == top.tolist()
        np.testing.assert_allclose([s for _, s in flat[i]], exact[i, top], rtol=1e-4)
        recall.append(len(set(top) & {r for r, _ in hnsw[i]}) / 10)
    assert np.mean(recall) >= 0.9
    meta = json.loads((tmp_path / "hnsw" / "mmsparse.json").read_text())
    assert meta["settings"]["index_type"] == "IndexHNSWFlat" and meta["settings"]["hnsw_m"] == 16


def test_seismic_matches_brute_force(sparse_setup, tmp_path):
    d, _, D, _, Q, _ = sparse_setup
    build_seismic_index(d / "docs.h5", tmp_path / "seis")
    res = open_index(tmp_path / "seis", heap_factor=1.0, query_cut=50).search(Q, 10)
    exact = (Q @ D.T).toarray()
    overlap = []
    for i in range(Q.shape[0]):
        if Q[i].nnz == 0:
            assert res[i] == []
            continue
        top = set(np.argsort(-exact[i], kind="stable")[:10].tolist())
        overlap.append(len(top & {r for r, _ in res[i]}) / 10)
        for doc, sc in res[i]:
            assert sc == pytest.approx(exact[i, doc], rel=0.02, abs=0.02)
    assert np.mean(overlap) >= 0.9


def test_prune_rows():
    m = sp.csr_matrix(np.array([[0.5, 0.1, 0.9, 0.3], [0.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.05]],
                               dtype=np.float32))
    p = prune_rows(m, top_n=2, min_weight=0.15).toarray()
    np.testing.assert_array_equal(p, np.array([[0.5, 0, 0.9, 0], [0, 0, 0, 0], [0.2, 0.2, 0, 0]], np.float32))


def test_rescore_is_exact():
    rng = np.random.default_rng(2)
    D = random_csr(rng, 50, 10)
    Q = random_csr(rng, 3, 8)
    cands = [[(j, 0.0) for j in range(0, 50, 2)], [], [(7, 1.0)]]
    out = rescore(Q, D, cands, k=5)
    exact = (Q @ D.T).toarray()
    rows = np.arange(0, 50, 2)
    top = rows[np.lexsort((rows, -exact[0, rows]))][:5]
    assert [r for r, _ in out[0]] == top.tolist()
    assert out[1] == [] and out[2][0][1] == pytest.approx(exact[2, 7])


def test_pisa_collection_writer_matches_toks_indexer(tmp_path):
    """write_pisa_collection (numpy) writes byte for byte what pyterrier-pisa's toks_indexer writes."""
    from pyterrier_pisa import PisaIndex

    from mmsparse.indexes.pisa import term_token, write_pisa_collection

    m = random_csr(np.random.default_rng(5), 120, 15, empty_rows=(3,))
    qm = quantize_rows(m, 255 / m.data.max())
    write_pisa_collection(tmp_path / "ours", qm)
    toks = np.array([term_token(j) for j in range(V)], dtype=object)
    PisaIndex(str(tmp_path / "ref"), stemmer="none", stops="none").toks_indexer(scale=1.0).index(
        {"docno": str(i), "toks": dict(zip(toks[qm.indices[qm.indptr[i]:qm.indptr[i + 1]]],
                                           qm.data[qm.indptr[i]:qm.indptr[i + 1]].tolist()))}
        for i in range(qm.shape[0]))
    names = sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ours").iterdir())
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def _exact_top(scores: np.ndarray, k: int) -> list[int]:
    rows = np.arange(len(scores))
    keep = scores > 0
    rows, s = rows[keep], scores[keep]
    return rows[np.lexsort((rows, -s))][:k].tolist()


def test_search_one_paths_match_batch_and_exhaustive(sparse_setup, tmp_path):
    """Single-query paths (used by the benchmark): PISA == its batch search; two-stage with every
    document as a candidate == exhaustive float top-k; Seismic at default settings keeps recall."""
    d, _, D, _, Q, _ = sparse_setup
    k = 10
    exact = (Q @ D.T).toarray()
    build_seismic_index(d / "docs.h5", tmp_path / "seis")
    seis = open_index(tmp_path / "seis")  # default query_cut / heap_factor
    overlap = []
    for algorithm in ("block_max_wand", "ranked_or_taat"):
        pisa = open_index(d / "idx", query_algorithm=algorithm)
        batch = pisa.search(Q, k)
        for i in range(Q.shape[0]):
            idx, w = Q.indices[Q.indptr[i]:Q.indptr[i + 1]], Q.data[Q.indptr[i]:Q.indptr[i + 1]]
            rows, scores = pisa.search_one(idx, w, k)
            assert [(int(r), pytest.approx(s)) for r, s in zip(rows, scores)] == batch[i]
            full, full_scores = rescore_one(idx, w, D, np.arange(D.shape[0]), k)
            if len(idx) == 0:
                assert len(rows) == 0 and len(seis.search_one(idx, w, k)[0]) == 0
                continue
            top = _exact_top(exact[i], k)
            assert full[:len(top)].tolist() == top
            np.testing.assert_allclose(full_scores[:len(top)], exact[i, top], rtol=1e-5)
            overlap.append(len(set(seis.search_one(idx, w, k)[0].tolist()) & set(top)) / len(top))
    assert np.mean(overlap) >= 0.8


def test_hnsw_returns_k_results_when_k_exceeds_ef_search(tmp_path):
    """Faiss HNSW returns only ~efSearch results; the searcher widens the beam to k."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 16)).astype(np.float32)
    write_dense(tmp_path / "d.h5", [f"d{i}" for i in range(400)], X,
                {"modality": "image", "backbone": "b", "model": "m", "dataset": "s", "split": "test",
                 "normalized": False})
    build_faiss_index(tmp_path / "d.h5", tmp_path / "hnsw", hnsw=True, hnsw_m=8, ef_search=8)
    s = open_index(tmp_path / "hnsw")
    rows, _ = s.search_one(X[0], 300)
    assert len(rows) == 300 and len(s.search(X[:2], 300)[1]) == 300
    exact = np.argsort(-(X @ X[0]))[:300]
    assert len(set(rows.tolist()) & set(exact.tolist())) / 300 >= 0.9
