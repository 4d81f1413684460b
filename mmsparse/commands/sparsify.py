"""`mmsparse sparsify`: dense HDF5 -> sparse HDF5 through a trained head.

Images (modality=image): the full head output (query_mode=doc). Captions (modality=text):
  expand         the full head output (expanded query)
  caption-terms  only the caption's own tokens keep their weight (the no-expansion query)
Streams the dense file in batches: memory O(batch) plus the output CSR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError

QUERY_MODES = ("expand", "caption-terms")


def main(
    head_dir: Path = typer.Argument(..., help="Head directory written by `mmsparse train-head`."),
    dense: Path = typer.Argument(..., help="Dense HDF5 of images or captions (from `mmsparse encode-dense`)."),
    out: Path = typer.Option(..., "-o", "--out", help="Sparse HDF5 to write (atomically)."),
    query_mode: Optional[str] = typer.Option(None, "--query-mode", help="Captions only: expand (default; full "
                                             "head output) or caption-terms (only the caption's own tokens "
                                             "keep weight). Images always get the full output. VDR heads: vdr "
                                             "(default; top-k + bag-of-words gated V(q)) or bow (binary bag of "
                                             "words, VDR^α: no network at query time)."),
    batch_size: int = typer.Option(1024, "--batch-size", min=1, help="Rows per forward pass (memory O(batch))."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch CPU threads."),
    force: bool = typer.Option(False, "--force", help="Apply the head even when the dense file's backbone or "
                               "model differs from the one its training vectors came from (a warning instead)."),
    dense_out: Optional[Path] = typer.Option(None, "--dense-out", help="Joint heads (train-head --method joint) "
                                             "only: write the tuned dense vectors here (default: OUT without .h5 "
                                             "+ '.dense.h5'). DENSE must then hold pre_projection states."),
    method: str = typer.Option("d2s", "--method", help="d2s (default): the head projects each dense vector "
                               "(d2s and the other caption-vocabulary heads); bm25v: an SAE head (train-head "
                               "--method sae) turns each image's patch_states into visual words, sum-pooled (eq. 7), "
                               "top-k_post (eq. 8) and uint16-quantised ×100 (§3.4); see BM25-V options. vdr: a "
                               "VDR head over token/patch states (chosen automatically for a VDR head); see VDR options."),
    k_post: int = typer.Option(16, "--k-post", min=1, rich_help_panel="BM25-V options",
                               help="Visual words kept per image after sum-pooling (eq. 8, paper 16)."),
    quantize: bool = typer.Option(True, "--quantize/--no-quantize", rich_help_panel="BM25-V options",
                                  help="Store weights as uint16 round(v·100), read back ÷100 (§3.4)."),
    batch_images: int = typer.Option(128, "--batch-images", min=1, rich_help_panel="BM25-V options",
                                     help="Images per SAE pass (memory ~ images x patches x e·D x 4 bytes)."),
    vdr_query_k: Optional[int] = typer.Option(None, "--vdr-query-k", min=1, rich_help_panel="VDR options",
                                              help="Top-k of parametric (vdr) queries, plus their bag of words "
                                              "(default: the head's, set by train-head --vdr-query-k)."),
    vdr_doc_k: Optional[int] = typer.Option(None, "--vdr-doc-k", min=1, rich_help_panel="VDR options",
                                            help="Top-k terms kept per image document (default: the head's, set by "
                                            "train-head --vdr-doc-k)."),
) -> None:
    """Project dense vectors onto the head's vocabulary and write them as a sparse HDF5 file."""
    import h5py
    import numpy as np
    import scipy.sparse as sp
    import torch
    from rich.console import Console
    from rich.progress import track

    from ..formats._h5 import read_strings
    from ..formats.dense import iter_dense, read_dense_attrs
    from ..formats.sparse import write_sparse
    from ..heads import load_head
    from ..heads.d2s import load_tokenizer
    from ..vocab import caption_token_ids, indicator, pad_ids, to_columns

    torch.set_num_threads(threads)
    if method == "bm25v":  # BM25-V visual words from patch_states: mmsparse/methods/bm25v.py
        from ..methods.bm25v import sparsify_cli
        return sparsify_cli(head_dir, dense, out, k_post, quantize, batch_images, threads, force)
    from ..heads.base import read_head_config
    if method == "vdr" or (method == "d2s" and (Path(head_dir) / "config.json").is_file()
                           and read_head_config(head_dir)[0].get("method") == "vdr"):  # mmsparse/methods/vdr.py
        from ..methods.vdr import sparsify_cli as vdr_sparsify
        return vdr_sparsify(head_dir, dense, out, query_mode, vdr_query_k, vdr_doc_k, batch_size, threads, force)
    if method != "d2s":
        raise InputError(f"--method {method!r}: choose d2s, bm25v or vdr")
    attrs = read_dense_attrs(dense)
    modality = attrs["modality"]
    if modality == "image":
        if query_mode not in (None, "expand"):
            raise InputError(f"{dense}: --query-mode {query_mode} applies to captions; this is an image file")
        mode = "doc"
    else:
        mode = query_mode or "expand"
        if mode not in QUERY_MODES:
            raise InputError(f"--query-mode {query_mode!r}: choose expand or caption-terms")
    from ..heads import joint as _joint  # noqa: F401  (registers joint heads with load_head)
    head = load_head(head_dir)
    if int(attrs["dim"]) != head.dim:
        raise InputError(f"{dense}: vectors have d={attrs['dim']} but head {head_dir} expects d={head.dim}; "
                         "use the head trained on this backbone's vectors")
    from ..atomic import kill_point
    from ..checks import check_compatible
    check_compatible(attrs, head.config.get("training", {}), ("backbone", "model"), str(dense),
                     f"head {head_dir} (its training vectors)", "sparsify vectors of the backbone the head "
                     "was trained on", force)
    v = int(head.config["vocab_size"])
    if head.method == "joint":  # re-project the pre-projection states with the tuned layers, then sparsify those
        from ..methods.joint import tuned_dense
        dense = tuned_dense(head, dense, dense_out or Path(str(out).removesuffix(".h5") + ".dense.h5"),
                            head_dir=head_dir)
    elif dense_out is not None:
        raise InputError("--dense-out: only joint heads (train-head --method joint) change the dense vectors")
    with h5py.File(dense, "r") as f:
        n = f["ids"].shape[0]
        texts_ds = "texts" in f
    if mode == "caption-terms":
        if not texts_ds:
            raise InputError(f"{dense}: no 'texts' dataset, needed for --query-mode caption-terms")
        tok = load_tokenizer(head, head_dir)
        tids = head.token_ids.numpy() if hasattr(head, "token_ids") else np.arange(v)

    ids, parts, texts = [], [], []
    with torch.no_grad(), h5py.File(dense, "r") as f:
        start = 0
        for chunk_ids, vec in track(iter_dense(dense, chunk_rows=batch_size), total=-(-n // batch_size),
                                    description=f"sparsify {mode}", console=Console(stderr=True), transient=True):
            s = head(torch.from_numpy(vec))
            t = read_strings(f["texts"][start:start + len(chunk_ids)]) if texts_ds else None
            if mode == "caption-terms":
                cols = to_columns(caption_token_ids(tok, t), tids)
                s = s * indicator(pad_ids(cols, v), v)
            ids.extend(chunk_ids)
            if t is not None:
                texts.extend(t)
            parts.append(sp.csr_matrix(s.numpy()))
            start += len(chunk_ids)
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
    m = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)
    out_attrs = {"modality": modality, "head": str(Path(head_dir).resolve()), "method": head.method,
                 "query_mode": mode, "vocab_size": v}
    for k in ("backbone", "model", "dataset", "split", "normalized"):
        if k in attrs:
            out_attrs[k] = attrs[k]
    out_attrs["dense"] = str(Path(dense).resolve())
    write_sparse(out, ids, m, head.vocab, out_attrs, texts if texts_ds else None)
    nnz = np.diff(m.indptr)
    Console(stderr=True).print(f"sparsify: {len(ids)} {modality} rows -> {out} ({mode}; "
                               f"{nnz.mean() if len(nnz) else 0:.1f} terms/row)")
