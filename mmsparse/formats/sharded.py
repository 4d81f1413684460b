"""Sharded outputs: a directory of part files in the dense or sparse HDF5 format + a manifest.

Written by the Ray paths of `encode-dense --ray` and `sparsify --ray` (mmsparse/distributed.py);
read wherever a dense or sparse HDF5 file is read (formats._h5.open_h5 hands a directory here).

Layout of a sharded output DIR (the directory stands where the single file would be, e.g.
OUT/test-images.h5/):
  part-00000.h5, part-00001.h5, ...   each a complete dense (or sparse) HDF5 file, written with
                                      the single-process writers (DenseWriter / write_sparse),
                                      with the same attributes; rows in part order = the rows of
                                      the single-process file
  manifest.json                       written last, atomically:
      {"format": "sharded", "format_version": 1, "kind": "dense" | "sparse", "rows": N,
       "parts": [{"name": "part-00000.h5", "rows": n0, "sha256": "<hex>"}, ...],
       "fingerprint": {...what made it: settings and inputs...}, "skipped": [[id, error], ...]}
A directory without manifest.json is unfinished (a killed run): readers refuse it, rerunning the
command finishes it, redoing only the parts that are missing or fail their checksum.

Reading concatenates the parts in manifest order without copying them: `open_sharded` returns an
in-memory HDF5 file whose datasets are HDF5 virtual datasets over the parts (ids, vectors, texts,
image_ids, per-row extras; sparse: ids, texts, indices, weights, plus indptr [N+1] int64 rebuilt
with each part's offset and the shared vocab). Slicing it reads only the parts' rows asked for,
so streaming readers (formats.dense.iter_dense) stay O(chunk) in memory. Readers check that
every part exists and has the manifest's row count; the sha256 checksums are verified by the
writer when it resumes (and by `verify_parts`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import h5py
import numpy as np

from ..atomic import atomic_path
from ..errors import InputError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
KINDS = ("dense", "sparse")
_open_count = itertools.count()


def part_name(k: int) -> str:
    """File name of part k: part-00000.h5, part-00001.h5, ..."""
    return f"part-{k:05d}.h5"


def is_sharded(path: str | Path) -> bool:
    """True if `path` is a directory (a sharded output, finished or not)."""
    return Path(path).is_dir()


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(block), b""):
            h.update(b)
    return h.hexdigest()


def write_manifest(directory: str | Path, kind: str, parts: list[dict], fingerprint: dict | None = None,
                   **extra) -> Path:
    """Write DIR/manifest.json atomically. parts: [{"name", "rows", "sha256"}] in row order."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected dense or sparse")
    m = {"format": "sharded", "format_version": FORMAT_VERSION, "kind": kind,
         "rows": int(sum(int(p["rows"]) for p in parts)),
         "parts": [{"name": p["name"], "rows": int(p["rows"]), "sha256": p["sha256"]} for p in parts],
         "fingerprint": fingerprint or {}, **extra}
    path = Path(directory) / MANIFEST
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(m, indent=1, sort_keys=True))
    return path


def read_manifest(directory: str | Path, kind: str | None = None) -> dict:
    """The manifest of sharded output `directory`, checked (version, kind, parts present).
    Raises InputError naming the directory, the field and the fix."""
    d = Path(directory)
    p = d / MANIFEST
    if not p.is_file():
        raise InputError(f"{d}: a directory without {MANIFEST}: not a sharded {kind or 'HDF5'} output, or an "
                         "unfinished one (a killed `--ray` run); rerun the command that writes it to finish it")
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read the manifest ({e}); rerun the command that writes it") from None
    if m.get("format") != "sharded" or m.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{p}: field 'format_version' is {m.get('format_version')!r} (format "
                         f"{m.get('format')!r}); this mmsparse reads sharded format version {FORMAT_VERSION}")
    if kind is not None and m.get("kind") != kind:
        raise InputError(f"{p}: field 'kind' is {m.get('kind')!r}, expected a sharded {kind} output")
    if not m.get("parts"):
        raise InputError(f"{p}: field 'parts' is empty; rerun the command that writes it")
    for part in m["parts"]:
        if not (d / part["name"]).is_file():
            raise InputError(f"{d / part['name']}: part listed in {MANIFEST} is missing; rerun the command "
                             "that wrote the directory (it redoes only missing parts)")
    return m


def verify_parts(directory: str | Path, parts: list[dict]) -> list[str]:
    """Names of the parts (manifest entries) whose file is missing or fails its sha256."""
    d = Path(directory)
    return [p["name"] for p in parts
            if not (d / p["name"]).is_file() or sha256_file(d / p["name"]) != p["sha256"]]


def _concat(f: h5py.File, name: str, sources: list[tuple[str, tuple, np.dtype]], where) -> None:
    """Virtual dataset `name` in `f`: the parts' datasets (path, shape, dtype) along axis 0."""
    tail, dt = sources[0][1][1:], sources[0][2]
    for path, shape, d in sources:
        if shape[1:] != tail or d != dt:
            raise InputError(f"{path}: dataset {name!r} has shape {shape} / dtype {d}, but the first part of "
                             f"{where} has (*, {', '.join(map(str, tail))}) / {dt}; the parts were made "
                             "with different settings: rerun with --force")
    n = sum(s[0] for _, s, _ in sources)
    lay = h5py.VirtualLayout(shape=(n, *tail), dtype=dt)
    o = 0
    for path, shape, _ in sources:
        if shape[0]:
            lay[o:o + shape[0]] = h5py.VirtualSource(path, name, shape=shape)
            o += shape[0]
    f.create_virtual_dataset(name, lay)


def open_sharded(directory: str | Path, kind: str) -> h5py.File:
    """A read-only view of sharded output `directory` as one HDF5 file of format `kind`
    (dense | sparse): an in-memory h5py.File with the first part's attributes and virtual
    datasets over the parts in manifest order (see the module docstring). Close it after use.
    Raises InputError if the manifest is missing or wrong, a part is missing, unreadable, of the
    wrong format or of another row count than the manifest says."""
    d = Path(directory).resolve()
    m = read_manifest(d, kind)
    infos = []  # per part: path, {dataset: (shape, dtype)}, vocab (sparse)
    attrs = None
    vocab = None
    for part in m["parts"]:
        p = d / part["name"]
        try:
            g = h5py.File(p, "r")
        except OSError as e:
            raise InputError(f"{p}: cannot open as HDF5 ({e}); rerun the command that wrote {d} "
                             "(it redoes corrupt parts)") from None
        with g:
            if g.attrs.get("format") != kind:
                raise InputError(f"{p}: expected a {kind} part (attribute format={kind!r}), found "
                                 f"format={g.attrs.get('format')!r}")
            if attrs is None:
                attrs = dict(g.attrs.items())
            shapes = {k: (g[k].shape, g[k].dtype) for k in g if isinstance(g[k], h5py.Dataset)}
            rows = shapes["ids"][0][0] if "ids" in shapes else -1
            if rows != int(part["rows"]):
                raise InputError(f"{p}: holds {rows} rows but {d / MANIFEST} says {part['rows']}; rerun the "
                                 f"command that wrote {d}")
            if kind == "sparse":
                v = g["vocab"][()] if "vocab" in g else None
                if vocab is None:
                    vocab = v
                elif v is None or len(v) != len(vocab) or not np.array_equal(v, vocab):
                    raise InputError(f"{p}: field 'vocab' differs from the first part's; the parts come from "
                                     "different heads: rerun with --force")
                indptr = g["indptr"][()].astype(np.int64) if "indptr" in g else None
            else:
                indptr = None
            infos.append((str(p), shapes, rows, indptr))
    f = h5py.File(f"mmsparse-sharded-{next(_open_count)}-{d}", "w", driver="core", backing_store=False)
    try:
        for k, v in attrs.items():
            f.attrs[k] = v
        f.attrs["sharded_from"] = str(d)
        common = set(infos[0][1])
        for _, s, _, _ in infos[1:]:
            common &= set(s)
        per_row = {"ids", "vectors", "texts", "image_ids"} if kind == "dense" else {"ids", "texts"}
        if kind == "dense":  # extras with one entry per row (token_states, pre_projection, ...)
            per_row |= {k for k in common if all(s[k][0] and s[k][0][0] == r for _, s, r, _ in infos)}
        for name in sorted(per_row & common):
            _concat(f, name, [(p, *s[name]) for p, s, _, _ in infos], d)
        if kind == "dense":
            for name in sorted(common - per_row):  # file-level extras (projection weights): the first part's
                with h5py.File(infos[0][0], "r") as g:
                    f.create_dataset(name, data=g[name][()], dtype=g[name].dtype)
        else:
            for name in ("indices", "weights"):
                if name in common:
                    _concat(f, name, [(p, *s[name]) for p, s, _, _ in infos], d)
            if "indptr" in common:
                off, pieces = 0, [np.zeros(1, np.int64)]
                for p, s, r, ip in infos:
                    if len(ip) != r + 1:
                        raise InputError(f"{p}: field 'indptr' has {len(ip)} entries for {r} rows; rerun the "
                                         f"command that wrote {d}")
                    pieces.append(ip[1:] - ip[0] + off)
                    off += int(ip[-1] - ip[0])
                f.create_dataset("indptr", data=np.concatenate(pieces))
            if vocab is not None:
                f.create_dataset("vocab", data=vocab, dtype=h5py.string_dtype(encoding="utf-8"))
    except BaseException:
        f.close()
        raise
    return f


def open_read(path: str | Path) -> h5py.File:
    """Open a dense or sparse HDF5 file, or a sharded directory of either (as `open_sharded`),
    read-only. For readers that open files with h5py directly (no format check here)."""
    p = Path(path)
    if p.is_dir():
        return open_sharded(p, read_manifest(p).get("kind"))
    return h5py.File(p, "r")
