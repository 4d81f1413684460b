"""Every registered method behind the one interface: trained by the one `fit`, saved, loaded by
`mmsparse.load_head` in a fresh interpreter, sparsified; deterministic; resumable exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.sparse import read_sparse
from mmsparse.methods import canonical, get_config_class, get_method, method_names
from mmsparse.methods.base import TrainInputs, make_config
from mmsparse.trainer import fit

# short schedules and small vocabularies so each method trains in seconds on the conftest data
OPTIONS = {
    "d2s": dict(epochs=2, batch_size=32, l1_warmup=2, eta=1e-3, vocab_min_df=1),
    "joint": dict(epochs=2, batch_size=16, l1_warmup=2, vocab_min_df=1, dense_side="pre-projection"),
    "vdr": dict(epochs=2, batch_size=32, vdr_train_k=8, vdr_query_k=8, vdr_doc_k=8, vocab_min_df=1),
    "bm25v": dict(epochs=2, batch_size=64, sae_expansion=4, sae_k=4),
    "inference-free": dict(epochs=2, batch_size=32, l1_warmup=2, eta=1e-3, vocab_min_df=1),
}
ONE_STEP = {"d2s": dict(batch_size=80), "joint": dict(batch_size=40), "vdr": dict(batch_size=80),
            "bm25v": dict(batch_size=160), "inference-free": dict(batch_size=80)}


METHODS = ["d2s", "joint", "vdr", "bm25v", "inference-free"]


def _inputs(data, method):
    if method == "bm25v":
        return dict(train_images=data / "train-images.h5")
    return dict(train_images=data / "train-images.h5", train_captions=data / "train-captions.h5",
                val_images=data / "val-images.h5", val_captions=data / "val-captions.h5")


def _train(data, out, method, **extra):
    ins = _inputs(data, method)
    return mmsparse.train_head(ins.pop("train_images"), ins.pop("train_captions", None), out=out, method=method,
                               **ins, **{**OPTIONS[method], **extra})


def test_registry_lists_the_builtins_and_refuses_unknown_names():
    assert method_names()[:5] == METHODS
    for m in method_names():
        cls = get_method(m)
        assert cls.name == m and cls.config_class is get_config_class(m) and cls.head_class.method == m
    assert canonical("sae") == "bm25v"          # head directories of 0.1 name BM25-V's head "sae"
    with pytest.raises(InputError, match="unknown; choose one of d2s, joint, vdr, bm25v"):
        get_method("splade")
    with pytest.raises(InputError, match="unknown option 'w1'"):
        make_config(get_config_class("d2s"), {"w1": 0.5})
    with pytest.raises(InputError, match="--expansion 'all'"):
        make_config(get_config_class("d2s"), {"expansion": "all"})


@pytest.mark.parametrize("method", METHODS)
def test_one_step_save_load_in_a_fresh_interpreter_and_sparsify(method, method_data, tmp_path):
    out = _train(method_data, tmp_path / "head", method, epochs=1, **ONE_STEP[method])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["method"] == method
    tr = cfg["training"]
    assert [h["step"] for h in tr["history"]] == [1]                  # one optimizer step of fit
    assert tr["config"] == {**tr["config"], "epochs": 1, **ONE_STEP[method]}
    assert tr["config"]["seed"] == 0 and tr["best_epoch"] == 1
    assert cfg["provenance"]["command"].startswith("mmsparse.train_head(")
    assert any(i["path"].endswith("train-images.h5") for i in cfg["provenance"]["inputs"])
    code = ("import sys, mmsparse; h = mmsparse.load_head(sys.argv[1]); "
            "print(type(h).__name__, h.method, h.config['vocab_size'], len(h.vocab))")
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    name, m, v, nv = r.stdout.split()
    assert m == method and name == get_method(method).head_class.__name__ and v == nv
    docs = mmsparse.sparsify(out, method_data / "test-images.h5", out=tmp_path / "docs.h5")
    col = read_sparse(docs)
    assert col.matrix.shape == (12, int(v)) and col.attrs["method"] == method and col.attrs["query_mode"] == "doc"
    assert col.matrix.nnz > 0 and np.isfinite(col.matrix.data).all() and (col.matrix.data > 0).all()
    if get_method(method).query_modes:
        q = read_sparse(mmsparse.sparsify(out, method_data / "test-captions.h5", out=tmp_path / "q.h5"))
        assert q.matrix.shape == (24, int(v)) and q.texts is not None and q.vocab == col.vocab


def _run(method, data, tmp, stop=None, ckpt=None):
    cls = get_method(method)
    m = cls(make_config(cls.config_class, OPTIONS[method]))
    ins = _inputs(data, method)
    head, train, val = m.setup(TrainInputs(**ins))
    return fit(m, head, train, val, ckpt_dir=ckpt, stop_after_epoch=stop)


@pytest.mark.parametrize("method", METHODS)
def test_training_is_deterministic(method, method_data, tmp_path):
    a = _train(method_data, tmp_path / "a", method)
    b = _train(method_data, tmp_path / "b", method)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ha = json.loads((a / "config.json").read_text())["training"]["history"]
    hb = json.loads((b / "config.json").read_text())["training"]["history"]
    assert [h["loss"] for h in ha] == [h["loss"] for h in hb] and [h.get("val") for h in ha] == [h.get("val") for h in hb]
    c = _train(method_data, tmp_path / "c", method, seed=1)     # and the seed matters
    wc = load_file(str(c / "model.safetensors"))
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)


@pytest.mark.parametrize("method", METHODS)
def test_interrupted_run_resumes_to_the_same_head(method, method_data, tmp_path):
    """Model, optimizer, scheduler, RNG and the method's own state (expansion control, ...) are
    restored: an interrupted run that resumes ends bit-identical to an uninterrupted one."""
    whole = _run(method, method_data, tmp_path)
    part = _run(method, method_data, tmp_path, stop=1, ckpt=tmp_path / "ckpt")
    assert not part.finished and len(part.history) == 1
    resumed = _run(method, method_data, tmp_path, ckpt=tmp_path / "ckpt")
    assert resumed.finished and [h["step"] for h in resumed.history] == [h["step"] for h in whole.history]
    assert resumed.best_epoch == whole.best_epoch
    for k in whole.state:
        assert torch.equal(resumed.state[k], whole.state[k]), k


def test_checkpoint_of_other_settings_is_refused(method_data, tmp_path):
    _run("d2s", method_data, tmp_path, stop=1, ckpt=tmp_path / "ckpt")
    cls = get_method("d2s")
    m = cls(make_config(cls.config_class, {**OPTIONS["d2s"], "eta": 0.5}))
    head, train, val = m.setup(TrainInputs(**_inputs(method_data, "d2s")))
    with pytest.raises(InputError, match="different settings or inputs; pass --restart"):
        fit(m, head, train, val, ckpt_dir=tmp_path / "ckpt")
