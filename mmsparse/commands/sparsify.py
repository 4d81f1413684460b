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
                                             "keep weight). Images always get the full output."),
    batch_size: int = typer.Option(1024, "--batch-size", min=1, help="Rows per forward pass (memory O(batch))."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch CPU threads."),
    force: bool = typer.Option(False, "--force", help="Apply the head even when the dense file's backbone or "
                               "model differs from the one its training vectors came from (a warning instead)."),
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
