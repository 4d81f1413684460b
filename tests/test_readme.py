"""The README's Python API example runs as written (real Flickr8k images through the real dual
encoder, 200 per split) and writes the same kinds of files as the shell pipeline."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import h5py
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_api_block() -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- python-api -->\s*```python\n(.*?)```\s*<!-- /python-api -->", text, re.S)
    assert m, "README.md lost its <!-- python-api --> example"
    return m.group(1)


@pytest.mark.slow  # the README's whole Python API example on real images: ~130 s
def test_python_api_example_runs(tmp_path, monkeypatch, flickr8k_dir, dual_encoder_dir, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(python_api_block(), str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert re.search(r"R@10 0\.\d{3}  FLOPs \d+\.\d", lines[0]) and len(lines) == 5, out
    w = tmp_path / "work"
    vocab = set((w / "heads" / "d2s" / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    for line in lines[1:4]:                                  # "<image id> [5 distinct vocabulary terms]"
        image_id, terms = line.split(" ", 1)
        terms = ast.literal_eval(terms)
        assert len(set(terms)) == 5 and set(terms) <= vocab, line
    hits = ast.literal_eval(lines[4])                       # the free-text query's top 3 test images
    assert len(set(hits)) == 3
    for split in ("train", "val", "test"):                   # encode-dense's files
        for kind in ("images", "captions"):
            with h5py.File(w / "dense" / f"{split}-{kind}.h5") as f:
                assert f.attrs["format"] == "dense" and f["ids"].shape[0] > 0
        assert (w / "dense" / f"{split}.qrels").is_file()
    cfg = json.loads((w / "heads" / "d2s" / "config.json").read_text())   # train-head's head directory
    assert cfg["method"] == "d2s" and (w / "heads" / "d2s" / "model.safetensors").is_file()
    assert cfg["provenance"]["command"].startswith("mmsparse.train_head(")
    assert {i["kind"] for i in cfg["provenance"]["inputs"]} == {"dense"}
    for name in ("test-images.h5", "test-captions.h5"):      # sparsify's files
        with h5py.File(w / "sparse" / name) as f:
            assert f.attrs["format"] == "sparse" and f.attrs["method"] == "d2s"
            assert f.attrs["command"].startswith("mmsparse.sparsify(")
    meta = json.loads((w / "index" / "d2s" / "mmsparse.json").read_text())
    assert meta["kind"] == "pisa" and meta["num_docs"] == 200
    side = json.loads((w / "runs" / "d2s.trec.meta.json").read_text())
    assert side["format"] == "run" and side["command"].startswith("mmsparse.search(")
    lines = (w / "runs" / "d2s.trec").read_text().splitlines()
    assert 0 < len(lines) <= 1000 * 100 and len(lines[0].split()) == 6          # 1,000 captions, k = 100
