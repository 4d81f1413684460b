"""`mmsparse query` / mmsparse.query on real components: Flickr8k through the real dual encoder, a
real D2S head, a real PISA index (conftest `search_setup`). A query is encoded exactly as the
same text in a captions file would be: it ranks as encode-dense + sparsify + search do."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

import mmsparse
from mmsparse.api.querying import QueryEncoder, QueryEngine, resolve_origin
from mmsparse.errors import InputError
from mmsparse.formats import read_run
from mmsparse.formats.sparse import read_sparse


def test_query_json_has_shared_terms_that_sum_to_the_score(search_setup, run_cli):
    s = search_setup
    code, out, err = run_cli("query", s["pisa"], "a dog running on the beach", "--k", "5", "--json")
    assert code == 0, err
    (r,) = json.loads(out)
    assert r["query"] == "a dog running on the beach" and r["modality"] == "text"
    assert [x["rank"] for x in r["results"]] == [1, 2, 3, 4, 5]
    scores = [x["score"] for x in r["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    terms = {t["term"]: t["weight"] for t in r["terms"]}
    assert "dog" in terms                                           # the caption's own word is a query term
    docs = read_sparse(s["sparse_images"])
    row = {d: i for i, d in enumerate(docs.ids)}
    for x in r["results"]:
        # contributions: q_t (the query's weight) x d_t (the image's stored weight), summing to <q, d>
        d = dict(zip(*(a.tolist() for a in docs.row(row[x["id"]]))))
        exact = sum(w * d.get(docs.vocab.index(t), 0.0) for t, w in terms.items())
        assert sum(c["contribution"] for c in x["shared"]) == pytest.approx(exact, rel=1e-5)
        for c in x["shared"]:
            assert c["query_weight"] == pytest.approx(terms[c["term"]])
            assert c["doc_weight"] == pytest.approx(d[docs.vocab.index(c["term"])])
        assert x["score"] == pytest.approx(exact, rel=0.03)           # PISA: 8-bit quantised <q, d>
    assert "query: loaded hf-dual" in err and " s" in err             # the load time is reported


def test_query_ranks_as_the_shell_chain(search_setup, run_cli, tmp_path, monkeypatch):
    """Queries from a file rank exactly as the four-command chain over the same file: encode-dense
    (a captions .txt), sparsify, search; and from stdin as a table."""
    s = search_setup
    from mmsparse.formats.dense import read_dense

    texts = [read_dense(s["dense"] / "test-captions.h5").texts[i] for i in (0, 7, 123, 321, 499)]
    (tmp_path / "q.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    code, out, err = run_cli("query", s["pisa"], "--file", tmp_path / "q.txt", "--k", "10", "--json")
    assert code == 0, err
    got = json.loads(out)
    model = resolve_origin(s["pisa"]).model
    for args in (("encode-dense", tmp_path / "q.txt", "-o", tmp_path / "dense", "--model", model),
                 ("sparsify", s["head"], tmp_path / "dense" / "all-captions.h5", "-o", tmp_path / "q.h5"),
                 # --force: the queries' file says dataset "q", the index's "flickr8k"
                 ("search", s["pisa"], tmp_path / "q.h5", "-o", tmp_path / "run.trec", "--k", "10", "--force")):
        code, _, err = run_cli(*args)
        assert code == 0, f"{args[0]}: {err[-2000:]}"
    run = read_run(tmp_path / "run.trec")
    for n, (text, r) in enumerate(zip(texts, got), 1):
        assert r["query"] == text
        want = sorted(run[str(n)].items(), key=lambda x: (-x[1], x[0]))
        assert [x["id"] for x in r["results"]] == [d for d, _ in want]
        np.testing.assert_allclose([x["score"] for x in r["results"]], [v for _, v in want], rtol=1e-5)
    # the same queries on stdin (no QUERIES, no --file), as a table
    monkeypatch.setattr("sys.stdin", io.StringIO(texts[0] + "\n\n" + texts[1] + "\n"))
    code, out, err = run_cli("query", s["pisa"], "--k", "3")
    assert code == 0, err
    assert out.count("rank") == 2 and got[0]["results"][0]["id"] in out and got[1]["results"][0]["id"] in out
    assert "shared terms" in out and "query terms:" in out


def test_image_query_edits_and_overrides(search_setup, tmp_path):
    s = search_setup
    docs = read_sparse(s["sparse_images"])
    img = docs.ids[3]
    with QueryEngine(s["pisa"]) as engine:                       # one model load for several queries
        res = engine.run(images=[s["images"] / f"{img}.jpg"], k=5)
        assert res[0]["modality"] == "image"
        # the query is the image's own document vector (up to float noise: one image vs a batch of 64)
        q = np.zeros(len(docs.vocab))
        for t in res[0]["terms"]:
            q[docs.vocab.index(t["term"])] = t["weight"]
        np.testing.assert_allclose(q, docs.matrix[3].toarray()[0], atol=1e-3)
        # image -> image: the 5 best images by the exact <q, d> (PISA's scores are 8-bit quantised)
        exact = docs.matrix @ q
        row = {d: i for i, d in enumerate(docs.ids)}
        got = [exact[row[x["id"]]] for x in res[0]["results"]]
        np.testing.assert_allclose(got, np.sort(exact)[::-1][:5], rtol=0.03)
        np.testing.assert_allclose([x["score"] for x in res[0]["results"]], got, rtol=0.03)
        # edits: drop the strongest term, add a word at the largest weight
        text = "a dog running on the beach"
        base = engine.run([text], k=10)[0]
        top = base["terms"][0]["term"]
        edited = engine.run([text], k=10, exclude=[top], add=["snow"])[0]
        terms = {t["term"]: t["weight"] for t in edited["terms"]}
        assert top not in terms and terms["snow"] == pytest.approx(base["terms"][0]["weight"])
        assert edited["excluded"] == [top] and edited["added"] == ["snow"]
        assert len(terms) == len(base["terms"]) - 1 + ("snow" not in {t["term"] for t in base["terms"]})
        with pytest.raises(InputError, match="not in the head's vocabulary"):
            engine.run([text], add=["ǂǂǂ"])
        # a word whose pieces are not all terms ("dog" "##q" "##q" "##q") is refused, not half-added
        with pytest.raises(InputError, match="pieces .*##q"):
            engine.run([text], add=["dogqqq"])
    # the head comes from the provenance; once it is gone, --head names it
    moved = tmp_path / "head-moved"
    shutil.copytree(s["head"], moved)
    meta = json.loads((s["pisa"] / "mmsparse.json").read_text())
    idx = tmp_path / "index"
    shutil.copytree(s["pisa"], idx)
    meta["source_attrs"]["head"] = str(tmp_path / "gone")
    meta["source"] = str(tmp_path / "gone.h5")
    (idx / "mmsparse.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="is not there any more; pass --head"):
        resolve_origin(idx)
    o = resolve_origin(idx, head=moved)
    assert (o.head, o.backbone, o.route) == (str(moved), "hf-dual", "sparse")
    again = mmsparse.query(idx, [text], head=moved, k=10, out=tmp_path / "r.json")
    assert again[0]["results"] == base["results"] and json.loads((tmp_path / "r.json").read_text()) == again


def test_query_errors_are_one_line(search_setup, run_cli, tmp_path):
    s = search_setup
    code, out, err = run_cli("query", s["pisa"], "   ")
    assert code == 2 and "empty query" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli("query", s["pisa"], "dog", "--image", tmp_path / "none.jpg")
    assert code == 2 and "not both" in err
    code, out, err = run_cli("query", tmp_path, "dog")
    assert code == 2 and "not an mmsparse index" in err


def test_dense_index_and_encoder(search_setup):
    """A Faiss index is queried with the backbone's vectors: its scores are the cosines of the
    query vector with the images' dense vectors."""
    from mmsparse.formats.dense import read_dense

    s = search_setup
    res = mmsparse.query(s["faiss"], ["two children playing in the snow"], k=3)[0]
    assert res["terms"] == [] and len(res["results"]) == 3
    enc = QueryEncoder.for_index(s["faiss"]).encode(["two children playing in the snow"])
    assert enc.matrix is None and enc.vectors.shape == (1, 512)
    imgs = read_dense(s["dense"] / "test-images.h5")
    cos = imgs.vectors @ enc.vectors[0]
    best = np.argsort(-cos)[:3]
    assert [x["id"] for x in res["results"]] == [imgs.ids[i] for i in best]
    np.testing.assert_allclose([x["score"] for x in res["results"]], cos[best], rtol=1e-5)
