"""Options of the dense baseline trained alike (`train-head --method dense`): CLIP's symmetric InfoNCE
with a learnable temperature over the towers' final layers and projections, on the data, schedule
and budget a VDR run uses (VDR paper Table 2 compares VDR_cm with CLIP and CLIP-BERT "following the
same training conditions"). The schedule options and their defaults are VDR's (App. A, which
follows CLIP), so one set of flags trains both alike."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import TrainConfig, option


@dataclass
class DenseConfig(TrainConfig):
    """The shared fields with VDR's schedule defaults, then the dense side's own."""

    epochs: int = option(20, "Passes over the training captions (as VDR).", min=1, paper="20 (VDR App. A)")
    batch_size: int = option(4096, "Caption-image pairs per step (as VDR).", min=1, paper="4096 (VDR App. A)")
    lr: float = option(2e-4, "AdamW peak learning rate of the projections and τ (as VDR's heads).", min=0.0,
                       paper="2e-4 (VDR App. A)")
    lr_schedule: str = option("cosine", "Learning rate after warm-up: linear, cosine or constant.",
                              choices=("linear", "cosine", "constant"), paper="cosine (VDR App. A)")
    lr_warmup: float = option(0.05, "Linear learning-rate warm-up: steps (>= 1) or a fraction of all steps (< 1).",
                              min=0.0, paper="1 epoch of 20 (VDR App. A)")
    tune_final_layer: bool = option(True, "Train copies of the towers' final layers (--freeze-final-layer: the "
                                    "projections only).", flag="--tune-final-layer/--freeze-final-layer")
    final_lr: float | None = option(None, "AdamW peak learning rate of the final layers (default: --lr).", min=0.0)
    tau_init: float = option(0.07, "Initial learnable temperature τ (logits = cos/τ; kept >= 0.01).", min=0.01,
                             paper="0.07 (CLIP)")
    batch_by: str = option("caption", "What a batch is drawn by: caption = B captions of (mostly) distinct images, "
                           "as CLIP and VDR; image = B captions from ~B/5 images, each with all its captions "
                           "(the image tower runs once per image and epoch, 5x less image work on Flickr8k/MSCOCO; "
                           "not in the paper).", choices=("caption", "image"), paper="caption (CLIP)")
    vdr_buffer_rows: int = option(4096, "Captions whose final-layer inputs are held in the shuffle buffer (as "
                                  "VDR's data stream).", min=1)
