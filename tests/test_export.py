"""`mmsparse export` / `import`: heads as sentence-transformers SparseEncoder models, checked against
sentence-transformers itself, and sparse vectors as JSON lines of term maps.

Small real components: heads built here over the real dual encoder's tokenizer (the query route)
or over the conftest tiny CLIP model (the image and text routes, through real encode-dense and
sparsify runs on a few generated images and captions). Every comparison is with what `mmsparse
sparsify` writes: the same terms, weights within 1e-5."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.methods.d2s.head import D2SHead
from mmsparse.methods.inference_free.head import InferenceFreeHead
from mmsparse.vocab import Vocab

pytest.importorskip("sentence_transformers", reason="the st extra (pip install -e '.[st]')")

TOL = 1e-5
WORDS = "a dog cat runs on the grass red ball .".split()


def _vocab_head(cls, dim: int, tok, ids, source: str, training: dict, seed: int = 0, **kw):
    """A random head of `cls` over the tokenizer ids `ids` of `tok` (terms: their tokens)."""
    g = torch.Generator().manual_seed(seed)
    inv = {i: t for t, i in tok.get_vocab().items()}
    voc = Vocab([inv[int(i)] for i in ids], torch.randn(len(ids), 8, generator=g), tok, source,
                np.asarray(ids, dtype=np.int64))
    head = cls.from_vocab(dim, voc, training, **kw)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() else 1))
    return head


def _rows(col) -> list[dict[str, float]]:
    """A SparseCollection's rows as {term: weight}."""
    return [dict(col.terms(i)) for i in range(len(col.ids))]


def _st_rows(model, emb) -> list[dict[str, float]]:
    """sentence-transformers embeddings [N, n] as {token: weight} through the model's own decode."""
    return [dict(r) for r in model.decode(emb)]


def _assert_same(expected: list[dict], got: list[dict]) -> None:
    assert len(expected) == len(got)
    for r, (e, g) in enumerate(zip(expected, got)):
        assert set(e) == set(g), f"row {r}: terms {sorted(set(e) ^ set(g))} differ"
        assert max((abs(e[t] - g[t]) for t in e), default=0.0) <= TOL, f"row {r}"


# -- the query route of an inference-free head: sentence-transformers alone -------------------

@pytest.fixture(scope="module")
def if_head(dual_encoder_dir, tmp_path_factory):
    """An inference-free head over 3,000 random ids of the real tokenizer plus the captions' words,
    [UNK] and the other special tokens, its table N(0, 1) (so about half the weights are <= 0)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dual_encoder_dir))
    rng = np.random.default_rng(0)
    own = tok.convert_tokens_to_ids(["dog", "beach", "running", "##s", ".", ",", "a", "zebra", "blue"])
    the = tok.convert_tokens_to_ids("the")
    ids = np.unique(np.concatenate([tok.all_special_ids, own, [the], rng.choice(np.arange(999, 30522), 3000, False)]))
    head = _vocab_head(InferenceFreeHead, 512, tok, ids, str(dual_encoder_dir),
                       {"backbone": "hf-dual", "model": str(dual_encoder_dir)})
    with torch.no_grad():   # the query words weigh > 0 ("zebra" only ever after token 128, see below), "the" < 0
        head.query_weight[np.searchsorted(ids, own)] = torch.linspace(0.5, 2.0, len(own))
        head.query_weight[np.searchsorted(ids, the)] = -1.0
        head.query_weight[np.searchsorted(ids, tok.all_special_ids)] = 3.0   # special tokens: never terms
    return head.save_pretrained(tmp_path_factory.mktemp("if") / "head")


LONG = " ".join(["dogs running on the beach,"] * 30) + " a zebra"   # 150+ tokens: "zebra" is cut
CAPTIONS = ["A dog running on the beach.", "Two DOGS, a blue ball!", "the", "Ünïcödé 🐕 dog", LONG,
            "zebra " + LONG]


def test_query_route_loads_in_sentence_transformers_alone(if_head, run_cli, tmp_path):
    """The --route query export is a plain SparseStaticEmbedding: a process that never imports
    mmsparse loads it and reproduces `sparsify`'s query vectors of the captions (a caption longer
    than 128 tokens included: the term past token 128 is dropped by both)."""
    (tmp_path / "q.tsv").write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate(CAPTIONS)), encoding="utf-8")
    assert run_cli("sparsify", if_head, tmp_path / "q.tsv", "-o", tmp_path / "q.h5")[0] == 0
    code, _, err = run_cli("export", if_head, "-o", tmp_path / "st", "--route", "query")
    assert code == 0, err
    modules = json.loads((tmp_path / "st" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["SparseStaticEmbedding"]
    script = textwrap.dedent(f"""
        import json, sys
        from sentence_transformers import SparseEncoder
        model = SparseEncoder({str(tmp_path / 'st')!r}, device="cpu")
        emb = model.encode_query({CAPTIONS!r})
        out = {{"rows": [dict(r) for r in model.decode(emb)], "dim": int(emb.shape[1]),
               "max_seq_length": model.max_seq_length, "similarity": model.similarity_fn_name}}
        assert "mmsparse" not in sys.modules, "mmsparse was imported"
        json.dump(out, sys.stdout)
        """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout)
    assert got["dim"] == 30522 and got["max_seq_length"] == 128 and got["similarity"] == "dot"
    expected = _rows(read_sparse(tmp_path / "q.h5"))
    _assert_same(expected, got["rows"])
    assert "zebra" not in expected[4] and "zebra" in expected[5] and "dog" in expected[3]
    assert not expected[2]                                     # "the": a weight <= 0 is no term


# -- image and text routes, on the tiny CLIP model ---------------------------------------------

@pytest.fixture(scope="module")
def tiny_data(tiny_clip, tmp_path_factory):
    """Six generated PNG images and five captions encoded by encode-dense with the tiny CLIP model
    (with pre-projection states, for joint heads)."""
    from PIL import Image

    d = tmp_path_factory.mktemp("tiny-export")
    rng = np.random.default_rng(0)
    (d / "images").mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (40 + 4 * i, 36, 3), dtype=np.uint8)).save(d / "images" / f"im{i}.png")
    (d / "caps.txt").write_text("a dog runs on the grass .\nthe red ball\ncat\na cat on a red dog .\nballs\n",
                                encoding="utf-8")
    for src in ("images", "caps.txt"):
        mmsparse.encode_dense(d / src, out=d / "dense", backbone="clip", model=tiny_clip, workers=0,
                              pre_projection=True)
    return d


def _tiny_head(method, tiny_clip, tmp_path):
    """A random d2s (top-k gated, posting floor), joint (tuned projections) or inference-free head
    over the tiny CLIP vocabulary."""
    from transformers import AutoTokenizer

    from mmsparse.backbones.base import load_backbone
    from mmsparse.methods.joint.head import JointHead

    tok = AutoTokenizer.from_pretrained(str(tiny_clip))
    training = {"backbone": "clip", "model": str(tiny_clip)}
    ids = np.arange(len(tok.get_vocab()))
    if method == "joint":
        g = torch.Generator().manual_seed(1)
        voc = Vocab([tok.convert_ids_to_tokens(int(i)) for i in ids], torch.randn(len(ids), 8, generator=g), tok,
                    str(tiny_clip))
        head = JointHead.from_backbone(voc, load_backbone("clip", tiny_clip, "cpu").projections(), training)
        with torch.no_grad():
            head.image_proj.weight.add_(0.1 * torch.randn(head.image_proj.weight.shape, generator=g))
    else:
        cls, kw = ((InferenceFreeHead, {}) if method == "inference-free"
                   else (D2SHead, {"doc_top_k": 6, "query_top_k": 5, "doc_max_share": 0.5}))
        head = _vocab_head(cls, 24, tok, ids, str(tiny_clip), training, **kw)
        if method == "d2s":
            with torch.no_grad():
                head.doc_floor.uniform_(0.0, 0.5)
    return head.save_pretrained(tmp_path / method)


@pytest.mark.parametrize("method", ["d2s", "joint", "inference-free"])
def test_image_and_text_routes_reproduce_sparsify(method, tiny_clip, tiny_data, run_cli, tmp_path):
    """The full export, loaded by SparseEncoder (mmsparse's module by its class path), gives
    sparsify's vectors of encode-dense's rows: images through encode_document (PIL images and
    paths), captions through encode_query (the text tower and head; an inference-free head's table)."""
    from PIL import Image
    from sentence_transformers import SparseEncoder

    head = _tiny_head(method, tiny_clip, tmp_path)
    dense = tiny_data / "dense"
    caps = tiny_data / "caps.txt" if method == "inference-free" else dense / "all-captions.h5"
    for src, name in ((dense / "all-images.h5", "docs"), (caps, "queries")):
        assert run_cli("sparsify", head, src, "-o", tmp_path / f"{name}.h5", "--allow-dense")[0] == 0
    code, _, err = run_cli("export", head, "-o", tmp_path / "st")
    assert code == 0, err
    model = SparseEncoder(str(tmp_path / "st"), device="cpu", trust_remote_code=True)
    docs, queries = read_sparse(tmp_path / "docs.h5"), read_sparse(tmp_path / "queries.h5")
    assert docs.matrix.nnz and queries.matrix.nnz
    paths = [str(tiny_data / "images" / f"{i}.png") for i in docs.ids]
    _assert_same(_rows(docs), _st_rows(model, model.encode_document([Image.open(p) for p in paths])))
    _assert_same(_rows(docs), _st_rows(model, model.encode_document(paths)))
    _assert_same(_rows(queries), _st_rows(model, model.encode_query(queries.texts)))
    assert model.get_embedding_dimension() == 16 and model.similarity_fn_name == "dot"
    card = (tmp_path / "st" / "README.md").read_text(encoding="utf-8")
    assert "library_name: sentence-transformers" in card and "trust_remote_code=True" in card
    assert f"| method | `{method}` |" in card


def test_inference_free_document_route_takes_images_only(tiny_clip, tmp_path):
    from sentence_transformers import SparseEncoder

    head = _tiny_head("inference-free", tiny_clip, tmp_path)
    mmsparse.export(head, out=tmp_path / "st")
    model = SparseEncoder(str(tmp_path / "st"), device="cpu", trust_remote_code=True)
    with pytest.raises(ValueError, match="encodes image, not text inputs"):
        model.encode_document(["a dog"])


# -- JSON lines --------------------------------------------------------------------------------

VOCAB = ["a", ".", "...", "dog", "%", "%2E", "u.s", "ünï", 'say "hi"', "[PAD]"]


@pytest.fixture
def sparse_file(tmp_path):
    """A sparse file over VOCAB (terms with '.', '%', quotes, non-ASCII) with an empty row."""
    m = np.array([[0.5, 1.25, 0, 3e-8, 0, 2.0, 0, 0, 0, 0], [0] * 10,
                  [0, 0, 0.1, 0, 7.0, 0, 1e5, 0.333333343, 0.75, 0]], dtype=np.float32)
    p = tmp_path / "s.h5"
    write_sparse(p, ["i1", "ü 2", "3"], m, VOCAB, {"modality": "image", "head": "h", "query_mode": "doc"})
    return p


@pytest.mark.parametrize("escape", [False, True])
def test_jsonl_round_trip_is_byte_identical(sparse_file, run_cli, tmp_path, escape):
    flag = ["--escape-dots"] if escape else []
    assert run_cli("export", sparse_file, "-o", tmp_path / "a.jsonl", *flag)[0] == 0
    lines = (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(ln) for ln in lines]
    assert [r["id"] for r in rows] == ["i1", "ü 2", "3"] and rows[1]["terms"] == {}
    src = read_sparse(sparse_file)
    names = [(t.replace("%", "%25").replace(".", "%2E") if escape else t) for t in VOCAB]
    for i, r in enumerate(rows):
        # each weight reads back as the float32 it was
        assert {t: np.float32(w) for t, w in r["terms"].items()} == {names[t]: w for t, w in zip(*src.row(i))}
    assert escape == ('"%2E": 1.25' in lines[0]) and escape != ('".": 1.25' in lines[0])
    code, _, err = run_cli("import", tmp_path / "a.jsonl", "--vocab", sparse_file, "-o", tmp_path / "b.h5", *flag)
    assert code == 0, err
    back = read_sparse(tmp_path / "b.h5")
    assert back.ids == src.ids and back.vocab == VOCAB and back.attrs["query_mode"] == "doc"
    assert (back.matrix != src.matrix).nnz == 0
    assert run_cli("export", tmp_path / "b.h5", "-o", tmp_path / "c.jsonl", *flag)[0] == 0
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_bad_inputs_get_one_line_errors_and_no_output(sparse_file, if_head, tiny_data, run_cli, tmp_path):
    (tmp_path / "keep.jsonl").write_text("old\n")
    cases = [(("export", tiny_data / "dense" / "all-images.h5", "-o", tmp_path / "keep.jsonl"), "a dense HDF5 file"),
             (("export", if_head, "-o", tmp_path / "keep.jsonl"), "a head directory"),
             (("export", sparse_file, "-o", tmp_path / "st", "--format", "sentence-transformers"), "a file")]
    for args, msg in cases:
        code, _, err = run_cli(*args)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "keep.jsonl").read_text() == "old\n" and not (tmp_path / "st").exists()
    # a head whose tokenizer is gone
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(if_head, bare)
    shutil.rmtree(bare / "tokenizer")
    cfg = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**cfg, "vocab_source": ""}))
    code, _, err = run_cli("export", bare, "-o", tmp_path / "st", "--route", "query")
    assert code == 2 and "no tokenizer/" in err and not (tmp_path / "st").exists(), err
    # lines that are not term maps: nothing written, the previous output kept
    write_sparse(tmp_path / "old.h5", ["x"], np.ones((1, len(VOCAB)), np.float32), VOCAB,
                 {"modality": "image", "head": "", "query_mode": "doc"})
    good = '{"id": "1", "terms": {"dog": 1.0}}\n'
    for line, msg in (('{"id": "2", "terms": ["dog"]}', ":3: terms: not an object"),
                      ('{"id": "2", "terms": {"dog": -1}}', ":3: terms: weight of 'dog' is -1"),
                      ('{"id": "2", "terms": {"cat": 1}}', ":3: terms: 'cat' is not a term"),
                      ('{"terms": {"dog": 1}}', ":3: id: missing"), ("[1, 2]", ":3: a JSON list"),
                      ('{"id": "1", "terms": {}}', "id '1' of row 2 is a repeat"), ("{oops", ":3: not a JSON object")):
        (tmp_path / "bad.jsonl").write_text(good + "\n" + line + "\n", encoding="utf-8")
        code, _, err = run_cli("import", tmp_path / "bad.jsonl", "--vocab", sparse_file, "-o", tmp_path / "old.h5")
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, (line, err)
        assert read_sparse(tmp_path / "old.h5").ids == ["x"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_jsonl_ingests_into_milvus_lite(sparse_file, tmp_path):
    """docs/export.md's Milvus recipe, run: the lines into a Milvus Lite collection (terms as
    vocabulary indices), searched with the same lines as queries: the exact dot products."""
    from mmsparse.indexes.milvus import connect

    mmsparse.export(sparse_file, out=tmp_path / "d.jsonl")
    col = {t: j for j, t in enumerate(VOCAB)}
    rows = [json.loads(ln) for ln in (tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["terms"]]             # Milvus refuses empty sparse vectors
    with connect(lite_db=tmp_path / "m.db") as client:
        from pymilvus import DataType

        schema = client.create_schema(auto_id=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
        schema.add_field("terms", DataType.SPARSE_FLOAT_VECTOR)
        index = client.prepare_index_params()
        index.add_index(field_name="terms", index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        client.create_collection("docs", schema=schema, index_params=index)
        client.insert("docs", [{"id": r["id"], "terms": {col[t]: w for t, w in r["terms"].items()}} for r in rows])
        client.load_collection("docs")
        hits = client.search("docs", data=[{col[t]: w for t, w in r["terms"].items()} for r in rows], limit=5,
                             anns_field="terms", search_params={"metric_type": "IP"})
    src = read_sparse(sparse_file)
    exact = (src.matrix @ src.matrix.T).toarray()
    for q, h in zip(rows, hits):
        qi = src.ids.index(q["id"])
        want = {d: exact[qi, j] for j, d in enumerate(src.ids) if exact[qi, j] > 0}
        got = {x["id"]: x["distance"] for x in h}
        assert got.keys() == want.keys()
        assert all(got[d] == pytest.approx(want[d], rel=1e-5) for d in want), (got, want)


def test_export_api_refuses_unknown_format_and_route(sparse_file, tmp_path):
    with pytest.raises(InputError, match="--format 'csv'"):
        mmsparse.export(sparse_file, out=tmp_path / "x", format="csv")
    with pytest.raises(InputError, match="--route 'docs'"):
        mmsparse.export(sparse_file, out=tmp_path / "x", route="docs")
