"""`encode_dense`: images and captions -> dense HDF5 files + qrels, with a frozen dual encoder.

Per split SPLIT it writes OUT/SPLIT-images.h5 and OUT/SPLIT-captions.h5 (dense HDF5: ids, vectors
[N, d] float32 or float16, texts and image_ids for captions; mmsparse/formats/dense.py, extras in
mmsparse/backbones/encode.py) and OUT/SPLIT.qrels (caption id -> the image it describes,
relevance 1), resumably and atomically.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter

if TYPE_CHECKING:
    from ..backbones.options import EncodeOptions


def _select_splits(data: dict, split: Sequence[str] | None, fmt: str, annotations) -> list[str]:
    """The splits to encode. A COCO captions file holds one split (named from the file:
    captions_val2017.json -> val2017); a single `split` names it (e.g. "test")."""
    if fmt == "coco" and split and len(split) == 1 and len(data) == 1 and split[0] not in data:
        (only,) = data
        data[split[0]] = data.pop(only)
    splits = list(dict.fromkeys(split or (["test"] if "test" in data else list(data))))
    missing = [s for s in splits if s not in data]
    if missing:
        raise InputError(f"{annotations}: split(s) {', '.join(missing)} not found; available: {', '.join(data)}"
                         + ("; a COCO captions file holds one split, which a single --split renames"
                            if fmt == "coco" else ""))
    return splits


@provenance.recorded("annotations", "image_root")
def encode_dense(annotations: str | Path, image_root: str | Path | None = None, *, out: str | Path,
                 options: "EncodeOptions | None" = None, progress: Reporter | None = None, **values) -> Path:
    """Encode a dataset's images and captions with a frozen backbone into `out`.

    annotations: a Karpathy split JSON (dataset_*.json), a COCO captions JSON, a captions
    .txt/.jsonl file, an image folder, or (format="hf") a Hugging Face dataset id or directory
    (see mmsparse/data/hf.py). image_root: the directory the JSON's image file names are relative to.
    options: an `mmsparse.backbones.options.EncodeOptions`; `values` are its fields as keywords
    (the command's flags without dashes) and replace it: backbone, model (hub id or local path;
    default $MMSPARSE_MODEL, else the shared Flickr8k dual encoder), split (default: test if
    present, else all; for a COCO file a single split names its one split), format and the hf
    columns, dataset, limit (the first N images of each split, with their captions), strict,
    batch_size, device, workers (DataLoader processes decoding images; 0 = this process, the
    vectors are byte-identical; default: one per 4 cores), threads (torch threads; default: every
    core), precision (fp32 | bf16 | fp16 | auto, mmsparse.runtime.resolve_precision), memory_format,
    dtype, the extras (pre_projection, token_states, patch_states, layer, states_dtype), force and
    the Ray options (ray, num_gpus_per_worker, cpus_per_worker, part_rows).
    Broken images and empty captions are skipped with a counted warning (mmsparse.checks.warn)
    and left out of the files and the qrels (a broken image's captions too); strict raises
    InputError on the first one instead (empty captions and missing image files before the model
    loads). Outputs already made with the same settings and inputs are kept unless force.
    ray: run as a Ray Data pipeline (mmsparse/distributed.py; "local", "auto" or
    "ray://host:10001"): OUT/SPLIT-images.h5 and OUT/SPLIT-captions.h5 become sharded directories
    (parts of `part_rows` records + manifest.json, mmsparse/formats/sharded.py); `workers` is then
    the number of backbone replicas (Ray actors) with `num_gpus_per_worker` GPUs and
    `cpus_per_worker` CPUs each.
    Returns `out` (a Path). Raises InputError for bad input or options.
    """
    from .. import settings
    from ..backbones import load_backbone
    from ..backbones.base import resolve_device
    from ..backbones.options import EncodeOptions
    from ..checks import check_captions, warn
    from ..data import read_dataset
    from ..runtime import cpu_bf16, default_threads, resolve_precision, torch_threads

    rep = reporter(progress)
    out = Path(out)
    opts = EncodeOptions.make(options, **values)
    hf = {"image_column": opts.image_column, "caption_column": opts.caption_column, "id_column": opts.id_column,
          "split_column": opts.split_column} if opts.format == "hf" else {}
    data, name, fmt = read_dataset(annotations, image_root, opts.format, **hf)
    splits = _select_splits(data, opts.split, fmt, annotations)
    todo = {}
    for s in splits:  # bad captions and (with strict) missing images fail before the model loads
        sd = data[s].limit(opts.limit)
        where = f"{annotations} (split {s})"
        if opts.strict:
            check_captions(sd.captions, where)
            if sd.loader is None:
                gone = next((r for r in sd.images if not Path(r.path).is_file()), None)
                if gone is not None:
                    raise InputError(f"{gone.path}: image not found; fix the image root or drop --strict "
                                     f"to skip missing images")
        else:
            sd, empty = sd.without_empty_captions()
            if empty:
                warn(f"{s}: skipped {len(empty)} empty caption(s) (e.g. {', '.join(map(repr, empty[:3]))}); "
                     f"use --strict to fail instead")
        todo[s] = sd
    model_path = str(opts.model) if opts.model is not None else str(settings.dual_encoder_dir())
    provenance.add_inputs([(model_path, "model")])
    source = str(Path(annotations).resolve()) if Path(annotations).exists() else str(annotations)
    if opts.ray is not None:  # a Ray Data pipeline writing sharded outputs (mmsparse/distributed.py)
        if opts.runtime == "onnx":
            raise InputError("--runtime onnx: --ray runs the towers in PyTorch; use --runtime torch (or auto) with "
                             "--ray")
        from ..distributed import encode_splits

        return encode_splits(todo, out=out, opts=dataclasses.replace(opts, model=model_path), name=name,
                             source=source, progress=rep)
    dev = resolve_device(opts.device)
    runtime = _runtime_wanted(opts, rep, dev)
    if runtime == "torch":
        resolve_precision(opts.precision, dev)   # a precision that cannot run here fails before the model loads
    threads = opts.threads or default_threads()
    t0 = time.perf_counter()
    with torch_threads(threads):
        bb = load_backbone(opts.backbone, model_path, dev)
        runtime = bb.set_runtime(runtime, threads, rep.log)
        if runtime == "onnx":
            precision = "fp32"
            if opts.precision == "auto":
                rep.log("--precision auto: fp32 (ONNX Runtime runs the towers in fp32; no native bf16 here)")
        else:
            precision = resolve_precision(opts.precision, dev)
            if opts.precision == "auto":
                why = f"native bf16 ({cpu_bf16() or 'CUDA'})" if precision == "bf16" else "no native bf16 here"
                rep.log(f"--precision auto: {precision} ({why})")
        layout = bb.set_memory_format(opts.memory_format) if runtime == "torch" else "onnx"
        if opts.final_layer_inputs:   # both towers' final layers known before any file is written
            for modality in ("image", "text"):
                bb.final_layer_spec(modality)
        rep.log(f"loaded {opts.backbone} {bb.model} on {bb.device} (d={bb.dim}) in {time.perf_counter() - t0:.1f} s; "
                f"{precision}, {threads} thread(s), " + ("ONNX Runtime" if runtime == "onnx" else
                                                          f"PyTorch, {layout} images"))
        out.mkdir(parents=True, exist_ok=True)
        for s, sd in todo.items():
            _encode_split(bb, sd, out, s, {"dataset": opts.dataset or name, "split": s, "source": source}, opts, rep)
    return out


def _runtime_wanted(opts, rep, dev: str = "cpu") -> str:
    """The runtime to ask the backbone for (Backbone.set_runtime): opts.runtime, except that what ONNX
    Runtime does not run (bf16/fp16 autocast, final-layer inputs, patch states of a --layer other than
    -1) makes auto torch (saying why) and is refused with --runtime onnx (InputError, one line). auto
    with --precision auto also takes torch where bf16 is native (AMX, AVX512-BF16, CUDA): there PyTorch
    bf16 encoded Flickr8k's training images faster than ONNX Runtime fp32 (docs/speed.md)."""
    from ..runtime import resolve_precision

    if opts.runtime == "torch":
        return "torch"
    native = opts.runtime == "auto" and opts.precision == "auto" and resolve_precision("auto", dev) == "bf16"
    why = ("native bf16 here (--precision auto)" if native else
           f"--precision {opts.precision}" if opts.precision in ("bf16", "fp16") else
           "--final-layer-inputs" if opts.final_layer_inputs else
           f"--patch-states --layer {opts.layer}" if opts.patch_states and opts.layer != -1 else None)
    if why is None:
        return opts.runtime
    if opts.runtime == "onnx":
        raise InputError(f"--runtime onnx: {why} needs the PyTorch towers (ONNX Runtime runs them in fp32 and gives "
                         f"vectors, pooled and last states only); use --runtime torch, or drop {why.split()[0]}")
    rep.log(f"--runtime auto: torch ({why}: PyTorch bf16 is faster)" if native else
            f"--runtime auto: torch ({why} needs the PyTorch towers)")
    return "torch"


def _encode_split(bb, sd, out: Path, s: str, base: dict, opts, rep) -> None:
    """One split's images, captions and qrels (the captions of unreadable images left out)."""
    from ..backbones.encode import encode_captions_file, encode_images_file
    from ..checks import warn
    from ..formats import write_qrels

    if opts.limit:
        base["limit"] = int(opts.limit)
    img = None
    if sd.images:
        img = encode_images_file(bb, sd.images, out / f"{s}-images.h5", {**base, "modality": "image"}, opts,
                                 loader=sd.loader, progress=rep)
        _summary(rep, s, "images", img)
        if img.skipped:
            ex = "; ".join(f"{i}: {e}" for i, e in img.skipped[:3])
            warn(f"{s}: skipped {len(img.skipped)} unreadable image(s) and their captions (e.g. {ex}); "
                 f"use --strict to fail instead")
    if sd.captions:
        skipped_imgs = {i for i, _ in img.skipped} if img else set()
        caps = [c for c in sd.captions if c.image_id not in skipped_imgs]
        cap = encode_captions_file(bb, caps, out / f"{s}-captions.h5", {**base, "modality": "text"}, opts,
                                   progress=rep)
        _summary(rep, s, "captions", cap)
        qrels = {c.id: {c.image_id: 1} for c in caps if c.image_id}
        if qrels:
            write_qrels(out / f"{s}.qrels", qrels, meta={"dataset": base["dataset"], "split": s})


def _summary(rep: Reporter, split: str, what: str, r) -> None:
    if not r.encoded and Path(r.path).is_file():
        # kept as it was: mark it checked now, so Make (which reran us because the annotations are
        # newer) sees it up to date instead of rerunning encode-dense and every later stage each time
        os.utime(r.path)
    rate = f", {r.per_second:.1f} {what}/s" if r.encoded else "" if r.seconds else " (already encoded)"
    rep.log(f"{split} {what}: {r.rows} rows -> {r.path}{rate}")
