"""Small h5py helpers shared by the dense and sparse formats."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from ..errors import InputError, require_file

STR = h5py.string_dtype(encoding="utf-8")


def open_h5(path: str | Path, kind: str) -> h5py.File:
    """Open an HDF5 file read-only, or raise InputError saying it is missing or unreadable."""
    if Path(path).is_dir():  # a sharded output: parts + manifest (formats/sharded.py)
        from .sharded import open_sharded
        return open_sharded(path, kind)
    p = require_file(path, f"{kind} HDF5")
    try:
        f = h5py.File(p, "r")
    except OSError as e:  # h5py reports truncation, wrong signature, ... as OSError
        raise InputError(f"{p}: cannot open as HDF5 ({e}); the file is truncated or not HDF5") from None
    found = f.attrs.get("format")
    if found != kind:
        f.close()
        raise InputError(
            f"{p}: expected a {kind} file (attribute format={kind!r}), found format={found!r}"
        )
    return f


def attrs_dict(f: h5py.File) -> dict:
    out = {}
    for k, v in f.attrs.items():
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        out[k] = v
    return out


def read_strings(ds) -> list[str]:
    return [s.decode() if isinstance(s, bytes) else s for s in ds[()]]


def check_ids(ids, path) -> None:
    """Ids are non-empty and unique (InputError naming the first offender and its row)."""
    if all(ids) and len(set(ids)) == len(ids):
        return
    from ..checks import check_ids as full

    full(ids, path)
