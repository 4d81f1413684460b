"""Encode image / caption records with a Backbone into dense HDF5 files, resumably.

An output that already holds the same settings and inputs (attribute `fingerprint`) is kept
unless force=True. Rows are encoded in shards of `shard_rows` records; each finished shard is written atomically to
OUT.partial/shard-NNNNN.h5 beside the target OUT, so an interrupted run that is started again
with the same settings skips the finished shards. When all shards exist they are streamed into
OUT through formats.DenseWriter in row blocks and the partial directory is removed; memory is
O(batch) throughout. Encoding
is deterministic, so a resumed run yields the same rows as an uninterrupted one.

Extra datasets in the dense file (only when asked for):
  pre_projection    [N, h] float32   pooled tower state before the projection (the [CLS] state for
                                     BLIP), plus file-level datasets image_proj_weight [d, h_img],
                                     text_proj_weight [d, h_txt] (and *_proj_bias [d] if any), so
                                     vectors = normalize(pre_projection @ W.T + b)
  token_states      [N, L, h_txt]    captions: last-layer token states, L = max_length, padded
  token_mask        [N, L] uint8     captions: 1 = real token (incl. [CLS]/[SEP]), 0 = padding
  token_ids         [N, L] int32     captions: input token ids (pad id where token_mask = 0)
  patch_states      [N, P, h_img]    images: patch/grid states of hidden layer `layer` (-1 = last;
                                     ViTs include the [CLS] position first; conv maps are flattened
                                     row-major to P = H*W)
token/patch states are stored as `states_dtype` (float16 by default).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

from ..atomic import atomic_path, kill_point
from ..errors import InputError
from ..formats import DenseWriter
from ..formats._h5 import STR, read_strings
from ..data.records import CaptionRecord, ImageRecord
from .base import Backbone

FINGERPRINT = "fingerprint.json"
MERGE_ROWS = 256


@dataclass
class EncodeResult:
    """What one encode call did: rows written, records skipped (broken images) and seconds spent
    encoding in this run (resumed shards cost nothing; `encoded` counts rows encoded now)."""

    path: Path
    rows: int
    encoded: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else float("nan")


# -- images -----------------------------------------------------------------------------------

def load_image(path: Path):
    """Open an image file fully decoded as RGB. Raises OSError/ValueError for unreadable files."""
    from PIL import Image
    with Image.open(path) as im:
        im.load()
        return im.convert("RGB")


class _ImageSet:
    """torch Dataset over ImageRecords: item -> (id, RGB image or None, error text)."""

    def __init__(self, records: Sequence[ImageRecord]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        try:
            return r.id, load_image(r.path), ""
        except Exception as e:  # noqa: BLE001 — any decoder failure is a broken image
            return r.id, None, f"{type(e).__name__}: {e}"


class _Collate:
    """Runs in the DataLoader worker: preprocess the batch's good images there."""

    def __init__(self, preprocess):
        self.preprocess = preprocess

    def __call__(self, items):
        good = [(i, im) for i, im, _ in items if im is not None]
        bad = [(i, err) for i, im, err in items if im is None]
        pv = self.preprocess([im for _, im in good]) if good else None
        return [i for i, _ in good], pv, bad


def _image_batches(backbone: Backbone, records, batch_size: int, workers: int):
    from torch.utils.data import DataLoader
    return DataLoader(_ImageSet(records), batch_size=batch_size, shuffle=False, num_workers=workers,
                      collate_fn=_Collate(backbone.image_preprocessor),
                      prefetch_factor=2 if workers > 0 else None, persistent_workers=False)


# -- shards -----------------------------------------------------------------------------------

def _fingerprint(kind: str, backbone: Backbone, records, settings: dict) -> dict:
    h = hashlib.sha1()
    for r in records:
        h.update(repr(r).encode())
    return {"kind": kind, "backbone": backbone.name, "model": backbone.model,
            "max_length": backbone.max_length, "n": len(records), "records_sha1": h.hexdigest(),
            **settings}


def _prepare_partial(partial: Path, fp: dict, log) -> None:
    f = partial / FINGERPRINT
    if partial.is_dir():
        try:
            old = json.loads(f.read_text())
        except (OSError, ValueError):
            old = None
        if old == fp:
            done = len(list(partial.glob("shard-*.h5")))
            if done:
                log(f"resuming {partial.name}: {done} finished shard(s) kept")
            return
        log(f"discarding {partial} (made with different settings or inputs)")
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    f.write_text(json.dumps(fp, sort_keys=True))


def _finished(out: Path, fp_text: str):
    """(rows, skipped) if `out` is a complete file made with fingerprint `fp_text`, else None."""
    if not out.is_file():
        return None
    try:
        with h5py.File(out, "r") as f:
            if f.attrs.get("fingerprint") != fp_text:
                return None
            skipped = [tuple(x.split("\t", 1)) for x in read_strings(f["skipped"])] if "skipped" in f else []
            return int(f["ids"].shape[0]), skipped
    except OSError:
        return None


class _ShardWriter:
    """One shard file, written row block by row block (memory O(batch)) into a temporary file
    that appears as `path` only on commit(). Datasets: ids (texts, image_ids), vectors, extras,
    skipped ("id<TAB>error" per unreadable image)."""

    def __init__(self, path: Path, n_rows: int | None = None):
        self._ctx = atomic_path(path)
        self.f = h5py.File(self._ctx.__enter__(), "w")
        self.n_rows = n_rows  # fixed size (rows written by position) or None (appended)

    def strings(self, name: str, values: list[str]) -> None:
        if name not in self.f:
            self.f.create_dataset(name, (0,), maxshape=(None,), dtype=STR, chunks=(1024,))
        ds = self.f[name]
        n0 = ds.shape[0]
        ds.resize((n0 + len(values),))
        ds[n0:] = values

    def rows(self, name: str, arr: np.ndarray, at: np.ndarray | None = None) -> None:
        """Append `arr` rows, or write them at row positions `at` (fixed-size shards)."""
        if name not in self.f:
            tail = arr.shape[1:]
            per_row = max(1, int(np.prod(tail, dtype=np.int64)) * arr.dtype.itemsize)
            chunk = max(1, min(1024, (1 << 20) // per_row))
            n = self.n_rows if at is not None else 0
            self.f.create_dataset(name, (n, *tail), maxshape=(None, *tail), dtype=arr.dtype,
                                  chunks=(chunk, *tail))
        ds = self.f[name]
        if at is None:
            n0 = ds.shape[0]
            ds.resize(n0 + arr.shape[0], axis=0)
            ds[n0:] = arr
        else:
            o = np.argsort(at)  # h5py wants increasing indices
            ds[at[o]] = arr[o]

    def commit(self, skipped: list[tuple[str, str]]) -> None:
        if "ids" not in self.f:
            self.strings("ids", [])
        if "vectors" not in self.f:
            self.f.create_dataset("vectors", data=np.zeros((0,), np.float32))
        self.f.create_dataset("skipped", data=np.array([f"{i}\t{e}" for i, e in skipped], dtype=object),
                              dtype=STR)
        self.f.close()
        self._ctx.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        self.f.close()
        try:
            self._ctx.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException:
            pass


def _pad_tokens(res: dict, length: int, pad_id: int, states_dtype) -> dict:
    """Pad token_* arrays of one batch from its longest length to the fixed `length`."""
    out = dict(res)
    n, l_ = res["token_mask"].shape
    if l_ < length:
        p = length - l_
        out["token_states"] = np.pad(res["token_states"], ((0, 0), (0, p), (0, 0)))
        out["token_mask"] = np.pad(res["token_mask"], ((0, 0), (0, p)))
        out["token_ids"] = np.pad(res["token_ids"], ((0, 0), (0, p)), constant_values=pad_id)
    out["token_states"] = out["token_states"].astype(states_dtype)
    return out


def _merge(out: Path, partial: Path, n_shards: int, dim: int, attrs: dict, text: bool,
           dtype: str, projections: dict) -> tuple[int, list[tuple[str, str]]]:
    skipped: list[tuple[str, str]] = []
    rows = 0
    with DenseWriter(out, dim, attrs, with_texts=text, dtype=dtype) as w:
        for s in range(n_shards):
            with h5py.File(partial / f"shard-{s:05d}.h5", "r") as f:
                skipped += [tuple(x.split("\t", 1)) for x in read_strings(f["skipped"])]
                n = f["ids"].shape[0]
                extra = [k for k in f if k not in ("ids", "texts", "image_ids", "vectors", "skipped")]
                for a in range(0, n, MERGE_ROWS):  # row blocks: memory O(block), not O(shard)
                    sl = slice(a, min(n, a + MERGE_ROWS))
                    texts = read_strings(f["texts"][sl]) if text else None
                    image_ids = read_strings(f["image_ids"][sl]) if text else None
                    w.append(read_strings(f["ids"][sl]), f["vectors"][sl], texts, image_ids)
                    for k in extra:
                        w.append_extra(k, f[k][sl])
                rows += n
        for k, v in projections.items():
            w.set_extra(k, v)
        if skipped:  # ids of unreadable images, "id<TAB>error", so reruns know what was left out
            w.set_extra("skipped", np.array([f"{i}\t{e}" for i, e in skipped], dtype=object).astype(STR))
    return rows, skipped


def _run_shards(kind, backbone, records, out, attrs, shard_rows, dtype, extras, states_dtype,
                layer, encode_shard, progress, log, force) -> EncodeResult:
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    settings = {"extras": sorted(extras), "layer": layer, "states_dtype": states_dtype,
                "shard_rows": shard_rows, "dtype": dtype, "attrs": {k: str(v) for k, v in sorted(attrs.items())}}
    fp = _fingerprint(kind, backbone, records, settings)
    fp_text = json.dumps(fp, sort_keys=True)
    if not force:
        done = _finished(out, fp_text)
        if done is not None:
            if progress:
                progress.add_task(f"{out.name} (up to date)", total=len(records), completed=len(records))
            return EncodeResult(out, done[0], 0, 0.0, done[1])
    _prepare_partial(partial, fp, log)
    n_shards = max(1, -(-len(records) // shard_rows))
    encoded, seconds = 0, 0.0
    task = progress.add_task(f"{out.name}", total=len(records)) if progress else None
    for s in range(n_shards):
        shard = records[s * shard_rows:(s + 1) * shard_rows]
        path = partial / f"shard-{s:05d}.h5"
        if not path.exists():
            t0 = time.perf_counter()
            sw = _ShardWriter(path, len(shard) if kind == "captions" else None)
            try:
                skipped = encode_shard(shard, sw, lambda k: progress.advance(task, k) if progress else None)
                encoded += sw.f["ids"].shape[0] if "ids" in sw.f else 0
                sw.commit(skipped)
            except BaseException as e:
                sw.abort(e)
                raise
            seconds += time.perf_counter() - t0
        elif progress:
            progress.advance(task, len(shard))
    side = "image_" if kind == "images" else "text_"
    proj = ({k: v for k, v in backbone.projections().items() if k.startswith(side)}
            if "pre_projection" in extras else {})
    a = {**attrs, **backbone.attrs(), "extras": ",".join(sorted(extras)), "fingerprint": fp_text}
    if "patch_states" in extras:
        a["patch_layer"] = int(layer)
    n, skipped = _merge(out, partial, n_shards, backbone.dim, a, kind == "captions", dtype, proj)
    shutil.rmtree(partial, ignore_errors=True)
    return EncodeResult(out, n, encoded, seconds, skipped)


# -- public -----------------------------------------------------------------------------------

def encode_images_file(backbone: Backbone, records: Sequence[ImageRecord], out: str | Path, attrs: dict,
                       batch_size: int = 64, workers: int = 1, dtype: str = "float32",
                       extras: Sequence[str] = (), layer: int = -1, states_dtype: str = "float16",
                       strict: bool = False, shard_rows: int = 1024, progress=None,
                       log=print, force: bool = False) -> EncodeResult:
    """Encode images into dense file `out` (modality=image, ids = record ids, vectors [N, d]).

    extras: subset of ("pre_projection", "patch_states"). Broken or missing images are skipped and
    listed in the result (strict=True raises InputError naming the first one instead).
    attrs: the dense attributes other than backbone/model/normalized/dim (modality, dataset, split...).
    """
    import torch
    sd = np.dtype(states_dtype)
    ex = tuple(e for e in extras if e in ("pre_projection", "patch_states"))

    def encode_shard(shard, sw, advance):
        skipped = []
        for ids, pv, bad in _image_batches(backbone, shard, batch_size, workers):
            if bad and strict:
                path = next(r.path for r in shard if r.id == bad[0][0])
                raise InputError(f"{path}: cannot read image ({bad[0][1]}); fix or remove it, "
                                 f"or drop --strict to skip broken images")
            skipped += bad
            if ids:
                res = backbone.encode_pixels(pv, ex, layer)
                sw.strings("ids", ids)
                sw.rows("vectors", res["vectors"].astype(np.float32))
                for e in ex:
                    sw.rows(e, res[e].astype(sd if e == "patch_states" else np.float32))
            advance(len(ids) + len(bad))
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        return skipped

    with torch.inference_mode():
        return _run_shards("images", backbone, list(records), out, attrs, shard_rows, dtype, ex,
                           states_dtype, layer, encode_shard, progress, log, force)


def encode_captions_file(backbone: Backbone, records: Sequence[CaptionRecord], out: str | Path, attrs: dict,
                         batch_size: int = 64, dtype: str = "float32", extras: Sequence[str] = (),
                         states_dtype: str = "float16", shard_rows: int = 4096, progress=None,
                         log=print, force: bool = False) -> EncodeResult:
    """Encode captions into dense file `out` (modality=text, ids = caption ids, texts and image_ids
    stored, vectors [N, d]). extras: subset of ("pre_projection", "token_states"); token_states
    also stores token_mask and token_ids, padded to backbone.max_length."""
    import torch
    sd = np.dtype(states_dtype)
    ex = tuple(e for e in extras if e in ("pre_projection", "token_states"))
    keys = [e for e in ex if e != "token_states"] + (["token_states", "token_mask", "token_ids"]
                                                     if "token_states" in ex else [])
    pad = backbone.tokenizer.pad_token_id or 0

    def encode_shard(shard, sw, advance):
        sw.strings("ids", [c.id for c in shard])
        sw.strings("texts", [c.text for c in shard])
        sw.strings("image_ids", [c.image_id for c in shard])
        # batches of similar length waste less compute on padding; rows are written back at
        # their file positions
        order = np.array(sorted(range(len(shard)), key=lambda i: len(shard[i].text)), dtype=np.int64)
        for s in range(0, len(order), batch_size):
            at = order[s:s + batch_size]
            res = backbone.encode_tokens(backbone.tokenize([shard[i].text for i in at]), ex)
            if "token_states" in ex:
                res = _pad_tokens(res, backbone.max_length, pad, sd)
            sw.rows("vectors", res["vectors"].astype(np.float32), at)
            for k in keys:
                sw.rows(k, res[k], at)
            advance(len(at))
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        return []

    with torch.inference_mode():
        return _run_shards("captions", backbone, list(records), out, attrs, shard_rows, dtype, ex,
                           states_dtype, -1, encode_shard, progress, log, force)
