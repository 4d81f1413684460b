"""Trainable both ways: an export fine-tuned by sentence-transformers' SparseEncoderTrainer (SpladeLoss
over SparseMultipleNegativesRankingLoss) on real Flickr8k caption-image pairs, in a process where
mmsparse cannot be imported, then read back by `mmsparse import` and used by encode-dense, sparsify,
index and search; the imported head gives the fine-tuned model's vectors.

The model is the conftest tiny CLIP (so a few steps take seconds); the pairs and the searched test
images and captions are real."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mmsparse
from mmsparse.formats.sparse import read_sparse

from test_export import TOL, _assert_same, _rows, _tiny_head, if_head  # noqa: F401  (if_head: a fixture)

pytest.importorskip("sentence_transformers", reason="the st extra (pip install -e '.[st]')")

# Fine-tune in a fresh interpreter where `import mmsparse` fails, save, and load the result again.
_FINETUNE = textwrap.dedent("""
    import json, sys
    sys.modules["mmsparse"] = None
    from datasets import Dataset
    from PIL import Image
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments, losses

    src, out, pairs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = SparseEncoder(src, device="cpu", trust_remote_code=True)
    data = Dataset.from_dict({"anchor": [c for c, _ in pairs],
                              "positive": [Image.open(p).convert("RGB") for _, p in pairs]})
    loss = losses.SpladeLoss(model, loss=losses.SparseMultipleNegativesRankingLoss(model),
                             document_regularizer_weight=1e-3, query_regularizer_weight=1e-3)
    args = SparseEncoderTrainingArguments(output_dir=out + "-run", max_steps=4, per_device_train_batch_size=8,
                                          learning_rate=5e-3, save_strategy="no", report_to="none", seed=0,
                                          use_cpu=True, disable_tqdm=True)
    SparseEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
    model.save(out)
    again = SparseEncoder(out, device="cpu", trust_remote_code=True)
    print(json.dumps(again.decode(again.encode_query([pairs[0][0]]))))
    """)


def test_finetuned_export_imports_and_searches(tiny_clip, flickr8k_dir, run_cli, tmp_path):
    from PIL import Image
    from sentence_transformers import SparseEncoder

    head = _tiny_head("d2s", tiny_clip, tmp_path)
    mmsparse.export(head, out=tmp_path / "st")
    data = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text(encoding="utf-8"))
    train = [im for im in data["images"] if im["split"] == "train"][:8]
    pairs = [(s["raw"], str(flickr8k_dir / "images" / im["filename"])) for im in train for s in im["sentences"][:4]]
    res = subprocess.run([sys.executable, "-c", _FINETUNE, str(tmp_path / "st"), str(tmp_path / "ft"),
                          json.dumps(pairs)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])[0], "the fine-tuned model gives an empty query"

    code, _, err = run_cli("import", tmp_path / "ft", "-o", tmp_path / "imported")
    assert code == 0, err
    assert "encode-dense" in err                      # its towers changed: the log line says how to encode
    new, old = mmsparse.load_head(tmp_path / "imported"), mmsparse.load_head(head)
    assert new.method == "d2s" and new.vocab == old.vocab
    assert not torch.equal(new.w2.weight, old.w2.weight), "the fine-tuning changed nothing"
    model_dir = new.config["training"]["model"]
    assert model_dir == str((tmp_path / "ft").resolve())

    # search with it: real test images and their captions through the fine-tuned dual encoder
    dense = mmsparse.encode_dense(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                                  out=tmp_path / "dense", backbone="clip", model=model_dir, split=["test"],
                                  limit=12, workers=0)
    docs = mmsparse.sparsify(tmp_path / "imported", dense / "test-images.h5", out=tmp_path / "docs.h5",
                             allow_dense=True)
    queries = mmsparse.sparsify(tmp_path / "imported", dense / "test-captions.h5", out=tmp_path / "q.h5",
                                allow_dense=True)
    run = mmsparse.search(mmsparse.build_index(docs, out=tmp_path / "index"), queries, out=tmp_path / "run.trec",
                          k=10)
    scores = mmsparse.evaluate(run, dense / "test.qrels", queries=queries, docs=docs)
    assert 0 <= scores["R@10"] <= 1 and scores["FLOPs"] > 0
    assert len({ln.split()[0] for ln in run.read_text().splitlines()}) == len(read_sparse(queries).ids)

    # the imported head gives the fine-tuned model's own vectors
    model = SparseEncoder(str(tmp_path / "ft"), device="cpu", trust_remote_code=True)
    d, q = read_sparse(docs), read_sparse(queries)
    images = [Image.open(flickr8k_dir / "images" / f"{i}.jpg") for i in d.ids]
    _assert_same(_rows(d), [dict(r) for r in model.decode(model.encode_document(images))])
    _assert_same(_rows(q), [dict(r) for r in model.decode(model.encode_query(q.texts))])
    assert np.isfinite(d.matrix.data).all() and TOL > 0


def test_import_refuses_what_it_cannot_read(if_head, tmp_path, run_cli):
    """A query-route export (no image route), a folder that is no export, and --vocab given with a
    folder: one line each, exit 2, nothing written."""
    mmsparse.export(if_head, out=tmp_path / "q", route="query")
    (tmp_path / "plain").mkdir()
    cases = [(("import", tmp_path / "q", "-o", tmp_path / "h"), "a query-route export"),
             (("import", tmp_path / "plain", "-o", tmp_path / "h"), "no modules.json"),
             (("import", tmp_path / "q", "-o", tmp_path / "h", "--vocab", if_head), "a model folder"),
             (("import", tmp_path / "x.jsonl", "-o", tmp_path / "h"), "need --vocab")]
    for args, msg in cases:
        code, _, err = run_cli(*args)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "h").exists()
