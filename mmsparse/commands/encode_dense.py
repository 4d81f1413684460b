"""`mmsparse encode-dense`: run a frozen dual encoder over a dataset's images and captions.

Writes per split: OUT/{split}-images.h5 and OUT/{split}-captions.h5 (dense HDF5, see
mmsparse/formats/dense.py; extra datasets in mmsparse/backbones/encode.py) and OUT/{split}.qrels
(caption id -> the image it describes, relevance 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import InputError

FORMATS = ("auto", "karpathy", "coco", "folder", "captions")


def _default_workers() -> int:
    return max(0, min(4, (os.cpu_count() or 1) - 1))


def main(
    annotations: Path = typer.Argument(..., help="Dataset annotations: a Karpathy split JSON (dataset_*.json), "
                                       "a COCO captions JSON, a captions .txt/.jsonl file, or an image folder "
                                       "(see --format)."),
    image_root: Optional[Path] = typer.Argument(None, help="Directory the annotation file's image filenames are "
                                                "relative to (not needed for an image folder or a captions file)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output directory (created; files are replaced atomically)."),
    backbone: str = typer.Option("hf-dual", "--backbone", help="Backbone: hf-dual (any transformers dual encoder with "
                                 "vision_model/text_model), clip, siglip, blip (BLIP ITC, 256-d), albef (official ALBEF checkpoint + "
                                 "BERT tokenizer files in one directory)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model directory or hub id. Default: $MMSPARSE_MODEL, "
                                        "else $MMSPARSE_SHARED/models/flickr8k-dual-encoder "
                                        "(MMSPARSE_SHARED defaults to <repo>/../shared)."),
    split: Optional[List[str]] = typer.Option(None, "--split", help="Split to encode, repeatable (default: test if present, else all). "
                                              "Karpathy 'restval' images belong to 'train'."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Images or captions per forward pass."),
    device: str = typer.Option("auto", "--device", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Dataset name stored in the files "
                                          "(default: the JSON's 'dataset' field, else the file stem)."),
    dtype: str = typer.Option("float32", "--dtype", help="Storage dtype of the vectors: float32 or float16."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N images of each split "
                                        "(with their captions), for tests and quick runs."),
    workers: int = typer.Option(_default_workers(), "--workers", min=0, help="DataLoader worker processes "
                                "decoding and preprocessing images (0 = in the main process)."),
    fmt: str = typer.Option("auto", "--format", help="Annotation format: auto (from the file), karpathy, coco, "
                            "folder, captions."),
    pre_projection: bool = typer.Option(False, "--pre-projection", help="Also store pooled states before the "
                                        "projection (dataset pre_projection [N, h]) and the projection weights."),
    token_states: bool = typer.Option(False, "--token-states", help="Captions: also store last-layer token states "
                                      "token_states [N, L, h], token_mask and token_ids (L = max caption tokens)."),
    patch_states: bool = typer.Option(False, "--patch-states", help="Images: also store patch states "
                                      "patch_states [N, P, h] of hidden layer --layer."),
    layer: int = typer.Option(-1, "--layer", help="Vision hidden layer for --patch-states (-1 = last, 0 = embeddings)."),
    states_dtype: str = typer.Option("float16", "--states-dtype", help="Storage dtype of token/patch states: "
                                     "float16 or float32."),
    strict: bool = typer.Option(False, "--strict", help="Fail on a missing or unreadable image "
                                "(default: skip it with a counted warning)."),
    force: bool = typer.Option(False, "--force", help="Re-encode even when an output already holds the same "
                               "settings and inputs (otherwise it is kept). Interrupted runs resume either way."),
) -> None:
    """Encode images and captions with a frozen dual encoder into dense HDF5 files + qrels."""
    import time

    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from .. import settings
    from ..backbones import load_backbone
    from ..backbones.encode import encode_captions_file, encode_images_file
    from ..data import read_dataset
    from ..formats import write_qrels

    err = Console(stderr=True)
    if dtype not in ("float32", "float16"):
        raise InputError(f"--dtype {dtype!r}: use float32 or float16")
    if states_dtype not in ("float32", "float16"):
        raise InputError(f"--states-dtype {states_dtype!r}: use float32 or float16")
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    data, name = read_dataset(annotations, image_root, fmt)
    splits = list(dict.fromkeys(split or (["test"] if "test" in data else list(data))))
    missing = [s for s in splits if s not in data]
    if missing:
        raise InputError(f"{annotations}: split(s) {', '.join(missing)} not found; "
                         f"available: {', '.join(data)}")
    extras = [e for e, on in (("pre_projection", pre_projection), ("token_states", token_states),
                              ("patch_states", patch_states)) if on]
    from ..checks import check_captions
    from ..provenance import add_inputs

    for s in splits:  # bad captions fail before the model loads (issue 10)
        check_captions(data[s].limit(limit).captions, f"{annotations} (split {s})")
    model_path = model or str(settings.dual_encoder_dir())
    add_inputs([(model_path, "model")])
    t0 = time.perf_counter()
    bb = load_backbone(backbone, model_path, device)
    err.print(f"loaded {backbone} {bb.model} on {bb.device} (d={bb.dim}) in {time.perf_counter() - t0:.1f} s")
    out.mkdir(parents=True, exist_ok=True)

    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn())
    with Progress(*cols, console=err, transient=False) as progress:
        for s in splits:
            sd = data[s].limit(limit)
            base = {"dataset": dataset or name, "split": s, "source": str(Path(annotations).resolve())}
            if limit:
                base["limit"] = int(limit)
            img = None
            if sd.images:
                img = encode_images_file(bb, sd.images, out / f"{s}-images.h5", {**base, "modality": "image"},
                                         batch_size=batch_size, workers=workers, dtype=dtype, extras=extras,
                                         layer=layer, states_dtype=states_dtype, strict=strict,
                                         progress=progress, log=err.print, force=force)
                _report(err, s, "images", img)
            if sd.captions:
                skipped_imgs = {i for i, _ in img.skipped} if img else set()
                caps = [c for c in sd.captions if c.image_id not in skipped_imgs]
                cap = encode_captions_file(bb, caps, out / f"{s}-captions.h5", {**base, "modality": "text"},
                                           batch_size=batch_size, dtype=dtype, extras=extras,
                                           states_dtype=states_dtype, progress=progress, log=err.print,
                                           force=force)
                _report(err, s, "captions", cap)
                qrels = {c.id: {c.image_id: 1} for c in caps if c.image_id}
                if qrels:
                    write_qrels(out / f"{s}.qrels", qrels, meta={"dataset": base["dataset"], "split": s})


def _report(err, split: str, what: str, r) -> None:
    rate = f", {r.per_second:.1f} {what}/s" if r.encoded else " (already encoded)"
    err.print(f"{split} {what}: {r.rows} rows -> {r.path}{rate}")
    if r.skipped:
        ex = "; ".join(f"{i}: {e}" for i, e in r.skipped[:3])
        err.print(f"[yellow]warning:[/] {split}: skipped {len(r.skipped)} unreadable image(s) and their "
                  f"captions (e.g. {ex}); use --strict to fail instead")
