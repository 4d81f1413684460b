"""Round trips of the file formats (dense/sparse HDF5, TREC runs and qrels)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mmsparse.atomic import atomic_path
from mmsparse.errors import InputError
from mmsparse.formats import read_dense, read_qrels, read_run, read_sparse, write_dense, write_qrels, write_run, write_sparse
from mmsparse.formats.dense import DenseWriter, iter_dense

ATTRS = dict(modality="image", backbone="hf-dual", model="m", dataset="d", split="test", normalized=True)
ids_st = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1, max_size=8),
                  min_size=0, max_size=12, unique=True)
slow_ok = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@slow_ok
@given(ids=ids_st, dim=st.integers(1, 6), half=st.booleans(), data=st.data())
def test_dense_round_trip(tmp_path, ids, dim, half, data):
    rng = np.random.default_rng(len(ids))
    vec = rng.standard_normal((len(ids), dim)).astype(np.float32)
    texts = data.draw(st.none() | st.just([f"caption ñ {i}" for i in ids]))
    p = tmp_path / f"d{len(ids)}-{dim}-{half}.h5"
    image_ids = [f"img{i}" for i in range(len(ids))] if texts is not None else None
    write_dense(p, ids, vec, ATTRS, texts=texts, dtype="float16" if half else "float32", image_ids=image_ids)
    d = read_dense(p)
    assert d.ids == ids and d.texts == texts and d.dim == dim and d.image_ids == image_ids
    np.testing.assert_allclose(d.vectors, vec, rtol=1e-3 if half else 0, atol=1e-3 if half else 0)
    assert d.attrs["modality"] == "image" and d.attrs["dim"] == dim and "command" in d.attrs
    got = [i for chunk, _ in iter_dense(p, chunk_rows=5) for i in chunk]
    assert got == ids


@slow_ok
@given(ids=ids_st, nv=st.integers(1, 30), density=st.floats(0, 1))
def test_sparse_round_trip(tmp_path, ids, nv, density):
    m = sp.random(len(ids), nv, density=density, format="csr", dtype=np.float32, random_state=3)
    vocab = [f"t{j}" if j % 3 else f"##w{j}" for j in range(nv)]
    p = tmp_path / f"s{len(ids)}-{nv}-{density:.3f}.h5"
    write_sparse(p, ids, m, vocab, dict(modality="text", head="h", query_mode="expand"))
    s = read_sparse(p)
    assert s.ids == ids and s.vocab == vocab
    assert (s.matrix != m).nnz == 0
    assert s.matrix.indices.dtype == np.int32 and s.matrix.data.dtype == np.float32


@slow_ok
@given(run=st.dictionaries(st.from_regex(r"[A-Za-z0-9_.-]{1,6}", fullmatch=True),
                           st.dictionaries(st.from_regex(r"[A-Za-z0-9_.-]{1,6}", fullmatch=True),
                                           st.floats(-1e3, 1e3, allow_nan=False), max_size=5), max_size=5))
def test_run_and_qrels_round_trip(tmp_path, run):
    p = tmp_path / "r.trec"
    write_run(p, run)
    back = read_run(p)
    assert back.keys() == {q for q, d in run.items() if d}
    for q, docs in back.items():
        assert docs.keys() == run[q].keys()
        np.testing.assert_allclose(list(docs.values()), [run[q][d] for d in docs], rtol=1e-5, atol=1e-9)
    qrels = {q: {d: 1 for d in docs} for q, docs in run.items() if docs}
    write_qrels(tmp_path / "q.qrels", qrels)
    assert read_qrels(tmp_path / "q.qrels") == qrels


def test_run_is_ranked_by_score(tmp_path):
    write_run(tmp_path / "r", {"q": {"a": 1.0, "b": 3.0, "c": 2.0}})
    lines = (tmp_path / "r").read_text().splitlines()
    assert [ln.split()[2] for ln in lines] == ["b", "c", "a"]
    assert [ln.split()[3] for ln in lines] == ["1", "2", "3"]


def test_malformed_run_names_the_line(tmp_path):
    p = tmp_path / "bad.trec"
    p.write_text("q1 Q0 d1 1 0.5 x\nq1 Q0 d2 2\n")
    with pytest.raises(InputError, match=r"bad.trec:2: malformed run line"):
        read_run(p)


def test_wrong_kind_and_truncated_files(tmp_path):
    write_sparse(tmp_path / "s.h5", ["a"], sp.csr_matrix(np.ones((1, 2))), ["x", "y"],
                 dict(modality="image", head="h", query_mode="doc"))
    with pytest.raises(InputError, match="expected a dense file"):
        read_dense(tmp_path / "s.h5")
    (tmp_path / "t.h5").write_bytes((tmp_path / "s.h5").read_bytes()[:300])
    with pytest.raises(InputError, match="truncated or not HDF5"):
        read_sparse(tmp_path / "t.h5")
    with pytest.raises(InputError, match="not found"):
        read_dense(tmp_path / "missing.h5")


def test_dense_rejects_nan_and_duplicates(tmp_path):
    with pytest.raises(InputError, match="NaN"):
        write_dense(tmp_path / "n.h5", ["a"], np.array([[np.nan]], np.float32), ATTRS)
    with pytest.raises(InputError, match="duplicate"):
        write_dense(tmp_path / "d.h5", ["a", "a"], np.zeros((2, 1), np.float32), ATTRS)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_writer_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.h5"
    with pytest.raises(RuntimeError):
        with DenseWriter(target, 2, ATTRS) as w:
            w.append(["a"], np.zeros((1, 2)))
            raise RuntimeError("killed")
    assert not list(tmp_path.iterdir())


def test_atomic_directory_replaces_whole(tmp_path):
    target = tmp_path / "idx"
    with atomic_path(target, directory=True) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ValueError):
        with atomic_path(target, directory=True) as tmp:
            (tmp / "b").write_text("2")
            raise ValueError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    assert [p.name for p in target.iterdir()] == ["a"]


# -- issue 10: more round trips (empty and single-row collections, unicode, float16, sidecars) --

uni = st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"))
tok_st = st.text(alphabet=uni, min_size=1, max_size=6)           # TREC-safe: no whitespace
uids_st = st.lists(tok_st, min_size=0, max_size=6, unique=True)


@slow_ok
@example(ids=[], dim=1, half=False, seed=0)
@example(ids=["ü"], dim=3, half=True, seed=1)
@given(ids=uids_st, dim=st.integers(1, 5), half=st.booleans(), seed=st.integers(0, 9))
def test_dense_round_trip_unicode_captions(tmp_path, ids, dim, half, seed):
    from mmsparse.formats import read_dense_attrs

    rng = np.random.default_rng(seed)
    vec = (rng.standard_normal((len(ids), dim)) * 100).astype(np.float16 if half else np.float32)
    texts = [f"{i} — ein Hund läuft 🐕" for i in ids]
    image_ids = [f"图{i}" for i in ids]
    attrs = dict(ATTRS, modality="text")
    p = tmp_path / f"u{len(ids)}{dim}{half}{seed}.h5"
    write_dense(p, ids, vec, attrs, texts=texts, dtype="float16" if half else "float32", image_ids=image_ids)
    d = read_dense(p)
    assert d.ids == ids and d.texts == texts and d.image_ids == image_ids and d.vectors.shape == (len(ids), dim)
    np.testing.assert_array_equal(d.vectors, vec.astype(np.float32))  # float16 values survive exactly
    assert read_dense_attrs(p)["dim"] == dim
    assert [i for c, _ in iter_dense(p, chunk_rows=2) for i in c] == ids


@slow_ok
@example(ids=[], nv=1, density=0.0)
@example(ids=["x"], nv=1, density=1.0)
@example(ids=["é", "ß"], nv=3, density=0.0)
@given(ids=uids_st, nv=st.integers(1, 12), density=st.floats(0, 1))
def test_sparse_round_trip_unicode_vocab_and_texts(tmp_path, ids, nv, density):
    m = sp.random(len(ids), nv, density=density, format="csr", dtype=np.float32, random_state=1)
    vocab = [f"##ü{j}" if j % 2 else f"térm{j}" for j in range(nv)]
    texts = [f"caption «{i}»" for i in ids]
    p = tmp_path / f"su{len(ids)}-{nv}-{density:.3f}.h5"
    write_sparse(p, ids, m, vocab, dict(modality="text", head="h", query_mode="caption-terms"), texts=texts)
    s = read_sparse(p)
    assert s.ids == ids and s.vocab == vocab and s.texts == texts and s.matrix.shape == (len(ids), nv)
    assert (s.matrix != m).nnz == 0 and s.nnz_per_row.sum() == m.nnz


@slow_ok
@example(run={})
@example(run={"q": {"d": 0.5}})
@given(run=st.dictionaries(tok_st, st.dictionaries(tok_st, st.floats(-1e6, 1e6, allow_nan=False, width=32),
                                                    max_size=4), max_size=4))
def test_run_and_qrels_round_trip_unicode(tmp_path, run):
    from mmsparse.provenance import read_provenance

    p = tmp_path / "u.trec"
    write_run(p, run, tag="t", meta={"k": 4})
    back = read_run(p)
    assert back.keys() == {q for q, d in run.items() if d}
    for q, docs in back.items():
        assert docs.keys() == run[q].keys()
        np.testing.assert_allclose([docs[d] for d in docs], [run[q][d] for d in docs], rtol=1e-5, atol=1e-6)
        ranks = [ln.split()[3] for ln in p.read_text(encoding="utf-8").splitlines() if ln.split()[0] == q]
        assert ranks == [str(r) for r in range(1, len(docs) + 1)]
    prov = read_provenance(p)
    assert prov["kind"] == "run" and prov["attrs"]["k"] == 4
    qrels = {q: {d: i % 3 for i, d in enumerate(docs)} for q, docs in run.items() if docs}
    write_qrels(tmp_path / "u.qrels", qrels, meta={"split": "test"})
    assert read_qrels(tmp_path / "u.qrels") == qrels
    assert read_provenance(tmp_path / "u.qrels")["attrs"]["split"] == "test"


def test_read_run_fast_path_equals_line_parser(tmp_path):
    """pandas path == line-by-line path, with queries interleaved and numeric-looking ids."""
    from mmsparse.formats import trec

    p = tmp_path / "r.trec"
    p.write_text("q1 Q0 d1 1 2.5 t\n007 Q0 10 1 1e3 t\nq1 Q0 d2 2 -1.0 t\n\n007 Q0 d1 2 0.5 t\n")
    fast = trec._read_run_pandas(p)
    assert fast == trec._read_run_lines(p) == {"q1": {"d1": 2.5, "d2": -1.0}, "007": {"10": 1000.0, "d1": 0.5}}
    bad = tmp_path / "bad.trec"
    bad.write_text("q1 Q0 d1 1 2.5 t\nq1 Q0 d2 x 1.0 t\n")
    assert trec._read_run_pandas(bad) is None
