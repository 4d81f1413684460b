"""`mmsparse export` / `import`: heads as self-contained sentence-transformers SparseEncoder models,
checked against sentence-transformers itself in processes where mmsparse cannot be imported, and
sparse vectors as JSON lines of term maps (also Seismic's form).

Small real components: heads built here over the real dual encoder's tokenizer (the query route)
or over the conftest tiny CLIP model (the image and text routes, through real encode-dense and
sparsify runs on a few generated images and captions). Every comparison is with what `mmsparse
sparsify` writes: the same terms, weights within 1e-5. Fine-tuning an export and reading it back:
tests/test_export_finetune.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.sparse import read_sparse, write_sparse
from mmsparse.methods.d2s.head import D2SHead
from mmsparse.methods.inference_free.head import InferenceFreeHead
from mmsparse.provenance import model_fingerprint
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
        sys.modules["mmsparse"] = None          # any import of mmsparse raises ImportError
        from sentence_transformers import SparseEncoder
        model = SparseEncoder({str(tmp_path / 'st')!r}, device="cpu")   # trust_remote_code=False
        emb = model.encode_query({CAPTIONS!r})
        out = {{"rows": [dict(r) for r in model.decode(emb)], "dim": int(emb.shape[1]),
               "max_seq_length": model.max_seq_length, "similarity": model.similarity_fn_name}}
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


# -- the full exports, on the tiny CLIP model, loaded where mmsparse cannot be imported ----------

@pytest.fixture(scope="module")
def tiny_data(tiny_clip, tmp_path_factory):
    """Six generated PNG images and five captions encoded by encode-dense with the tiny CLIP model
    (with final-layer inputs stored as float32, for joint heads with tuned final layers)."""
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
                              final_layer_inputs=True, states_dtype="float32")
    return d


def _tiny_head(method, tiny_clip, tmp_path, doc_top_k: int = 6):
    """A random d2s (top-k gated, posting floor), joint (tuned projections and tuned final layers) or
    inference-free (top-k gated image side) head over the tiny CLIP vocabulary; doc_top_k: the image
    side's k (the query side's is 5)."""
    from transformers import AutoTokenizer

    from mmsparse.backbones.base import load_backbone
    from mmsparse.methods.joint.head import JointHead

    tok = AutoTokenizer.from_pretrained(str(tiny_clip))
    training = {"backbone": "clip", "model": str(tiny_clip)}
    ids = np.arange(len(tok.get_vocab()))
    gates = {"doc_top_k": doc_top_k, "query_top_k": 5}
    if method == "joint":
        g = torch.Generator().manual_seed(1)
        voc = Vocab([tok.convert_ids_to_tokens(int(i)) for i in ids], torch.randn(len(ids), 8, generator=g), tok,
                    str(tiny_clip))
        bb = load_backbone("clip", tiny_clip, "cpu")
        head = JointHead.from_backbone(voc, bb.projections(), training, **gates)
        text, image = bb.final_layer_weights("text"), bb.final_layer_weights("image")
        with torch.no_grad():
            head.image_proj.weight.add_(0.1 * torch.randn(head.image_proj.weight.shape, generator=g))
            for p in [*text.parameters(), *image.parameters()]:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        head.set_final_layers(text, image, {"model": str(tiny_clip)}, tuned=True)
    else:
        cls, kw = ((InferenceFreeHead, {"doc_top_k": doc_top_k}) if method == "inference-free"
                   else (D2SHead, {**gates, "doc_max_share": 0.5}))
        head = _vocab_head(cls, 24, tok, ids, str(tiny_clip), training, **kw)
        if method == "d2s":
            with torch.no_grad():
                head.doc_floor.uniform_(0.0, 0.5)
    return head.save_pretrained(tmp_path / method)


METHODS = ("d2s", "joint", "inference-free")

# Run in a fresh interpreter where `import mmsparse` fails: load each export as a user would,
# encode the images (PIL and paths) as documents and the captions as queries.
_USER_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.modules["mmsparse"] = None          # any import of mmsparse raises ImportError
    from PIL import Image
    from sentence_transformers import SparseEncoder

    jobs = json.loads(sys.argv[1])

    def rows(model, emb):
        return [dict(r) for r in model.decode(emb)]

    def ids(emb):
        emb = emb.coalesce()
        return [{str(int(c)): float(v) for (r, c), v in zip(emb.indices().T.tolist(), emb.values().tolist()) if r == i}
                for i in range(emb.shape[0])]

    out = {}
    for name, job in jobs.items():
        m = SparseEncoder(job["dir"], device="cpu", trust_remote_code=job["trust"])
        docs = m.encode_document([Image.open(p) for p in job["images"]])
        res = {"docs": rows(m, docs), "doc_ids": ids(docs), "doc_paths": rows(m, m.encode_document(job["images"])),
               "queries": rows(m, m.encode_query(job["texts"])), "dim": m.get_embedding_dimension(),
               "similarity": m.similarity_fn_name}
        if job.get("caption_terms"):
            res["caption_terms"] = rows(m, m.encode(job["texts"], task="caption-terms"))
        try:
            m.encode_document(["a dog"])
            res["text_docs"] = "encoded"
        except ValueError as e:
            res["text_docs"] = str(e)
        out[name] = res
    json.dump(out, sys.stdout)
    """)


@pytest.fixture(scope="module")
def exports(tiny_clip, tiny_data, tmp_path_factory):
    """Per method: the head, its export, sparsify's rows of the images and captions (and caption-term
    queries for d2s), and what the export gives in a process where mmsparse cannot be imported."""
    from mmsparse.formats.sparse import read_sparse as read

    root = tmp_path_factory.mktemp("exports")
    dense = tiny_data / "dense"
    out, jobs = {}, {}
    for method in METHODS:
        d = root / method
        head = _tiny_head(method, tiny_clip, d)
        caps = tiny_data / "caps.txt" if method == "inference-free" else dense / "all-captions.h5"
        docs = read(mmsparse.sparsify(head, dense / "all-images.h5", out=d / "docs.h5", allow_dense=True))
        queries = read(mmsparse.sparsify(head, caps, out=d / "queries.h5", allow_dense=True))
        e = {"head": head, "st": mmsparse.export(head, out=d / "st"), "docs": docs, "queries": queries}
        if method == "d2s":
            e["caption_terms"] = read(mmsparse.sparsify(head, caps, out=d / "ct.h5", query_mode="caption-terms"))
        out[method] = e
        jobs[method] = {"dir": str(e["st"]), "trust": True, "caption_terms": method == "d2s", "texts": queries.texts,
                        "images": [str(tiny_data / "images" / f"{i}.png") for i in docs.ids]}
    res = subprocess.run([sys.executable, "-c", _USER_SCRIPT, json.dumps(jobs)], capture_output=True, text=True,
                         cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for method, got in json.loads(res.stdout).items():
        out[method]["user"] = got
    return out


@pytest.mark.parametrize("method", METHODS)
def test_export_reproduces_sparsify_without_mmsparse(method, exports):
    """SparseEncoder(folder, trust_remote_code=True), in a process where mmsparse cannot be imported,
    gives sparsify's rows of encode-dense's vectors: images through encode_document (PIL images and
    paths), captions through encode_query (the text tower and head; an inference-free head's table),
    and for d2s caption-term queries through task="caption-terms": the same terms, within 1e-5."""
    e = exports[method]
    got = e["user"]
    assert e["docs"].matrix.nnz and e["queries"].matrix.nnz
    _assert_same(_rows(e["docs"]), got["docs"])
    _assert_same(_rows(e["docs"]), got["doc_paths"])
    _assert_same(_rows(e["queries"]), got["queries"])
    if method == "d2s":
        ct = _rows(e["caption_terms"])
        _assert_same(ct, got["caption_terms"])
        assert ct != _rows(e["queries"])                  # a mode of its own
    assert got["dim"] == 16 and got["similarity"] == "dot"


@pytest.mark.parametrize("method", METHODS)
def test_export_holds_only_sentence_transformers_modules_and_its_own_file(method, exports):
    """Every module is sentence-transformers' own or sparse_gates.SparseGates, whose file is in the
    folder and imports no mmsparse; text documents of an inference-free model are refused."""
    st = exports[method]["st"]
    types = [m["type"] for m in json.loads((st / "modules.json").read_text())]
    if (st / "router_config.json").is_file():
        types += list(json.loads((st / "router_config.json").read_text())["types"].values())
    assert all(t.startswith("sentence_transformers.") or t == "sparse_gates.SparseGates" for t in types), types
    assert "sparse_gates.SparseGates" in types
    code = (st / "sparse_gates.py").read_text(encoding="utf-8")
    assert "mmsparse" not in "".join(ln for ln in code.splitlines() if ln.lstrip().startswith(("import", "from")))
    card = (st / "README.md").read_text(encoding="utf-8")
    assert "library_name: sentence-transformers" in card and "trust_remote_code=True" in card
    assert f"| method | `{method}` |" in card and "pipeline_tag: feature-extraction" in card
    gates = next(m["path"] for m in json.loads((st / "modules.json").read_text()) if m["type"].endswith("SparseGates"))
    assert f"full record: `{gates}/config.json`" in card and "training" in json.loads(
        (st / gates / "config.json").read_text())["mmsparse"]["config"]
    assert "Pillow" in card and "Image.open(p)" in card
    text_docs = exports[method]["user"]["text_docs"]
    assert (text_docs != "encoded") == (method == "inference-free"), text_docs


def test_export_folder_holds_no_machine_path(tiny_clip, tiny_data, run_cli, tmp_path, tmp_path_factory):
    """A folder written by `mmsparse export` (each method, and the query route) holds no absolute path
    in any file: the dual encoder is named by model_fingerprint (and model_name), the training files by
    name and content sha256 (when they exist), nested records (a joint head's final-layer source, the
    training options) likewise."""
    from mmsparse.provenance import file_sha256

    base = str(tmp_path_factory.getbasetemp())
    train = tiny_data / "dense" / "all-images.h5"
    for method, route in (*((m, "all") for m in METHODS), ("inference-free", "query")):
        head = _tiny_head(method, tiny_clip, tmp_path / route)
        cfg = json.loads((head / "config.json").read_text())
        cfg["training"].update(train_images=str(train), val_captions=str(tmp_path / "gone" / "val-captions.h5"),
                               config={"out": str(tmp_path / "heads" / method), "lr": 1e-3})
        (head / "config.json").write_text(json.dumps(cfg))
        out = tmp_path / f"st-{method}-{route}"
        code, _, err = run_cli("export", head, "-o", out, "--route", route)
        assert code == 0, err
        for f in (p for p in out.rglob("*") if p.is_file()):
            data = f.read_bytes()
            assert base.encode() not in data and str(Path.home()).encode() + b"/" not in data, f
        if route == "query":
            continue
        gates = next(m["path"] for m in json.loads((out / "modules.json").read_text()) if m["type"].endswith("Gates"))
        tr = json.loads((out / gates / "config.json").read_text())["mmsparse"]["config"]["training"]
        assert "model" not in tr and tr["model_name"] == tiny_clip.name
        assert tr["model_fingerprint"] == model_fingerprint(tiny_clip)
        assert tr["train_images"] == train.name and tr["train_images_sha256"] == file_sha256(train)
        assert tr["val_captions"] == "val-captions.h5" and "val_captions_sha256" not in tr
        assert tr["config"] == {"out": method, "lr": 1e-3}


def test_siglip_d2s_export_reproduces_sparsify(tiny_siglip, tiny_data, tmp_path):
    """SigLIP towers (captions padded to max_length, the last position pooled) export too: images and
    captions give sparsify's rows of encode-dense's SigLIP vectors."""
    from PIL import Image
    from sentence_transformers import SparseEncoder
    from transformers import AutoTokenizer

    for src in ("images", "caps.txt"):
        mmsparse.encode_dense(tiny_data / src, out=tmp_path / "dense", backbone="siglip", model=tiny_siglip, workers=0)
    tok = AutoTokenizer.from_pretrained(str(tiny_siglip))
    head = _vocab_head(D2SHead, 32, tok, np.arange(len(tok.get_vocab())), str(tiny_siglip),
                       {"backbone": "siglip", "model": str(tiny_siglip)}, doc_top_k=6, query_top_k=5)
    head = head.save_pretrained(tmp_path / "d2s")
    docs = read_sparse(mmsparse.sparsify(head, tmp_path / "dense" / "all-images.h5", out=tmp_path / "d.h5",
                                         allow_dense=True))
    queries = read_sparse(mmsparse.sparsify(head, tmp_path / "dense" / "all-captions.h5", out=tmp_path / "q.h5",
                                            allow_dense=True))
    model = SparseEncoder(str(mmsparse.export(head, out=tmp_path / "st")), device="cpu", trust_remote_code=True)
    images = [Image.open(tiny_data / "images" / f"{i}.png") for i in docs.ids]
    _assert_same(_rows(docs), _st_rows(model, model.encode_document(images)))
    _assert_same(_rows(queries), _st_rows(model, model.encode_query(queries.texts)))


@pytest.mark.parametrize("method", METHODS)
def test_import_of_an_export_gives_the_head_back(method, exports, tiny_data, run_cli, tmp_path):
    """`mmsparse import` of an export nobody fine-tuned: d2s and inference-free heads come back with
    their weights and training record (an inference-free table as max(0, w), which gives the same
    queries); a joint head comes back as a d2s head over the export's own dual encoder, and the
    vectors of encode-dense with that model through it are the joint head's sparsify rows."""
    e = exports[method]
    code, _, err = run_cli("import", e["st"], "-o", tmp_path / "head")
    assert code == 0, err
    old, new = mmsparse.load_head(e["head"]), mmsparse.load_head(tmp_path / "head")
    assert new.vocab == old.vocab and new.method == ("d2s" if method == "joint" else method)
    for k in ("w1.weight", "norm.weight", "norm.bias", "w2.weight", "w2.bias", "token_ids"):
        assert torch.equal(new.state_dict()[k], old.state_dict()[k]), k
    if method != "joint":
        # the record names the model by what it is (no machine path), and sparsify still checks it
        want = {**old.config["training"], "model_name": Path(old.config["training"]["model"]).name,
                "model_fingerprint": model_fingerprint(old.config["training"]["model"])}
        assert new.config["training"] == {k: v for k, v in want.items() if k != "model"} and "encode-dense" not in err
        other = tmp_path / "other-model.h5"
        shutil.copyfile(tiny_data / "dense" / "all-images.h5", other)
        with h5py.File(other, "a") as f:
            f.attrs["model_fingerprint"] = "sha256:" + "0" * 64
        code, _, err = run_cli("sparsify", tmp_path / "head", other, "-o", tmp_path / "o.h5", "--allow-dense")
        assert code == 2 and "model_fingerprint" in err, err
        caps = tiny_data / "caps.txt" if method == "inference-free" else tiny_data / "dense" / "all-captions.h5"
        for src, ref in ((tiny_data / "dense" / "all-images.h5", e["docs"]), (caps, e["queries"])):
            _assert_same(_rows(ref), _rows(read_sparse(mmsparse.sparsify(tmp_path / "head", src, out=tmp_path / "x.h5",
                                                                         allow_dense=True))))
        return
    assert new.config["training"]["model"] == str(e["st"].resolve()) and "encode-dense" in err
    dense = mmsparse.encode_dense(tiny_data / "images", out=tmp_path / "dense", backbone="clip", model=e["st"],
                                  workers=0)
    docs = mmsparse.sparsify(tmp_path / "head", dense / "all-images.h5", out=tmp_path / "d.h5", allow_dense=True)
    _assert_same(_rows(e["docs"]), _rows(read_sparse(docs)))


def test_term_ids_agree_between_hdf5_jsonl_and_the_model(exports, tiny_clip, tmp_path):
    """One id space: a sparse HDF5 row's column c is tokenizer id token_ids[c]; the JSONL export's
    terms are the tokens the export's tokenizer maps to those ids; the exported model outputs the
    same weights at the same ids."""
    from transformers import AutoTokenizer

    e = exports["d2s"]
    head = mmsparse.load_head(e["head"])
    lines = [json.loads(ln) for ln in
             mmsparse.export(e["head"].parent / "docs.h5", out=tmp_path / "d.jsonl").read_text().splitlines()]
    col = AutoTokenizer.from_pretrained(str(e["st"])).get_vocab()       # the export's own tokenizer
    tids = head.token_ids.numpy()
    for r, (line, model_row) in enumerate(zip(lines, e["user"]["doc_ids"])):
        cols, w = e["docs"].row(r)
        hdf5 = {int(tids[c]): np.float32(v) for c, v in zip(cols, w)}
        jsonl = {col[t]: np.float32(v) for t, v in line["terms"].items()}
        assert hdf5 and hdf5 == jsonl
        assert set(hdf5) == {int(k) for k in model_row}
        assert all(abs(hdf5[int(k)] - v) <= TOL for k, v in model_row.items())


def test_heads_the_export_cannot_express_are_refused_in_one_line(tiny_clip, run_cli, tmp_path):
    """VDR (per-position pooling), a mean-centred D2S head, a head of a backbone sentence-transformers'
    Transformer module does not run: exit 2, one line saying why, nothing written."""
    from transformers import AutoTokenizer

    from mmsparse.methods.vdr.head import VDRHead

    tok = AutoTokenizer.from_pretrained(str(tiny_clip))
    ids = np.arange(len(tok.get_vocab()))
    training = {"backbone": "clip", "model": str(tiny_clip)}
    voc = Vocab([tok.convert_ids_to_tokens(int(i)) for i in ids], torch.randn(len(ids), 8), tok, str(tiny_clip), ids)
    heads = {"vdr": VDRHead.from_vocab(voc, 24, 32, 32, "token_states", "patch_states", training=training),
             "center": D2SHead.from_vocab(24, voc, training, center="mean"),
             "blip": D2SHead.from_vocab(24, voc, {**training, "backbone": "blip"})}
    why = {"vdr": "per-position states", "center": "--center mean", "blip": "--backbone blip"}
    for name, head in heads.items():
        head.save_pretrained(tmp_path / name)
        code, _, err = run_cli("export", tmp_path / name, "-o", tmp_path / f"{name}-st")
        assert code == 2 and why[name] in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / f"{name}-st").exists()


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


def test_seismic_jsonl_builds_a_seismic_index_and_reads_back(sparse_file, run_cli, tmp_path):
    """--seismic writes what Seismic's own loader reads (integer ids, `vector`) and the ids beside it;
    the index it builds finds each row by its terms, and import gives the file back."""
    seismic = pytest.importorskip("seismic")
    code, _, err = run_cli("export", sparse_file, "-o", tmp_path / "s.jsonl", "--seismic")
    assert code == 0, err
    lines = [json.loads(ln) for ln in (tmp_path / "s.jsonl").read_text(encoding="utf-8").splitlines()]
    src = read_sparse(sparse_file)
    assert [ln["id"] for ln in lines] == [0, 1, 2] and all(set(ln) == {"id", "vector"} for ln in lines)
    assert (tmp_path / "s.ids.txt").read_text(encoding="utf-8").splitlines() == src.ids
    index = seismic.SeismicIndex.build(str(tmp_path / "s.jsonl"))
    assert index.len == 2 or index.len == 3                    # Seismic may leave out the empty row
    names = (tmp_path / "s.ids.txt").read_text(encoding="utf-8").splitlines()
    exact = (src.matrix @ src.matrix.T).toarray()
    for r, ln in enumerate(lines):
        if not ln["vector"]:
            continue
        q = np.array(list(ln["vector"]), dtype=seismic.get_seismic_string())
        hits = index.search(query_id=str(r), query_components=q, query_values=np.array(list(ln["vector"].values()),
                            dtype=np.float32), k=3, query_cut=10, heap_factor=1.0)
        best = max(hits, key=lambda h: h[1])
        assert names[int(best[2])] == src.ids[int(np.argmax(exact[r]))]
        if max(ln["vector"].values()) < 1e3:          # Seismic stores weights as float16 (1e5 is inf there)
            assert best[1] == pytest.approx(exact[r].max(), rel=2e-3)
    code, _, err = run_cli("import", tmp_path / "s.jsonl", "--vocab", sparse_file, "-o", tmp_path / "b.h5")
    assert code == 0, err
    back = read_sparse(tmp_path / "b.h5")
    assert back.ids == src.ids and (back.matrix != src.matrix).nnz == 0


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


def test_milvus_recipe_matches_model_queries_with_jsonl_documents(exports, tmp_path):
    """docs/export.md's Milvus recipe, run: the documents' JSON lines into a Milvus Lite collection,
    terms as tokenizer ids (the head's tokenizer), searched with the queries the exported model
    gives (its ids): each query returns sparsify's exact dot products with the documents."""
    from pymilvus import DataType
    from transformers import AutoTokenizer

    from mmsparse.indexes.milvus import connect

    e = exports["d2s"]
    col = AutoTokenizer.from_pretrained(str(e["head"] / "tokenizer")).get_vocab()
    sparse = lambda terms: {col[t]: w for t, w in terms.items()}                  # noqa: E731
    rows = [json.loads(ln) for ln in
            mmsparse.export(e["head"].parent / "docs.h5", out=tmp_path / "d.jsonl").read_text().splitlines()]
    queries = [sparse(q) for q in e["user"]["queries"]]                           # the model's own output
    with connect(lite_db=tmp_path / "m.db") as client:
        schema = client.create_schema(auto_id=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=256)
        schema.add_field("terms", DataType.SPARSE_FLOAT_VECTOR)
        index = client.prepare_index_params()
        index.add_index(field_name="terms", index_type="SPARSE_INVERTED_INDEX", metric_type="IP")
        client.create_collection("docs", schema=schema, index_params=index)
        client.insert("docs", [{"id": r["id"], "terms": sparse(r["terms"])} for r in rows if r["terms"]])
        client.load_collection("docs")
        hits = client.search("docs", data=queries, limit=10, anns_field="terms", search_params={"metric_type": "IP"})
    exact = (e["queries"].matrix @ e["docs"].matrix.T).toarray()
    for qi, h in enumerate(hits):
        want = {d: exact[qi, j] for j, d in enumerate(e["docs"].ids) if exact[qi, j] > 0}
        got = {x["id"]: x["distance"] for x in h}
        assert got.keys() == want.keys()
        assert all(got[d] == pytest.approx(want[d], rel=1e-4) for d in want), (got, want)


def test_export_api_refuses_unknown_format_and_route(sparse_file, tmp_path):
    with pytest.raises(InputError, match="--format 'csv'"):
        mmsparse.export(sparse_file, out=tmp_path / "x", format="csv")
    with pytest.raises(InputError, match="--route 'docs'"):
        mmsparse.export(sparse_file, out=tmp_path / "x", route="docs")


def test_export_without_sentence_transformers_names_the_extra(tiny_clip, tmp_path):
    """`mmsparse export` (and `import`) where sentence-transformers cannot be imported: one line naming
    the st extra, exit 2 (not an internal error from an import deeper in)."""
    script = textwrap.dedent("""
        import sys
        sys.modules["sentence_transformers"] = None     # any import of it raises ImportError
        from mmsparse import cli
        sys.argv = ["mmsparse", *sys.argv[1:]]
        cli.main()
        """)
    head = _tiny_head("d2s", tiny_clip, tmp_path)
    folder = mmsparse.export(head, out=tmp_path / "folder")
    for args in (["export", str(head), "-o", str(tmp_path / "st")], ["import", str(folder), "-o", str(tmp_path / "h")]):
        res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=tmp_path,
                             timeout=300)
        assert res.returncode == 2, res.stderr[-2000:]
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'mmsparse[st]'" in lines[0], res.stderr
    assert not (tmp_path / "st").exists() and not (tmp_path / "h").exists()


def test_import_refuses_a_query_table_a_head_cannot_hold(tiny_clip, run_cli, tmp_path):
    """The inference-free export's query table is frozen by default; a table that went negative (trained
    unfrozen: SparseStaticEmbedding has no ReLU) or holds weight at ids outside the head's terms is
    refused by `mmsparse import` in one line with the count and the fix, exit 2, nothing written:
    never clamped in silence."""
    from safetensors.torch import load_file, save_file

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_clip))
    head = _vocab_head(InferenceFreeHead, 24, tok, np.arange(5, len(tok.get_vocab())), str(tiny_clip),
                       {"backbone": "clip", "model": str(tiny_clip)}, doc_top_k=6).save_pretrained(tmp_path / "if")
    st = mmsparse.export(head, out=tmp_path / "st")
    router = json.loads((st / "modules.json").read_text())[0]["path"]
    cfg = json.loads((st / router / "router_config.json").read_text())
    table = st / router / cfg["structure"]["query"][0]
    assert json.loads((table / "config.json").read_text())["frozen"] is True
    w = load_file(str(table / "model.safetensors"))["weight"]
    ids = mmsparse.load_head(head).token_ids
    terms = ids[w[ids] > 0][:3]
    outside = torch.ones_like(w, dtype=torch.bool)
    outside[ids] = False
    for name, change, msg in (("neg", lambda v: v.index_fill_(0, terms, -0.5), "3 negative weight(s)"),
                              ("stray", lambda v: v.masked_fill_(outside, 0.25), "weight(s) at token ids outside")):
        bad = tmp_path / name
        shutil.copytree(st, bad)
        save_file({"weight": change(w.clone())}, str(bad / router / cfg["structure"]["query"][0] / "model.safetensors"))
        code, _, err = run_cli("import", bad, "-o", tmp_path / "h")
        assert code == 2 and msg in err and "frozen" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "h").exists()


def test_portable_record_names_hub_models_by_id_and_cards_say_base_model():
    """A dual encoder in the Hugging Face cache is named by its hub id (the card's base_model), a
    path in a list by its last component, an absolute path of no file by its name alone."""
    from mmsparse.methods.head import model_card
    from mmsparse.methods.st_record import portable

    cfg = {"vocab_source": "/cache/models--org--clip-x/snapshots/abc123",
           "training": {"model": "/cache/models--org--clip-x/snapshots/abc123", "model_fingerprint": "hf:org/clip-x@abc",
                        "train_images": "/data/run/train-images.h5", "inputs": ["/data/a.h5", "b"]}}
    out = portable(cfg)
    assert out["vocab_source"] == "org/clip-x"
    assert out["training"] == {"model": "org/clip-x", "model_name": "org/clip-x", "model_fingerprint": "hf:org/clip-x@abc",
                               "train_images": "train-images.h5", "inputs": ["a.h5", "b"]}
    card = model_card({"method": "d2s", **out}, use=["(use)"])
    assert "base_model: org/clip-x" in card and "pipeline_tag: feature-extraction" in card and "/cache" not in card
