"""Ray Data for the heavy stages: `encode-dense --ray` and `sparsify --ray` (docs/ray.md).

The same stage code as the single-process path, run as a Ray Data pipeline:

    ray.data.from_items(parts still to do)           one row per part: its records / row range
      .map_batches(_EncodePart | _SparsifyPart,      one model replica (backbone or head) per
                   batch_size=1, concurrency=workers, actor; each call encodes one part and
                   num_cpus=cpus_per_worker,          writes it atomically (temp + rename) as
                   num_gpus=num_gpus_per_worker)     DIR/part-NNNNN.h5 with the single-process
                                                     writers (formats.DenseWriter / write_sparse)
      .iter_rows()                                   the driver journals each finished part
                                                     (DIR/.parts.jsonl: name, rows, sha256)
    DIR/manifest.json                                written last (formats/sharded.py)

A part is `part_rows` consecutive rows (records for encode, rows of the dense input for
sparsify), so the parts concatenated in order are the rows of the single-process output. A
rerun with the same settings and inputs keeps every part that the journal (or the manifest)
lists and whose file still has its sha256, and redoes only the missing or corrupt ones; other
settings start the directory afresh. Actors write the parts themselves, so on a cluster DIR (and
the inputs) must be on storage every node sees (NFS, a mounted bucket).

Ray is imported inside the functions (`pip install -e '.[scale]'`). `ray="local"` starts a local
Ray instance (no dashboard, worker logs not forwarded) with enough logical CPUs that the actor
pool and Ray Data's read tasks do not starve each other; "auto" or "ray://host:10001" joins a
cluster. A Ray session already started in the process (ray.init by the caller) is reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import pickle
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from . import provenance
from .atomic import kill_point, locks_output, output_lock
from .errors import InputError
from .formats.sharded import (
    MANIFEST,
    part_name,
    read_manifest,
    sha256_file,
    verify_parts,
    write_manifest,
)
from .progress import Reporter, reporter

JOURNAL = ".parts.jsonl"
IMAGE_PART_ROWS = 1024
CAPTION_PART_ROWS = 4096
SPARSIFY_PART_ROWS = 65536


# -- Ray session ----------------------------------------------------------------------------

def init_ray(address: str | None, workers: int = 1, cpus_per_worker: float = 1) -> None:
    """Start or join Ray. address: "local" (or None): a local instance with
    max(4, workers * cpus_per_worker + 2) logical CPUs; "auto": the cluster this machine belongs
    to; "ray://host:10001": a remote cluster through Ray Client. Workers never inherit the test
    kill hook (MMSPARSE_TEST_KILL_AFTER), which is for the driver, and get runtime.worker_env()
    (one malloc arena). Raises InputError if the
    cluster does not answer or Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray: Ray is not installed; pip install -e '.[scale]' (or pip install 'ray[data]')") from None
    if address not in (None, "", "local", "auto"):
        _check_reachable(address)
    if ray.is_initialized():
        return
    from .runtime import worker_env

    # one malloc arena in the workers (runtime.worker_env: their calls run on a worker thread)
    env = {"env_vars": {"MMSPARSE_TEST_KILL_AFTER": "", **worker_env()}}
    for name in ("ray", "ray.data"):  # Ray's notices are not the user's business; errors still raise
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        if address in (None, "", "local"):
            ray.init(num_cpus=max(4, math.ceil(workers * cpus_per_worker) + 2), include_dashboard=False,
                     log_to_driver=False, runtime_env=env, logging_level=logging.ERROR)
        else:
            ray.init(address=address, log_to_driver=False, runtime_env=env, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InputError(f"--ray {address}: cannot start or reach Ray ({str(e).splitlines()[0] if str(e) else e}); "
                         "use --ray local, or the address of a running cluster (auto, ray://host:10001)") from None
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False  # progress goes to the Reporter, per finished part
    try:
        ctx.print_on_execution_start = False
    except AttributeError:  # older Ray
        pass


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """InputError unless HOST:PORT of `address` (ray://HOST:PORT or HOST:PORT) accepts a TCP
    connection within `timeout` s (Ray itself retries an unreachable address for minutes)."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray {address}: not an address; use local, auto, ray://HOST:10001 or HOST:6379")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise InputError(f"--ray {address}: nothing answers at {host}:{port} ({e}); start the cluster "
                         "(ray start --head) or use --ray local") from None


def _check_pool(workers: int, num_gpus_per_worker: float, cpus_per_worker: float) -> None:
    if workers < 1:
        raise InputError(f"--workers {workers}: a Ray run needs at least one worker")
    if num_gpus_per_worker < 0 or cpus_per_worker <= 0:
        raise InputError("--num-gpus-per-worker must be >= 0 and --cpus-per-worker > 0")


def _run_parts(actor_cls, ctor: dict, items: list[dict], workers: int, cpus_per_worker: float,
               num_gpus_per_worker: float):
    """Yield one result dict per part as the actor pool finishes them (any order)."""
    import ray

    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    with warnings.catch_warnings():  # max_restarts travels as a deprecated ray_remote_args in Ray 2.5x
        warnings.simplefilter("ignore")
        res = ds.map_batches(actor_cls, fn_constructor_kwargs=ctor, batch_size=1, batch_format="numpy",
                             compute=ray.data.ActorPoolStrategy(size=min(workers, len(items))),
                             num_cpus=cpus_per_worker, num_gpus=num_gpus_per_worker or None,
                             zero_copy_batch=True, max_restarts=0)
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for row in res.iter_rows():
        yield {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}


# -- resumable part directory ---------------------------------------------------------------

class _PartDir:
    """The sharded output directory being written: which parts are done (journal or manifest,
    checked by sha256), the journal of new ones, the manifest at the end."""

    def __init__(self, path: Path, kind: str, fingerprint: dict, n_parts: int, force: bool, log):
        self.path, self.kind, self.fp, self.n_parts = Path(path), kind, fingerprint, n_parts
        self.done: dict[str, dict] = {}
        self.up_to_date = False
        p = self.path
        if p.is_file():  # a single-file output of an earlier plain run: replaced by the directory
            p.unlink()
        old = []
        if p.is_dir() and not force:
            old = self._known()
        elif p.is_dir():
            self._clear()
        p.mkdir(parents=True, exist_ok=True)
        names = {part_name(k) for k in range(n_parts)}
        old = [e for e in old if e["name"] in names]
        bad = set(verify_parts(p, old)) if old else set()
        self.done = {e["name"]: e for e in old if e["name"] not in bad}
        if bad:
            log(f"{p.name}: {len(bad)} part(s) missing or failing their checksum, redone: {', '.join(sorted(bad))}")
        if len(self.done) == n_parts and (p / MANIFEST).is_file():
            self.up_to_date = True
            return
        (p / MANIFEST).unlink(missing_ok=True)  # no reader takes the directory until it is complete
        for q in p.iterdir():  # parts not known to be good (and stray files) go
            if q.name.startswith("part-") and q.name not in self.done:
                q.unlink()
        with open(p / JOURNAL, "w") as f:
            f.write(json.dumps({"fingerprint": fingerprint}, sort_keys=True) + "\n")
            f.writelines(json.dumps(e, sort_keys=True) + "\n" for e in self.done.values())
        if self.done:
            log(f"resuming {p.name}: {len(self.done)} of {n_parts} part(s) kept")

    def _known(self) -> list[dict]:
        """Parts recorded by a run with the same fingerprint (manifest, else journal); [] and a
        cleared directory if the settings or inputs differ."""
        m_path, j_path = self.path / MANIFEST, self.path / JOURNAL
        if m_path.is_file():
            try:
                m = json.loads(m_path.read_text())
                if m.get("fingerprint") == self.fp and m.get("kind") == self.kind:
                    return list(m["parts"])
            except (OSError, ValueError, KeyError):
                pass
        elif j_path.is_file():
            lines = [json.loads(x) for x in j_path.read_text().splitlines() if x.strip().endswith("}")]
            if lines and lines[0].get("fingerprint") == self.fp:
                return [e for e in lines[1:] if "name" in e]
        self._clear()
        return []

    def _clear(self) -> None:
        for q in self.path.iterdir():
            if q.is_file() and (q.name.startswith("part-") or q.name.startswith(".part-")
                                or q.name in (MANIFEST, JOURNAL, ".skipped.json")):
                q.unlink()

    def todo(self) -> list[int]:
        return [k for k in range(self.n_parts) if part_name(k) not in self.done]

    def add(self, entry: dict) -> None:
        """Journal one finished part (name, rows, sha256), durably."""
        e = {"name": entry["name"], "rows": int(entry["rows"]), "sha256": entry["sha256"]}
        self.done[e["name"]] = e
        with open(self.path / JOURNAL, "a") as f:
            f.write(json.dumps(e, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finish(self, **extra) -> None:
        parts = [self.done[part_name(k)] for k in range(self.n_parts)]
        write_manifest(self.path, self.kind, parts, self.fp, **extra)
        (self.path / JOURNAL).unlink(missing_ok=True)


def _provenance_state() -> dict:
    """The driver's running stage (command, inputs, seed), for the actors' writers."""
    return provenance.record()


def _with_provenance(state: dict):
    """Context in an actor: writers' stamp() records the driver's command and inputs."""
    ctx = provenance.recording((), seed=state.get("seed"), command=state.get("command"))
    st = ctx.__enter__()
    st["inputs"] = list(state.get("inputs", []))
    return ctx


def _set_threads(cpus_per_worker: float) -> None:
    import torch

    torch.set_num_threads(max(1, int(cpus_per_worker)))


# -- encode ---------------------------------------------------------------------------------

class _EncodePart:
    """Ray actor: one backbone replica; each call encodes one part (a row: kind images | captions,
    part number, output directory, pickled records) and writes DIR/part-NNNNN.h5 with
    formats.DenseWriter. Returns kind, name, rows, sha256, skipped (JSON [[id, error], ...])."""

    def __init__(self, backbone, model, device, attrs, dtype, batch_size, precision, loader, strict,
                 cpus_per_worker, prov):
        from .backbones import load_backbone
        from .backbones.base import resolve_device
        from .runtime import resolve_precision

        _set_threads(cpus_per_worker)
        dev = resolve_device(device)
        self.bb = load_backbone(backbone, model, dev)
        self.attrs, self.dtype = attrs, dtype  # attrs: {kind: dense attributes}
        self.batch_size, self.loader, self.strict = batch_size, loader, strict
        self.precision = resolve_precision(precision, dev)
        self.prov = prov

    def __call__(self, batch: dict) -> dict:
        out = {"kind": [], "name": [], "rows": [], "sha256": [], "skipped": []}
        for kind, k, d, blob in zip(batch["kind"], batch["part"], batch["out_dir"], batch["records"]):
            kind = str(kind)
            records = pickle.loads(blob)
            path = Path(str(d)) / part_name(int(k))
            ctx = _with_provenance(self.prov)
            try:
                rows, skipped = (self._images if kind == "images" else self._captions)(records, path)
            finally:
                ctx.__exit__(None, None, None)
            out["kind"].append(kind)
            out["name"].append(path.name)
            out["rows"].append(rows)
            out["sha256"].append(sha256_file(path))
            out["skipped"].append(json.dumps(skipped))
        return {k: np.array(v) for k, v in out.items()}

    def _writer(self, path, kind: str):
        from .formats import DenseWriter

        return DenseWriter(path, self.bb.dim, {**self.attrs[kind], **self.bb.attrs()}, with_texts=kind == "captions",
                           dtype=self.dtype)

    def _images(self, records, path):
        import torch

        from .backbones.encode import image_batches
        from .backbones.shapes import encode_pixel_batch
        from .runtime import autocast

        skipped, rows = [], 0
        with torch.inference_mode(), self._writer(path, "images") as w:
            for ids, pv, bad in image_batches(self.bb, records, self.batch_size, 0, self.loader):
                if bad and self.strict:
                    where = next(r.path for r in records if r.id == bad[0][0])
                    raise InputError(f"{where}: cannot read image ({bad[0][1]}); fix or remove it, "
                                     f"or drop --strict to skip broken images")
                skipped += [list(b) for b in bad]
                if ids:
                    with autocast(self.bb.device, self.precision):
                        res = encode_pixel_batch(self.bb, pv, self.batch_size)
                    w.append(list(ids), res["vectors"].astype(np.float32))
                    rows += len(ids)
        return rows, skipped

    def _captions(self, records, path):
        import torch

        from .backbones.shapes import encode_token_batch
        from .runtime import autocast

        vec = np.zeros((len(records), self.bb.dim), np.float32)
        order = sorted(range(len(records)), key=lambda i: len(records[i].text))  # as the plain path
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                at = order[s:s + self.batch_size]
                with autocast(self.bb.device, self.precision):
                    res = encode_token_batch(self.bb, self.bb.tokenize([records[i].text for i in at]), self.batch_size)
                vec[at] = res["vectors"].astype(np.float32)
        with self._writer(path, "captions") as w:
            if records:
                w.append([c.id for c in records], vec, [c.text for c in records], [c.image_id for c in records])
        return len(records), []


def _fingerprint(kind: str, records, settings: dict) -> dict:
    h = hashlib.sha1()
    for r in records:
        h.update(repr(r).encode())
    return {"kind": kind, "n": len(records), "records_sha1": h.hexdigest(), **settings}


def _drop_captions(pd: _PartDir, gone: set[str]) -> int:
    """Rewrite the caption parts holding captions of unreadable images without them (the plain
    path leaves a skipped image's captions out); updates the journal. Returns rows dropped."""
    import h5py

    from .formats import DenseWriter
    from .formats._h5 import attrs_dict, read_strings

    dropped = 0
    for name, e in sorted(pd.done.items()):
        p = pd.path / name
        with h5py.File(p, "r") as f:
            of = read_strings(f["image_ids"]) if "image_ids" in f else []
            keep = [i for i, x in enumerate(of) if x not in gone]
            if len(keep) == len(of):
                continue
            a = {k: v for k, v in attrs_dict(f).items() if k not in ("format", "dim")}
            ids, texts = read_strings(f["ids"]), read_strings(f["texts"])
            vec = f["vectors"][()]
        with DenseWriter(p, vec.shape[1], a, with_texts=True, dtype=str(vec.dtype)) as w:
            if keep:
                w.append([ids[i] for i in keep], vec[keep], [texts[i] for i in keep], [of[i] for i in keep])
        dropped += len(of) - len(keep)
        pd.add({"name": name, "rows": len(keep), "sha256": sha256_file(p)})
    return dropped


def _encode_split(sd, out: Path, split: str, base: dict, common: dict, part_rows: int | None, workers: int,
                  cpus_per_worker: float, num_gpus_per_worker: float, force: bool, rep: Reporter) -> list:
    """Encode one split's images and captions into OUT/SPLIT-{images,captions}.h5 (sharded) in one
    Ray Data pipeline (one actor pool for both). Returns the captions kept (those of readable images)."""
    from .checks import warn

    files = {}
    if sd.images:
        files["images"] = (list(sd.images), out / f"{split}-images.h5", {**base, "modality": "image"},
                           part_rows or IMAGE_PART_ROWS)
    if sd.captions:
        files["captions"] = (list(sd.captions), out / f"{split}-captions.h5", {**base, "modality": "text"},
                             part_rows or CAPTION_PART_ROWS)
    try:  # the model by what it is (a moved model keeps its parts, one changed in place does not)
        model = {"model_fingerprint": provenance.model_fingerprint(common["model"])}
    except InputError:  # a model only the cluster's machines hold
        model = {"model": common["model"]}
    settings = {"backbone": common["backbone"], **model, "dtype": common["dtype"], "precision": common["precision"]}
    pds, items, attrs, tasks = {}, [], {}, {}
    for kind, (recs, path, a, pr) in files.items():
        fp = _fingerprint(kind, recs, {**settings, "part_rows": pr, "attrs": {k: str(v) for k, v in sorted(a.items())}})
        attrs[kind] = {**a, "extras": "", "fingerprint": json.dumps(fp, sort_keys=True)}
        pds[kind] = pd = _PartDir(path, "dense", fp, max(1, -(-len(recs) // pr)), force, rep.log)
        items += [{"kind": kind, "part": k, "out_dir": str(path.resolve()),
                   "records": pickle.dumps(recs[k * pr:(k + 1) * pr])} for k in pd.todo()]
    skipped = {kind: _journal_skipped(pds[kind].path) for kind in pds}
    stack = contextlib.ExitStack()
    with stack:
        for kind, (recs, path, _, pr) in files.items():
            pd = pds[kind]
            what = "up to date" if pd.up_to_date else f"ray: {len(pd.todo())} of {pd.n_parts} parts"
            tasks[kind] = stack.enter_context(rep.task(f"{path.name} ({what})", total=len(recs)))
            tasks[kind].advance(sum(len(recs[k * pr:(k + 1) * pr]) for k in range(pd.n_parts)
                                    if part_name(k) in pd.done))
        t0, encoded = time.perf_counter(), {k: 0 for k in files}
        if items:
            ctor = dict(attrs=attrs, loader=common["loader"], cpus_per_worker=cpus_per_worker,
                        prov=_provenance_state(), **{k: v for k, v in common.items() if k != "loader"})
            for r in _run_parts(_EncodePart, ctor, items, workers, cpus_per_worker, num_gpus_per_worker):
                kind = r["kind"]
                pds[kind].add(r)
                if kind == "images":
                    skipped[kind] = _journal_skipped(pds[kind].path, r["name"], json.loads(r["skipped"]))
                recs, _, _, pr = files[kind]
                k = int(r["name"][5:10])
                tasks[kind].advance(len(recs[k * pr:(k + 1) * pr]))
                encoded[kind] += int(r["rows"])
                kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts the driver here
        seconds = time.perf_counter() - t0
    gone: list = []
    if "images" in pds:
        pd = pds["images"]
        gone = [tuple(x) for k in range(pd.n_parts) for x in skipped["images"].get(part_name(k), [])]
        if not pd.up_to_date:
            pd.finish(skipped=[list(x) for x in gone])
            (pd.path / ".skipped.json").unlink(missing_ok=True)
        else:
            gone = [tuple(x) for x in read_manifest(pd.path, "dense").get("skipped", [])]
    gone_ids = {i for i, _ in gone}
    if "captions" in pds and not pds["captions"].up_to_date:
        if gone_ids:
            _drop_captions(pds["captions"], gone_ids)
        pds["captions"].finish()
    for kind, (recs, path, _, _) in files.items():
        rows = sum(e["rows"] for e in pds[kind].done.values())
        if not encoded[kind] and Path(path).exists():
            os.utime(path)  # checked and kept: up to date for Make (see api/encoding.py)
        rate = (f", {encoded[kind] / seconds:.1f} {kind}/s (with the other kind in the same pool)"
                if encoded[kind] and seconds > 0 else " (already encoded)")
        rep.log(f"{split} {kind}: {rows} rows -> {path}{rate}")
    if gone:
        ex = "; ".join(f"{i}: {e}" for i, e in gone[:3])
        warn(f"{split}: skipped {len(gone)} unreadable image(s) and their captions (e.g. {ex}); "
             f"use --strict to fail instead")
    return [c for c in sd.captions if c.image_id not in gone_ids]


def _journal_skipped(out: Path, name: str | None = None, skipped: list | None = None) -> dict:
    """Skipped images per part, kept beside the journal (DIR/.skipped.json) until the manifest
    holds them; with `name` adds that part's list. Returns {part name: [[id, error], ...]}."""
    p = out / ".skipped.json"
    try:
        d = json.loads(p.read_text()) if p.is_file() else {}
    except (OSError, ValueError):
        d = {}
    if name is not None:
        d[name] = skipped or []
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, p)
    return d


def encode_splits(todo: dict, *, out: Path, opts, name: str, source: str,
                  progress: Reporter | None = None) -> Path:
    """`encode_dense(..., ray=ADDRESS)`: per split S, OUT/S-images.h5 and OUT/S-captions.h5 as
    sharded dense directories (formats/sharded.py) and OUT/S.qrels, through one Ray Data actor
    pool per split of `opts.workers` backbone replicas (`num_gpus_per_worker` GPUs,
    `cpus_per_worker` CPUs and torch threads each; workers None = runtime.default_workers()).
    todo: {split: SplitData} as mmsparse.api.encoding prepared it (limits applied, empty captions
    dropped); opts: its EncodeOptions, with `model` set. part_rows: records per part (default 1024
    images, 4096 captions). Rows equal the single-process files' (vectors within float tolerance:
    other batches); an unreadable image is left out with its captions, as there.
    Raises InputError for options the Ray path does not support (extras) or a Ray that cannot
    start."""
    from .formats import write_qrels
    from .runtime import default_workers

    extras = [e for e in ("pre_projection", "token_states", "patch_states", "final_layer_inputs") if getattr(opts, e)]
    if extras:
        raise InputError(f"--ray: extra datasets ({', '.join('--' + e.replace('_', '-') for e in extras)}) are "
                         "written by the single-process path only; drop --ray or the extra options")
    workers, cpus_per_worker = default_workers() if opts.workers is None else opts.workers, opts.cpus_per_worker
    _check_pool(workers, opts.num_gpus_per_worker, cpus_per_worker)
    rep = reporter(progress)
    init_ray(opts.ray, workers, cpus_per_worker)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for s, sd in todo.items():
        base = {"dataset": opts.dataset or name, "split": s, "source": source}
        if opts.limit:
            base["limit"] = int(opts.limit)
        common = dict(backbone=opts.backbone, model=opts.model, device=opts.device, dtype=opts.dtype,
                      batch_size=opts.batch_size, precision=opts.precision, strict=opts.strict, loader=sd.loader)
        with output_lock(out / f"{s}-images.h5"), output_lock(out / f"{s}-captions.h5"):  # one writer each
            caps = _encode_split(sd, out, s, base, common, opts.part_rows, workers, cpus_per_worker,
                                 opts.num_gpus_per_worker, opts.force, rep)
        qrels = {c.id: {c.image_id: 1} for c in caps if c.image_id}
        if qrels:
            write_qrels(out / f"{s}.qrels", qrels, meta={"dataset": base["dataset"], "split": s})
    return out


# -- sparsify -------------------------------------------------------------------------------

def _slice_dense(src, a: int, b: int, path: Path) -> None:
    """Rows [a, b) of dense file or sharded directory `src` as a dense HDF5 file `path`: every
    per-row dataset sliced, file-level datasets and attributes copied (what a method reads)."""
    import h5py

    from .formats.sharded import open_read

    with open_read(src) as f, h5py.File(path, "w") as g:
        n = f["ids"].shape[0]
        for k, v in f.attrs.items():
            g.attrs[k] = v
        for k in f:
            ds = f[k]
            if not isinstance(ds, h5py.Dataset):
                continue
            data = ds[a:b] if ds.shape and ds.shape[0] == n else ds[()]
            g.create_dataset(k, data=data, dtype=ds.dtype)


class _SparsifyPart:
    """Ray actor: one head replica; each call sparsifies rows [start, stop) of the dense input
    through the head's method (the single-process code, on a slice of the input) and writes
    DIR/part-NNNNN.h5 with formats.write_sparse. Returns name, rows, sha256."""

    def __init__(self, head, head_dir, dense, out_dir, mode, options, batch_size, out_attrs,
                 cpus_per_worker, prov):
        from .methods import get_method
        from .methods.head import load_head

        _set_threads(cpus_per_worker)
        self.h = head if head is not None else load_head(head_dir)
        self.m = get_method(self.h.method)
        self.head_dir = Path(head_dir) if head_dir else None
        self.dense, self.out_dir, self.mode = dense, Path(out_dir), mode
        self.options, self.batch_size, self.out_attrs, self.prov = options, batch_size, out_attrs, prov

    def __call__(self, batch: dict) -> dict:
        from .formats.sparse import write_sparse

        out = {"name": [], "rows": [], "sha256": []}
        for k, a, b in zip(batch["part"], batch["start"], batch["stop"]):
            path = self.out_dir / part_name(int(k))
            ctx = _with_provenance(self.prov)
            try:
                with tempfile.TemporaryDirectory(prefix="mmsparse-part-") as tmp:
                    piece = Path(tmp) / "dense.h5"
                    _slice_dense(self.dense, int(a), int(b), piece)
                    res = self.m.sparsify(self.h, self.head_dir, piece, path, self.mode, self.options,
                                          self.batch_size, reporter(None))
                if res.matrix.nnz and not np.isfinite(res.matrix.data).all():
                    raise InputError(f"{self.dense}: the head gives NaN/Inf weights for some rows of part {k}; "
                                     "check the input vectors")
                write_sparse(path, res.ids, res.matrix, self.h.vocab, {**res.attrs, **self.out_attrs}, res.texts)
            finally:
                ctx.__exit__(None, None, None)
            out["name"].append(path.name)
            out["rows"].append(len(res.ids))
            out["sha256"].append(sha256_file(path))
        return {k: np.array(v) for k, v in out.items()}


@locks_output("out")  # one writer of the part directory at a time
def sparsify_parts(head, head_dir: Path | None, dense: Path, out: Path, mode: str, options: dict,
                   batch_size: int, out_attrs: dict, *, n_rows: int, ray: str, workers: int = 1,
                   num_gpus_per_worker: float = 0.0, cpus_per_worker: float = 1,
                   part_rows: int | None = None, force: bool = False,
                   progress: Reporter | None = None) -> Path:
    """`sparsify(..., ray=ADDRESS)`: the `n_rows` rows of dense input `dense` (file or sharded
    directory) through the head in parts of `part_rows` rows (default 65,536), one head replica
    per Ray actor, into sharded sparse directory `out` (formats/sharded.py). out_attrs: the sparse
    attributes the single-process path writes (the method's own are added per part). head: a
    loaded SparseHead (sent to the actors) or None (each actor loads `head_dir`). Resumable: a
    rerun redoes only missing or corrupt parts. Returns `out`."""
    _check_pool(workers, num_gpus_per_worker, cpus_per_worker)
    if part_rows is not None and part_rows < 1:
        raise InputError(f"--part-rows {part_rows}: must be >= 1")
    rep = reporter(progress)
    pr = part_rows or SPARSIFY_PART_ROWS
    n_parts = max(1, -(-n_rows // pr))
    dense = Path(dense).resolve()
    src = provenance.content_hash(dense)
    fp = {"kind": "sparsify", "dense": str(dense), "dense_hash": src, "n": n_rows, "part_rows": pr,
          "mode": mode, "options": {k: repr(v) for k, v in sorted(options.items())},
          "head": str(Path(head_dir).resolve()) if head_dir else "",
          "head_hash": provenance.content_hash(head_dir) if head_dir else {},
          "attrs": {k: str(v) for k, v in sorted(out_attrs.items())}}
    pd = _PartDir(Path(out), "sparse", fp, n_parts, force, rep.log)
    if pd.up_to_date:
        rep.log(f"sparsify: {out} is up to date ({n_rows} rows)")
        return Path(out)
    init_ray(ray, workers, cpus_per_worker)
    todo = pd.todo()
    items = [{"part": k, "start": k * pr, "stop": min(n_rows, (k + 1) * pr)} for k in todo]
    ctor = dict(head=head if head_dir is None else None, head_dir=str(head_dir) if head_dir else None,
                dense=str(dense), out_dir=str(Path(out).resolve()), mode=mode, options=options,
                batch_size=batch_size, out_attrs=out_attrs, cpus_per_worker=cpus_per_worker,
                prov=_provenance_state())
    with rep.task(f"sparsify {mode} (ray: {len(todo)} of {n_parts} parts, {workers} worker(s))",
                  total=n_rows) as task:
        task.advance(sum(min(n_rows, (k + 1) * pr) - k * pr for k in range(n_parts) if k not in todo))
        if todo:
            for r in _run_parts(_SparsifyPart, ctor, items, workers, cpus_per_worker, num_gpus_per_worker):
                pd.add(r)
                task.advance(int(r["rows"]))
                kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts the driver here
    pd.finish()
    rep.log(f"sparsify: {n_rows} rows -> {out} ({n_parts} parts, ray)")
    return Path(out)
