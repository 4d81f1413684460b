"""`mmsparse.json`: what an index directory holds and how it was built.

Keys: kind (pisa | seismic | bmp | kannolo | faiss | milvus), format_version, source (absolute path of the HDF5
it was built from), source_attrs (modality, head, backbone, model, dataset, split, ... of that
file), num_docs, build_seconds, settings (engine options), plus kind-specific keys (quantisation
scale for PISA and BMP, dim/metric for Faiss, connection, collection and fields for Milvus), and
provenance: mmsparse_version, command and inputs (path, kind and sha256 of the source file; see
mmsparse/provenance.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, require_dir
from ..provenance import record

META_NAME = "mmsparse.json"
KINDS = ("pisa", "seismic", "bmp", "kannolo", "faiss", "milvus")
SPARSE_KINDS = ("pisa", "seismic", "bmp", "kannolo")  # sparse-only engines (Milvus holds sparse and/or dense)
# Source-file attributes worth carrying into the index metadata (when present).
SOURCE_KEYS = ("format", "modality", "head", "method", "query_mode", "backbone", "model", "model_fingerprint",
               "dataset", "split", "normalized", "dim", "mmsparse_version", "command")


def source_attrs(attrs: dict) -> dict:
    """The subset of an HDF5 file's attributes recorded in the index metadata."""
    return {k: attrs[k] for k in SOURCE_KEYS if k in attrs}


def write_meta(index_dir: Path, meta: dict) -> None:
    """Write `mmsparse.json` into (the temporary) index directory, adding provenance. Atomic, so
    an index updated in place (Milvus) never shows a half-written file."""
    from ..atomic import write_text_atomic

    out = {**meta, "format_version": 1, **record()}
    write_text_atomic(Path(index_dir) / META_NAME, json.dumps(out, indent=2, sort_keys=True) + "\n")


def read_meta(index_dir: str | Path) -> dict:
    """Load and check `mmsparse.json`. Raises InputError if missing, unreadable or unknown kind."""
    d = require_dir(index_dir, "index")
    p = d / META_NAME
    if not p.is_file():
        raise InputError(f"{d}: not an mmsparse index (no {META_NAME}); build one with `mmsparse index`")
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: unreadable index metadata ({e}); rebuild the index") from None
    if meta.get("kind") not in KINDS:
        raise InputError(f"{p}: field 'kind' is {meta.get('kind')!r}, expected one of {', '.join(KINDS)}")
    return meta


def hdf5_format(path: str | Path, what: str) -> str:
    """The `format` attribute (sparse | dense) of an HDF5 file; InputError if missing or other."""
    import h5py

    from ..errors import require_file

    if Path(path).is_dir():  # a sharded output: parts + manifest.json (formats/sharded.py)
        from ..formats.sharded import read_manifest
        return read_manifest(path)["kind"]
    p = require_file(path, what)
    try:
        with h5py.File(p, "r") as f:
            fmt = f.attrs.get("format")
    except OSError as e:
        raise InputError(f"{p}: cannot open as HDF5 ({e}); the file is truncated or not HDF5") from None
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt not in ("sparse", "dense"):
        raise InputError(f"{p}: attribute 'format' is {fmt!r}, expected 'sparse' or 'dense' "
                         "(make it with `mmsparse encode-dense` or `mmsparse sparsify`)")
    return fmt
