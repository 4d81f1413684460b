"""`mmsparse encode-dense`: run a frozen dual encoder over a dataset's images and captions.

Writes per split: OUT/{split}-images.h5 and OUT/{split}-captions.h5 (dense HDF5, see
mmsparse/formats/dense.py; extra datasets in mmsparse/backbones/encode.py) and OUT/{split}.qrels
(caption id -> the image it describes, relevance 1). A thin layer over mmsparse.api.encoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..api.encoding import default_workers

INPUT = "Input"
SPEED = "Speed"
EXTRAS = "Extra datasets"
RAY = "Ray (docs/ray.md)"


def main(
    annotations: str = typer.Argument(..., help="Dataset annotations: a Karpathy split JSON (dataset_*.json), "
                                      "a COCO captions JSON, a captions .txt/.jsonl file, an image folder, or "
                                      "(--format hf) a Hugging Face dataset id or directory (see --format)."),
    image_root: Optional[Path] = typer.Argument(None, help="Directory the annotation file's image filenames are "
                                                "relative to (not needed for an image folder, a captions file or "
                                                "a dataset holding its images)."),
    out: Path = typer.Option(..., "-o", "--out", help="Output directory (created; files are replaced atomically)."),
    backbone: str = typer.Option("hf-dual", "--backbone", help="Backbone: hf-dual (any transformers dual encoder "
                                 "with vision_model/text_model), clip, siglip, blip (BLIP ITC, 256-d), albef (official "
                                 "ALBEF checkpoint + BERT tokenizer files in one directory)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model directory or hub id. Default: $MMSPARSE_MODEL, "
                                        "else $MMSPARSE_SHARED/models/flickr8k-dual-encoder "
                                        "(MMSPARSE_SHARED defaults to <repo>/../shared)."),
    split: Optional[List[str]] = typer.Option(None, "--split", help="Split to encode, repeatable (default: test if "
                                              "present, else all). Karpathy 'restval' images belong to 'train'. A "
                                              "COCO captions file holds one split (captions_val2017.json: val2017); "
                                              "one --split renames it (e.g. --split test).", rich_help_panel=INPUT),
    fmt: str = typer.Option("auto", "--format", help="Annotation format: auto (from the file), karpathy, coco, "
                            "folder, captions, hf (a Hugging Face `datasets` id or a directory from save_to_disk; "
                            "an id needs the Hub online).", rich_help_panel=INPUT),
    image_column: str = typer.Option("image", "--image-column", help="--format hf: column of the images (Image "
                                     "feature, or paths relative to IMAGE_ROOT).", rich_help_panel=INPUT),
    caption_column: str = typer.Option("caption", "--caption-column", help="--format hf: column of the captions "
                                       "(a string or a list of strings per row).", rich_help_panel=INPUT),
    id_column: Optional[str] = typer.Option(None, "--id-column", help="--format hf: column naming each row's image; "
                                            "rows with the same id are one image (default: the row number).",
                                            rich_help_panel=INPUT),
    split_column: Optional[str] = typer.Option(None, "--split-column", help="--format hf: column assigning rows to "
                                               "splits, e.g. `split` (default: the dataset's own splits; "
                                               "'validation' is read as 'val').", rich_help_panel=INPUT),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Dataset name stored in the files "
                                          "(default: the JSON's 'dataset' field, else the file stem).",
                                          rich_help_panel=INPUT),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N images of each split "
                                        "(with their captions), for tests and quick runs.", rich_help_panel=INPUT),
    strict: bool = typer.Option(False, "--strict", help="Fail on the first missing or unreadable image or empty "
                                "caption (default: skip them with a counted warning; a skipped image's captions "
                                "are left out too).", rich_help_panel=INPUT),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Images or captions per forward pass.",
                                   rich_help_panel=SPEED),
    device: str = typer.Option("auto", "--device", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps.",
                               rich_help_panel=SPEED),
    workers: int = typer.Option(default_workers(), "--workers", min=0, help="DataLoader worker processes "
                                "decoding and preprocessing images (0 = in the main process; the vectors are the "
                                "same bytes either way). Default: CPU cores - 1, at most 4.", rich_help_panel=SPEED),
    precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16 / fp16 autocast of the encoders on "
                                  "CUDA (a CPU run is fp32 only). Vectors are stored as --dtype either way.",
                                  rich_help_panel=SPEED),
    dtype: str = typer.Option("float32", "--dtype", help="Storage dtype of the vectors: float32 or float16."),
    pre_projection: bool = typer.Option(False, "--pre-projection", help="Also store pooled states before the "
                                        "projection (dataset pre_projection [N, h]) and the projection weights.",
                                        rich_help_panel=EXTRAS),
    token_states: bool = typer.Option(False, "--token-states", help="Captions: also store last-layer token states "
                                      "token_states [N, L, h], token_mask and token_ids (L = max caption tokens).",
                                      rich_help_panel=EXTRAS),
    patch_states: bool = typer.Option(False, "--patch-states", help="Images: also store patch states "
                                      "patch_states [N, P, h] of hidden layer --layer.", rich_help_panel=EXTRAS),
    layer: int = typer.Option(-1, "--layer", help="Vision hidden layer for --patch-states (-1 = last, 0 = "
                              "embeddings).", rich_help_panel=EXTRAS),
    states_dtype: str = typer.Option("float16", "--states-dtype", help="Storage dtype of token/patch states: "
                                     "float16 or float32.", rich_help_panel=EXTRAS),
    force: bool = typer.Option(False, "--force", help="Re-encode even when an output already holds the same "
                               "settings and inputs (otherwise it is kept). Interrupted runs resume either way."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run as a Ray Data pipeline (needs the 'scale' "
                                      "extra; docs/ray.md): local (a Ray instance on this machine), auto (the cluster this "
                                      "machine is in) or ray://HOST:10001. Each output becomes a sharded directory "
                                      "(part files + manifest.json) that every stage reads like the file; "
                                      "--workers is then the number of model replicas (Ray actors). Default: off.",
                                      rich_help_panel=RAY),
    num_gpus_per_worker: float = typer.Option(0.0, "--num-gpus-per-worker", min=0, help="--ray: GPUs per model "
                                              "replica (fractions share a GPU; 0 = CPU).", rich_help_panel=RAY),
    cpus_per_worker: float = typer.Option(1.0, "--cpus-per-worker", min=0.01, help="--ray: CPUs reserved per model "
                                          "replica; also its torch threads (at least 1).", rich_help_panel=RAY),
    part_rows: Optional[int] = typer.Option(None, "--part-rows", min=1, help="--ray: records per part file "
                                            "[default: 1024 images, 4096 captions].", rich_help_panel=RAY),
) -> None:
    """Encode images and captions with a frozen dual encoder into dense HDF5 files + qrels."""
    from ..api.encoding import encode_dense
    from ..cli_ui import RichReporter

    encode_dense(annotations, image_root, out=out, backbone=backbone, model=model, split=split,
                 batch_size=batch_size, device=device, dataset=dataset, dtype=dtype, limit=limit, workers=workers,
                 format=fmt, image_column=image_column, caption_column=caption_column, id_column=id_column,
                 split_column=split_column, pre_projection=pre_projection, token_states=token_states,
                 patch_states=patch_states, layer=layer, states_dtype=states_dtype, precision=precision,
                 strict=strict, force=force, ray=ray, num_gpus_per_worker=num_gpus_per_worker,
                 cpus_per_worker=cpus_per_worker, part_rows=part_rows, progress=RichReporter())
