"""`sparsify`: dense HDF5 -> sparse HDF5 through any method's head; query text -> sparse HDF5
through an inference-free head's term-weight table (no torch, no model)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import provenance
from ..checks import DENSE_FIX, check_compatible, near_dense, terms_share, warn
from ..errors import InputError
from ..formats.dense import iter_dense, read_dense_attrs
from ..formats.sparse import write_sparse
from ..methods import get_config_class, get_method
from ..methods.headdir import head_method, read_head_config
from ..progress import reporter
from ..runtime import default_threads

if TYPE_CHECKING:
    from ..methods.head import SparseHead

# attributes of the dense file the sparse file carries over
KEEP = ("backbone", "model", "model_fingerprint", "dataset", "split", "normalized", "patch_layer")
TABLE_METHOD = "inference-free"   # the method whose queries are text through a table, with no model


@provenance.recorded("head", "dense")
def sparsify(head: str | Path | SparseHead, dense: str | Path, *, out: str | Path, query_mode: str | None = None,
             batch_size: int | None = None, threads: int | None = None, force: bool = False,
             ray: str | None = None, workers: int = 1, num_gpus_per_worker: float = 0.0,
             cpus_per_worker: float = 1, part_rows: int | None = None, allow_dense: bool = False, progress=None,
             **options) -> Path:
    """Project the rows of dense HDF5 `dense` onto the vocabulary of `head` (a head directory or
    a loaded head) and write them as a sparse HDF5 file (CSR, see docs/formats.md) to `out`.

    An inference-free head encodes queries from their text, with no model (its term-weight
    table): `dense` may then also be a .tsv (id<TAB>text) or .txt (one query per line, ids =
    line numbers) file, and of a captions HDF5 only `ids` and `texts` are read, never the
    vectors (mmsparse.formats.queries). Torch is not imported on that path; --threads, --force
    and the batch size do not apply; --ray is refused. Any other head refuses text files.

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
    Rows holding more than 10 % of the vocabulary on average (a head not sparse yet) get a warning
    line with the measured density and the fix, unless allow_dense.
    """
    from ..formats.queries import query_file_kind

    rep = reporter(progress)
    loaded = not isinstance(head, (str, Path))
    method = head.method if loaded else head_method(head)
    cfg_class = get_config_class(method)
    unknown = sorted(set(options) - set(cfg_class.sparsify_options))
    if unknown:
        raise InputError(f"{unknown[0]}: not an option of {method} heads; they take "
                         f"{', '.join(sorted(cfg_class.sparsify_options)) or 'no extra options'}")
    kind = query_file_kind(dense, "dense HDF5")
    if kind != "hdf5" and method != TABLE_METHOD:
        raise InputError(f"{dense}: a .{kind} file of query text, but a {method} head encodes captions from their "
                         f"vectors: run `mmsparse encode-dense {dense}` and sparsify its captions file (only "
                         "inference-free heads read text)")
    attrs = read_dense_attrs(dense) if kind == "hdf5" else {"modality": "text"}
    if method == TABLE_METHOD and attrs["modality"] == "text":
        return _sparsify_texts(head, dense, Path(out), query_mode, ray, rep)
    import torch

    from ..methods.head import load_head

    h, head_dir = (head, None) if loaded else (load_head(head), Path(head))
    m = get_method(h.method)
    opts = {k: spec[0] for k, spec in m.config_class.sparsify_options.items()} | options
    mode = m.query_mode(attrs["modality"], query_mode, dense)
    check_compatible(attrs, h.config.get("training", {}), m.compat_keys, str(dense),
                     f"head {head_dir or h.method} (its training vectors)",
                     "sparsify vectors of the backbone the head was trained on", force)
    if m.output == "dense":    # a dense head (methods/dense): OUT receives the tuned dense vectors
        if ray is not None:
            raise InputError(f"--ray: a {h.method} head writes dense vectors; run without --ray")
        torch.set_num_threads(threads or default_threads())
        m.sparsify(h, head_dir, Path(dense), Path(out), mode, opts, batch_size or m.batch_size, rep)
        rep.log(f"sparsify: {attrs['modality']} rows of {dense} -> {out} ({h.method} head: tuned dense vectors)")
        return Path(out)
    n_rows = 0
    for ids, _ in iter_dense(dense, chunk_rows=65536):  # ids and NaN/Inf, whichever method reads what
        n_rows += len(ids)
    if ray is not None:  # a Ray Data pipeline writing a sharded output (mmsparse/distributed.py)
        from ..distributed import sparsify_parts

        keep = {"modality": attrs["modality"], "head": _head_attr(head_dir),
                "method": h.method, "query_mode": mode, "vocab_size": int(h.config["vocab_size"]),
                **{k: attrs[k] for k in KEEP if k in attrs}, "dense": str(Path(dense).resolve())}
        return sparsify_parts(h if head_dir is None else None, head_dir, Path(dense), Path(out), mode, opts,
                              batch_size or m.batch_size, keep, n_rows=n_rows, ray=ray, workers=workers,
                              num_gpus_per_worker=num_gpus_per_worker, cpus_per_worker=cpus_per_worker,
                              part_rows=part_rows, force=force, progress=rep)
    torch.set_num_threads(threads or default_threads())
    res = m.sparsify(h, head_dir, Path(dense), Path(out), mode, opts, batch_size or m.batch_size, rep)
    if res.matrix.nnz and not np.isfinite(res.matrix.data).all():
        raise InputError(f"{dense}: the head gives NaN/Inf weights for some rows; check the input vectors")
    out_attrs = {"modality": attrs["modality"], "head": _head_attr(head_dir),
                 "method": h.method, "query_mode": mode, "vocab_size": int(h.config["vocab_size"]),
                 **res.attrs, **{k: attrs[k] for k in KEEP if k in attrs}, "dense": str(Path(dense).resolve())}
    write_sparse(out, res.ids, res.matrix, h.vocab, out_attrs, res.texts)
    nnz = np.diff(res.matrix.indptr)
    rep.log(f"sparsify: {len(res.ids)} {attrs['modality']} rows -> {out} ({h.method} {mode}; "
            f"{nnz.mean() if len(nnz) else 0:.1f} terms/row)")
    v = int(h.config["vocab_size"])
    if len(nnz) and near_dense(nnz.mean(), v) and not allow_dense:
        warn(f"{out}: {terms_share('its ' + str(len(nnz)) + ' rows', nnz.mean(), v)}, {nnz.sum() * 8 / 1e6:,.0f} MB "
             f"of postings: head {head_dir or h.method} is not sparse yet, and an index of these walks most posting "
             f"lists for every query; {DENSE_FIX}, or pass --allow-dense to go on quietly")
    return Path(out)


def _head_attr(head_dir: Path | None) -> str:
    """The `head` attribute of a sparse file: the head directory's absolute path ("" for a head
    passed loaded). search compares queries' and documents' by it."""
    return str(Path(head_dir).resolve()) if head_dir else ""


def _sparsify_texts(head, source: Path, out: Path, query_mode: str | None, ray: str | None, rep) -> Path:
    """Query texts of `source` through inference-free `head` (table_queries) into the sparse HDF5 `out`."""
    from ..methods.inference_free.queries import QUERY_MODE

    if query_mode not in (None, QUERY_MODE):
        raise InputError(f"--query-mode {query_mode}: an inference-free head takes {QUERY_MODE} queries only")
    if ray is not None:
        raise InputError(f"--ray: {source} holds query texts, encoded here by a table lookup with no model to "
                         "distribute; run without --ray")
    col = table_queries(head, source, rep)
    write_sparse(out, col.ids, col.matrix, col.vocab, col.attrs, col.texts)
    nnz = np.diff(col.matrix.indptr)
    rep.log(f"sparsify: {len(col.ids)} text rows of {source} -> {out} ({TABLE_METHOD}: the term-weight table, no "
            f"model; {nnz.mean() if len(nnz) else 0:.1f} terms/row)")
    return out


def table_queries(head, source: str | Path, progress=None):
    """The query texts of `source` (a .tsv, .txt or captions HDF5: mmsparse.formats.queries)
    through the term-weight table of the inference-free `head` (a directory or hub id, read
    without torch; or a loaded head): a SparseCollection (CSR [N, |V|] float32, the head's
    vocab, the texts) with the attributes sparsify writes: modality text, head, method and
    query_mode inference-free, query_encoder, vocab_size, plus an HDF5 source's provenance
    attributes (KEEP) and its path as `dense`. InputError for bad input (formats.queries) or a
    head without a table."""
    from ..formats.queries import read_query_texts
    from ..formats.sparse import SparseCollection
    from ..methods.headdir import resolve_head_path
    from ..methods.inference_free.queries import QUERY_MODE, sparsify_texts

    loaded = not isinstance(head, (str, Path))
    head_dir = None if loaded else resolve_head_path(head)
    vocab = list(head.vocab) if loaded else read_head_config(head_dir)[1]
    ids, texts, src_attrs = read_query_texts(source)
    res = sparsify_texts(head if loaded else None, head_dir, ids, texts, progress=progress)
    attrs = {"modality": "text", "head": _head_attr(None if loaded else Path(head)), "method": TABLE_METHOD,
             "query_mode": QUERY_MODE, "vocab_size": len(vocab), **res.attrs,
             **{k: src_attrs[k] for k in KEEP if k in src_attrs}}
    if src_attrs:
        attrs["dense"] = str(Path(source).resolve())
    return SparseCollection(res.ids, res.matrix, vocab, attrs, res.texts)
