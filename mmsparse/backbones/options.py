"""The options of `encode-dense`, in one dataclass (as each method holds its training options).

`EncodeOptions` is what the command line, `mmsparse.encode_dense`, the single-process encoder
(backbones/encode.py) and the Ray pipeline (distributed.py) pass down: the command's flags are
made from its fields (commands/encode_dense.py), so a new option is one field here and the code
that reads it. No torch import: `--help` reads this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from ..errors import InputError
from ..options import check_options, option

INPUT, SPEED, EXTRAS, RAY = "Input", "Speed", "Extra datasets", "Ray (docs/ray.md)"
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
MEMORY_FORMATS = ("auto", "channels-last", "contiguous")
RUNTIMES = ("auto", "onnx", "torch")


@dataclass
class EncodeOptions:
    """Every option of encode-dense but its inputs, output and progress. None means "the
    machine's default" where the help says so (workers, threads)."""

    backbone: str = option("hf-dual", "Backbone: hf-dual (any transformers dual encoder with vision_model/"
                           "text_model), clip, siglip, blip (BLIP ITC, 256-d), albef (official ALBEF checkpoint + "
                           "BERT tokenizer files in one directory).")
    model: str | None = option(None, "Model directory or hub id. Default: $MMSPARSE_MODEL, else "
                               "$MMSPARSE_SHARED/models/flickr8k-dual-encoder (MMSPARSE_SHARED defaults to "
                               "<repo>/../shared).")
    split: list[str] | None = option(None, "Split to encode, repeatable (default: test if present, else all). "
                                     "Karpathy 'restval' images belong to 'train'. A COCO captions file holds one "
                                     "split (captions_val2017.json: val2017); one --split renames it (e.g. --split "
                                     "test).", panel=INPUT)
    format: str = option("auto", "Annotation format: auto (from the file), karpathy, coco, folder, captions, hf (a "
                         "Hugging Face `datasets` id or a directory from save_to_disk; an id needs the Hub online).",
                         choices=("auto", "karpathy", "coco", "folder", "captions", "hf"), panel=INPUT)
    image_column: str = option("image", "--format hf: column of the images (Image feature, or paths relative to "
                               "IMAGE_ROOT).", panel=INPUT)
    caption_column: str = option("caption", "--format hf: column of the captions (a string or a list of strings "
                                 "per row).", panel=INPUT)
    id_column: str | None = option(None, "--format hf: column naming each row's image; rows with the same id are "
                                   "one image (default: the row number).", panel=INPUT)
    split_column: str | None = option(None, "--format hf: column assigning rows to splits, e.g. `split` (default: "
                                      "the dataset's own splits; 'validation' is read as 'val').", panel=INPUT)
    dataset: str | None = option(None, "Dataset name stored in the files (default: the JSON's 'dataset' field, "
                                 "else the file stem).", panel=INPUT)
    limit: int | None = option(None, "Only the first N images of each split (with their captions), for tests and "
                               "quick runs.", min=1, panel=INPUT)
    strict: bool = option(False, "Fail on the first missing or unreadable image or empty caption (default: skip "
                          "them with a counted warning; a skipped image's captions are left out too).", panel=INPUT)
    batch_size: int = option(64, "Images or captions per forward pass.", min=1, panel=SPEED)
    device: str = option("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps.", panel=SPEED)
    workers: int | None = option(None, "DataLoader worker processes decoding and preprocessing images (0 = in the "
                                 "main process; the vectors are the same bytes either way). Default: one per 4 CPU "
                                 "cores, 1 to 8 (mmsparse.runtime.default_workers).", min=0, panel=SPEED)
    threads: int | None = option(None, "torch CPU threads of the encoders. Default: every CPU core this process "
                                 "may use.", min=1, panel=SPEED)
    precision: str = option("fp32", "fp32; bf16 (autocast: on CUDA, or on a CPU with a bf16 matrix unit, AMX or "
                            "AVX512-BF16; refused elsewhere, where it is emulated and slower than fp32); fp16 "
                            "(autocast, CUDA only); auto (bf16 where it is native, else fp32; the run says which). "
                            "Vectors are stored as --dtype either way.", choices=PRECISIONS, panel=SPEED)
    runtime: str = option("auto", "What runs the towers: torch (PyTorch), onnx (ONNX Runtime on the CPU: mmsparse "
                          "exports the towers once per model and caches the graphs by the model's content "
                          "fingerprint; needs the 'onnx' extra; fp32, vectors within cosine 0.9999 of PyTorch's) "
                          "or auto (onnx on the CPU where onnxruntime is installed and the towers export, at "
                          "--precision fp32 or auto; torch on GPUs, under --precision bf16/fp16, for "
                          "--final-layer-inputs and --patch-states of a --layer other than -1; docs/speed.md).",
                          choices=RUNTIMES, panel=SPEED)
    memory_format: str = option("auto", "Layout of convolutional image towers in PyTorch: channels-last, contiguous, "
                                "or auto (channels-last on the CPU, faster on the AVX2 and AVX-512 CPUs measured; "
                                "contiguous on CUDA, where its first batch costs seconds more and decoding bounds "
                                "the stage anyway). Transformer towers and --runtime onnx are unaffected.",
                                choices=MEMORY_FORMATS, panel=SPEED)
    dtype: str = option("float32", "Storage dtype of the vectors: float32 or float16.",
                        choices=("float32", "float16"))
    pre_projection: bool = option(False, "Also store pooled states before the projection (dataset pre_projection "
                                  "[N, h]) and the projection weights.", panel=EXTRAS)
    token_states: bool = option(False, "Captions: also store last-layer token states token_states [N, L, h], "
                                "token_mask and token_ids (L = max caption tokens).", panel=EXTRAS)
    patch_states: bool = option(False, "Images: also store patch states patch_states [N, P, h] of hidden layer "
                                "--layer.", panel=EXTRAS)
    final_layer_inputs: bool = option(False, "Also store what enters each tower's final layer (dataset final_input, "
                                      "as --states-dtype), which `train-head --method joint` tunes: captions the "
                                      "hidden states entering the last transformer layer [N, L, h] plus final_mask "
                                      "[N, L] (L = max caption tokens; MiniLM: 64 x 384, 48 KiB per caption in "
                                      "float16; BLIP: 64 x 768, 96 KiB); images what enters the final block: "
                                      "EfficientNet the feature map feeding the top convolution [N, C, H, W] (Lite0 "
                                      "at 224 px 320 x 7 x 7, 30.6 KiB per image in float16), ViTs the hidden states "
                                      "entering the last block [N, P, h] (ViT-B/16 at 384 px: 577 x 768, 866 KiB). "
                                      "Towers: BERT-like text (hf-dual, blip, albef), CLIP and SigLIP text and vision "
                                      "(clip, siglip, hf-dual), EfficientNet and ViT image (hf-dual, blip, albef); "
                                      "others are refused before any file is written.", panel=EXTRAS)
    layer: int = option(-1, "Vision hidden layer for --patch-states (-1 = last, 0 = embeddings).", panel=EXTRAS)
    states_dtype: str = option("float16", "Storage dtype of token/patch states and final-layer inputs: float16 or "
                               "float32 (twice the bytes).",
                               choices=("float32", "float16"), panel=EXTRAS)
    force: bool = option(False, "Re-encode even when an output already holds the same settings and inputs "
                         "(otherwise it is kept). Interrupted runs resume either way.")
    ray: str | None = option(None, "Run as a Ray Data pipeline (needs the 'scale' extra; docs/ray.md): local (a Ray "
                             "instance on this machine), auto (the cluster this machine is in) or ray://HOST:10001. "
                             "Each output becomes a sharded directory (part files + manifest.json) that every stage "
                             "reads like the file; --workers is then the number of model replicas (Ray actors). "
                             "Default: off.", panel=RAY)
    num_gpus_per_worker: float = option(0.0, "--ray: GPUs per model replica (fractions share a GPU; 0 = CPU).",
                                        min=0.0, panel=RAY)
    cpus_per_worker: float = option(1.0, "--ray: CPUs reserved per model replica; also its torch threads (at "
                                    "least 1).", min=0.01, panel=RAY)
    part_rows: int | None = option(None, "--ray: records per part file (default: 1024 images, 4096 captions).",
                                   min=1, panel=RAY)

    @classmethod
    def make(cls, options: "EncodeOptions | None" = None, **values) -> "EncodeOptions":
        """`options` (or the defaults) with `values` replacing fields; InputError naming an unknown
        key or a value outside its bounds or choices."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise InputError(f"encode-dense: unknown option {unknown[0]!r}; known: {', '.join(sorted(names))}")
        opts = dataclasses.replace(options or cls(), **values)
        check_options(opts)
        return opts

    def extras(self, kind: str) -> tuple[str, ...]:
        """The extra datasets asked for that files of `kind` (images | captions) hold, in the
        fixed order pre_projection, token_states / patch_states, final_input."""
        own = "patch_states" if kind == "images" else "token_states"
        return tuple(e for e in ("pre_projection", own) if getattr(self, e)) + (
            ("final_input",) if self.final_layer_inputs else ())
