"""BMP and kANNolo indexes (`index --engine bmp|kannolo`) on real Flickr8k vectors (the shared
search_setup: 100 test images sparsified by a real D2S head, their 500 captions as expanded
queries), each against exhaustive float scoring; plus BMP's integer edge cases on seeded data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.indexes import open_index
from mmsparse.indexes.bmp import build_bmp_index
from mmsparse.indexes.kannolo import build_kannolo_index


@pytest.fixture(scope="module")
def real(search_setup, tmp_path_factory):
    """Documents and expanded caption queries of the real small setup, with their exact top-10."""
    d = tmp_path_factory.mktemp("engines")
    s = search_setup
    caps = mmsparse.sparsify(s["head"], s["dense"] / "test-captions.h5", out=d / "caps.h5")
    D, Q = read_sparse(s["sparse_images"]).matrix, read_sparse(caps).matrix
    scores = (Q @ D.T).toarray()
    exact = [_top(r, 10) for r in scores]
    return {"dir": d, "docs": s["sparse_images"], "caps": caps, "D": D, "Q": Q, "scores": scores, "exact": exact}


def _top(scores: np.ndarray, k: int) -> list[int]:
    rows = np.flatnonzero(scores > 0)
    return rows[np.lexsort((rows, -scores[rows]))][:k].tolist()


def _overlap(res: list[list[tuple[int, float]]], exact: list[list[int]]) -> float:
    return float(np.mean([len({r for r, _ in got[:10]} & set(e)) / len(e) for got, e in zip(res, exact) if e]))


def test_kannolo_flat_is_exact_and_hnsw_keeps_overlap(real):
    """kANNolo keeps the weights in 16 bits: its flat index is exact up to that rounding."""
    flat = mmsparse.build_index(real["docs"], out=real["dir"] / "kflat", engine="kannolo", kannolo_index="flat")
    res = open_index(flat).search(real["Q"], 10)
    assert _overlap(res, real["exact"]) >= 0.99
    for i, got in enumerate(res):
        np.testing.assert_allclose([s for _, s in got], real["scores"][i, [r for r, _ in got]], rtol=2e-3)
    hnsw = mmsparse.build_index(real["docs"], out=real["dir"] / "khnsw", engine="kannolo", hnsw_m=16,
                                ef_construction=100, ef_search=40)
    meta = json.loads((hnsw / "mmsparse.json").read_text())
    assert meta["kind"] == "kannolo" and meta["settings"]["hnsw_m"] == 16 and meta["settings"]["ef_search"] == 40
    assert meta["source_attrs"]["modality"] == "image" and meta["num_docs"] == real["D"].shape[0]
    assert any(x.get("sha256") for x in meta["inputs"])   # the source file's fingerprint, as for PISA
    s = open_index(hnsw)
    assert s.ef_search == 40
    assert _overlap(s.search(real["Q"], 10), real["exact"]) >= 0.95
    one = [list(zip(*(a.tolist() for a in s.search_one(q.indices, q.data, 10)))) for q in real["Q"]]
    assert [[r for r, _ in x] for x in one] == [[r for r, _ in x] for x in s.search(real["Q"], 10)]


def test_bmp_exact_at_alpha_1_and_faster_settings_lose_little(real):
    idx = mmsparse.build_index(real["docs"], out=real["dir"] / "bmp", engine="bmp", bmp_block_size=8)
    meta = json.loads((idx / "mmsparse.json").read_text())
    q = meta["quantization"]
    assert meta["kind"] == "bmp" and meta["settings"]["block_size"] == 8 and q["bound"] in ("bits", "u16-score")
    _assert_u16_safe(real["D"], q["scale"])
    s = open_index(idx)
    res = s.search(real["Q"], 10)
    assert _overlap(res, real["exact"]) >= 0.95   # integer weights: ties and rounding only
    for i, r in enumerate(res):   # exact on its own integer weights: the brute-force k-th score
        a, b = real["Q"].indptr[i], real["Q"].indptr[i + 1]
        idx_, w = real["Q"].indices[a:b], real["Q"].data[a:b]
        live = s._indexed[idx_] & (np.rint(w * 32 / w.max()) > 0)
        want = _int_topk(real["D"], s.scale, idx_[live], w[live], 10)
        got = _bmp_int_scores(s, w[live], np.array([sc for _, sc in r]))
        assert len(got) == len(want) and (not len(got) or got[-1] == want[-1]), (i, got, want)
    # scores ~ <q, d>: integer rounding of both sides (5-bit queries: this small head's expanded
    # queries hold ~370 terms, most of them tiny, so the error is larger than on the main job's)
    got = np.array([sc for r in res for _, sc in r])
    want = np.array([real["scores"][i, d] for i, r in enumerate(res) for d, _ in r])
    assert np.corrcoef(got, want)[0, 1] > 0.98 and np.median(np.abs(got / want - 1)) < 0.1
    fast = open_index(idx, alpha=0.7, beta=0.5).search(real["Q"], 10)
    assert 0.5 <= _overlap(fast, real["exact"]) <= _overlap(res, real["exact"])


def test_bmp_and_kannolo_through_the_cli(real, run_cli, tmp_path):
    for engine, flags, sflags in (("bmp", ["--bmp-block-size", "16"], ["--bmp-alpha", "1.0"]),
                                  ("kannolo", ["--hnsw-m", "16"], ["--ef-search", "50"])):
        code, _, err = run_cli("index", real["docs"], "-o", tmp_path / engine, "--engine", engine, *flags)
        assert code == 0, err
        code, _, err = run_cli("search", tmp_path / engine, real["caps"], "-o", tmp_path / f"{engine}.trec",
                               "--k", 10, *sflags)
        assert code == 0, err
        lines = (tmp_path / f"{engine}.trec").read_text().splitlines()
        assert len(lines) == 10 * real["Q"].shape[0] and lines[0].split()[5] == f"mmsparse-{engine}"
        code, _, err = run_cli("search", tmp_path / engine, real["caps"], "-o", tmp_path / "p.trec", "--k", 10,
                               "--query-top-n", 3)   # query-side pruning works for every engine
        assert code == 0, err
        # ... and searches the pruned queries: the engine's own answer to each caption's 3 largest terms
        from mmsparse.indexes.rescore import prune_rows

        s = open_index(tmp_path / engine, **({"ef_search": 50} if engine == "kannolo" else {}))
        want = [{s.ids[r] for r, _ in x} for x in s.search(prune_rows(real["Q"], top_n=3), 10)]
        full = [{s.ids[r] for r, _ in x} for x in s.search(real["Q"], 10)]
        got = _trec_sets(tmp_path / "p.trec", read_sparse(real["caps"]).ids)
        assert np.mean([len(g & w) / max(1, len(w)) for g, w in zip(got, want)]) >= 0.99
        assert np.mean([len(g & f) / max(1, len(f)) for g, f in zip(got, full)]) < 0.9   # not the full queries'


def _trec_sets(path, qids: list[str]) -> list[set[str]]:
    """The document ids a TREC run holds per query, in the order of qids."""
    got: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        qid, _, doc = line.split()[:3]
        got.setdefault(qid, set()).add(doc)
    return [got.get(q, set()) for q in qids]


@pytest.mark.parametrize("args,msg", [(["--engine", "bmp", "--bmp-block-size", "300"], "--bmp-block-size"),
                                      (["--engine", "bmp", "--bmp-bits", "9"], "--bmp-bits"),
                                      (["--engine", "kannolo", "--kannolo-index", "ivf"], "--kannolo-index")])
def test_bad_options_exit_2_one_line(real, run_cli, tmp_path, args, msg):
    code, out, err = run_cli("index", real["docs"], "-o", tmp_path / "x", *args)
    assert code == 2 and msg in err and not (tmp_path / "x").exists()
    if "--kannolo-index" in args:   # refused by the API itself: one line
        assert len([x for x in err.splitlines() if x.strip()]) == 1, err


def test_dense_input_refused(search_setup, run_cli, tmp_path):
    code, _, err = run_cli("index", search_setup["dense"] / "test-images.h5", "-o", tmp_path / "x", "--engine", "bmp")
    assert code == 2 and "is a dense file" in err and len(err.strip().splitlines()) == 1


def _write(path, m: sp.csr_matrix):
    write_sparse(path, [f"d{i}" for i in range(m.shape[0])], m, [f"w{j}" for j in range(m.shape[1])],
                 {"modality": "image", "head": "h", "query_mode": "doc"})


def test_bmp_scale_keeps_scores_below_2_16(tmp_path):
    """Documents with 300 terms of weight ~1 would overflow BMP's u16 scores at 8 bits; the scale
    is lowered (bound u16-score) and the ranking stays exact."""
    rng = np.random.default_rng(0)
    n, v = 120, 400
    m = sp.random(n, v, density=0.75, random_state=1, format="csr", dtype=np.float32)
    m.data = (0.5 + rng.random(m.nnz)).astype(np.float32)
    _write(tmp_path / "d.h5", m)
    meta = build_bmp_index(tmp_path / "d.h5", tmp_path / "b")
    assert meta["quantization"]["bound"] == "u16-score"
    _assert_u16_safe(m, meta["quantization"]["scale"])
    q = m[:5].copy()
    exact = (q @ m.T).toarray()
    s = open_index(tmp_path / "b")
    res = s.search(q, 5)
    for i in range(5):
        assert res[i][0][0] == int(np.argmax(exact[i]))   # its own row scores highest
        assert res[i][0][1] == pytest.approx(exact[i].max(), rel=0.05)
        # BMP's u16 sum did not wrap: its integer top score is brute-force integer scoring's
        a, b = q.indptr[i], q.indptr[i + 1]
        want = _int_topk(m, s.scale, q.indices[a:b], q.data[a:b], 1)
        assert _bmp_int_scores(s, q.data[a:b], np.array([res[i][0][1]]))[0] == want[0] < 65536


def _assert_u16_safe(m: sp.csr_matrix, scale: float) -> None:
    """BMP's integer document weights (rint(w x scale), what it sums in u16) fit u8, and every
    document's integer L1 norm x 33 (the largest query weight after rounding) stays below 2^16."""
    from mmsparse.indexes.bmp_exact import int_weights

    d = sp.csr_matrix((int_weights(m.data, scale), m.indices, m.indptr), shape=m.shape)
    assert d.data.max() <= 255 and np.asarray(d.sum(axis=1)).max() * 33 <= 65535


def test_bmp_builds_documents_of_thousands_of_terms(tmp_path):
    """4,500 terms a document (a head far from sparse): the rounding slack alone would exceed the
    16-bit bound; the scale takes the other bound, the small weights round to 0 (the metadata says
    how many) and search answers; documents whose weights all round to 0 are refused in one line."""
    rng = np.random.default_rng(3)
    m = sp.random(12, 5000, density=0.9, random_state=4, format="csr", dtype=np.float32)
    m.data = np.where(rng.random(m.nnz) < 0.01, 3 + rng.random(m.nnz), 0.01).astype(np.float32)
    _write(tmp_path / "d.h5", m)
    meta = build_bmp_index(tmp_path / "d.h5", tmp_path / "b")
    assert meta["quantization"]["bound"] == "u16-score" and 0 < meta["dropped_postings"] < m.nnz
    res = open_index(tmp_path / "b").search(m[:3], 3)
    assert [r[0][0] for r in res] == [0, 1, 2]   # each document's own row first
    m.data[:] = 0.5
    _write(tmp_path / "flat.h5", m)
    with pytest.raises(InputError, match="too many terms for BMP"):
        build_bmp_index(tmp_path / "flat.h5", tmp_path / "b2")
    assert not (tmp_path / "b2").exists()


def test_bmp_guards_its_panics(tmp_path):
    """An empty query, one of unindexed terms, and a one-term query whose list's 10 largest weights
    all equal its maximum (BMP would find no block above its threshold) answer without a panic:
    nothing, nothing, and the exact top-k."""
    m = sp.lil_matrix((40, 10), dtype=np.float32)
    for i in range(20):
        m[i, 0] = 2.0          # 20 postings at the largest weight: 10th largest == max
        m[i, 1 + i % 5] = 0.5
    m = m.tocsr()
    _write(tmp_path / "d.h5", m)
    build_bmp_index(tmp_path / "d.h5", tmp_path / "b", block_size=4)
    s = open_index(tmp_path / "b")
    assert len(s.search_one(np.array([], np.int32), np.array([], np.float32), 5)[0]) == 0
    assert len(s.search_one(np.array([9], np.int32), np.array([1.0], np.float32), 5)[0]) == 0
    rows, scores = s.search_one(np.array([0], np.int32), np.array([1.0], np.float32), 5)
    assert rows.tolist() == [0, 1, 2, 3, 4] and np.allclose(scores, 2.0) and s.fallbacks == 1
    rows, _ = s.search_one(np.array([0, 1], np.int32), np.array([1.0, 1.0], np.float32), 3)
    assert set(rows.tolist()) == {0, 5, 10}
    assert s._forward is None   # answered from the top postings kept beside the index: no copy of the collection
    with pytest.raises(BaseException) as e:   # the flagged query does panic inside BMP itself
        s.index.search({s._tokens[0]: 32.0}, 5, 1.0, 1.0)
    assert type(e.value).__name__ == "PanicException"


def test_bmp_hands_over_every_query_it_cannot_panic_on(tmp_path):
    """BMP panics only when no block's bound (the sum over the query's terms) passes its starting
    threshold. Two terms whose 10 largest weights all equal their maximum, and one document holding
    both: no single term passes the threshold (the check of issue 50 flagged every such query),
    but that document's block does, so BMP answers, and exactly."""
    m = sp.lil_matrix((64, 4), dtype=np.float32)
    for i in range(0, 40, 2):
        m[i, 0] = m[i + 1, 1] = 2.0
    m[50, 0] = m[50, 1] = 2.0
    m[51, 2] = 0.3
    m = m.tocsr()
    _write(tmp_path / "d.h5", m)
    build_bmp_index(tmp_path / "d.h5", tmp_path / "b", block_size=8)
    s = open_index(tmp_path / "b")
    for k in (1, 5, 10):
        rows, scores = s.search_one(np.array([0, 1], np.int32), np.array([1.0, 1.0], np.float32), k)
        assert rows[0] == 50 and scores[0] == pytest.approx(4.0) and len(rows) == k
        assert np.allclose(scores[1:], 2.0)
    assert s.fallbacks == 0


def test_kannolo_refuses_empty_collection(tmp_path):
    _write(tmp_path / "e.h5", sp.csr_matrix((3, 5), dtype=np.float32))
    with pytest.raises(InputError, match="no non-empty document"):
        build_kannolo_index(tmp_path / "e.h5", tmp_path / "k")
    assert not (tmp_path / "k").exists()


def _int_topk(m: sp.csr_matrix, scale: float, idx: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """Brute-force integer scores of BMP's own weights: documents rint(w x scale), the query
    rint(w x 32 / max w); the k largest positive scores, decreasing [<= k] int64."""
    from mmsparse.indexes.bmp_exact import int_weights

    d = sp.csr_matrix((int_weights(m.data, scale), m.indices, m.indptr), shape=m.shape)
    q = np.zeros(m.shape[1])
    q[idx] = np.rint(w * (32 / w.max()))
    s = (d @ q).astype(np.int64)
    return -np.sort(-s[s > 0])[:k]


def _bmp_int_scores(s, w: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """BMP searcher scores (~ <q, d>) back to its integers."""
    return np.rint(scores * s.scale * 32 / w.max()).astype(np.int64)


def _loose_blocks(n: int = 640, v: int = 48, seed: int = 5) -> sp.csr_matrix:
    """Documents whose block maxima are loose bounds: 6 terms a document, weights spread over
    two orders of magnitude, so a block's bound sums maxima held by different documents."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), 6)
    cols = np.concatenate([rng.choice(v, 6, replace=False) for _ in range(n)])
    return sp.csr_matrix((rng.uniform(0.02, 2.0, len(rows)).astype(np.float32), (rows, cols)), shape=(n, v))


def test_bmp_reaches_the_brute_force_integer_kth_score(tmp_path):
    """alpha = beta = 1 is exact on BMP's integer weights: for every query the k-th score equals
    brute-force integer scoring's (ties at the k-th score may swap documents). Released BMP never
    scores the last block it visits; mmsparse's completion does (indexes/bmp_exact.py)."""
    m = _loose_blocks()
    _write(tmp_path / "d.h5", m)
    build_bmp_index(tmp_path / "d.h5", tmp_path / "b", block_size=16)
    s = open_index(tmp_path / "b")
    rng = np.random.default_rng(6)
    bad = []
    for i in range(150):
        idx = np.sort(rng.choice(m.shape[1], int(rng.integers(1, 12)), replace=False)).astype(np.int32)
        w = rng.uniform(0.05, 1.0, len(idx)).astype(np.float32)
        for k in (1, 10):
            want = _int_topk(m, s.scale, idx, w, k)
            rows, scores = s.search_one(idx, w, k)
            got = _bmp_int_scores(s, w, scores)
            if len(got) != len(want) or (len(got) and got[-1] != want[-1]):
                bad.append((i, k, got.tolist(), want.tolist()))
    assert not bad, f"{len(bad)} of 300 searches miss the k-th score, e.g. {bad[:2]}"
    assert s.completions > 0   # the last block mattered
