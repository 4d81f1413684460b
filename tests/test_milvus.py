"""`index --engine milvus` / `search` on Milvus Lite with real Flickr8k vectors.

The collection: the first 60 Flickr8k test images and their 300 captions encoded by the real
dual encoder, made sparse by a real D2S head (trained for 2 epochs on those vectors: the test
needs the head's kind of sparse vectors, float weights over a learned vocabulary, not a good
head). Milvus scores float weights exactly, so its top-k must equal exhaustive scoring;
PISA scores 8-bit quantised weights, so its top-k must equal exhaustive scoring of the
quantised weights and share nearly all of Milvus' top-k.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

import mmsparse
from mmsparse.formats.dense import read_dense, write_dense
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.formats.trec import read_run
from mmsparse.indexes import open_index
from mmsparse.indexes.milvus import connect
from mmsparse.indexes.pisa import quantize_rows, row_scales

N_IMAGES = 60
TEST_SECONDS = 90  # every test here is bounded: Milvus Lite runs a gRPC server in this process


@pytest.fixture(autouse=True)
def bounded_and_no_leak():
    """Each test ends within TEST_SECONDS, and leaves no Milvus Lite server running."""
    from milvus_lite.server_manager import server_manager_instance as lite

    def expire(*_):
        raise TimeoutError(f"Milvus test ran over {TEST_SECONDS} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not getattr(lite, "_servers", {}), "a Milvus Lite server was left running"


@pytest.fixture(scope="module")
def real(tmp_path_factory, flickr8k_dir, dual_encoder_dir):
    d = tmp_path_factory.mktemp("milvus")
    dense = d / "dense"
    mmsparse.encode_dense(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out=dense,
                          model=str(dual_encoder_dir), split=["test"], limit=N_IMAGES, workers=0)
    head = mmsparse.train_head(dense / "test-images.h5", dense / "test-captions.h5", out=d / "head", epochs=2,
                               batch_size=64, vocab_min_df=1, eta=1e-3, l1_warmup=2)
    mmsparse.sparsify(head, dense / "test-images.h5", out=d / "img.h5")
    mmsparse.sparsify(head, dense / "test-captions.h5", out=d / "cap.h5")
    img, cap = read_dense(dense / "test-images.h5"), read_dense(dense / "test-captions.h5")
    docs, queries = read_sparse(d / "img.h5"), read_sparse(d / "cap.h5")
    assert docs.ids == img.ids and queries.ids == cap.ids
    idx = mmsparse.build_index(d / "img.h5", out=d / "idx", engine="milvus", dense=dense / "test-images.h5",
                               batch_size=25)
    return SimpleNamespace(dir=d, idx=idx, D=docs.matrix, Q=queries.matrix, V=len(docs.vocab), img=img, cap=cap,
                           img_ids=img.ids, cap_ids=cap.ids, dense_img=dense / "test-images.h5",
                           dense_cap=dense / "test-captions.h5")


def _top(run: dict, q: str) -> list[tuple[str, float]]:
    return sorted(run.get(q, {}).items(), key=lambda x: (-x[1], x[0]))


def test_index_metadata_and_provenance(real):
    meta = json.loads((real.idx / "mmsparse.json").read_text())
    assert meta["kind"] == "milvus" and meta["num_docs"] == N_IMAGES and meta["fields"] == ["sparse", "dense"]
    assert meta["nnz"] == real.D.nnz and meta["dim"] == real.img.dim and meta["milvus"]["lite_db"] == "milvus.db"
    assert meta["milvus"]["collection"].startswith(meta["milvus"]["alias"] + "__")
    assert {(i["kind"], i["path"]) for i in meta["inputs"]} == {("sparse", str(real.dir / "img.h5")),
                                                               ("dense", str(real.dense_img))}
    assert meta["command"].startswith("mmsparse.build_index(")
    assert meta["bytes"]["sparse_payload"] == 8 * real.D.nnz and meta["bytes"]["lite_db"] > 0


def test_sparse_topk_equals_exhaustive_and_pisa(real, run_cli, tmp_path):
    k = 10
    code, _, err = run_cli("search", real.idx, real.dir / "cap.h5", "-o", tmp_path / "milvus.trec", "--k", k)
    assert code == 0, err
    code, _, err = run_cli("index", real.dir / "img.h5", "-o", tmp_path / "pisa")  # 8-bit weights
    assert code == 0, err
    code, _, err = run_cli("search", tmp_path / "pisa", real.dir / "cap.h5", "-o", tmp_path / "pisa.trec", "--k", k,
                           "--query-bits", 8, "--query-algorithm", "ranked_or")
    assert code == 0, err
    mil, pisa = read_run(tmp_path / "milvus.trec"), read_run(tmp_path / "pisa.trec")
    exact = (real.Q @ real.D.T).toarray()
    # what PISA computes: integer document and query weights, scores divided back by both scales
    sd = json.loads((tmp_path / "pisa" / "mmsparse.json").read_text())["quantization"]["scale"]
    sq = row_scales(real.Q, 8)
    exact_int = (quantize_rows(real.Q, sq) @ quantize_rows(real.D, sd).T).toarray() / (sq[:, None] * sd)
    assert set(mil) == set(pisa) == set(real.cap_ids)  # a trained head leaves no caption empty
    overlap = []
    for i, q in enumerate(real.cap_ids):
        order = np.lexsort((np.arange(exact.shape[1]), -exact[i]))[:k]
        got = sorted(mil[q].items(), key=lambda x: -x[1])
        # Milvus: the exhaustive float top-k, same documents in the same order, same scores
        np.testing.assert_allclose([s for _, s in got], exact[i, order], rtol=2e-5)
        assert {d for d, _ in got} == {real.img_ids[j] for j in order}, q
        # PISA: the exhaustive top-k of the quantised weights
        p_scores = sorted(pisa[q].values(), reverse=True)
        np.testing.assert_allclose(p_scores, np.sort(exact_int[i])[::-1][:k], rtol=1e-4)
        both = set(pisa[q]) & {d for d, _ in got}
        overlap.append(len(both) / k)
        # a document PISA ranks in and Milvus out is within twice the rounding error of Milvus' k-th score
        err = np.abs(exact_int[i] - exact[i]).max()
        for doc in set(pisa[q]) - both:
            assert exact[i, real.img_ids.index(doc)] >= exact[i, order[-1]] - 2 * err - 1e-6, (q, doc)
    assert np.mean(overlap) >= 0.9, np.mean(overlap)  # the two engines agree up to PISA's 8-bit rounding
    side = json.loads((tmp_path / "milvus.trec.meta.json").read_text())
    assert side["index_kind"] == "milvus" and side["milvus"]["route"] == "sparse"
    assert {i["kind"] for i in side["inputs"]} == {"index", "sparse"}


def test_dense_topk_equals_faiss_flat(real, run_cli, tmp_path):
    k = 10
    for args in (["index", real.dense_img, "-o", tmp_path / "flat"],
                 ["search", tmp_path / "flat", real.dense_cap, "-o", tmp_path / "flat.trec", "--k", k],
                 ["search", real.idx, real.dense_cap, "-o", tmp_path / "milvus.trec", "--k", k, "--mode", "dense"]):
        code, _, err = run_cli(*args)
        assert code == 0, err
    flat, mil = read_run(tmp_path / "flat.trec"), read_run(tmp_path / "milvus.trec")
    exact = real.cap.vectors @ real.img.vectors.T
    assert set(mil) == set(real.cap_ids)
    for i, q in enumerate(real.cap_ids):
        a, b = _top(mil, q), _top(flat, q)
        assert [d for d, _ in a] == [d for d, _ in b], q
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], rtol=1e-5)
        assert [d for d, _ in a] == [real.img_ids[j] for j in np.argsort(-exact[i])[:k]]


@pytest.mark.slow  # two Milvus Lite collections: ~13 s
def test_hybrid_is_deterministic_and_fuses_the_routes(real, run_cli, tmp_path):
    k, c = 10, 20
    runs = []
    for name in ("a", "b"):
        code, _, err = run_cli("search", real.idx, real.dir / "cap.h5", "--dense-queries", real.dense_cap,
                               "--mode", "hybrid", "--candidates", c, "--k", k, "-o", tmp_path / f"{name}.trec")
        assert code == 0, err
        runs.append((tmp_path / f"{name}.trec").read_bytes())
    assert runs[0] == runs[1] and runs[0]
    hyb = read_run(tmp_path / "a.trec")
    # RRF (k = 60) of the two routes' own top-c lists, ranks from 1
    with open_index(real.idx) as s:
        sparse_lists = s.search_sparse(real.Q, c)
        dense_lists = s.search_dense(real.cap.vectors, c)
    for i, q in enumerate(real.cap_ids):
        fused: dict[str, float] = {}
        for hits in (sparse_lists[i], dense_lists[i]):
            for r, (doc, _) in enumerate(hits, 1):
                fused[doc] = fused.get(doc, 0.0) + 1 / (60 + r)
        want = sorted(fused.values(), reverse=True)[:k]
        np.testing.assert_allclose(sorted(hyb[q].values(), reverse=True), want, rtol=1e-5)
    # weighted fusion with all weight on the dense route ranks exactly like the dense route (checked on
    # the engine's order: the run file's 6 significant digits may tie near-equal fused scores)
    code, _, err = run_cli("search", real.idx, real.dir / "cap.h5", "--dense-queries", real.dense_cap,
                           "--mode", "hybrid", "--fusion", "weighted", "--sparse-weight", 0, "--dense-weight", 1,
                           "--candidates", c, "--k", k, "-o", tmp_path / "w.trec")
    assert code == 0, err
    w = read_run(tmp_path / "w.trec")
    with open_index(real.idx) as s:
        weighted = s.search_hybrid(real.Q, real.cap.vectors, k, candidates=c, fusion="weighted",
                                   sparse_weight=0.0, dense_weight=1.0)
    for i, q in enumerate(real.cap_ids):
        assert [d for d, _ in weighted[i]] == [d for d, _ in dense_lists[i][:k]], q
        assert set(w[q]) == {d for d, _ in weighted[i]}, q


def _one_line_exit_2(run_cli, *args, msg: str) -> str:
    code, _, err = run_cli(*args)
    assert code == 2, (args, err)
    assert len(err.strip().splitlines()) == 1 and msg in err, err
    return err


def test_bad_input_exits_2_with_one_line(real, run_cli, tmp_path):
    out = tmp_path / "out.trec"
    # dense queries of another dimension
    write_dense(tmp_path / "short.h5", real.cap_ids, real.cap.vectors[:, :256],
                {**real.cap.attrs, "dim": 256})
    _one_line_exit_2(run_cli, "search", real.idx, real.dir / "cap.h5", "--mode", "hybrid", "--dense-queries",
                     tmp_path / "short.h5", "-o", out, msg="dimension 256")
    # queries whose sparse vectors are all empty
    col = read_sparse(real.dir / "cap.h5")
    write_sparse(tmp_path / "empty.h5", col.ids[:5], sp.csr_matrix((5, real.V), dtype=np.float32), col.vocab,
                 {**col.attrs})
    _one_line_exit_2(run_cli, "search", real.idx, tmp_path / "empty.h5", "-o", out, msg="empty sparse vector")
    # --dense holding other documents than INPUT
    _one_line_exit_2(run_cli, "index", real.dir / "img.h5", "--engine", "milvus", "--dense", real.dense_cap,
                     "-o", tmp_path / "idx", msg="same documents")
    # a Milvus server that does not answer: a port nothing listens on
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _one_line_exit_2(run_cli, "index", real.dir / "img.h5", "--engine", "milvus", "--uri", f"http://127.0.0.1:{port}",
                     "-o", tmp_path / "idx", msg="does not answer")
    # a server that accepts the connection and never answers: given up after --timeout seconds
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        t0 = time.monotonic()
        err = _one_line_exit_2(run_cli, "index", real.dir / "img.h5", "--engine", "milvus", "--timeout", 1,
                               "--uri", f"http://127.0.0.1:{s.getsockname()[1]}", "-o", tmp_path / "idx",
                               msg="does not answer")
        assert time.monotonic() - t0 < 15 and "--uri" in err
    assert not out.exists() and not (tmp_path / "idx").exists()


def test_refused_settings_and_killed_insert_keep_the_previous_collection(real, run_cli, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(real.idx, idx)
    code, _, err = run_cli("search", idx, real.dir / "cap.h5", "-o", tmp_path / "ref.trec", "--k", 5)
    assert code == 0, err
    meta = (idx / "mmsparse.json").read_bytes()
    args = ["index", real.dir / "img.h5", "--engine", "milvus", "--dense", real.dense_img, "-o", idx,
            "--batch-size", 10]
    # Milvus Lite implements only the TAAT_NAIVE algorithm: refused at build, the old collection stays
    _one_line_exit_2(run_cli, *args, "--milvus-algorithm", "DAAT_MAXSCORE", msg="TAAT_NAIVE")
    assert (idx / "mmsparse.json").read_bytes() == meta
    # killed at the 3rd of 10 insert batches
    p = subprocess.run([sys.executable, "-m", "mmsparse.cli", *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "MMSPARSE_TEST_KILL_AFTER": "3"}, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert (idx / "mmsparse.json").read_bytes() == meta
    code, _, err = run_cli("search", idx, real.dir / "cap.h5", "-o", tmp_path / "after.trec", "--k", 5)
    assert code == 0, err
    assert (tmp_path / "after.trec").read_bytes() == (tmp_path / "ref.trec").read_bytes()
    # the rerun builds a new collection, moves the alias and drops both the old and the half-built one
    code, _, err = run_cli(*args)
    assert code == 0, err
    new = json.loads((idx / "mmsparse.json").read_text())["milvus"]
    assert new["collection"] != json.loads(meta)["milvus"]["collection"]
    with connect(lite_db=idx / "milvus.db") as client:
        assert client.list_collections() == [new["collection"]]
        assert client.describe_alias(new["alias"])["collection_name"] == new["collection"]
    code, _, err = run_cli("search", idx, real.dir / "cap.h5", "-o", tmp_path / "rerun.trec", "--k", 5)
    assert code == 0, err
    assert read_run(tmp_path / "rerun.trec") == read_run(tmp_path / "ref.trec")
