"""Check `mmsparse export --format sentence-transformers` against sentence-transformers itself, on
the main job's heads (README "Use with other tools"; docs/export.md). check_results.py runs it.

    python examples/flickr8k/check_export.py [WORK]      (WORK default: examples/flickr8k/work)

1. The inference-free head (WORK/heads/if) exported with --route query is loaded in a process that
   imports sentence-transformers and h5py, never mmsparse. Its vectors of the 5,000 test captions
   must equal sparsify's (WORK/sparse/if/test-captions.inference-free.h5): the same terms, weights
   within 1e-5; and R@10 over the 1,000 test images (WORK/sparse/if/test-images.h5, their terms
   mapped to token ids by the model's tokenizer) ranked by sentence-transformers' own similarity
   must equal R@10 of exact scoring of the two HDF5 files within 0.001.
2. The D2S head (WORK/heads/d2s) exported whole, at the precision its dense files were encoded
   with (bf16 where the main job ran with --precision auto on a CPU with bf16 units): its
   encode_document of the test images (the Flickr8k files) must equal sparsify's rows
   (WORK/sparse/d2s/test-images.h5), same terms, within 1e-5. A text tower is not batch
   invariant (a caption's vector depends on its batch's padded length: ~1e-3 in bf16, ~2e-7 in
   fp32), so the text route is checked at fp32 and one caption per batch on both sides:
   encode_query of the test captions by the export with --precision fp32 against encode-dense
   --precision fp32 --batch-size 1 + sparsify of the same captions (one torch thread each).
   EXPORT_SAMPLE=N checks the first N images and 5N captions (default 200; 0 = all 1,000 and
   5,000), so the check stays short.
Exits 1 naming each check that fails. The exports go to a temporary directory, never into WORK.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

TOL = 1e-5          # max |weight difference| (and the same terms)
R10_TOL = 0.001     # |R@10 (sentence-transformers similarity) - R@10 (exact scoring)|

# Run in a fresh interpreter that never imports mmsparse: load the query-route export, encode the
# captions, rank the images (their HDF5 terms as token ids) by the model's own similarity.
_ST_SCRIPT = textwrap.dedent("""
    import json, sys
    import h5py, numpy as np, torch
    from sentence_transformers import SparseEncoder

    export, captions, docs = sys.argv[1:4]
    model = SparseEncoder(export, device="cpu")
    with h5py.File(captions, "r") as f:
        texts = [t.decode() for t in f["texts"][()]]
    q = model.encode_query(texts, batch_size=256)
    with h5py.File(docs, "r") as f:
        ids = [t.decode() for t in f["ids"][()]]
        cols = np.array(model.tokenizer.convert_tokens_to_ids([t.decode() for t in f["vocab"][()]]))
        ptr, ind, w = f["indptr"][()], f["indices"][()], f["weights"][()]
    rows = np.repeat(np.arange(len(ids)), np.diff(ptr))
    d = torch.sparse_coo_tensor(np.stack([rows, cols[ind]]), torch.from_numpy(w), (len(ids), q.shape[1]))
    scores = model.similarity(q, d).to_dense().numpy()
    top = np.lexsort((np.broadcast_to(np.arange(len(ids)), scores.shape), -scores), axis=1)[:, :10]
    out = {"rows": [dict(r) for r in model.decode(q)], "top10": [[ids[j] for j in t] for t in top]}
    assert "mmsparse" not in sys.modules, "the query-route model imported mmsparse"
    json.dump(out, sys.stdout)
    """)


def _rows(col, n: int | None = None) -> list[dict[str, float]]:
    return [dict(col.terms(i)) for i in range(len(col.ids) if n is None else min(n, len(col.ids)))]


def _compare(name: str, expected: list[dict], got: list[dict]) -> tuple[bool, str]:
    """(ok, line) of two lists of {term: weight}: same terms per row, max |difference| <= TOL."""
    terms = sum(set(e) != set(g) for e, g in zip(expected, got)) + abs(len(expected) - len(got))
    diff = max((abs(e[t] - g.get(t, 0.0)) for e, g in zip(expected, got) for t in e), default=0.0)
    ok = terms == 0 and diff <= TOL
    return ok, f"{name}: {len(expected)} rows, {terms} with other terms, max |diff| {diff:.2e} (<= {TOL:g})"


def _recall10(top10: list[list[str]], qids: list[str], qrels: dict) -> float:
    return float(np.mean([any(qrels.get(q, {}).get(d, 0) > 0 for d in t) for q, t in zip(qids, top10)]))


def _exact_top10(q, d, doc_ids: list[str]) -> list[list[str]]:
    """Top 10 documents per query by exact dot products of CSR q and d (ties: document order)."""
    scores = (q @ d.T).toarray()
    order = np.lexsort((np.broadcast_to(np.arange(len(doc_ids)), scores.shape), -scores), axis=1)[:, :10]
    return [[doc_ids[j] for j in t] for t in order]


def check_query_route(work: Path, tmp: Path) -> list[tuple[bool, str]]:
    """Check 1 of the module docstring."""
    import mmsparse
    from mmsparse.formats import read_qrels, read_sparse

    head, sparse = work / "heads" / "if", work / "sparse" / "if"
    mmsparse.export(head, out=tmp / "if-query", route="query")
    captions = work / "dense" / "hf-dual" / "test-captions.h5"
    res = subprocess.run([sys.executable, "-c", _ST_SCRIPT, str(tmp / "if-query"), str(captions),
                          str(sparse / "test-images.h5")], capture_output=True, text=True, timeout=1200)
    if res.returncode != 0:
        return [(False, f"inference-free query route in sentence-transformers: failed: {res.stderr.strip()[-500:]}")]
    got = json.loads(res.stdout)
    queries, docs = read_sparse(sparse / "test-captions.inference-free.h5"), read_sparse(sparse / "test-images.h5")
    qrels = read_qrels(work / "dense" / "hf-dual" / "test.qrels")
    st_r10 = _recall10(got["top10"], queries.ids, qrels)
    exact_r10 = _recall10(_exact_top10(queries.matrix, docs.matrix, docs.ids), queries.ids, qrels)
    ok_r = abs(st_r10 - exact_r10) <= R10_TOL
    return [_compare("inference-free query route (sentence-transformers only) vs sparsify", _rows(queries),
                     got["rows"]),
            (ok_r, f"inference-free R@10: sentence-transformers similarity {st_r10:.4f}, exact scoring "
                   f"{exact_r10:.4f} (|diff| <= {R10_TOL})")]


def check_d2s_images(work: Path, tmp: Path, sample: int) -> list[tuple[bool, str]]:
    """Check 2 of the module docstring, images: the export at the dense files' precision against
    the main job's own rows."""
    from sentence_transformers import SparseEncoder

    import mmsparse
    from mmsparse.formats import read_dense_attrs, read_sparse
    from mmsparse.settings import flickr8k_dir

    docs = read_sparse(work / "sparse" / "d2s" / "test-images.h5")
    n = sample or len(docs.ids)
    mmsparse.export(work / "heads" / "d2s", out=tmp / "d2s")
    model = SparseEncoder(str(tmp / "d2s"), device="cpu", trust_remote_code=True)
    images = [str(flickr8k_dir() / "images" / f"{i}.jpg") for i in docs.ids[:n]]
    d = [dict(r) for r in model.decode(model.encode_document(images, batch_size=32))]
    precision = read_dense_attrs(work / "dense" / "hf-dual" / "test-images.h5").get("precision", "fp32")
    return [_compare(f"D2S image route (encode_document, {precision}) vs sparsify", _rows(docs, n), d)]


def check_d2s_texts(work: Path, tmp: Path, sample: int) -> list[tuple[bool, str]]:
    """Check 2 of the module docstring, captions. A text tower's vector depends on the padded length
    of its batch (bf16: ~1e-3, enough to swap terms; fp32: ~2e-7, which still swaps a term tied at
    the top-k gate now and then), so both sides run at fp32, one caption per batch, one thread:
    encode-dense + sparsify of the captions against the export's encode_query."""
    import torch
    from sentence_transformers import SparseEncoder

    import mmsparse
    from mmsparse.formats import read_sparse

    head = work / "heads" / "d2s"
    texts = read_sparse(work / "sparse" / "d2s" / "test-captions.expand.h5").texts
    texts = texts[:5 * sample] if sample else texts
    (tmp / "caps.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
    tr = json.loads((head / "config.json").read_text(encoding="utf-8"))["training"]
    threads = torch.get_num_threads()
    try:
        mmsparse.encode_dense(tmp / "caps.txt", out=tmp / "dense", backbone=tr["backbone"], model=tr["model"],
                              precision="fp32", batch_size=1, workers=0, threads=1)
        mmsparse.sparsify(head, tmp / "dense" / "all-captions.h5", out=tmp / "caps.h5", threads=1)
        mmsparse.export(head, out=tmp / "d2s-text", route="query", precision="fp32")
        model = SparseEncoder(str(tmp / "d2s-text"), device="cpu", trust_remote_code=True)
        torch.set_num_threads(1)
        q = [dict(r) for r in model.decode(model.encode_query(texts, batch_size=1))]
    finally:
        torch.set_num_threads(threads)
    return [_compare("D2S text route (encode_query, fp32, one caption per batch) vs encode-dense + sparsify "
                     "(the same)", _rows(read_sparse(tmp / "caps.h5")), q)]


def check(work: Path, sample: int = 200) -> list[str]:
    """The checks that fail, as lines; [] when all hold. Prints one line per check."""
    for p in (work / "heads" / "if" / "config.json", work / "heads" / "d2s" / "config.json"):
        if not p.is_file():
            return [f"{p}: missing; run `make -C examples/flickr8k` first"]
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return ["sentence-transformers is not installed: pip install -e '.[st]'"]
    with tempfile.TemporaryDirectory(prefix="mmsparse-check-export-") as tmp:
        results = (check_query_route(work, Path(tmp)) + check_d2s_images(work, Path(tmp), sample)
                   + check_d2s_texts(work, Path(tmp), sample))
    for ok, line in results:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
    return [line for ok, line in results if not ok]


if __name__ == "__main__":
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "work"
    failed = check(work, int(os.environ.get("EXPORT_SAMPLE", "200")))
    if failed:
        print(f"{len(failed)} export check(s) failed:", *failed, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("the exported heads reproduce their vectors in sentence-transformers")
