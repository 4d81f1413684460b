"""Trainable both ways: d2s, joint and inference-free exports fine-tuned by sentence-transformers'
SparseEncoderTrainer (SpladeLoss over SparseMultipleNegativesRankingLoss) on real Flickr8k
caption-image pairs, in a process where mmsparse cannot be imported; the fine-tuning must retrieve
its training pairs better than before; the card's own loading snippet runs on the saved model; then
`mmsparse import` reads each back and the imported head (through encode-dense with the fine-tuned
dual encoder and sparsify) scores validation caption-image pairs as the fine-tuned model does.

The dual encoder is a tiny random CLIP whose WordPiece vocabulary is the words of the captions used
here (so captions are words, not [UNK], and a few steps take seconds); pairs, images and captions
are real."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mmsparse
from mmsparse.formats.sparse import read_sparse

from test_export import _tiny_head

pytest.importorskip("sentence_transformers", reason="the st extra (pip install -e '.[st]')")

TOL = 1e-5
METHODS = ("d2s", "joint", "inference-free")

# In a fresh interpreter where `import mmsparse` fails: per export, the mean reciprocal rank of each
# training caption's image among the training images before and after fine-tuning; save as
# docs/export.md says (no generated card; the export's card copied back); run the card's snippet;
# the reloaded model's scores of the validation captions x images.
_FINETUNE = textwrap.dedent("""
    import json, shutil, sys
    sys.modules["mmsparse"] = None
    import torch
    from datasets import Dataset
    from PIL import Image
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments, losses

    jobs, pairs, images, val = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), \\
        json.loads(sys.argv[4])
    pil = {p: Image.open(p).convert("RGB") for p in images}
    caps, target = [c for c, _ in pairs], torch.tensor([images.index(p) for _, p in pairs])

    def scores(m, texts, paths):
        with torch.no_grad():
            q = m.encode_query(texts, convert_to_tensor=True).to_dense()
            d = m.encode_document([Image.open(p).convert("RGB") for p in paths], convert_to_tensor=True).to_dense()
        return q @ d.T

    def mrr(m):   # ties count against the pair: rank = images scoring >= the caption's own
        s = scores(m, caps, images)
        rank = (s >= s.gather(1, target[:, None])).sum(1).float()
        return float((1 / rank).mean())

    out = {}
    for name, job in jobs.items():
        model = SparseEncoder(job["src"], device="cpu", trust_remote_code=True)
        before = mrr(model)
        data = Dataset.from_dict({"anchor": caps, "positive": [pil[p] for _, p in pairs]})
        loss = losses.SpladeLoss(model, loss=losses.SparseMultipleNegativesRankingLoss(model),
                                 document_regularizer_weight=1e-4, query_regularizer_weight=1e-4)
        args = SparseEncoderTrainingArguments(
            output_dir=job["out"] + "-run", max_steps=job["steps"], per_device_train_batch_size=8,
            learning_rate=job["lr"], save_strategy="no", report_to="none", seed=0, use_cpu=True, disable_tqdm=True,
            router_mapping={"anchor": "query", "positive": "document"} if job["router"] else {})
        SparseEncoderTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
        after = mrr(model)
        model.save(job["out"], create_model_card=False)
        shutil.copyfile(job["src"] + "/README.md", job["out"] + "/README.md")
        snippet = job["snippet"].replace('"DIR"', repr(job["out"])).replace('"dog.jpg"', repr(images[0]))
        exec(snippet, {})
        again = SparseEncoder(job["out"], device="cpu", trust_remote_code=True)
        out[name] = {"before": before, "after": after, "val": scores(again, val["texts"], val["images"]).tolist()}
    json.dump(out, sys.stdout)
    """)


@pytest.fixture(scope="module")
def flickr(flickr8k_dir):
    """8 training images with 4 captions each (the pairs), 4 validation images with 5 captions each."""
    data = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text(encoding="utf-8"))
    train = [im for im in data["images"] if im["split"] == "train"][:8]
    val = [im for im in data["images"] if im["split"] == "val"][:4]
    path = lambda im: str(flickr8k_dir / "images" / im["filename"])             # noqa: E731
    return {"pairs": [(s["raw"], path(im)) for im in train for s in im["sentences"][:4]],
            "images": [path(im) for im in train],
            "val_images": [path(im) for im in val], "val_texts": [s["raw"] for im in val for s in im["sentences"]]}


@pytest.fixture(scope="module")
def caption_clip(flickr, tmp_path_factory):
    """A random tiny CLIPModel (conftest's sizes) whose tokenizer holds the captions' words."""
    from transformers import BasicTokenizer

    from conftest import TINY_WORDS, save_tiny_clip

    basic = BasicTokenizer(do_lower_case=True)
    seen = sorted({w for c in [c for c, _ in flickr["pairs"]] + flickr["val_texts"] for w in basic.tokenize(c)})
    words = TINY_WORDS[:5] + [w for w in seen if w not in TINY_WORDS[:5]]
    return save_tiny_clip(words, tmp_path_factory.mktemp("caption-clip"))


@pytest.fixture(scope="module")
def finetuned(caption_clip, flickr, tmp_path_factory):
    """Per method: the head, its export, the fine-tuned folder and what the fine-tuning process reported."""
    root = tmp_path_factory.mktemp("finetune")
    out, jobs = {}, {}
    for method in METHODS:
        # the image side's gate: 6 terms, or 48 for inference-free, whose frozen table leaves the
        # image side alone to learn (at 6 few query terms meet an image's, and its ranking barely moves)
        head = _tiny_head(method, caption_clip, root / method, doc_top_k=48 if method == "inference-free" else 6)
        st = mmsparse.export(head, out=root / method / "st")
        card = (st / "README.md").read_text(encoding="utf-8")
        snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
        out[method] = {"head": head, "st": st, "ft": root / method / "ft"}
        jobs[method] = {"src": str(st), "out": str(root / method / "ft"), "snippet": snippet, "steps": 8, "lr": 2e-4,
                        "router": method == "inference-free"}
    val = {"texts": flickr["val_texts"], "images": flickr["val_images"]}
    res = subprocess.run([sys.executable, "-c", _FINETUNE, json.dumps(jobs), json.dumps(flickr["pairs"]),
                          json.dumps(flickr["images"]), json.dumps(val)],
                         capture_output=True, text=True, cwd=root, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    for method, got in json.loads(res.stdout.strip().splitlines()[-1]).items():
        out[method]["user"] = got
    return out


@pytest.mark.parametrize("method", METHODS)
def test_finetuning_an_export_retrieves_its_training_pairs_better(method, finetuned):
    """The mean reciprocal rank of each training caption's image (ties counted against it) rises."""
    got = finetuned[method]["user"]
    assert got["after"] > got["before"], got


@pytest.mark.parametrize("method", METHODS)
def test_finetuned_export_imports_and_scores_as_the_model(method, finetuned, flickr, run_cli, tmp_path):
    """`mmsparse import` of the fine-tuned folder, then encode-dense with its own dual encoder (the
    log line names it) and sparsify: every validation caption-image pair's score (a dot product of
    the two sparse rows) is the fine-tuned model's own, within 1e-5. The inference-free table
    (frozen: the default) comes back as it was trained."""
    e = finetuned[method]
    code, _, err = run_cli("import", e["ft"], "-o", tmp_path / "head")
    assert code == 0, err
    assert "encode-dense" in err                         # its towers changed: the log line says how to encode
    head = mmsparse.load_head(tmp_path / "head")
    model = head.config["training"]["model"]
    assert model == str(mmsparse.methods.st.tower_dir(e["ft"]).resolve())
    (tmp_path / "images").mkdir()
    for p in flickr["val_images"]:
        shutil.copyfile(p, tmp_path / "images" / p.rsplit("/", 1)[1])
    (tmp_path / "caps.txt").write_text("\n".join(flickr["val_texts"]) + "\n", encoding="utf-8")
    for src in ("images", "caps.txt"):
        mmsparse.encode_dense(tmp_path / src, out=tmp_path / "dense", backbone="clip", model=model, workers=0)
    caps = tmp_path / "caps.txt" if method == "inference-free" else tmp_path / "dense" / "all-captions.h5"
    docs = read_sparse(mmsparse.sparsify(tmp_path / "head", tmp_path / "dense" / "all-images.h5",
                                         out=tmp_path / "d.h5", allow_dense=True))
    queries = read_sparse(mmsparse.sparsify(tmp_path / "head", caps, out=tmp_path / "q.h5", allow_dense=True))
    ours = (queries.matrix @ docs.matrix.T).toarray()
    order_q = [queries.texts.index(t) for t in flickr["val_texts"]]
    order_d = [docs.ids.index(p.rsplit("/", 1)[1].rsplit(".", 1)[0]) for p in flickr["val_images"]]
    theirs = np.asarray(e["user"]["val"])
    assert theirs.shape == (20, 4) and (theirs > 0).any()
    assert np.abs(ours[np.ix_(order_q, order_d)] - theirs).max() <= TOL
    if method == "inference-free":        # the frozen table: as exported
        from safetensors.torch import load_file

        table = next(e["st"].rglob("query_*SparseStaticEmbedding/model.safetensors"))
        assert np.array_equal(head.query_weight.detach().numpy(), load_file(str(table))["weight"][head.token_ids].numpy())


def test_import_refuses_what_it_cannot_read(tiny_clip, tmp_path, run_cli):
    """A query-route export (no image route), a folder that is no export, and --vocab given with a
    folder: one line each, exit 2, nothing written."""
    head = _tiny_head("inference-free", tiny_clip, tmp_path)
    mmsparse.export(head, out=tmp_path / "q", route="query")
    (tmp_path / "plain").mkdir()
    cases = [(("import", tmp_path / "q", "-o", tmp_path / "h"), "a query-route export"),
             (("import", tmp_path / "plain", "-o", tmp_path / "h"), "no modules.json"),
             (("import", tmp_path / "q", "-o", tmp_path / "h", "--vocab", head), "a model folder"),
             (("import", tmp_path / "x.jsonl", "-o", tmp_path / "h"), "need --vocab")]
    for args, msg in cases:
        code, _, err = run_cli(*args)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "h").exists()
