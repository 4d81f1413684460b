"""`sparsify`: dense HDF5 -> sparse HDF5 through any method's head."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import provenance
from ..checks import check_compatible
from ..errors import InputError
from ..formats.dense import iter_dense, read_dense_attrs
from ..formats.sparse import write_sparse
from ..methods import get_method
from ..methods.head import SparseHead, load_head
from ..progress import reporter

# attributes of the dense file the sparse file carries over
KEEP = ("backbone", "model", "model_fingerprint", "dataset", "split", "normalized", "patch_layer")


@provenance.recorded("head", "dense")
def sparsify(head: str | Path | SparseHead, dense: str | Path, *, out: str | Path, query_mode: str | None = None,
             batch_size: int | None = None, threads: int | None = None, force: bool = False,
             ray: str | None = None, workers: int = 1, num_gpus_per_worker: float = 0.0,
             cpus_per_worker: float = 1, part_rows: int | None = None, progress=None, **options) -> Path:
    """Project the rows of dense HDF5 `dense` onto the vocabulary of `head` (a head directory or
    a loaded head) and write them as a sparse HDF5 file (CSR, see docs/formats.md) to `out`.

    The head's method decides how (mmsparse.methods): images become documents; captions become
    queries in `query_mode` (d2s/joint: expand | caption-terms; vdr: vdr | bow; the method's first
    mode by default). batch_size: rows per forward pass (memory O(batch); default the method's).
    force: apply the head to vectors of another backbone/model than it was trained on (a warning
    instead of an error). **options: the method's own sparsify options (e.g. vdr_query_k,
    k_post, dense_out). Every input is checked (ids, NaN/Inf) before anything is written; the
    output appears atomically. ray: run as a Ray Data pipeline ("local", "auto" or
    "ray://host:10001"; mmsparse/distributed.py) with `workers` head replicas (Ray actors,
    `num_gpus_per_worker` GPUs and `cpus_per_worker` CPUs each); `out` is then a sharded directory
    (parts of `part_rows` rows + manifest.json, mmsparse/formats/sharded.py). Returns `out`.
    """
    import torch

    rep = reporter(progress)
    h, head_dir = (head, None) if isinstance(head, SparseHead) else (load_head(head), Path(head))
    m = get_method(h.method)
    unknown = sorted(set(options) - set(m.config_class.sparsify_options))
    if unknown:
        raise InputError(f"{unknown[0]}: not an option of {m.name} heads; they take "
                         f"{', '.join(sorted(m.config_class.sparsify_options)) or 'no extra options'}")
    opts = {k: spec[0] for k, spec in m.config_class.sparsify_options.items()} | options
    attrs = read_dense_attrs(dense)
    mode = m.query_mode(attrs["modality"], query_mode, dense)
    check_compatible(attrs, h.config.get("training", {}), m.compat_keys, str(dense),
                     f"head {head_dir or h.method} (its training vectors)",
                     "sparsify vectors of the backbone the head was trained on", force)
    n_rows = 0
    for ids, _ in iter_dense(dense, chunk_rows=65536):  # ids and NaN/Inf, whichever method reads what
        n_rows += len(ids)
    if ray is not None:  # a Ray Data pipeline writing a sharded output (mmsparse/distributed.py)
        from ..distributed import sparsify_parts

        keep = {"modality": attrs["modality"], "head": str(head_dir.resolve()) if head_dir else "",
                "method": h.method, "query_mode": mode, "vocab_size": int(h.config["vocab_size"]),
                **{k: attrs[k] for k in KEEP if k in attrs}, "dense": str(Path(dense).resolve())}
        return sparsify_parts(h if head_dir is None else None, head_dir, Path(dense), Path(out), mode, opts,
                              batch_size or m.batch_size, keep, n_rows=n_rows, ray=ray, workers=workers,
                              num_gpus_per_worker=num_gpus_per_worker, cpus_per_worker=cpus_per_worker,
                              part_rows=part_rows, force=force, progress=rep)
    if threads:
        torch.set_num_threads(threads)
    res = m.sparsify(h, head_dir, Path(dense), Path(out), mode, opts, batch_size or m.batch_size, rep)
    if res.matrix.nnz and not np.isfinite(res.matrix.data).all():
        raise InputError(f"{dense}: the head gives NaN/Inf weights for some rows; check the input vectors")
    out_attrs = {"modality": attrs["modality"], "head": str(head_dir.resolve()) if head_dir else "",
                 "method": h.method, "query_mode": mode, "vocab_size": int(h.config["vocab_size"]),
                 **res.attrs, **{k: attrs[k] for k in KEEP if k in attrs}, "dense": str(Path(dense).resolve())}
    write_sparse(out, res.ids, res.matrix, h.vocab, out_attrs, res.texts)
    nnz = np.diff(res.matrix.indptr)
    rep.log(f"sparsify: {len(res.ids)} {attrs['modality']} rows -> {out} ({h.method} {mode}; "
            f"{nnz.mean() if len(nnz) else 0:.1f} terms/row)")
    return Path(out)
