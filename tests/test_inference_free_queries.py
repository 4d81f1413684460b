"""Inference-free text queries: image search with no model at query time, on real components.

conftest `inference_free_setup`: an inference-free head trained on real Flickr8k vectors (the
dual encoder's), the test images sparsified by it and indexed with PISA; Seismic and Milvus Lite
indexes of the same images are built here. A text query is its tokens weighted by the head's
term-weight table, so `sparsify` of a .tsv / .txt / captions file, `search` of a text file,
`query`, `serve` and the PyTerrier encoder give the same rows and rankings, and none of them
imports torch, transformers or pyterrier for it (checked in fresh processes, by -X importtime
and sys.modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import h5py
import httpx
import numpy as np
import pytest

import mmsparse
from mmsparse.api.querying import QueryEngine, TableQueryEncoder
from mmsparse.errors import InputError
from mmsparse.formats import read_dense, read_run, read_sparse
from mmsparse.formats.queries import read_query_texts
from mmsparse.methods.inference_free.queries import DESCRIPTION, TermWeightQueryEncoder

TEXTS = ["a dog running on the beach", "two children playing in the snow", "a man riding a bike"]
MODEL_CODE = ("torch", "transformers", "pyterrier", "pyterrier_pisa", "pandas")   # none may load for a text query
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _imported(importtime_log: str) -> set[str]:
    """Module names a `python -X importtime` run imported (its stderr)."""
    return {ln.rsplit("|", 1)[1].strip() for ln in importtime_log.splitlines()
            if ln.startswith("import time:") and "|" in ln}


def _mmsparse(*args, importtime: bool = True) -> subprocess.CompletedProcess:
    """`mmsparse ARGS` in a fresh interpreter (python [-X importtime] -m mmsparse.cli)."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "mmsparse.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def _top(run: dict, q: str) -> list[tuple[str, float]]:
    return sorted(run.get(q, {}).items(), key=lambda x: (-x[1], x[0]))


@pytest.fixture(scope="module")
def files(inference_free_setup, tmp_path_factory) -> dict:
    """The 500 test captions as a .tsv (caption ids) and the same captions sparsified from the
    captions HDF5; a .txt of TEXTS with blank lines between them."""
    s = inference_free_setup
    d = tmp_path_factory.mktemp("if-queries")
    caps = read_dense(s["dense"] / "test-captions.h5")
    (d / "q.tsv").write_text("".join(f"{i}\t{t}\n" for i, t in zip(caps.ids, caps.texts)), encoding="utf-8")
    (d / "q.txt").write_text("\n".join(f"{t}\n" for t in TEXTS), encoding="utf-8")   # lines 1, 3, 5
    mmsparse.sparsify(s["head"], s["dense"] / "test-captions.h5", out=d / "caps.h5")
    return {"dir": d, "tsv": d / "q.tsv", "txt": d / "q.txt", "caps": d / "caps.h5", "captions": caps}


@pytest.fixture(scope="module")
def engines(inference_free_setup, tmp_path_factory) -> dict:
    """Seismic and Milvus Lite indexes of the inference-free image documents (`index` unchanged)."""
    s, d = inference_free_setup, tmp_path_factory.mktemp("if-indexes")
    return {"pisa": s["pisa"],
            "seismic": mmsparse.build_index(s["sparse_images"], out=d / "seismic", engine="seismic"),
            "milvus": mmsparse.build_index(s["sparse_images"], out=d / "milvus", engine="milvus")}


# -- sparsify: text in, a normal sparse query file out ----------------------------------------

def test_sparsify_reads_text_not_vectors_and_loads_no_model(inference_free_setup, search_setup, files, run_cli,
                                                            tmp_path):
    s, caps = inference_free_setup, files["captions"]
    code, _, err = run_cli("sparsify", s["head"], files["tsv"], "-o", tmp_path / "tsv.h5")
    assert code == 0, err
    a, b = read_sparse(tmp_path / "tsv.h5"), read_sparse(files["caps"])
    assert a.ids == b.ids == caps.ids and a.texts == b.texts == caps.texts
    assert (a.matrix != b.matrix).nnz == 0 and a.matrix.nnz > 0 and a.vocab == b.vocab
    # the table's rows: max(0, w_t) on each caption's terms
    table = TermWeightQueryEncoder.load(s["head"])
    assert (table.encode(caps.texts[:50]) != a.matrix[:50]).nnz == 0
    for col in (a, b):
        assert col.attrs["modality"] == "text" and col.attrs["query_mode"] == "inference-free"
        assert col.attrs["method"] == "inference-free" and col.attrs["head"] == str(s["head"].resolve())
        assert col.attrs["query_encoder"] == DESCRIPTION
    assert b.attrs["split"] == "test" and b.attrs["dense"] == str((s["dense"] / "test-captions.h5").resolve())
    assert "split" not in a.attrs and "dense" not in a.attrs               # a text file records no dataset
    assert {i["kind"] for i in json.loads(a.attrs["inputs"])} == {"head", "queries"}
    # the captions file's vectors are never read: NaN vectors change nothing (a D2S head refuses them)
    nan = tmp_path / "nan-captions.h5"
    nan.write_bytes((s["dense"] / "test-captions.h5").read_bytes())
    with h5py.File(nan, "r+") as f:
        f["vectors"][...] = np.nan
    code, _, err = run_cli("sparsify", s["head"], nan, "-o", tmp_path / "nan.h5")
    assert code == 0, err
    assert (read_sparse(tmp_path / "nan.h5").matrix != b.matrix).nnz == 0
    code, _, err = run_cli("sparsify", search_setup["head"], nan, "-o", tmp_path / "d2s.h5")
    assert code == 2 and "NaN" in err and not (tmp_path / "d2s.h5").exists()
    # a fresh process: no torch, no transformers; .txt ids are line numbers, blank lines skipped
    p = _mmsparse("sparsify", s["head"], files["txt"], "-o", tmp_path / "txt.h5")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not _imported(p.stderr) & set(MODEL_CODE), _imported(p.stderr) & set(MODEL_CODE)
    t = read_sparse(tmp_path / "txt.h5")
    assert t.ids == ["1", "3", "5"] and t.texts == TEXTS
    assert (t.matrix != table.encode(TEXTS)).nnz == 0


def test_txt_ids_are_encode_dense_caption_ids(files):
    """A .txt file of queries numbers its lines as encode-dense numbers a .txt captions file, so
    one qrels file fits both."""
    from mmsparse.data.plain import read_captions_file

    ids, texts, attrs = read_query_texts(files["txt"])
    recs = read_captions_file(files["txt"])["all"].captions
    assert ids == [c.id for c in recs] and texts == [c.text for c in recs] and attrs == {}


def test_bad_query_files_exit_2_with_one_line(inference_free_setup, search_setup, files, run_cli, tmp_path):
    s = inference_free_setup
    d2s_head = search_setup["head"]
    bad = {"notab.tsv": "q1\ta dog\nq2 two cats\n", "noid.tsv": "\ta dog\n", "notext.tsv": "q1\ta dog\nq2\t  \n",
           "dup.tsv": "q1\ta dog\n\nq1\ttwo cats\n", "blank.txt": "\n  \n\n", "queries.csv": "q1,a dog\n"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 on a beach\n".encode("latin-1"))
    cases = [
        ((s["head"], tmp_path / "notab.tsv"), "notab.tsv:2: no tab"),
        ((s["head"], tmp_path / "noid.tsv"), "noid.tsv:1: empty id"),
        ((s["head"], tmp_path / "notext.tsv"), "notext.tsv:2: query 'q2' has no text"),
        ((s["head"], tmp_path / "dup.tsv"), "dup.tsv:3: duplicate query id 'q1' (first on line 1)"),
        ((s["head"], tmp_path / "blank.txt"), "no queries"),
        ((s["head"], tmp_path / "queries.csv"), "rename it"),
        ((s["head"], tmp_path / "latin1.txt"), "not UTF-8"),
        ((s["head"], tmp_path / "missing.tsv"), "not found"),
        ((s["head"], files["tsv"], "--query-mode", "expand"), "takes inference-free queries only"),
        ((s["head"], files["tsv"], "--ray", "local"), "--ray"),
        ((d2s_head, files["tsv"]), "encode-dense"),                  # a D2S head encodes captions from vectors
    ]
    for args, msg in cases:
        out = tmp_path / "out.h5"
        code, _, err = run_cli("sparsify", *args, "-o", out)
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1 and msg in err, err
        assert not out.exists()


# -- search: a text file against the index, no sparse query file needed ------------------------

def test_search_text_ranks_as_sparsify_then_search(inference_free_setup, search_setup, files, run_cli, tmp_path):
    s = inference_free_setup
    runs = {}
    for name, queries in (("tsv", files["tsv"]), ("h5", files["caps"]), ("txt", files["txt"])):
        code, _, err = run_cli("search", s["pisa"], queries, "-o", tmp_path / f"{name}.trec", "--k", "10")
        assert code == 0, err
        runs[name] = read_run(tmp_path / f"{name}.trec")
    assert runs["tsv"] == runs["h5"] and len(runs["tsv"]) == 500
    side = json.loads((tmp_path / "tsv.trec.meta.json").read_text())
    assert side["queries"] == {"modality": "text", "head": str(s["head"].resolve()), "method": "inference-free",
                               "query_mode": "inference-free"}
    assert {i["kind"] for i in side["inputs"]} == {"index", "queries", "head"}
    # a .txt file's ids are its line numbers: the run of a .tsv of the same texts with those ids
    (tmp_path / "same.tsv").write_text("".join(f"{n}\t{t}\n" for n, t in zip((1, 3, 5), TEXTS)), encoding="utf-8")
    assert run_cli("search", s["pisa"], tmp_path / "same.tsv", "-o", tmp_path / "same.trec", "--k", "10")[0] == 0
    assert runs["txt"] == read_run(tmp_path / "same.trec") and set(runs["txt"]) == {"1", "3", "5"}
    # eval reads the run as any other: the qrels of encode-dense fit the caption ids
    code, _, err = run_cli("eval", tmp_path / "tsv.trec", s["dense"] / "test.qrels", "-o", tmp_path / "e.json")
    assert code == 0, err
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["queries"] == 500 and 0.1 < ev["R@10"] <= 1.0
    # indexes whose queries need a model refuse text, naming the fix
    for index in (search_setup["pisa"], search_setup["faiss"]):
        code, _, err = run_cli("search", index, files["tsv"], "-o", tmp_path / "x.trec")
        assert code == 2 and len(err.strip().splitlines()) == 1 and "encode-dense" in err, err
    code, _, err = run_cli("search", s["pisa"], files["caps"], "-o", tmp_path / "x.trec", "--head", s["head"])
    assert code == 2 and "--head applies to text QUERIES" in err
    assert not (tmp_path / "x.trec").exists()


# -- query: no model loaded, the answer `search` gives -----------------------------------------

def test_query_loads_no_model_and_answers_as_search(inference_free_setup, files, tmp_path, capsys):
    s = inference_free_setup
    t0 = time.perf_counter()
    p = _mmsparse("query", s["pisa"], *TEXTS, "--k", "10", "--json")
    wall = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr[-2000:]
    imported = _imported(p.stderr)
    assert not imported & set(MODEL_CODE), imported & set(MODEL_CODE)
    assert {"tokenizers", "safetensors", "h5py"} <= imported
    assert "term-weight table" in p.stderr and "no model" in p.stderr
    got = json.loads(p.stdout)
    (tmp_path / "q.tsv").write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    assert mmsparse.search(s["pisa"], tmp_path / "q.tsv", out=tmp_path / "run.trec", k=10).is_file()
    run = read_run(tmp_path / "run.trec")
    table = TermWeightQueryEncoder.load(s["head"])
    for i, r in enumerate(got):
        want = _top(run, f"q{i}")
        assert [x["id"] for x in r["results"]] == [d for d, _ in want]
        np.testing.assert_allclose([x["score"] for x in r["results"]], [v for _, v in want], rtol=1e-5)
        assert [(t["term"], pytest.approx(t["weight"])) for t in r["terms"]] == table.terms(TEXTS[i])
    # the library call in a fresh interpreter: nothing of a model in sys.modules afterwards
    code = (f"import json, sys, mmsparse; r = mmsparse.query({str(s['pisa'])!r}, [{TEXTS[0]!r}], k=10); "
            f"print(json.dumps({{'ids': [x['id'] for x in r[0]['results']], "
            f"'loaded': sorted(m for m in {MODEL_CODE!r} if m in sys.modules)}}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["loaded"] == [] and out["ids"] == [x["id"] for x in got[0]["results"]]
    with capsys.disabled():
        print(f"\nmmsparse query (3 texts, inference-free head, PISA) under -X importtime: {wall:.2f} s wall")


def test_engine_edits_terms_and_refuses_images(inference_free_setup, run_cli, tmp_path):
    s = inference_free_setup
    with QueryEngine(s["pisa"]) as engine:
        assert isinstance(engine.encoder, TableQueryEncoder) and engine.backbone is None
        assert engine.method == "inference-free" and engine.encoder.description == DESCRIPTION
        (r,) = engine.run([TEXTS[0]], k=5)
        terms = [t["term"] for t in r["terms"]]
        assert "dog" in terms and "beach" in terms
        (e,) = engine.run([TEXTS[0]], k=5, exclude=["beach"], add=["grass"])
        weights = {t["term"]: t["weight"] for t in e["terms"]}
        assert "beach" not in weights and weights["grass"] == pytest.approx(max(t["weight"] for t in r["terms"]))
        assert [x["id"] for x in e["results"]] != [x["id"] for x in r["results"]]
        with pytest.raises(InputError, match="not in the head's vocabulary"):
            engine.run([TEXTS[0]], add=["qqqxzzq"])
        with pytest.raises(InputError, match="text queries only"):
            engine.encode(images=[next(s["images"].glob("*.jpg"))])
    with pytest.raises(InputError, match="inference-free queries only"):
        QueryEngine(s["pisa"], query_mode="expand")
    code, _, err = run_cli("query", s["pisa"], "--image", next(s["images"].glob("*.jpg")))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "text queries only" in err


# -- the three engines -------------------------------------------------------------------------

def test_pisa_seismic_and_milvus_answer_text_queries(engines, inference_free_setup, files, run_cli, tmp_path):
    """Each engine searches the .tsv as the sparsified file, `query` answers as `search`, and
    Milvus (exact float scores) returns the exhaustive top-k of the table's queries."""
    docs = read_sparse(inference_free_setup["sparse_images"])
    Q = read_sparse(files["caps"]).matrix
    exact = (Q @ docs.matrix.T).toarray()
    for kind, index in engines.items():
        assert json.loads((index / "mmsparse.json").read_text())["source_attrs"]["method"] == "inference-free"
        runs = {}
        for name, queries in (("tsv", files["tsv"]), ("h5", files["caps"])):
            code, _, err = run_cli("search", index, queries, "-o", tmp_path / f"{kind}-{name}.trec", "--k", "10")
            assert code == 0, f"{kind}: {err}"
            runs[name] = read_run(tmp_path / f"{kind}-{name}.trec")
        assert runs["tsv"] == runs["h5"] and len(runs["tsv"]) == 500, kind
        caps = files["captions"]
        hits = mmsparse.query(index, caps.texts[:3], k=10)
        for i, h in enumerate(hits):
            want = _top(runs["tsv"], caps.ids[i])
            assert [x["id"] for x in h["results"]] == [d for d, _ in want], kind
            np.testing.assert_allclose([x["score"] for x in h["results"]], [v for _, v in want], rtol=1e-4)
        overlap = []
        for i, q in enumerate(caps.ids):
            top = {docs.ids[j] for j in np.lexsort((np.arange(exact.shape[1]), -exact[i]))[:10]}
            overlap.append(len(top & set(runs["tsv"][q])) / 10)
            if kind == "milvus":
                got = sorted(runs["tsv"][q].values(), reverse=True)
                np.testing.assert_allclose(got, np.sort(exact[i])[::-1][:10], rtol=2e-5)
        assert np.mean(overlap) >= (1.0 if kind == "milvus" else 0.9), (kind, np.mean(overlap))


# -- PyTerrier ---------------------------------------------------------------------------------

def test_pyterrier_encoder_needs_no_model(engines, inference_free_setup, search_setup, files, tmp_path):
    pytest.importorskip("pyterrier")
    import pandas as pd

    from mmsparse.pyterrier import InferenceFreeQueryEncoder, SparseQueryEncoder, retriever

    s, caps = inference_free_setup, files["captions"]
    topics = pd.DataFrame({"qid": caps.ids[:100], "query": caps.texts[:100]})
    for kind in ("pisa", "seismic"):
        index = engines[kind]
        assert mmsparse.search(index, files["tsv"], out=tmp_path / f"{kind}.trec", k=10).is_file()
        run = read_run(tmp_path / f"{kind}.trec")
        for enc in (InferenceFreeQueryEncoder(index), InferenceFreeQueryEncoder(s["head"]), SparseQueryEncoder(index)):
            assert isinstance(enc.encoder, TableQueryEncoder) and enc.encoder.backbone is None
            res = (enc >> retriever(index, num_results=10))(topics)
            for q, g in res.groupby("qid"):
                want = _top(run, q)
                assert g.sort_values("rank")["docno"].tolist() == [d for d, _ in want], (kind, q)
                np.testing.assert_allclose(g.sort_values("rank")["score"], [v for _, v in want], rtol=1e-4)
    toks = InferenceFreeQueryEncoder(s["pisa"])(pd.DataFrame({"qid": ["a", "b"], "query": [TEXTS[0], " "]}))
    assert toks["query_toks"][0] == dict(TermWeightQueryEncoder.load(s["head"]).terms(TEXTS[0]))
    assert toks["query_toks"][1] == {}
    with pytest.raises(InputError, match="needs an inference-free head"):
        InferenceFreeQueryEncoder(search_setup["pisa"])


# -- serve: the page and the JSON API with no model --------------------------------------------

def test_serve_answers_with_no_model(inference_free_setup, tmp_path):
    from test_serve import CHROMIUM, _free_port, _stop

    s = inference_free_setup
    port, log = _free_port(), tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "mmsparse.cli", "serve", s["pisa"],
                                 "--image-root", s["images"], "--port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"serve exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(url + "/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"serve did not answer within 60 s: {log.read_text()[-2000:]}"
            time.sleep(0.2)
        info = httpx.get(url + "/info", timeout=10).json()["indexes"]["sparse"]
        assert info["query_encoder"] == DESCRIPTION and info["model_loaded"] is False
        assert info["method"] == "inference-free"
        want = mmsparse.query(s["pisa"], TEXTS, k=10)
        for w in want:
            r = httpx.get(url + "/search", params={"q": w["query"], "k": 10}, timeout=30).json()
            assert [x["id"] for x in r["results"]] == [x["id"] for x in w["results"]]
            assert [t["term"] for t in r["terms"]] == [t["term"] for t in w["terms"]]
            assert r["results"][0]["shared"] and r["results"][0]["image"]
        edited = httpx.get(url + "/search", params={"q": TEXTS[0], "exclude": want[0]["terms"][0]["term"]},
                           timeout=30).json()
        assert want[0]["terms"][0]["term"] not in [t["term"] for t in edited["terms"]]
        if CHROMIUM is not None:
            _page_shows_the_encoder(url, tmp_path)
    finally:
        _stop(proc)
    imported = _imported(log.read_text(errors="replace"))
    assert "fastapi" in imported and not imported & set(MODEL_CODE), imported & set(MODEL_CODE)


def _page_shows_the_encoder(url: str, tmp_path) -> None:
    """Headless Chromium opens the page with a query in its URL: the info line names the table as
    the query encoder, the query's terms show as chips, the results as images."""
    from urllib.parse import quote

    import threading

    from test_serve import CHROMIUM, FLAGS, _DevTools, _stop

    profile = tmp_path / "profile"
    profile.mkdir()
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(ln) for ln in proc.stderr], daemon=True).start()
    cdp = None
    try:
        deadline = time.monotonic() + 60
        while not any("DevTools listening on" in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, f"no DevTools endpoint: {''.join(lines)[-2000:]}"
            time.sleep(0.1)
        ws = next(ln for ln in lines if "DevTools listening on" in ln).split("listening on", 1)[1].strip()
        cdp = _DevTools(ws)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

        def js(expr: str):
            return cdp.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, sid)["result"].get("value")

        cdp.call("Page.navigate", {"url": f"{url}/?q={quote(TEXTS[0])}&k=10"}, sid)
        end = time.monotonic() + 60
        while not js("(document.getElementById('status') || {dataset: {}}).dataset.state === 'done'"):
            assert time.monotonic() < end, f"the page did not search: {js('document.body.innerText')}"
            time.sleep(0.1)
        assert f"query encoder: {DESCRIPTION}" in js("document.getElementById('info').textContent")
        assert js("document.getElementById('info').dataset.modelLoaded") == "false"
        chips = js("[...document.querySelectorAll('#chips .chip')].map(e => e.dataset.term)")
        assert "dog" in chips and "beach" in chips
        assert js("document.querySelectorAll('#sparse-results .hit img').length") == 10
    finally:
        if cdp is not None:
            cdp.close()
        _stop(proc)


def test_encode_one_is_the_training_time_query(inference_free_setup, files):
    """`encode_one` (the per-query path of query/serve/the end-to-end benchmark) gives the terms and
    weights training scored: the head's query_vectors on caption_token_ids' columns; special-token
    strings, unknown words and repeats included."""
    import torch

    from mmsparse.methods.head import load_head, require_tokenizer
    from mmsparse.vocab import caption_token_ids, pad_ids, to_columns

    head = load_head(inference_free_setup["head"])
    tok = require_tokenizer(head, inference_free_setup["head"])
    table = TermWeightQueryEncoder.load(inference_free_setup["head"])
    texts = [*files["captions"].texts[:40], "[CLS] a dog [SEP] dog dog [MASK]", "zxqv ünïcödé 🐕", ""]
    cols = to_columns(caption_token_ids(tok, texts), head.token_ids.numpy(), len(tok))
    terms = torch.from_numpy(pad_ids(cols, len(head.vocab)))   # padded with |V|, as training pads them
    with torch.no_grad():
        want = head.query_vectors(terms).numpy()
    m = table.encode(texts)
    for i, text in enumerate(texts):
        ids, w = table.encode_one(text)
        assert ids.dtype == np.int32 and w.dtype == np.float32 and (np.diff(ids) > 0).all()
        assert ids.tolist() == np.flatnonzero(want[i]).tolist(), text
        np.testing.assert_allclose(w, want[i][ids], rtol=1e-6)
        assert m.indices[m.indptr[i]:m.indptr[i + 1]].tolist() == ids.tolist()
