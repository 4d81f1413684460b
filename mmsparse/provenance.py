"""What every output records about how it was made, and walking that record back.

Every output carries `mmsparse_version`, `command` (the command line), `inputs` and, for
seeded stages, `seed`:
  HDF5 files          file attributes (`inputs` as a JSON string)
  head directories    config.json "provenance" object
  index directories   mmsparse.json
  eval JSON           top-level keys
  runs and qrels      a sidecar RUN.meta.json (TREC text has no header)
`inputs` is a list of {"path": absolute path, "kind": dense|sparse|head|index|run|qrels|
annotations|images|model|..., "sha256": content hash} (directories: hash over their files'
hashes; large directories such as image folders or models: "manifest_sha256" over names, sizes
and modification times instead).

Every API function runs inside `recording` (the `recorded` decorator registers its input
paths; `add_inputs` adds inputs a stage finds itself), so the writers' `stamp()` records them
whether the stage was started from the shell or from Python.
`chain(path)` / `format_chain` walk the record back to the images and captions
(`mmsparse inspect --provenance FILE`).

`model_fingerprint(path_or_id)` says what a model is, wherever it lies (a content hash, or a hub
commit); dense files record it as `model_fingerprint` beside `model`, and checks.check_compatible
compares models by it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from ._version import __version__
from .errors import InputError

# directories above this total size get a manifest hash (names, sizes, mtimes), not a content hash
CONTENT_HASH_DIR_LIMIT = 64 << 20
SIDECAR = ".meta.json"

_current: contextvars.ContextVar = contextvars.ContextVar("mmsparse_provenance", default=None)
_hash_cache: dict[tuple, str] = {}


def command_line() -> str:
    """The command line of the running stage: the one its `recording` was given (the shell line
    under the `mmsparse` script, the Python call under the API), else the process's argv."""
    st = _current.get()
    if st and st.get("command"):
        return st["command"]
    if not sys.argv:
        return ""
    return " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name or "python", *sys.argv[1:]])


@contextlib.contextmanager
def recording(inputs=(), seed: int | None = None, command: str | None = None) -> Iterator[dict]:
    """Record one stage: the writers' `stamp()` / `record()` inside the block carry `inputs`
    (paths, or (path, kind) pairs; missing paths are skipped), `seed` and `command`. An inner
    recording without a command keeps the outer one's (the CLI sets the shell line, then the API
    function it calls records its inputs). Context-local, so threads and asyncio tasks do not mix."""
    outer = _current.get() or {}
    state = {"inputs": [], "seed": seed, "command": command or outer.get("command")}
    token = _current.set(state)
    try:
        add_inputs(inputs)
        yield state
    finally:
        _current.reset(token)


def recorded(*input_params: str, seed_param: str = "seed") -> Callable:
    """Decorator for API functions: the call runs inside `recording`, with the paths passed as
    `input_params` as inputs, the `seed_param` argument as seed and, outside the CLI, the Python
    call itself as the command, e.g. `mmsparse.sparsify('heads/d2s', 'test-images.h5', out='x.h5')`."""
    def deco(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            bound = sig.bind_partial(*args, **kwargs)
            paths = []
            for name in input_params:
                v = bound.arguments.get(name)
                for x in (v if isinstance(v, (list, tuple)) else [v]):
                    if isinstance(x, (str, Path)):
                        paths.append(x)
            seed = bound.arguments.get(seed_param, bound.arguments.get("options", {}).get(seed_param))
            call = None if (_current.get() or {}).get("command") else _python_call(fn.__name__, bound)
            with recording(paths, seed=seed, command=call):
                return fn(*args, **kwargs)
        return run
    return deco


def _python_call(name: str, bound: inspect.BoundArguments) -> str:
    parts = []
    for k, v in bound.arguments.items():
        p = bound.signature.parameters[k]
        if k == "progress" or v is None:
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parts += [f"{kk}={_repr(vv)}" for kk, vv in v.items()]
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts += [_repr(x) for x in v]
        elif p.default is inspect.Parameter.empty and p.kind is not inspect.Parameter.KEYWORD_ONLY:
            parts.append(_repr(v))
        else:
            parts.append(f"{k}={_repr(v)}")
    return f"mmsparse.{name}({', '.join(parts)})"


def _repr(v) -> str:
    return repr(str(v)) if isinstance(v, Path) else repr(v)


# -- hashing ----------------------------------------------------------------------------------

def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file's bytes, cached by (path, size, mtime) within the process."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _hash_cache[key] = h.hexdigest()
    return _hash_cache[key]


def content_hash(path: str | Path) -> dict:
    """{"sha256": ...} of a file or a small directory (over relative names and file hashes), or
    {"manifest_sha256": ...} (names, sizes, mtimes) of a large one; {} if `path` is missing."""
    p = Path(path)
    if p.is_file():
        return {"sha256": file_sha256(p)}
    if not p.is_dir():
        return {}
    files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    stats = [(f, f.stat()) for f in files]
    h = hashlib.sha256()
    if sum(s.st_size for _, s in stats) <= CONTENT_HASH_DIR_LIMIT:
        for f, _ in stats:
            h.update(f"{f.relative_to(p).as_posix()}\0{file_sha256(f)}\n".encode())
        return {"sha256": h.hexdigest()}
    for f, s in stats:
        h.update(f"{f.relative_to(p).as_posix()}\0{s.st_size}\0{s.st_mtime_ns}\n".encode())
    return {"manifest_sha256": h.hexdigest()}


# -- model fingerprints -----------------------------------------------------------------------

# files beside a model that do not change what it computes: model cards, licences
_NOT_MODEL = re.compile(r"(?i)^(readme|license|licence|notice|citation)([.-].*)?$|.*\.(md|rst)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_fingerprints: dict[tuple, str] = {}


def model_fingerprint(model: str | Path, cache_dir: str | Path | None = None) -> str:
    """What a model *is*, wherever it lies: compare two fingerprints to tell whether vectors come
    from the same model (a model moved, copied or mounted elsewhere keeps its fingerprint; one
    changed in place gets a new one).

    A local directory: "sha256:<hex>" over the relative names and sha256 of its files (config,
    weights, tokenizer and processor files; hidden files, model cards and licences left out); a
    local file (a checkpoint): "sha256:<hex>" of its bytes. A hub id: "hf:<id>@<commit>", the
    revision of its copy in the local Hugging Face cache (`cache_dir`, default the hub's own),
    found offline; a cached snapshot not named by a commit is hashed as a local directory.

    Local fingerprints are kept in memory and on disk ($MMSPARSE_CACHE/fingerprints, see
    settings.cache_dir; the model directory may be read-only), keyed by the resolved path and
    every file's size and modification time: a model is read once (0.2 s for the 108 MB shared
    model from the page cache), a changed file is read again. Raises InputError if `model` is
    neither a local path nor a hub id in the local cache."""
    p = Path(model).expanduser()
    if p.exists():
        return _local_fingerprint(p.resolve())
    snapshot = _hub_snapshot(str(model), cache_dir)
    if snapshot is None:
        raise InputError(f"{model}: model not found (neither a local path nor a hub id in the local Hugging Face "
                         "cache); pass the model directory")
    if _COMMIT.match(snapshot.name):
        return f"hf:{model}@{snapshot.name}"
    return _local_fingerprint(snapshot.resolve())


def _hub_snapshot(repo_id: str, cache_dir) -> Path | None:
    """The snapshot directory of hub model `repo_id` in the local cache (its main revision), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    except Exception:  # not a valid repo id (e.g. a path that does not exist), or no huggingface_hub
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def _model_files(root: Path) -> list[tuple[str, Path, os.stat_result]]:
    """(relative name, path, stat) of the files that make up a model directory (or file)."""
    if root.is_file():
        return [(root.name, root, root.stat())]
    out = []
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or _NOT_MODEL.match(f.name) or not f.is_file():
            continue
        out.append((rel.as_posix(), f, f.stat()))
    return out


def _local_fingerprint(root: Path) -> str:
    files = _model_files(root)
    listing = [[rel, s.st_size, s.st_mtime_ns] for rel, _, s in files]
    key = (str(root), json.dumps(listing))
    if key in _fingerprints:
        return _fingerprints[key]
    from .settings import cache_dir

    entry = cache_dir() / "fingerprints" / (hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".json")
    try:
        old = json.loads(entry.read_text(encoding="utf-8"))
        if old.get("path") == str(root) and old.get("files") == listing and old.get("fingerprint"):
            _fingerprints[key] = old["fingerprint"]
            return old["fingerprint"]
    except (OSError, ValueError, AttributeError):
        pass
    if root.is_file():
        fp = "sha256:" + file_sha256(root)
    else:
        h = hashlib.sha256()
        for rel, f, _ in files:
            h.update(f"{rel}\0{file_sha256(f)}\n".encode())
        fp = "sha256:" + h.hexdigest()
    _fingerprints[key] = fp
    try:  # a read-only or full cache only costs the next process the hash again
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", dir=entry.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"path": str(root), "files": listing, "fingerprint": fp}, f)
        os.replace(tmp, entry)
    except OSError:
        pass
    return fp


# -- kinds ------------------------------------------------------------------------------------

def detect_kind(path: str | Path) -> str:
    """What an input is: dense | sparse | hdf5 | head | index | run | qrels | queries | eval |
    annotations | model | images | dir | file | missing. Cheap: reads attributes and a first line only."""
    p = Path(path)
    if not p.exists():
        return "missing"
    if p.is_dir():
        if (p / "mmsparse.json").is_file():
            return "index"
        if (p / "config.json").is_file():  # a head's config names its method; a model's does not
            cfg = _json(p / "config.json")
            return "head" if "method" in cfg and (p / "vocab.txt").is_file() else "model"
        return "images" if any(p.glob("*.jp*g")) or any(p.glob("*.png")) else "dir"
    side = sidecar_path(p)
    if side.is_file():
        try:
            k = json.loads(side.read_text(encoding="utf-8")).get("format")
            if k in ("run", "qrels"):
                return k
        except (OSError, ValueError):
            pass
    with open(p, "rb") as f:
        head = f.read(8)
    if head == b"\x89HDF\r\n\x1a\n":
        try:
            import h5py
            with h5py.File(p, "r") as h:
                fmt = h.attrs.get("format")
            fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
            return fmt if fmt in ("dense", "sparse") else "hdf5"
        except OSError:
            return "hdf5"
    if p.suffix == ".json":
        try:
            o = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "file"
        if isinstance(o, dict) and "measures" in o:
            return "eval"
        if isinstance(o, dict) and ("images" in o or "annotations" in o):
            return "annotations"
        return "file"
    try:
        with open(p, encoding="utf-8") as f:
            first = next((ln for ln in f if ln.strip()), "")
    except (OSError, UnicodeDecodeError):
        return "file"
    if len(first.rstrip("\r\n").split("\t")) == 2:  # id<TAB>text: a queries.tsv (formats/queries.py)
        return "queries"
    n = len(first.split())
    return "run" if n == 6 else "qrels" if n == 4 else "file"


def input_record(path: str | Path, kind: str | None = None) -> dict:
    """{"path", "kind", "sha256" | "manifest_sha256"} of one input."""
    p = Path(path)
    return {"path": str(p.resolve()), "kind": kind or detect_kind(p), **content_hash(p)}


# -- recording --------------------------------------------------------------------------------

def add_inputs(inputs) -> None:
    """Register more inputs of the running command (paths or (path, kind) pairs)."""
    st = _current.get()
    if st is None:  # outside a recording there is nothing to attach inputs to
        return
    known = {r["path"] for r in st["inputs"]}
    for x in inputs:
        path, kind = (x if isinstance(x, tuple) else (x, None))
        if path is None or not Path(path).exists():
            continue
        try:
            rec = input_record(path, kind)
        except OSError:  # unreadable: the command's own checks will name it; record the path only
            rec = {"path": str(Path(path).resolve()), "kind": kind or "unreadable"}
        if rec["path"] not in known:
            known.add(rec["path"])
            st["inputs"].append(rec)


def record(inputs=None, seed: int | None = None) -> dict:
    """JSON-ready provenance: mmsparse_version, command, inputs (list), seed (if any).
    `inputs`/`seed` default to what the running stage registered (recording/add_inputs)."""
    st = _current.get() or {"inputs": [], "seed": None}
    ins = [input_record(*(x if isinstance(x, tuple) else (x,))) for x in inputs] if inputs is not None \
        else list(st["inputs"])
    out = {"mmsparse_version": __version__, "command": command_line(), "inputs": ins}
    s = seed if seed is not None else st["seed"]
    if s is not None:
        out["seed"] = int(s)
    return out


def stamp(inputs=None, seed: int | None = None) -> dict:
    """Attributes every HDF5 output carries: `mmsparse_version`, `command`, `inputs` (a JSON
    string, see `record`) and `seed` when the command has one."""
    r = record(inputs, seed)
    r["inputs"] = json.dumps(r["inputs"], ensure_ascii=False)
    return r


def sidecar_path(path: str | Path) -> Path:
    """RUN -> RUN.meta.json, the provenance sidecar of a text output (run, qrels)."""
    p = Path(path)
    return p.with_name(p.name + SIDECAR)


# -- reading back -----------------------------------------------------------------------------

def read_provenance(path: str | Path) -> dict:
    """The recorded provenance of an mmsparse output: {"path", "kind", "command",
    "mmsparse_version", "seed", "inputs": [...], "attrs": {...}} (missing keys: None / [])."""
    p = Path(path)
    kind = detect_kind(p)
    rec: dict = {}
    if kind in ("dense", "sparse"):
        import h5py

        with h5py.File(p, "r") as f:  # core reads attributes itself: formats sit above it
            rec = {k: v.decode() if isinstance(v, bytes) else v.item() if getattr(v, "ndim", None) == 0 else v
                   for k, v in f.attrs.items()}
    elif kind == "head":
        cfg = _json(p / "config.json")
        rec = {**cfg.get("provenance", {}), "training": cfg.get("training", {})}
    elif kind == "index":
        rec = _json(p / "mmsparse.json")
    elif kind in ("run", "qrels"):
        rec = _json(sidecar_path(p))
    elif kind == "eval":
        rec = _json(p)
    inputs = rec.get("inputs", [])
    if isinstance(inputs, str):
        try:
            inputs = json.loads(inputs)
        except ValueError:
            inputs = []
    if not inputs:
        inputs = _legacy_inputs(kind, rec)
    return {"path": str(p.resolve()) if p.exists() else str(p), "kind": kind,
            "command": rec.get("command"), "mmsparse_version": rec.get("mmsparse_version"),
            "seed": rec.get("seed"), "inputs": inputs, "attrs": rec}


def _json(p: Path) -> dict:
    try:
        o = json.loads(p.read_text(encoding="utf-8"))
        return o if isinstance(o, dict) else {}
    except (OSError, ValueError):
        return {}


def _legacy_inputs(kind: str, rec: dict) -> list[dict]:
    """Inputs named by older attributes (files written before `inputs` was recorded)."""
    names = {"dense": ("source",), "sparse": ("head", "dense"), "index": ("source",),
             "head": (), "eval": ("run", "qrels")}.get(kind, ())
    out = [{"path": str(rec[k])} for k in names if rec.get(k)]
    if kind == "head":
        t = rec.get("training", {})
        out = [{"path": t[k]} for k in ("train_images", "train_captions", "val_images", "val_captions") if t.get(k)]
    return out


def check_input(rec: dict) -> str:
    """"ok" when the recorded input still has the recorded hash, "changed", "missing", or
    "unhashed" (nothing recorded to compare)."""
    p = Path(rec["path"])
    if not p.exists():
        return "missing"
    for key in ("sha256", "manifest_sha256"):
        if rec.get(key):
            return "ok" if content_hash(p).get(key) == rec[key] else "changed"
    return "unhashed"


def chain(path: str | Path, _seen: set | None = None, _depth: int = 0) -> dict:
    """The provenance tree of `path`: read_provenance plus, per input, its own tree
    ("parents") and whether it still matches the recorded hash ("status")."""
    seen = _seen if _seen is not None else set()
    node = read_provenance(path)
    node["parents"] = []
    key = node["path"]
    if key in seen or _depth > 20:
        node["repeated"] = True
        return node
    seen.add(key)
    for rec in node["inputs"]:
        if not Path(rec["path"]).exists():
            child = {"path": rec["path"], "kind": rec.get("kind", "?"), "parents": [], "inputs": []}
        elif rec.get("kind") in ("images", "model", "annotations", "dir", "queries") or \
                detect_kind(rec["path"]) in ("images", "model", "annotations", "dir", "file", "queries"):
            child = {"path": rec["path"], "kind": rec.get("kind") or detect_kind(rec["path"]),
                     "parents": [], "inputs": []}
        else:
            child = chain(rec["path"], seen, _depth + 1)
        child["status"] = check_input(rec)
        node["parents"].append(child)
    return node


def format_chain(tree: dict) -> list[str]:
    """Indented text lines of a `chain` tree: path (kind, status), then command and version."""
    lines: list[str] = []

    def walk(n: dict, indent: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        status = f", {n['status']}" if n.get("status") and n["status"] != "ok" else ""
        lines.append(f"{indent}{branch}{n['path']}  ({n.get('kind', '?')}{status})")
        sub = indent + ("" if root else ("   " if last else "│  "))
        if n.get("repeated"):
            lines.append(f"{sub}   (shown above)")
            return
        if n.get("command"):
            extra = f", seed {n['seed']}" if n.get("seed") is not None else ""
            lines.append(f"{sub}   made by: {n['command']}  [mmsparse {n.get('mmsparse_version')}{extra}]")
        ps = n.get("parents", [])
        for i, c in enumerate(ps):
            walk(c, sub, i == len(ps) - 1, False)

    walk(tree, "", True, True)
    return lines
