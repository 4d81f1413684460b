"""Issue 10: every bad input, through the real CLI entry point (mmsparse.cli.main, in-process).

Each test asserts the exit code, the one-line message on stderr, and that no output (nor a
temporary sibling of one) appeared. Inputs are small real files: dense/sparse HDF5 written
with the format writers, a real D2S head directory, real PISA and Faiss indexes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mmsparse.cli import app
from mmsparse.formats import read_sparse, write_dense, write_qrels, write_sparse
from conftest import WORDS  # one word list for every test

D = 32


# -- fixtures ---------------------------------------------------------------------------------

def _dense(path, ids, vec, model, modality="image", split="test", texts=None, image_ids=None, **extra):
    attrs = dict(backbone="hf-dual", model=str(model), dataset="unit", split=split, normalized=True,
                 modality=modality, **extra)
    write_dense(path, ids, vec, attrs, texts=texts, image_ids=image_ids)


@pytest.fixture(scope="module")
def w(tmp_path_factory, dual_encoder_dir):
    """A small consistent workspace: dense images/captions, qrels, a head, sparse files, indexes, a run."""
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.vocab import Vocab

    root = tmp_path_factory.mktemp("rel")
    rng = np.random.default_rng(0)
    ann = root / "dataset_unit.json"
    ann.write_text(json.dumps({"dataset": "unit", "images": []}))
    zi = rng.normal(size=(20, D)).astype(np.float32)
    zi /= np.linalg.norm(zi, axis=1, keepdims=True)
    cap_ids = [f"c{i}-{j}" for i in range(20) for j in range(2)]
    img_of = [f"i{i}" for i in range(20) for _ in range(2)]
    zc = zi[np.repeat(np.arange(20), 2)] + 0.1 * rng.normal(size=(40, D)).astype(np.float32)
    texts = [" ".join(rng.choice(WORDS, 5)) for _ in cap_ids]
    _dense(root / "img.h5", [f"i{i}" for i in range(20)], zi, dual_encoder_dir, source=str(ann))
    _dense(root / "cap.h5", cap_ids, zc, dual_encoder_dir, "text", texts=texts, image_ids=img_of, source=str(ann))
    write_qrels(root / "test.qrels", {c: {i: 1} for c, i in zip(cap_ids, img_of)},
                meta={"dataset": "unit", "split": "test"})
    torch.manual_seed(0)
    voc = Vocab(WORDS, torch.randn(len(WORDS), 16), None, "unit")
    head = D2SHead.from_vocab(D, voc, {"backbone": "hf-dual", "model": str(dual_encoder_dir), "dataset": "unit"})
    head.save_pretrained(root / "head")
    run = CliRunner()
    for args in (["sparsify", root / "head", root / "img.h5", "-o", root / "simg.h5"],
                 ["sparsify", root / "head", root / "cap.h5", "-o", root / "scap.h5"],
                 ["index", root / "simg.h5", "-o", root / "pisa"],
                 ["index", root / "img.h5", "-o", root / "faiss"],
                 ["search", root / "pisa", root / "scap.h5", "-o", root / "run.trec", "--k", "10"]):
        r = run.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, (args, r.output, r.exception)
    return root


class Result:
    def __init__(self, code: int, err: str, out: str = ""):
        self.code, self.err, self.out = code, err, out
        lines = [ln for ln in err.splitlines() if ln.startswith("mmsparse: error:")]
        self.error = lines[-1] if lines else ""


@pytest.fixture
def cli(run_cli):
    """`mmsparse ARGS` through the real entry point (conftest's run_cli) as a Result."""
    def run(*args) -> Result:
        code, out, err = run_cli(*args)
        return Result(code, err, out)
    return run


def no_output(out: Path) -> bool:
    """Nothing at `out`, and no temporary sibling of it."""
    if out.exists():
        return False
    return not [p for p in out.parent.glob(f".{out.name}*")] if out.parent.exists() else True


def bad(r: Result, *fragments: str) -> None:
    """Exit 2 with one error line holding every fragment."""
    assert r.code == 2, r.err
    assert r.error, r.err
    for f in fragments:
        assert f in r.error, (f, r.err)


def _copy(src: Path, dst: Path) -> Path:
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def _edit(path: Path, fn) -> Path:
    with h5py.File(path, "r+") as f:
        fn(f)
    return path


# the command lines of each stage, with the file under test in slot X (and outputs in tmp)
def _cmds(w: Path, tmp: Path) -> dict:
    return {
        "encode-dense": lambda x: ["encode-dense", x, tmp, "-o", tmp / "out"],
        "train-head": lambda x: ["train-head", w / "img.h5", x, "-o", tmp / "out"],
        "sparsify": lambda x: ["sparsify", w / "head", x, "-o", tmp / "out"],
        "index": lambda x: ["index", x, "-o", tmp / "out"],
        "search": lambda x: ["search", w / "pisa", x, "-o", tmp / "out"],
        "search-faiss": lambda x: ["search", w / "faiss", x, "-o", tmp / "out"],
        "eval": lambda x: ["eval", w / "run.trec", w / "test.qrels", "--queries", x, "--docs", w / "simg.h5",
                           "-o", tmp / "out"],
        "inspect": lambda x: ["inspect", x, "i0", "--html", tmp / "out"],
    }


# -- files: exist, right kind, attributes, readable --------------------------------------------

@pytest.mark.parametrize("cmd", ["encode-dense", "train-head", "sparsify", "index", "search", "eval", "inspect"])
def test_missing_input(cli, w, tmp_path, cmd):
    r = cli(*_cmds(w, tmp_path)[cmd](tmp_path / "nope.h5"))
    bad(r, "nope.h5", "not found")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "index", "search", "eval", "inspect"])
def test_truncated_hdf5(cli, w, tmp_path, cmd):
    src = w / ("simg.h5" if cmd in ("index", "eval", "inspect") else "scap.h5" if cmd == "search" else "cap.h5")
    t = tmp_path / "trunc.h5"
    t.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    bad(cli(*_cmds(w, tmp_path)[cmd](t)), "trunc.h5", "truncated or not HDF5")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "search-faiss"])
def test_sparse_given_where_dense_expected(cli, w, tmp_path, cmd):
    r = cli(*_cmds(w, tmp_path)[cmd](w / "scap.h5"))
    bad(r, "scap.h5", "dense")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["search", "eval", "inspect"])
def test_dense_given_where_sparse_expected(cli, w, tmp_path, cmd):
    r = cli(*_cmds(w, tmp_path)[cmd](w / "cap.h5"))
    bad(r, "cap.h5", "sparse")
    assert no_output(tmp_path / "out")


def test_index_dir_given_as_head(cli, w, tmp_path):
    bad(cli("sparsify", w / "pisa", w / "img.h5", "-o", tmp_path / "out"), "pisa", "not a head directory")
    assert no_output(tmp_path / "out")


def test_head_dir_given_as_index(cli, w, tmp_path):
    bad(cli("search", w / "head", w / "scap.h5", "-o", tmp_path / "out"), "head", "not an mmsparse index")
    assert no_output(tmp_path / "out")


def test_run_given_as_qrels(cli, w, tmp_path):
    r = cli("eval", w / "run.trec", w / "run.trec", "-o", tmp_path / "out")
    bad(r, "run.trec:1:", "malformed qrels line")
    assert no_output(tmp_path / "out")


def test_hdf5_given_as_annotations(cli, w, tmp_path):
    r = cli("encode-dense", w / "img.h5", tmp_path, "-o", tmp_path / "out")
    bad(r, "img.h5", "not valid JSON")
    assert not (tmp_path / "out").exists()


def test_binary_file_given_as_run(cli, w, tmp_path):
    bad(cli("eval", w / "img.h5", w / "test.qrels", "-o", tmp_path / "out"), "img.h5", "not a UTF-8 text file")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "index", "search-faiss"])
def test_dense_missing_attribute(cli, w, tmp_path, cmd):
    x = _edit(_copy(w / ("cap.h5" if cmd != "index" else "img.h5"), tmp_path / "noattr.h5"),
              lambda f: f.attrs.__delitem__("modality"))
    if cmd == "search-faiss":
        x = _edit(_copy(w / "cap.h5", tmp_path / "noattr2.h5"), lambda f: f.attrs.__delitem__("modality"))
    bad(cli(*_cmds(w, tmp_path)[cmd](x)), "noattr", "modality")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["index", "search", "inspect"])
def test_sparse_missing_dataset(cli, w, tmp_path, cmd):
    x = _edit(_copy(w / ("scap.h5" if cmd == "search" else "simg.h5"), tmp_path / "novocab.h5"),
              lambda f: f.__delitem__("vocab"))
    bad(cli(*_cmds(w, tmp_path)[cmd](x)), "novocab.h5", "lacks dataset 'vocab'")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["index", "search", "inspect"])
def test_sparse_missing_attribute(cli, w, tmp_path, cmd):
    x = _edit(_copy(w / ("scap.h5" if cmd == "search" else "simg.h5"), tmp_path / "nohead.h5"),
              lambda f: f.attrs.__delitem__("query_mode"))
    bad(cli(*_cmds(w, tmp_path)[cmd](x)), "nohead.h5", "lacks attribute(s) query_mode")
    assert no_output(tmp_path / "out")


def test_head_without_weights(cli, w, tmp_path):
    h = _copy(w / "head", tmp_path / "h")
    (h / "model.safetensors").unlink()
    bad(cli("sparsify", h, w / "img.h5", "-o", tmp_path / "out"), "not a head directory", "model.safetensors")
    assert no_output(tmp_path / "out")


# -- compatibility from provenance ------------------------------------------------------------

def test_head_dim_vs_vector_dim(cli, w, tmp_path, dual_encoder_dir):
    _dense(tmp_path / "d16.h5", ["a", "b"], np.ones((2, 16), np.float32), dual_encoder_dir)
    bad(cli("sparsify", w / "head", tmp_path / "d16.h5", "-o", tmp_path / "out"), "d=16", "d=32")
    assert no_output(tmp_path / "out")


def test_head_vocab_vs_sparse_vocab(cli, w, tmp_path):
    s = read_sparse(w / "scap.h5")
    write_sparse(tmp_path / "q.h5", s.ids, s.matrix, [t.upper() for t in s.vocab], s.attrs, s.texts)
    bad(cli("search", w / "pisa", tmp_path / "q.h5", "-o", tmp_path / "out"), "q.h5", "vocab", "16 terms")
    assert no_output(tmp_path / "out")
    r = cli("eval", w / "run.trec", w / "test.qrels", "--queries", tmp_path / "q.h5", "--docs", w / "simg.h5",
            "-o", tmp_path / "out")
    bad(r, "vocab differs", "same head")
    assert no_output(tmp_path / "out")


def test_backbone_of_dense_vs_head_training(cli, w, tmp_path):
    x = _edit(_copy(w / "img.h5", tmp_path / "other.h5"), lambda f: f.attrs.__setitem__("model", "other/model"))
    r = cli("sparsify", w / "head", x, "-o", tmp_path / "out")
    bad(r, "other.h5: model='other/model'", "head", "--force")
    assert no_output(tmp_path / "out")
    r = cli("sparsify", w / "head", x, "-o", tmp_path / "out", "--force")
    assert r.code == 0 and "warning" in r.err and (tmp_path / "out").is_file(), r.err


def test_backbone_of_images_vs_captions(cli, w, tmp_path):
    x = _edit(_copy(w / "cap.h5", tmp_path / "cap-b.h5"), lambda f: f.attrs.__setitem__("backbone", "blip"))
    bad(cli("train-head", w / "img.h5", x, "-o", tmp_path / "out"), "backbone='hf-dual'", "backbone='blip'")
    assert no_output(tmp_path / "out")


def test_model_of_queries_vs_documents(cli, w, tmp_path):
    x = _edit(_copy(w / "cap.h5", tmp_path / "q.h5"), lambda f: f.attrs.__setitem__("model", "other/model"))
    bad(cli("search", w / "faiss", x, "-o", tmp_path / "out"), "q.h5: model='other/model'", "index")
    assert no_output(tmp_path / "out")


def test_split_of_queries_vs_documents(cli, w, tmp_path):
    x = _edit(_copy(w / "scap.h5", tmp_path / "q.h5"), lambda f: f.attrs.__setitem__("split", "val"))
    bad(cli("search", w / "pisa", x, "-o", tmp_path / "out"), "split='val'", "split='test'", "--force")
    assert no_output(tmp_path / "out")


def test_split_of_run_vs_qrels(cli, w, tmp_path):
    q = _copy(w / "test.qrels", tmp_path / "val.qrels")
    (tmp_path / "val.qrels.meta.json").write_text(json.dumps({"format": "qrels", "dataset": "unit", "split": "val"}))
    bad(cli("eval", w / "run.trec", q, "-o", tmp_path / "out"), "split='test'", "split='val'", "--force")
    assert no_output(tmp_path / "out")
    r = cli("eval", w / "run.trec", q, "-o", tmp_path / "out", "--force")
    assert r.code == 0 and (tmp_path / "out").is_file(), r.err


def test_images_as_queries_for_image_documents(cli, w, tmp_path):
    r = cli("search", w / "pisa", w / "simg.h5", "-o", tmp_path / "out")
    bad(r, "simg.h5: modality='image'", "modality='text' queries", "--force")
    assert no_output(tmp_path / "out")
    r = cli("search", w / "pisa", w / "simg.h5", "-o", tmp_path / "out", "--force", "--k", "3")
    assert r.code == 0 and (tmp_path / "out").is_file(), r.err


def test_caption_query_mode_on_an_image_file(cli, w, tmp_path):
    r = cli("sparsify", w / "head", w / "img.h5", "-o", tmp_path / "out", "--query-mode", "caption-terms")
    bad(r, "img.h5", "applies to captions", "image file")
    assert no_output(tmp_path / "out")


def test_captions_given_as_training_images(cli, w, tmp_path):
    bad(cli("train-head", w / "cap.h5", w / "cap.h5", "-o", tmp_path / "out"), "cap.h5", "modality='text'",
        "image")
    assert no_output(tmp_path / "out")


# -- values ----------------------------------------------------------------------------------

def _with_row(src: Path, dst: Path, row: int, vec=None, id_=None) -> Path:
    def fn(f):
        if vec is not None:
            v = f["vectors"][()]
            v[row] = vec
            f["vectors"][...] = v
        if id_ is not None:
            ids = [x.decode() for x in f["ids"][()]]
            ids[row] = id_
            f["ids"][...] = ids
    return _edit(_copy(src, dst), fn)


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "index", "search-faiss"])
def test_nan_in_vectors(cli, w, tmp_path, cmd):
    src = w / ("img.h5" if cmd == "index" else "cap.h5")
    x = _with_row(src, tmp_path / "nan.h5", 13, vec=np.nan)
    args = _cmds(w, tmp_path)[cmd](x) + (["--batch-size", "4"] if cmd == "sparsify" else [])
    bad(cli(*args), "nan.h5", "NaN/Inf")
    assert no_output(tmp_path / "out")


def test_inf_in_vectors(cli, w, tmp_path):
    x = _with_row(w / "cap.h5", tmp_path / "inf.h5", 3, vec=np.inf)
    bad(cli("sparsify", w / "head", x, "-o", tmp_path / "out"), "inf.h5", "NaN/Inf", "c1-1")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "index", "search-faiss"])
def test_empty_id(cli, w, tmp_path, cmd):
    src = w / ("img.h5" if cmd == "index" else "cap.h5")
    bad(cli(*_cmds(w, tmp_path)[cmd](_with_row(src, tmp_path / "e.h5", 5, id_=""))), "e.h5", "empty id")
    assert no_output(tmp_path / "out")


@pytest.mark.parametrize("cmd", ["train-head", "sparsify", "index", "search-faiss", "inspect"])
def test_duplicate_ids(cli, w, tmp_path, cmd):
    src = w / ("img.h5" if cmd == "index" else "simg.h5" if cmd == "inspect" else "cap.h5")
    x = _with_row(src, tmp_path / "dup.h5", 5, id_="i0" if cmd in ("index", "inspect") else "c0-0")
    bad(cli(*_cmds(w, tmp_path)[cmd](x)), "dup.h5", "duplicate id")
    assert no_output(tmp_path / "out")


def test_zero_length_caption(cli, tmp_path):
    img = tmp_path / "images"
    img.mkdir()
    ann = tmp_path / "dataset_x.json"
    ann.write_text(json.dumps({"dataset": "x", "images": [
        {"filename": "a.jpg", "split": "test", "sentences": [{"raw": "a dog", "sentid": 1},
                                                             {"raw": "   ", "sentid": 2}]}]}))
    r = cli("encode-dense", ann, img, "-o", tmp_path / "out", "--strict")  # without: skipped, warned (issue 19)
    bad(r, "dataset_x.json", "caption '2' is empty", "1 empty")
    assert not (tmp_path / "out").exists()


def test_empty_sparse_queries_get_empty_results(cli, w, tmp_path):
    s = read_sparse(w / "scap.h5")
    m = s.matrix.tolil()
    m[[2, 7], :] = 0
    write_sparse(tmp_path / "q.h5", s.ids, m.tocsr(), s.vocab, s.attrs, s.texts)
    out = tmp_path / "run.trec"
    r = cli("search", w / "pisa", tmp_path / "q.h5", "-o", out, "--k", "5")
    assert r.code == 0, r.err
    assert "2 queries had empty sparse vectors" in r.err
    qids = {ln.split()[0] for ln in out.read_text().splitlines()}
    assert s.ids[2] not in qids and s.ids[7] not in qids and len(qids) == len(s.ids) - 2
    meta = json.loads((tmp_path / "run.trec.meta.json").read_text())
    assert meta["empty_queries"] == 2 and meta["queries"]["split"] == "test"


# -- runs and qrels ---------------------------------------------------------------------------

def test_malformed_run_line(cli, w, tmp_path):
    lines = (w / "run.trec").read_text().splitlines()
    lines[4] = lines[4].rsplit(" ", 2)[0]
    (tmp_path / "r.trec").write_text("\n".join(lines) + "\n")
    bad(cli("eval", tmp_path / "r.trec", w / "test.qrels", "-o", tmp_path / "out"), "r.trec:5:",
        "malformed run line")
    assert no_output(tmp_path / "out")


def test_non_numeric_score(cli, w, tmp_path):
    (tmp_path / "r.trec").write_text("c0-0 Q0 i0 1 0.5 t\nc0-0 Q0 i1 2 high t\n")
    bad(cli("eval", tmp_path / "r.trec", w / "test.qrels", "-o", tmp_path / "out"), "r.trec:2:", "not a number")
    assert no_output(tmp_path / "out")


def test_malformed_qrels_line(cli, w, tmp_path):
    (tmp_path / "q.qrels").write_text("c0-0 0 i0 1\nc0-1 0 i0 yes\n")
    bad(cli("eval", w / "run.trec", tmp_path / "q.qrels", "-o", tmp_path / "out"), "q.qrels:2:",
        "not an integer")
    assert no_output(tmp_path / "out")


def _partial_qrels(w: Path, tmp: Path, drop: int) -> Path:
    q = tmp / "part.qrels"
    q.write_text("".join(ln + "\n" for ln in (w / "test.qrels").read_text().splitlines()[drop:]))
    return q


def test_run_queries_missing_from_qrels(cli, w, tmp_path):
    q = _partial_qrels(w, tmp_path, 3)
    r = cli("eval", w / "run.trec", q, "-o", tmp_path / "ok.json")
    assert r.code == 0 and "3 run queries are not in the qrels" in r.err, r.err
    assert json.loads((tmp_path / "ok.json").read_text())["queries_not_in_qrels"] == 3
    bad(cli("eval", w / "run.trec", q, "-o", tmp_path / "out", "--strict"), "3 run query id(s) are not in",
        "--strict")
    assert no_output(tmp_path / "out")


def test_qrels_queries_missing_from_run(cli, w, tmp_path):
    lines = [ln for ln in (w / "run.trec").read_text().splitlines() if not ln.startswith(("c0-", "c1-"))]
    (tmp_path / "r.trec").write_text("\n".join(lines) + "\n")
    r = cli("eval", tmp_path / "r.trec", w / "test.qrels", "-o", tmp_path / "ok.json")
    assert r.code == 0 and "4 qrels queries are missing from the run" in r.err, r.err
    assert json.loads((tmp_path / "ok.json").read_text())["queries_not_in_run"] == 4


# -- outputs, exit codes ----------------------------------------------------------------------

def test_out_is_a_directory(cli, w, tmp_path):
    (tmp_path / "d").mkdir()
    bad(cli("search", w / "pisa", w / "scap.h5", "-o", tmp_path / "d"), "is a directory")
    assert not list((tmp_path / "d").iterdir())


def test_index_out_is_a_file(cli, w, tmp_path):
    (tmp_path / "f").write_text("keep")
    bad(cli("index", w / "simg.h5", "-o", tmp_path / "f"), "exists and is a file")
    assert (tmp_path / "f").read_text() == "keep"


def test_usage_error_exits_2(cli, w, tmp_path):
    r = cli("index", w / "simg.h5", "-o", tmp_path / "out", "--no-such-option")
    assert r.code == 2 and "No such option" in r.err
    assert no_output(tmp_path / "out")


def test_internal_error_is_one_line_exit_1_and_debug_shows_traceback(cli, w, tmp_path, monkeypatch):
    # a deliberate bug inside a stage (nothing in the inputs is wrong) stands for any internal error
    import mmsparse.formats as formats

    def broken(path):
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(formats, "read_qrels", broken)
    monkeypatch.setenv("MMSPARSE_DEBUG", "0")  # --debug sets it to 1; undone after the test
    r = cli("eval", w / "run.trec", w / "test.qrels", "-o", tmp_path / "out")
    assert r.code == 1
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "internal error: ZeroDivisionError: simulated bug" in lines[0]
    assert "--debug" in lines[0] and no_output(tmp_path / "out")
    with pytest.raises(ZeroDivisionError):  # --debug: the exception (and its traceback) escapes
        cli("eval", w / "run.trec", w / "test.qrels", "-o", tmp_path / "out", "--debug")


def test_bad_input_error_is_one_line(cli, w, tmp_path):
    r = cli("sparsify", w / "head", w / "scap.h5", "-o", tmp_path / "out")
    assert r.code == 2 and r.err.strip().splitlines() == [r.error]


def test_failed_rewrite_keeps_previous_output(cli, w, tmp_path):
    out = tmp_path / "s.h5"
    assert cli("sparsify", w / "head", w / "cap.h5", "-o", out).code == 0
    before = out.read_bytes()
    x = _with_row(w / "cap.h5", tmp_path / "nan.h5", 30, vec=np.nan)
    bad(cli("sparsify", w / "head", x, "-o", out, "--batch-size", "8"), "NaN/Inf")
    assert out.read_bytes() == before and not list(tmp_path.glob(".s.h5*"))


# -- provenance -------------------------------------------------------------------------------

def test_outputs_record_inputs_with_hashes(w, tmp_path):
    from mmsparse.provenance import content_hash, read_provenance

    s = read_provenance(w / "scap.h5")
    assert s["kind"] == "sparse" and s["command"].startswith("mmsparse")
    got = {Path(r["path"]).name: r for r in s["inputs"]}
    assert got["cap.h5"]["kind"] == "dense" and got["cap.h5"]["sha256"] == content_hash(w / "cap.h5")["sha256"]
    assert got["head"]["kind"] == "head" and got["head"]["sha256"]
    idx = read_provenance(w / "pisa")
    assert [Path(r["path"]).name for r in idx["inputs"]] == ["simg.h5"]
    run = read_provenance(w / "run.trec")
    assert run["kind"] == "run" and {Path(r["path"]).name for r in run["inputs"]} == {"pisa", "scap.h5"}
    head = json.loads((w / "head" / "config.json").read_text())
    assert "provenance" in head and head["provenance"]["mmsparse_version"]
    out = tmp_path / "e.json"
    assert CliRunner().invoke(app, ["eval", str(w / "run.trec"), str(w / "test.qrels"), "-o", str(out)]).exit_code == 0
    ev = read_provenance(out)
    assert ev["kind"] == "eval" and {Path(r["path"]).name for r in ev["inputs"]} == {"run.trec", "test.qrels"}
    assert ev["command"].startswith("mmsparse eval")


def test_inspect_provenance_walks_back_to_captions(cli, w, tmp_path):
    r = cli("inspect", w / "run.trec", "--provenance")
    assert r.code == 0 and "made by: mmsparse search" in r.out and "dataset_unit.json" in r.out, r.err
    r = cli("inspect", w / "run.trec", "--provenance", "--json")
    names = _names(json.loads(r.out))
    assert {"run.trec", "pisa", "simg.h5", "scap.h5", "img.h5", "cap.h5", "head", "dataset_unit.json"} <= names


def _names(t: dict) -> set:
    return {Path(t["path"]).name} | set().union(*[_names(c) for c in t.get("parents", [])])


def test_provenance_flags_changed_inputs(w, tmp_path):
    from mmsparse.provenance import chain

    d = _copy(w / "cap.h5", tmp_path / "cap.h5")
    r = CliRunner().invoke(app, ["sparsify", str(w / "head"), str(d), "-o", str(tmp_path / "s.h5")])
    assert r.exit_code == 0
    assert {c["status"] for c in chain(tmp_path / "s.h5")["parents"]} == {"ok"}
    _edit(d, lambda f: f.attrs.__setitem__("split", "val"))
    st = {Path(c["path"]).name: c["status"] for c in chain(tmp_path / "s.h5")["parents"]}
    assert st["cap.h5"] == "changed" and st["head"] == "ok"
