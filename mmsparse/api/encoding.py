"""`encode_dense`: images and captions -> dense HDF5 files + qrels, with a frozen dual encoder.

Per split SPLIT it writes OUT/SPLIT-images.h5 and OUT/SPLIT-captions.h5 (dense HDF5: ids, vectors
[N, d] float32 or float16, texts and image_ids for captions; mmsparse/formats/dense.py, extras in
mmsparse/backbones/encode.py) and OUT/SPLIT.qrels (caption id -> the image it describes,
relevance 1), resumably and atomically.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter

DTYPES = ("float32", "float16")


def default_workers() -> int:
    """DataLoader workers by default: one core left for the model, at most 4 (1 on 2 cores)."""
    return max(0, min(4, (os.cpu_count() or 1) - 1))


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


@provenance.recorded("annotations", "image_root", "model")
def encode_dense(annotations: str | Path, image_root: str | Path | None = None, *, out: str | Path,
                 backbone: str = "hf-dual", model: str | Path | None = None, split: Sequence[str] | None = None,
                 batch_size: int = 64, device: str = "auto", dataset: str | None = None, dtype: str = "float32",
                 limit: int | None = None, workers: int = default_workers(), format: str = "auto",
                 image_column: str = "image", caption_column: str = "caption", id_column: str | None = None,
                 split_column: str | None = None, pre_projection: bool = False, token_states: bool = False,
                 patch_states: bool = False, layer: int = -1, states_dtype: str = "float16",
                 precision: str = "fp32", strict: bool = False, force: bool = False,
                 ray: str | None = None, num_gpus_per_worker: float = 0.0, cpus_per_worker: float = 1,
                 part_rows: int | None = None, progress: Reporter | None = None) -> Path:
    """Encode a dataset's images and captions with frozen backbone `backbone` into `out`.

    annotations: a Karpathy split JSON (dataset_*.json), a COCO captions JSON, a captions
    .txt/.jsonl file, an image folder, or (format="hf") a Hugging Face dataset id or directory
    with columns `image_column`, `caption_column` (and optional `id_column`, `split_column`; see
    mmsparse/data/hf.py). image_root: the directory the JSON's image file names are relative to.
    model: hub id or local path (default: $MMSPARSE_MODEL, else the shared Flickr8k dual encoder).
    split: splits to encode (default: test if present, else all); for a COCO file a single split
    names its one split. workers: DataLoader processes decoding/preprocessing images (0 = this
    process; the vectors are byte-identical). precision: fp32, or bf16/fp16 autocast on CUDA.
    limit: only the first N images of each split, with their captions.
    Broken images and empty captions are skipped with a counted warning (mmsparse.checks.warn)
    and left out of the files and the qrels (a broken image's captions too); strict=True raises
    InputError on the first one instead (empty captions and missing image files before the model
    loads). Outputs already made with the same settings and inputs are kept unless force=True.
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
    from ..backbones.encode import check_precision, encode_captions_file, encode_images_file
    from ..checks import check_captions, warn
    from ..data import read_dataset
    from ..formats import write_qrels

    rep = reporter(progress)
    out = Path(out)
    for opt, v in (("--dtype", dtype), ("--states-dtype", states_dtype)):
        if v not in DTYPES:
            raise InputError(f"{opt} {v!r}: use float32 or float16")
    hf = {"image_column": image_column, "caption_column": caption_column, "id_column": id_column,
          "split_column": split_column} if format == "hf" else {}
    data, name, fmt = read_dataset(annotations, image_root, format, **hf)
    splits = _select_splits(data, split, fmt, annotations)
    todo = {}
    for s in splits:  # bad captions and (with strict) missing images fail before the model loads
        sd = data[s].limit(limit)
        where = f"{annotations} (split {s})"
        if strict:
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
    if ray is not None:  # a Ray Data pipeline writing sharded outputs (mmsparse/distributed.py)
        from ..distributed import encode_splits

        model_path = str(model) if model is not None else str(settings.dual_encoder_dir())
        provenance.add_inputs([(model_path, "model")])
        return encode_splits(
            todo, out=Path(out), backbone=backbone, model=model_path, dataset=dataset, name=name,
            source=str(Path(annotations).resolve()) if Path(annotations).exists() else str(annotations),
            limit=limit, batch_size=batch_size, device=device, dtype=dtype, precision=precision, strict=strict,
            force=force, extras=[e for e, on in (("pre_projection", pre_projection), ("token_states", token_states),
                                                 ("patch_states", patch_states)) if on],
            ray=ray, workers=workers, num_gpus_per_worker=num_gpus_per_worker, cpus_per_worker=cpus_per_worker,
            part_rows=part_rows, progress=rep)
    dev = resolve_device(device)
    check_precision(precision, dev)
    extras = [e for e, on in (("pre_projection", pre_projection), ("token_states", token_states),
                              ("patch_states", patch_states)) if on]
    model_path = str(model) if model is not None else str(settings.dual_encoder_dir())
    provenance.add_inputs([(model_path, "model")])
    t0 = time.perf_counter()
    bb = load_backbone(backbone, model_path, dev)
    rep.log(f"loaded {backbone} {bb.model} on {bb.device} (d={bb.dim}) in {time.perf_counter() - t0:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    source = str(Path(annotations).resolve()) if Path(annotations).exists() else str(annotations)
    for s, sd in todo.items():
        base = {"dataset": dataset or name, "split": s, "source": source}
        if limit:
            base["limit"] = int(limit)
        img = None
        if sd.images:
            img = encode_images_file(bb, sd.images, out / f"{s}-images.h5", {**base, "modality": "image"},
                                     batch_size=batch_size, workers=workers, dtype=dtype, extras=extras,
                                     layer=layer, states_dtype=states_dtype, strict=strict, precision=precision,
                                     loader=sd.loader, progress=rep, force=force)
            _summary(rep, s, "images", img)
            if img.skipped:
                ex = "; ".join(f"{i}: {e}" for i, e in img.skipped[:3])
                warn(f"{s}: skipped {len(img.skipped)} unreadable image(s) and their captions (e.g. {ex}); "
                     f"use --strict to fail instead")
        if sd.captions:
            skipped_imgs = {i for i, _ in img.skipped} if img else set()
            caps = [c for c in sd.captions if c.image_id not in skipped_imgs]
            cap = encode_captions_file(bb, caps, out / f"{s}-captions.h5", {**base, "modality": "text"},
                                       batch_size=batch_size, dtype=dtype, extras=extras, states_dtype=states_dtype,
                                       precision=precision, progress=rep, force=force)
            _summary(rep, s, "captions", cap)
            qrels = {c.id: {c.image_id: 1} for c in caps if c.image_id}
            if qrels:
                write_qrels(out / f"{s}.qrels", qrels, meta={"dataset": base["dataset"], "split": s})
    return out


def _summary(rep: Reporter, split: str, what: str, r) -> None:
    if not r.encoded and Path(r.path).is_file():
        # kept as it was: mark it checked now, so Make (which reran us because the annotations are
        # newer) sees it up to date instead of rerunning encode-dense and every later stage each time
        os.utime(r.path)
    rate = f", {r.per_second:.1f} {what}/s" if r.encoded else "" if r.seconds else " (already encoded)"
    rep.log(f"{split} {what}: {r.rows} rows -> {r.path}{rate}")
