"""Check `mmsparse export --format sentence-transformers` as a user without mmsparse meets it, on the
main job's heads (docs/export.md). check_results.py runs it after every main job.

    python examples/flickr8k/check_export.py [WORK]      (WORK default: examples/flickr8k/work)

The D2S head (WORK/heads/d2s) and the inference-free head (WORK/heads/if) are exported whole, the
inference-free head also with --route query, into a temporary directory (never into WORK). Then:

1. Every module of each folder is sentence-transformers' own or `sparse_gates.SparseGates`, whose
   file is inside the folder, and the query-route folder is sentence-transformers' alone.
2. In a fresh interpreter where `import mmsparse` fails, SparseEncoder(folder, trust_remote_code=True)
   of each full export encodes every test image (PIL images, encode_document) and the first 1,000
   test captions (encode_query; the D2S folder also as caption-term queries, task="caption-terms")
   to `sparsify`'s vectors: the same terms, weights within 1e-5, at fp32. The reference is sparsify
   of the test images encoded again in the arithmetic the export runs (--precision fp32 --runtime
   torch --memory-format contiguous, 32 images a batch): the main job's own encodes may come from
   ONNX Runtime, bf16 or channels-last convolutions, whose vectors differ by ~1e-6, enough to move
   a weight by 1e-5 or swap a term at a gate (CI's AVX2 run: one inference-free image of 1,000).
   A text tower's vector depends on the padded length of its batch (~2e-7 at fp32, enough to swap a
   term tied at the top-k gate now and then), so the D2S captions are encoded one per batch, one
   torch thread, on both sides.
3. The query-route folder loads with trust_remote_code=False and gives sparsify's queries of all
   5,000 test captions; ranking the 1,000 test images by its own `similarity` (their HDF5 terms
   mapped to token ids by its tokenizer) gives the R@10 of exact scoring of the two HDF5 files.

EXPORT_SAMPLE=N checks the first N images and N captions instead (for a quick look). Exits 1 naming
each check that fails; prints each check's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

TOL = 1e-5          # max |weight difference| (and the same terms)
R10_TOL = 0.001     # |R@10 (sentence-transformers similarity) - R@10 (exact scoring)|
CAPTIONS = 1000     # test captions checked through the full exports

# A user's process: mmsparse cannot be imported. Loads each export, encodes, prints JSON.
_USER = textwrap.dedent("""
    import json, sys, time
    sys.modules["mmsparse"] = None          # any import of mmsparse raises ImportError
    import h5py, numpy as np, torch
    from PIL import Image
    from sentence_transformers import SparseEncoder

    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    rows = lambda m, e: [dict(r) for r in m.decode(e)]
    out, seconds = {}, {}
    for name in ("d2s", "if"):
        start = time.time()
        m = SparseEncoder(job[name], device="cpu", trust_remote_code=True)
        out[name] = {"docs": rows(m, m.encode_document([Image.open(p) for p in job["images"]], batch_size=32))}
        seconds[f"{name} images"] = time.time() - start
        start = time.time()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)            # as encode-dense --threads 1 on the reference side
        batch = 1 if name == "d2s" else 256
        out[name]["queries"] = rows(m, m.encode_query(job["texts"], batch_size=batch))
        if name == "d2s":
            out[name]["caption_terms"] = rows(m, m.encode(job["texts"], task="caption-terms", batch_size=1))
        torch.set_num_threads(threads)
        seconds[f"{name} captions"] = time.time() - start
    start = time.time()
    m = SparseEncoder(job["if-query"], device="cpu")   # trust_remote_code=False
    q = m.encode_query(job["all_texts"], batch_size=256)
    with h5py.File(job["if_docs"], "r") as f:
        ids = [t.decode() for t in f["ids"][()]]
        cols = np.array(m.tokenizer.convert_tokens_to_ids([t.decode() for t in f["vocab"][()]]))
        ptr, ind, w = f["indptr"][()], f["indices"][()], f["weights"][()]
    rows_ = np.repeat(np.arange(len(ids)), np.diff(ptr))
    d = torch.sparse_coo_tensor(np.stack([rows_, cols[ind]]), torch.from_numpy(w), (len(ids), q.shape[1]))
    scores = m.similarity(q, d).to_dense().numpy()
    top = np.lexsort((np.broadcast_to(np.arange(len(ids)), scores.shape), -scores), axis=1)[:, :10]
    out["if-query"] = {"queries": rows(m, q), "top10": [[ids[j] for j in t] for t in top]}
    seconds["if-query"] = time.time() - start
    out["seconds"] = seconds
    json.dump(out, sys.stdout)
    """)


def _rows(col, n: int | None = None) -> list[dict[str, float]]:
    return [dict(col.terms(i)) for i in range(len(col.ids) if n is None else min(n, len(col.ids)))]


def _compare(name: str, expected: list[dict], got: list[dict]) -> tuple[bool, str]:
    """(ok, line) of two lists of {term: weight}: same terms per row, max |difference| <= TOL."""
    terms = sum(set(e) != set(g) for e, g in zip(expected, got)) + abs(len(expected) - len(got))
    diff = max((abs(e[t] - g.get(t, 0.0)) for e, g in zip(expected, got) for t in e), default=0.0)
    ok = terms == 0 and diff <= TOL and len(expected) > 0
    return ok, f"{name}: {len(expected)} rows, {terms} with other terms, max |diff| {diff:.2e} (<= {TOL:g})"


def _recall10(top10: list[list[str]], qids: list[str], qrels: dict) -> float:
    return float(np.mean([any(qrels.get(q, {}).get(d, 0) > 0 for d in t) for q, t in zip(qids, top10)]))


def _exact_top10(q, d, doc_ids: list[str]) -> list[list[str]]:
    """Top 10 documents per query by exact dot products of CSR q and d (ties: document order)."""
    scores = (q @ d.T).toarray()
    order = np.lexsort((np.broadcast_to(np.arange(len(doc_ids)), scores.shape), -scores), axis=1)[:, :10]
    return [[doc_ids[j] for j in t] for t in order]


def check_modules(folder: Path, own_only: bool = False) -> tuple[bool, str]:
    """Check 1: the module classes modules.json (and a Router's config) name."""
    types = [m["type"] for m in json.loads((folder / "modules.json").read_text(encoding="utf-8"))]
    if (folder / "router_config.json").is_file():
        types += json.loads((folder / "router_config.json").read_text(encoding="utf-8"))["types"].values()
    foreign = [t for t in types if not t.startswith("sentence_transformers.")
               and (own_only or t != "sparse_gates.SparseGates" or not (folder / "sparse_gates.py").is_file())]
    what = "sentence-transformers' own" + ("" if own_only else " or sparse_gates.py in the folder")
    return not foreign, f"{folder.name}: {len(types)} modules, each {what}" + (f"; not: {foreign}" if foreign else "")


def _references(work: Path, tmp: Path, n_img: int, texts: list[str]) -> dict:
    """sparsify's rows at fp32 (check 2's reference): {"d2s"/"if": docs rows, "d2s": queries and
    caption-term rows, "if": query rows}."""
    import mmsparse
    from mmsparse.formats import read_sparse
    from mmsparse.settings import flickr8k_dir

    heads = {name: work / "heads" / name for name in ("d2s", "if")}
    data = flickr8k_dir()
    again = mmsparse.encode_dense(data / "dataset_flickr8k.json", data / "images", out=tmp / "dense-fp32",
                                  split=["test"], precision="fp32", runtime="torch", memory_format="contiguous",
                                  batch_size=32, workers=0)
    images = {name: mmsparse.sparsify(h, again / "test-images.h5", out=tmp / f"{name}-images.h5")
              for name, h in heads.items()}
    (tmp / "caps.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
    tr = json.loads((heads["d2s"] / "config.json").read_text(encoding="utf-8"))["training"]
    caps = mmsparse.encode_dense(tmp / "caps.txt", out=tmp / "dense-caps", backbone=tr["backbone"],
                                 model=tr["model"], precision="fp32", runtime="torch", batch_size=1, workers=0,
                                 threads=1)
    ref = {name: {"docs": _rows(read_sparse(images[name]), n_img)} for name in heads}
    for mode in ("expand", "caption-terms"):
        out = mmsparse.sparsify(heads["d2s"], caps / "all-captions.h5", out=tmp / f"d2s-{mode}.h5", threads=1,
                                query_mode=mode)
        ref["d2s"]["queries" if mode == "expand" else "caption_terms"] = _rows(read_sparse(out))
    ref["if"]["queries"] = _rows(read_sparse(work / "sparse" / "if" / "test-captions.inference-free.h5"), len(texts))
    return ref


def check(work: Path, sample: int = 0) -> list[str]:
    """The checks that fail, as lines; [] when all hold. Prints one line per check (with its time)."""
    for p in (work / "heads" / "if" / "config.json", work / "heads" / "d2s" / "config.json"):
        if not p.is_file():
            return [f"{p}: missing; run `make -C examples/flickr8k` first"]
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return ["sentence-transformers is not installed: pip install -e '.[st]'"]
    import mmsparse
    from mmsparse.formats import read_qrels, read_sparse
    from mmsparse.settings import flickr8k_dir

    results = []
    with tempfile.TemporaryDirectory(prefix="mmsparse-check-export-") as t:
        tmp, t0 = Path(t), time.time()
        folders = {"d2s": mmsparse.export(work / "heads" / "d2s", out=tmp / "d2s"),
                   "if": mmsparse.export(work / "heads" / "if", out=tmp / "if"),
                   "if-query": mmsparse.export(work / "heads" / "if", out=tmp / "if-query", route="query")}
        results += [check_modules(f, own_only=name == "if-query") for name, f in folders.items()]
        doc_ids = read_sparse(work / "sparse" / "d2s" / "test-images.h5").ids
        all_q = read_sparse(work / "sparse" / "if" / "test-captions.inference-free.h5")
        n_img, n_cap = (sample or len(doc_ids)), (sample or CAPTIONS)
        texts = all_q.texts[:n_cap]
        ref = _references(work, tmp, n_img, texts)
        t1 = time.time()
        job = {**{k: str(v) for k, v in folders.items()}, "texts": texts, "all_texts": all_q.texts,
               "images": [str(flickr8k_dir() / "images" / f"{i}.jpg") for i in doc_ids[:n_img]],
               "if_docs": str(work / "sparse" / "if" / "test-images.h5")}
        (tmp / "job.json").write_text(json.dumps(job), encoding="utf-8")
        res = subprocess.run([sys.executable, "-c", _USER, str(tmp / "job.json")], capture_output=True, text=True,
                             timeout=3600)
        if res.returncode != 0:
            return [f"the exports in a process without mmsparse: failed: {res.stderr.strip()[-800:]}"]
        got = json.loads(res.stdout)
        t2 = time.time()
    for name, label in (("d2s", "D2S"), ("if", "inference-free")):
        results.append(_compare(f"{label} export, images (encode_document, fp32) vs sparsify", ref[name]["docs"],
                                got[name]["docs"]))
        results.append(_compare(f"{label} export, captions (encode_query) vs sparsify", ref[name]["queries"],
                                got[name]["queries"]))
    results.append(_compare("D2S export, caption-term queries (task='caption-terms') vs sparsify",
                            ref["d2s"]["caption_terms"], got["d2s"]["caption_terms"]))
    results.append(_compare("inference-free query route (trust_remote_code=False), all captions vs sparsify",
                            _rows(all_q), got["if-query"]["queries"]))
    docs = read_sparse(work / "sparse" / "if" / "test-images.h5")
    qrels = read_qrels(work / "dense" / "hf-dual" / "test.qrels")
    st_r10 = _recall10(got["if-query"]["top10"], all_q.ids, qrels)
    exact_r10 = _recall10(_exact_top10(all_q.matrix, docs.matrix, docs.ids), all_q.ids, qrels)
    results.append((abs(st_r10 - exact_r10) <= R10_TOL, f"inference-free R@10: sentence-transformers similarity "
                    f"{st_r10:.4f}, exact scoring {exact_r10:.4f} (|diff| <= {R10_TOL})"))
    for ok, line in results:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
    print(f"check_export: {n_img} images, {len(texts)} captions: exports and references {t1 - t0:.0f} s, "
          f"sentence-transformers without mmsparse {t2 - t1:.0f} s ("
          + ", ".join(f"{k} {v:.0f} s" for k, v in got["seconds"].items()) + ")")
    return [line for ok, line in results if not ok]


if __name__ == "__main__":
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "work"
    failed = check(work, int(os.environ.get("EXPORT_SAMPLE", "0")))
    if failed:
        print(f"{len(failed)} export check(s) failed:", *failed, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("the exported heads reproduce their vectors in sentence-transformers, without mmsparse")
