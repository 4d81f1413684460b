"""BM25-V (visual words + Okapi BM25 + dense rerank): training and sparsify entry points, and
the Table-2-like summary of the example.

  train-head --method sae   train_cli: a top-k SAE (heads/sae.py) on the patch features of a
                            dense image HDF5 (`patch_states`, streamed from disk)
  sparsify --method bm25v   sparsify_cli: per image, h_p for every patch (eq. 6), sum-pool
                            (eq. 7), top-k_post (eq. 8), uint16 quantisation ×100 (§3.4); the
                            sparse file's vocabulary is the SAE's visual words (vw00042, ...)
  index --weighting bm25    mmsparse/indexes/bm25.py
  python -m mmsparse.methods.bm25v table ...   R@1/5/10/100 and bytes per image, as Table 2
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import InputError

QUANT_SCALE = 100      # §3.4: uint16 = round(v * 100), clipped to [0, 65535]
QUANT_MAX = 65535


# -- eq. 7, eq. 8 and the quantisation ---------------------------------------------------------

def pool_topk(vals, idx, patches: int, vocab_size: int, k_post: int):
    """Sum-pool patch activations per image (eq. 7) and keep the top-k_post (eq. 8).

    vals/idx: torch [B*P, k] float32 / int64, the SAE's top-k per patch, images' patches
    consecutive (P = `patches`). Returns torch (values [B, k_post] float32, indices [B, k_post]
    int64) by decreasing value; values are 0 where an image has fewer than k_post active words.
    """
    import torch

    b = vals.shape[0] // patches
    rows = torch.arange(b, device=vals.device).repeat_interleave(patches * vals.shape[1])
    pooled = torch.zeros(b, vocab_size, dtype=torch.float32, device=vals.device)
    pooled.index_put_((rows, idx.reshape(-1)), vals.reshape(-1).float(), accumulate=True)
    return torch.topk(pooled, min(k_post, vocab_size), dim=1)


def quantize(v: np.ndarray) -> np.ndarray:
    """float activations -> uint16 rint(v * 100) clipped to [0, 65535] (§3.4)."""
    return np.clip(np.rint(np.asarray(v, dtype=np.float64) * QUANT_SCALE), 0, QUANT_MAX).astype(np.uint16)


def dequantize(q: np.ndarray) -> np.ndarray:
    """uint16 -> float32 q / 100, the term frequency BM25 sees (steps of 0.01)."""
    return (np.asarray(q, dtype=np.float32) / QUANT_SCALE).astype(np.float32)


def to_csr_rows(vals: np.ndarray, idx: np.ndarray, vocab_size: int, quant: bool = True) -> sp.csr_matrix:
    """[B, k_post] values/indices -> CSR [B, eD] float32, quantised (×100, uint16, ÷100) when
    `quant`; entries that are (or round to) 0 dropped."""
    w = dequantize(quantize(vals)) if quant else np.asarray(vals, dtype=np.float32)
    rows = np.repeat(np.arange(vals.shape[0]), vals.shape[1])
    m = sp.csr_matrix((w.ravel(), (rows, idx.ravel())), shape=(vals.shape[0], vocab_size), dtype=np.float32)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def sparsify_patches(head, path: str | Path, k_post: int = 16, batch_images: int = 256, quant: bool = True,
                     progress=None) -> tuple[list[str], sp.csr_matrix]:
    """(ids, CSR [N, eD] float32) of the dense image HDF5 `path` through SAE `head`:
    eq. 6-8 and the quantisation, `batch_images` images at a time (memory O(batch * P * k)).
    progress: called with the number of images done."""
    import h5py
    import torch

    from ..formats._h5 import read_strings
    from ..heads.sae import iter_patch_rows, patch_shape

    n, p, d = patch_shape(path)
    skip = int(head.config.get("patch_skip", 0))
    if d != head.dim:
        raise InputError(f"{path}: patch features have D={d} but the SAE head expects D={head.dim}; "
                         "use the head trained on this backbone's patches")
    with h5py.File(path, "r") as f:
        ids = read_strings(f["ids"])
    v = int(head.config["vocab_size"])
    parts = []
    with torch.no_grad():
        for s, x in iter_patch_rows(path, batch_images, skip):
            vals, idx = head.encode_topk(torch.from_numpy(x))
            pv, pi = pool_topk(vals, idx, p - skip, v, k_post)
            parts.append(to_csr_rows(pv.numpy(), pi.numpy(), v, quant))
            if progress:
                progress(min(n, s + batch_images))
    m = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)
    return ids, m


# -- command bodies (called from commands/train_head.py and commands/sparsify.py) -----------

def train_cli(train_images: Path | None, out: Path, k: int, expansion: int, lam: float, epochs: int,
              batch_size: int, lr: float, patch_skip: int, buffer_images: int, seed: int, threads: int,
              device: str) -> None:
    """`train-head --method sae`: train a top-k SAE on TRAIN_IMAGES' patch_states, save to OUT."""
    import time

    import torch
    from rich.console import Console

    from ..formats.dense import read_dense_attrs
    from ..heads.sae import SAEHead, SAETrainConfig, patch_shape, train_sae
    from ..progress import epoch_progress

    if train_images is None:
        raise InputError("train-head --method sae: missing TRAIN_IMAGES (a dense image HDF5 with patch_states)")
    if device != "cpu":
        raise InputError(f"--device {device}: the SAE trainer runs on cpu here; use --device cpu")
    attrs = read_dense_attrs(train_images)
    if attrs.get("modality") != "image":
        raise InputError(f"{train_images}: modality={attrs.get('modality')!r}; the SAE trains on image patches")
    n, p, d = patch_shape(train_images)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    training = {k_: attrs.get(k_) for k_ in ("backbone", "model", "dataset", "split", "patch_layer")}
    training["train_images"] = str(Path(train_images).resolve())
    head = SAEHead.create(d, expansion, k, lam, patch_skip, training)
    cfg = SAETrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, buffer_images=buffer_images)
    err = Console(stderr=True)
    err.print(f"train-head sae: {n} images x {p - patch_skip} patches, D={d}, vocabulary eD={head.config['vocab_size']}"
              f" visual words, k={k}, λ={lam}")
    t0 = time.time()
    with epoch_progress(err, None, epochs, first="SAE") as (prog, update):

        def on_step(r):
            update(r, f"loss {r['loss']:.4f}")

        def on_epoch(r):
            prog.console.print(f"epoch {r['epoch']}: loss {r['loss']:.4f} rel. mse {r['rel_mse']:.3f} "
                               f"l1 {r['l1']:.2f} alive {100 * r['alive']:.1f}% ({r['seconds']:.0f}s)")

        train_sae(head, train_images, cfg, on_step, on_epoch)
    head.config["training"]["seconds"] = round(time.time() - t0, 1)
    head.save_pretrained(out)
    err.print(f"saved SAE to {out} in {time.time() - t0:.0f}s")


def sparsify_cli(head_dir: Path, dense: Path, out: Path, k_post: int, quantize_weights: bool, batch_images: int,
                 threads: int, force: bool) -> None:
    """`sparsify --method bm25v`: dense image HDF5 (patch_states) -> sparse visual-word HDF5."""
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from ..checks import check_compatible
    from ..formats.dense import read_dense_attrs
    from ..formats.sparse import write_sparse
    from ..heads import load_head

    from ..heads import sae as _sae  # noqa: F401  (registers the SAE head with load_head)

    torch.set_num_threads(threads)
    head = load_head(head_dir)
    if head.method != "sae":
        raise InputError(f"{head_dir}: a {head.method!r} head; --method bm25v needs an SAE head "
                         "(train-head --method sae)")
    attrs = read_dense_attrs(dense)
    if attrs.get("modality") != "image":
        raise InputError(f"{dense}: modality={attrs.get('modality')!r}; --method bm25v sparsifies images "
                         "(their patch_states)")
    check_compatible(attrs, head.config.get("training", {}), ("backbone", "model", "patch_layer"), str(dense),
                     f"head {head_dir} (its training patches)", "sparsify patches of the backbone and layer "
                     "the SAE was trained on", force)
    from ..heads.sae import patch_shape
    n = patch_shape(dense)[0]
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task("sparsify bm25v", total=n)
        ids, m = sparsify_patches(head, dense, k_post, batch_images, quantize_weights,
                                  lambda done: prog.update(task, completed=done))
    out_attrs = {"modality": "image", "head": str(Path(head_dir).resolve()), "method": "bm25v",
                 "query_mode": "doc", "vocab_size": int(head.config["vocab_size"]), "k_post": int(k_post),
                 "quantization": f"uint16 x{QUANT_SCALE}" if quantize_weights else "none",
                 "sae_k": int(head.config["k"]), "dense": str(Path(dense).resolve())}
    for key in ("backbone", "model", "dataset", "split", "normalized", "patch_layer"):
        if key in attrs:
            out_attrs[key] = attrs[key]
    write_sparse(out, ids, m, head.vocab, out_attrs)
    nnz = np.diff(m.indptr)
    Console(stderr=True).print(f"sparsify bm25v: {len(ids)} images -> {out} ({nnz.mean() if len(nnz) else 0:.1f} "
                               f"visual words/image, {int((m.getnnz(axis=0) > 0).sum())} of {m.shape[1]} words used)")


# -- Table 2 ---------------------------------------------------------------------------------

def index_bytes(index_dir: Path) -> dict:
    """Bytes per image of an index: `model` (BM25-V: 6·L0 = 4-byte word id + uint16 value per
    posting, §4.5; dense: 4·D float32), and `disk` (the engine's files: PISA's compressed
    postings + block-max data; Faiss's index file), both / N."""
    meta = json.loads((Path(index_dir) / "mmsparse.json").read_text(encoding="utf-8"))
    n = int(meta["num_docs"])
    d = Path(index_dir)
    if meta["kind"] == "faiss":
        dim = int(meta.get("dim") or meta.get("source_attrs", {}).get("dim"))
        disk = sum(f.stat().st_size for f in d.glob("*.index"))
        return {"model": 4 * dim, "disk": disk / n, "num_docs": n}
    enc = meta["settings"]["index_encoding"]
    pisa = d / "pisa"
    disk = sum(f.stat().st_size for f in pisa.glob(f"*.{enc}")) + sum(f.stat().st_size for f in pisa.glob("*.bmw.*")
                                                                      if not f.name.endswith(enc))
    return {"model": 6 * meta["nnz"] / n, "disk": disk / n, "num_docs": n, "L0": meta["nnz"] / n}


def table(rows: list[tuple[str, Path, float]], ks=(1, 5, 10, 100)) -> str:
    """Markdown table: label, R@k (= ir-measures Success@k: a same-class image in the top k,
    the metric-learning Recall@K of the paper), bytes/image. rows: (label, eval JSON, bytes)."""
    head = "| method | " + " | ".join(f"R@{k}" for k in ks) + " | bytes/image |"
    lines = [head, "|" + "---|" * (len(ks) + 2)]
    for label, path, b in rows:
        e = json.loads(Path(path).read_text(encoding="utf-8"))
        vals = []
        for k in ks:
            v = e.get(f"Success@{k}")
            vals.append("–" if v is None else f"{v:.3f}")
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {b:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """python -m mmsparse.methods.bm25v table --bm25v E.json --dense E.json --rerank K=E.json ...
    --sparse-index DIR --dense-index DIR -o TABLE.md"""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m mmsparse.methods.bm25v")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="Table-2-like summary of BM25-V / dense / two-stage evaluations")
    t.add_argument("--bm25v", required=True, type=Path)
    t.add_argument("--dense", required=True, type=Path)
    t.add_argument("--rerank", action="append", default=[], metavar="K=EVAL.json")
    t.add_argument("--sparse-index", required=True, type=Path)
    t.add_argument("--dense-index", required=True, type=Path)
    t.add_argument("-o", "--out", type=Path)
    a = ap.parse_args(argv)
    sb, db = index_bytes(a.sparse_index), index_bytes(a.dense_index)
    rows = [("Dense (exact cosine)", a.dense, db["model"]), ("BM25-V (sparse only)", a.bm25v, sb["model"])]
    for spec in a.rerank:
        k, _, path = spec.partition("=")
        rows.append((f"BM25-V top-{k} → dense rerank", Path(path), db["model"] + sb["model"]))
    text = (table(rows) + "\n\nR@K = a same-class image among the top K (ir-measures Success@K), query image "
            f"excluded. bytes/image: BM25-V 6·L0 with L0 = {sb['L0']:.2f} visual words/image (4-byte id + "
            f"uint16; PISA's compressed postings on disk: {sb['disk']:.1f}); dense 4·D float32 (Faiss file: "
            f"{db['disk']:.0f}); two-stage = both. Gallery: {sb['num_docs']} images.\n")
    print(text)
    if a.out:
        from ..atomic import write_text_atomic
        write_text_atomic(a.out, text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
