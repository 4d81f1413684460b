"""Encode image / caption records with a Backbone into dense HDF5 files, resumably.

An output that already holds the same settings and inputs (attribute `fingerprint`) is kept
unless force=True. Rows are encoded in shards of `shard_rows` records; each finished shard is written atomically to
OUT.partial/shard-NNNNN.h5 beside the target OUT, so an interrupted run that is started again
with the same settings skips the finished shards. When all shards exist they are streamed into
OUT through formats.DenseWriter in row blocks and the partial directory is removed; memory is
O(batch) throughout. Encoding
is deterministic, so a resumed run yields the same rows as an uninterrupted one. The output's
write lock (atomic.output_lock) is held from the up-to-date check to the merge, so a second
writer of OUT stops (exit 2) instead of sharing OUT.partial.

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
  final_input       [N, L, h_txt]    captions: hidden states entering the text tower's final layer,
                    [N, C, H, W]     images: the feature map entering a convolutional tower's final block,
                    [N, P, h_img]    or the hidden states entering a ViT's last block
  final_mask        [N, L] uint8     captions: attention mask of final_input (backbones/final_layer.py;
                                     file attribute `final_layer`: the layer's JSON description)
token/patch states and final_input are stored as `states_dtype` (float16 by default).

Options are one `EncodeOptions` (backbones/options.py); the functions below also take its fields
as keywords. Speed: images are decoded and preprocessed by a torch DataLoader with `workers`
processes (0 = in the calling process; the vectors are byte-identical either way, the model runs
in the calling process), batches go through pinned memory on CUDA, `precision` bf16/fp16 runs the
encoders under autocast (CUDA, or bf16 on a CPU with AMX/AVX512-BF16: mmsparse.runtime), entered
once per file so cast weights are reused across batches (vectors are still normalised and stored
as float32/`dtype`), and `memory_format` lays convolutional image towers out channels-last where
that is faster (Backbone.set_memory_format). On CUDA every batch is padded to one shape (shapes.py:
a new shape costs seconds of kernel set-up there). Progress goes to a `mmsparse.progress.Reporter` (one
task per output file; resume messages as log lines); nothing here prints.
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

from ..atomic import atomic_path, kill_point, locks_output
from ..errors import InputError
from ..formats import DenseWriter
from ..formats._h5 import STR, read_strings
from ..data.records import CaptionRecord, ImageRecord
from ..progress import Reporter, reporter
from ..provenance import check_input
from ..runtime import autocast, default_workers, resolve_precision
from .base import Backbone
from .options import EncodeOptions
from .shapes import encode_pixel_batch, encode_token_batch

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


def _load_record(record: ImageRecord):
    return load_image(record.path)


class _ImageSet:
    """torch Dataset over ImageRecords: item -> (id, RGB image or None, error text). `loader`
    (picklable, record -> PIL image) reads an image; default: the file at record.path."""

    def __init__(self, records: Sequence[ImageRecord], loader=None):
        self.records = records
        self.loader = loader or _load_record

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        try:
            im = self.loader(r)
            return r.id, im if im.mode == "RGB" else im.convert("RGB"), ""
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


class _RangeBatches:
    """Batch sampler: consecutive index batches of at most `batch_size` within each [start, stop)
    range, ranges in order (a batch never spans two shards)."""

    def __init__(self, ranges: Sequence[tuple[int, int]], batch_size: int):
        self.ranges, self.batch_size = list(ranges), batch_size

    def __iter__(self):
        for a, b in self.ranges:
            for i in range(a, b, self.batch_size):
                yield list(range(i, min(b, i + self.batch_size)))

    def __len__(self) -> int:
        return sum(-(-(b - a) // self.batch_size) for a, b in self.ranges)


def image_batches(backbone: Backbone, records, batch_size: int, workers: int, loader=None,
                  ranges: Sequence[tuple[int, int]] | None = None):
    """DataLoader over `records` in order (only the index `ranges` [start, stop), default all):
    batches (ids, pixel_values [B, 3, H, W] float32 or None, [(id, error)] of unreadable images),
    decoded and preprocessed by `workers` processes (0 = here), which keep working ahead across
    ranges; pinned memory when the backbone runs on CUDA."""
    from torch.utils.data import DataLoader
    sampler = _RangeBatches(ranges or [(0, len(records))], batch_size)
    return DataLoader(_ImageSet(records, loader), batch_sampler=sampler, num_workers=workers,
                      collate_fn=_Collate(backbone.image_preprocessor),
                      pin_memory=str(backbone.device).startswith("cuda"),
                      prefetch_factor=2 if workers > 0 else None, persistent_workers=False)


# -- shards -----------------------------------------------------------------------------------

def _fingerprint(kind: str, backbone: Backbone, records, settings: dict) -> dict:
    h = hashlib.sha1()
    for r in records:
        h.update(repr(r).encode())
    # the model by what it is, not where it lies: a moved model keeps its outputs, one changed in
    # place is encoded again
    fp = backbone.fingerprint()
    model = {"model_fingerprint": fp} if fp else {"model": backbone.model}
    return {"kind": kind, "backbone": backbone.name, **model,
            "max_length": backbone.max_length, "n": len(records), "records_sha1": h.hexdigest(),
            **settings}


def _kept_from_before_fingerprints(recorded: str, fp: dict, attrs, model: str) -> bool:
    """An output written before model fingerprints (its `fingerprint` names the model by path)
    with the settings of `fp` is kept when the model is the one at that path and is unchanged since:
    the file's recorded model input (provenance `inputs`) still has its hash. Such a file keeps no
    `model_fingerprint`; `encode-dense --force` writes one."""
    try:
        old = json.loads(recorded)
        inputs = json.loads(attrs.get("inputs", "[]"))
    except (TypeError, ValueError):
        return False
    if not isinstance(old, dict) or "model_fingerprint" in old or "model_fingerprint" not in fp:
        return False
    if {k: v for k, v in old.items() if k != "model"} != {k: v for k, v in fp.items() if k != "model_fingerprint"}:
        return False
    if old.get("model") != model:
        return False
    rec = next((r for r in inputs if isinstance(r, dict) and r.get("kind") == "model" and r.get("path") == model), None)
    return rec is not None and check_input(rec) == "ok"


def _prepare_partial(partial: Path, fp: dict, log) -> None:  # log: str -> None
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


def _finished(out: Path, fp_text: str, model: str):
    """(rows, skipped) if `out` is a complete file made with fingerprint `fp_text` (or before
    fingerprints, from the unchanged `model`), else None."""
    if not out.is_file():
        return None
    try:
        with h5py.File(out, "r") as f:
            rec = f.attrs.get("fingerprint")
            if rec != fp_text and not _kept_from_before_fingerprints(rec, json.loads(fp_text), f.attrs, model):
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


def _pad_final(res: dict, length: int, states_dtype) -> dict:
    """Pad final_input / final_mask of one caption batch to the fixed `length` (as _pad_tokens)."""
    out = dict(res)
    p = length - res["final_mask"].shape[1]
    if p > 0:
        out["final_input"] = np.pad(res["final_input"], ((0, 0), (0, p), (0, 0)))
        out["final_mask"] = np.pad(res["final_mask"], ((0, 0), (0, p)))
    out["final_input"] = out["final_input"].astype(states_dtype)
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


@locks_output("out")  # one writer per output: two would share (and delete) OUT.partial
def _run_shards(kind, backbone, records, out, attrs, opts: EncodeOptions, precision: str, shard_rows: int,
                encode_shard, rep: Reporter, begin=None) -> EncodeResult:
    """Encode `records` shard by shard (see the module docstring) and merge into `out`.
    encode_shard(shard records, shard writer, advance) -> skipped [(id, error)]; begin(ranges), if
    given, is called once with the [start, stop) record ranges of the shards still to encode.
    precision: the resolved one (fp32 | bf16 | fp16)."""
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    extras = opts.extras(kind)
    if "final_input" in extras:  # InputError for backbones without a known final layer, before any work
        backbone.final_layer_spec("image" if kind == "images" else "text")
    layer = opts.layer if kind == "images" else -1
    settings = {"extras": sorted(extras), "layer": layer, "states_dtype": opts.states_dtype,
                "shard_rows": shard_rows, "dtype": opts.dtype, "attrs": {k: str(v) for k, v in sorted(attrs.items())}}
    if precision != "fp32":  # fp32 files keep the fingerprint they had before --precision existed
        settings["precision"] = precision
    onnx = backbone.runs_onnx(extras, layer)
    if kind == "images" and backbone.channels_last and not onnx:  # likewise contiguous files before --memory-format
        settings["memory_format"] = "channels-last"
    if onnx:  # and PyTorch files before --runtime
        settings["runtime"] = "onnx"
    fp = _fingerprint(kind, backbone, records, settings)
    fp_text = json.dumps(fp, sort_keys=True)
    if not opts.force:
        done = _finished(out, fp_text, backbone.model)
        if done is not None:
            with rep.task(f"{out.name} (up to date)", total=len(records)) as t:
                t.advance(len(records))
            return EncodeResult(out, done[0], 0, 0.0, done[1])
    _prepare_partial(partial, fp, rep.log)
    n_shards = max(1, -(-len(records) // shard_rows))
    encoded, seconds = 0, 0.0
    if begin is not None:
        begin([(s * shard_rows, min(len(records), (s + 1) * shard_rows)) for s in range(n_shards)
               if not (partial / f"shard-{s:05d}.h5").exists()])
    with rep.task(out.name, total=len(records)) as task, autocast(backbone.device, precision):
        for s in range(n_shards):
            shard = records[s * shard_rows:(s + 1) * shard_rows]
            path = partial / f"shard-{s:05d}.h5"
            if path.exists():
                task.advance(len(shard))
                continue
            t0 = time.perf_counter()
            sw = _ShardWriter(path, len(shard) if kind == "captions" else None)
            try:
                skipped = encode_shard(shard, sw, task.advance)
                encoded += sw.f["ids"].shape[0] if "ids" in sw.f else 0
                sw.commit(skipped)
            except BaseException as e:
                sw.abort(e)
                raise
            seconds += time.perf_counter() - t0
    side = "image_" if kind == "images" else "text_"
    proj = ({k: v for k, v in backbone.projections().items() if k.startswith(side)}
            if "pre_projection" in extras else {})
    a = {**attrs, **backbone.attrs(), "extras": ",".join(sorted(extras)), "fingerprint": fp_text}
    if "patch_states" in extras:
        a["patch_layer"] = int(layer)
    if "final_input" in extras:
        a["final_layer"] = json.dumps(backbone.final_layer_spec("image" if kind == "images" else "text"),
                                      sort_keys=True)
    if precision != "fp32":
        a["precision"] = precision
    if onnx:
        a["runtime"] = "onnx"
    n, skipped = _merge(out, partial, n_shards, backbone.dim, a, kind == "captions", opts.dtype, proj)
    shutil.rmtree(partial, ignore_errors=True)
    return EncodeResult(out, n, encoded, seconds, skipped)


def _precision(backbone: Backbone, opts: EncodeOptions, extras, layer: int = -1) -> str:
    """The precision the towers compute in: fp32 where they run in ONNX Runtime (Backbone.runs_onnx; --precision
    auto or fp32, InputError for bf16/fp16), else runtime.resolve_precision."""
    if not backbone.runs_onnx(extras, layer):
        return resolve_precision(opts.precision, backbone.device)
    if opts.precision in ("bf16", "fp16"):
        raise InputError(f"--precision {opts.precision}: the towers run in ONNX Runtime, in fp32; use --runtime torch "
                         f"for {opts.precision} autocast")
    return "fp32"


# -- public -----------------------------------------------------------------------------------

def encode_images_file(backbone: Backbone, records: Sequence[ImageRecord], out: str | Path, attrs: dict,
                       options: EncodeOptions | None = None, *, loader=None, shard_rows: int = 1024,
                       progress: Reporter | None = None, **values) -> EncodeResult:
    """Encode images into dense file `out` (modality=image, ids = record ids, vectors [N, d] float32
    or `dtype`), resumably (see the module docstring).

    options: an EncodeOptions; `values` replace its fields (batch_size=32, workers=0, ...). Read
    here: batch_size, workers (DataLoader processes decoding and preprocessing images, 0 = this
    process, same bytes either way; None = runtime.default_workers()), dtype, pre_projection and
    patch_states (extras) with layer and states_dtype, strict, precision (fp32, bf16/fp16 autocast,
    auto; InputError where it cannot run, runtime.resolve_precision), force. The backbone's layout
    is its own (Backbone.set_memory_format). loader: picklable record -> PIL image (default: open
    record.path). Broken or missing images are skipped and listed in the result (strict raises
    InputError naming the first one instead).
    attrs: the dense attributes other than backbone/model/normalized/dim (modality, dataset, split...).
    """
    import torch
    opts = EncodeOptions.make(options, **values)
    sd = np.dtype(opts.states_dtype)
    ex = opts.extras("images")
    precision = _precision(backbone, opts, ex, opts.layer)
    workers = default_workers() if opts.workers is None else opts.workers

    records = list(records)
    batches = {}

    def begin(ranges):  # one DataLoader over every shard still to do: workers never wait for a shard
        batches["it"] = iter(image_batches(backbone, records, opts.batch_size, workers, loader, ranges))

    def encode_shard(shard, sw, advance):
        skipped, done = [], 0
        while done < len(shard):
            ids, pv, bad = next(batches["it"])
            done += len(ids) + len(bad)
            if bad and opts.strict:
                path = next(r.path for r in shard if r.id == bad[0][0])
                raise InputError(f"{path}: cannot read image ({bad[0][1]}); fix or remove it, "
                                 f"or drop --strict to skip broken images")
            skipped += bad
            if ids:
                res = encode_pixel_batch(backbone, pv, opts.batch_size, ex, opts.layer)
                sw.strings("ids", ids)
                sw.rows("vectors", res["vectors"].astype(np.float32))
                for e in ex:
                    sw.rows(e, res[e].astype(sd if e in ("patch_states", "final_input") else np.float32))
            advance(len(ids) + len(bad))
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        return skipped

    with torch.inference_mode():
        return _run_shards("images", backbone, records, out, attrs, opts, precision, shard_rows, encode_shard,
                           reporter(progress), begin)


def encode_captions_file(backbone: Backbone, records: Sequence[CaptionRecord], out: str | Path, attrs: dict,
                         options: EncodeOptions | None = None, *, shard_rows: int = 4096,
                         progress: Reporter | None = None, **values) -> EncodeResult:
    """Encode captions into dense file `out` (modality=text, ids = caption ids, texts and image_ids
    stored, vectors [N, d]). options / values as for encode_images_file; read here: batch_size,
    dtype, pre_projection and token_states (extras; token_states also stores token_mask and
    token_ids, padded to backbone.max_length) with states_dtype, precision, force. Captions are
    not checked here (the caller drops or refuses empty ones)."""
    import torch
    opts = EncodeOptions.make(options, **values)
    sd = np.dtype(opts.states_dtype)
    ex = opts.extras("captions")
    precision = _precision(backbone, opts, ex)
    keys = [e for e in ex if e not in ("token_states", "final_input")] + (
        ["token_states", "token_mask", "token_ids"] if "token_states" in ex else []) + (
        ["final_input", "final_mask"] if "final_input" in ex else [])
    pad = backbone.tokenizer.pad_token_id or 0
    bs = opts.batch_size

    def encode_shard(shard, sw, advance):
        sw.strings("ids", [c.id for c in shard])
        sw.strings("texts", [c.text for c in shard])
        sw.strings("image_ids", [c.image_id for c in shard])
        # batches of similar length waste less compute on padding; rows are written back at
        # their file positions
        order = np.array(sorted(range(len(shard)), key=lambda i: len(shard[i].text)), dtype=np.int64)
        for s in range(0, len(order), bs):
            at = order[s:s + bs]
            res = encode_token_batch(backbone, backbone.tokenize([shard[i].text for i in at]), bs, ex)
            if "token_states" in ex:
                res = _pad_tokens(res, backbone.max_length, pad, sd)
            if "final_input" in ex:
                res = _pad_final(res, backbone.max_length, sd)
            sw.rows("vectors", res["vectors"].astype(np.float32), at)
            for k in keys:
                sw.rows(k, res[k], at)
            advance(len(at))
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        return []

    with torch.inference_mode():
        return _run_shards("captions", backbone, list(records), out, attrs, opts, precision, shard_rows,
                           encode_shard, reporter(progress))
