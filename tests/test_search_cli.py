"""`mmsparse index` + `mmsparse search` end to end through the real CLI entry point."""

from __future__ import annotations

import inspect
import json
import re

import numpy as np
import pytest
import scipy.sparse as sp
import seismic  # noqa: F401  (a required dependency: missing is an import error, not a skip)

import mmsparse
from mmsparse.formats.dense import write_dense
from mmsparse.formats.sparse import write_sparse
from mmsparse.formats.trec import read_run
from mmsparse.indexes.pisa import quantize_rows, row_scales

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
def pisa_dir(files):
    d = files[0]
    return mmsparse.build_index(d / "img.h5", out=d / "pisa_idx", quant_bits=10)


def test_python_api_writes_what_the_cli_writes(files, pisa_dir, tmp_path):
    """The API returns its output path and records the Python call and its inputs as provenance."""
    d, (_, D), (q_ids, Q), *_ = files
    assert pisa_dir == d / "pisa_idx"
    meta = json.loads((pisa_dir / "mmsparse.json").read_text())
    assert meta["command"].startswith("mmsparse.build_index(") and "quant_bits=10" in meta["command"]
    assert [(i["kind"], i["path"]) for i in meta["inputs"]] == [("sparse", str(d / "img.h5"))]
    out = mmsparse.search(pisa_dir, d / "txt.h5", out=tmp_path / "api.trec", k=3)
    assert out == tmp_path / "api.trec"
    side = json.loads((tmp_path / "api.trec.meta.json").read_text())
    assert side["command"].startswith("mmsparse.search(") and side["k"] == 3
    assert {i["kind"] for i in side["inputs"]} == {"index", "sparse"}
    run = read_run(out)
    exact = (Q @ D.T).toarray()
    for i, q in enumerate(q_ids):
        if q in run:
            np.testing.assert_allclose(sorted(run[q].values(), reverse=True), np.sort(exact[i])[::-1][:3], rtol=0.02)


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


def test_two_stage_rescores_the_first_stage_candidates(files, pisa_dir, run_cli):
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


def _pruned(Q: sp.csr_matrix, top_n: int, min_weight: float) -> sp.csr_matrix:
    """Each row's weights >= min_weight, then its top_n largest (ties: smaller term id), by hand."""
    rows = []
    for i in range(Q.shape[0]):
        w = Q[i].toarray().ravel()
        keep = [t for t in np.flatnonzero(w) if w[t] >= min_weight]
        keep = sorted(keep, key=lambda t: (-w[t], t))[:top_n or None]
        r = np.zeros_like(w)
        r[keep] = w[keep]
        rows.append(r)
    return sp.csr_matrix(np.array(rows))


@pytest.mark.parametrize("top_n,min_weight", [(3, 0.0), (0, 1.2), (4, 0.9)])
def test_query_pruning_searches_the_pruned_terms(files, pisa_dir, run_cli, tmp_path, top_n, min_weight):
    """Pruning acts on the postings: with k above the collection size, each query retrieves
    exactly the documents in the posting lists of its kept terms (the largest weights
    >= --min-weight, at most --query-top-n), scored by the kept terms only; documents reached
    only through dropped terms are gone."""
    d, (doc_ids, D), (q_ids, Q), *_ = files
    code, _, err = run_cli("search", pisa_dir, d / "txt.h5", "-o", tmp_path / "pruned.trec", "--k", 1000,
                           "--query-top-n", top_n, "--min-weight", min_weight, "--query-bits", 12)
    assert code == 0, err
    run = read_run(tmp_path / "pruned.trec")
    P = _pruned(Q, top_n, min_weight)
    assert 0 < P.nnz < Q.nnz
    posting = (D > 0).astype(np.int32).T.tocsr()  # term -> the documents holding it
    sd = json.loads((pisa_dir / "mmsparse.json").read_text())["quantization"]["scale"]
    sq = row_scales(P, 12)  # PISA's scores of the pruned queries: integer weights, divided back
    pruned = (quantize_rows(P, sq) @ quantize_rows(D, sd).T).toarray() / (np.maximum(sq, 1e-30)[:, None] * sd)
    lost = 0
    for i, q in enumerate(q_ids):
        kept, full = P[i].indices, Q[i].indices
        reached = {doc_ids[j] for j in np.unique(posting[kept].indices)}
        if len(kept) == 0:
            assert q not in run  # every term dropped: no postings, no results
            continue
        assert set(run[q]) == reached, q
        for doc, score in run[q].items():
            assert score == pytest.approx(pruned[i, doc_ids.index(doc)], rel=1e-4)
        lost += len({doc_ids[j] for j in np.unique(posting[full].indices)} - reached)
    assert lost >= len(q_ids)  # the dropped terms' postings held documents no kept term reaches


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


# a unit or scale each option's help must state
UNITS = {"index": {"--quant-bits": "bits", "--ef-construction": "nodes", "--ef-search": "nodes",
                   "--seismic-centroid-fraction": "fraction", "--seismic-summary-energy": "fraction",
                   "--milvus-drop-ratio-build": "fraction", "--batch-size": "per insert", "--threads": "threads",
                   "--timeout": "seconds"},
         "search": {"--k": "per query", "--candidates": "per query", "--batch-size": "per search call",
                    "--query-bits": "bits", "--ef-search": "nodes", "--rrf-k": "rank units",
                    "--milvus-drop-ratio-search": "fraction", "--min-weight": "units", "--rerank-k": "per query",
                    "--timeout": "seconds"}}

# what a user reads for some options, written out literally (defaults, ranges, choices), so a
# default changed in the API and the CLI together still fails here
SHOWN = {"index": {"--quant-bits": ["[default: 8]", "1<=x<=16", "2^bits-1"],
                   "--engine": ["[default: auto]", "pisa", "seismic", "faiss", "milvus"],
                   "--milvus-algorithm": ["[default: auto]", "TAAT_NAIVE", "DAAT_MAXSCORE", "DAAT_WAND"],
                   "--milvus-drop-ratio-build": ["[default: 0.0]", "0.0<=x<=0.99"],
                   "--batch-size": ["[default: 1000]"], "--timeout": ["[default: 30.0]"],
                   "--uri": ["http://host:19530", "milvus.db"], "--token": ["never written", "MMSPARSE_MILVUS_TOKEN"],
                   "--hnsw-m": ["[default: 32]"], "--ef-construction": ["[default: 200]"]},
         "search": {"--k": ["[default: 1000]", "x>=1"], "--mode": ["[default: single]", "two-stage", "hybrid"],
                    "--fusion": ["[default: rrf]", "weighted", "1/(rrf_k + rank)"], "--rrf-k": ["[default: 60]"],
                    "--query-bits": ["[default: 8]", "1<=x<=16"], "--candidates": ["[default: 1000]"],
                    "--milvus-drop-ratio-search": ["[default: 0.0]", "0.0<=x<=0.99"],
                    "--sparse-weight": ["[default: 0.5]"], "--dense-weight": ["[default: 0.5]"],
                    "--ef-search": ["[default: 0]", "at least k"], "--timeout": ["[default: 30.0]"],
                    "--query-top-n": ["[default: 0]", "0 = keep all"]}}


def _option_help(text: str) -> dict[str, str]:
    """--flag -> its help text (all its lines) in a rich --help screen."""
    out, flag = {}, None
    for line in text.splitlines():
        m = re.match(r"^\W*(?:\*\s+)?(--[\w-]+)", line)
        if m:
            flag = m[1]
            out[flag] = ""
        if flag:
            out[flag] += " " + line.strip("│ ")
        if line.startswith("╰"):
            flag = None
    return out


@pytest.mark.parametrize("cmd,fn", [("index", "build_index"), ("search", "search")])
def test_help_states_the_api_defaults_and_units(run_cli, monkeypatch, cmd, fn):
    """Every option's --help shows the default of the same-named keyword of the Python API (0 and
    0.0 included), options with a unit name it, and some options show literal defaults, ranges
    and choices."""
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps at the terminal width
    code, out, _ = run_cli(cmd, "--help")
    assert code == 0
    helps = _option_help(out)
    shown = 0
    keywords = [(name, p.default) for name, p in inspect.signature(getattr(mmsparse, fn)).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("out", "progress", "engine_options")]
    if fn == "build_index":   # its engine settings: the fields of the engines' options dataclasses
        import dataclasses

        from mmsparse.indexes.options import ALL
        keywords += [(f.name, f.default) for cls in ALL for f in dataclasses.fields(cls)]
    for name, default in keywords:
        flag = "--" + name.replace("_", "-")
        assert flag in helps, flag  # the CLI has every keyword of the API
        if default is not None and default is not False and default != "":  # 0 and 0.0 are shown
            assert f"[default: {default}]" in helps[flag], (flag, helps[flag])
            shown += 1
    assert shown >= 15
    for flag, unit in UNITS[cmd].items():
        assert unit in helps[flag].replace(flag, "").lower(), (flag, helps[flag])
    for flag, texts in SHOWN[cmd].items():
        for text in texts:
            assert text in helps[flag], (flag, text, helps[flag])
