"""Options of VDR, Vocabulary Disentangled Retrieval (Zhou et al., §3, App. A): over the towers' final
layers (tuned, as the paper trains its encoders, or frozen) or over stored token and patch states."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import TrainConfig, VocabConfig, option


@dataclass
class PairSchedule(TrainConfig):
    """The schedule and data stream VDR and the dense model trained alike share (methods/dense: one
    set of flags trains both alike). Defaults: VDR's App. A, which follows CLIP."""

    epochs: int = option(20, "Passes over the training captions.", min=1, paper="20 (App. A, cross-modal)")
    batch_size: int = option(4096, "Caption-image pairs per step.", min=1, paper="4096 (App. A)")
    lr: float = option(2e-4, "AdamW peak learning rate.", min=0.0, paper="2e-4 (App. A)")
    lr_schedule: str = option("cosine", "Learning rate after warm-up: linear, cosine or constant.",
                              choices=("linear", "cosine", "constant"), paper="cosine (App. A)")
    lr_warmup: float = option(0.05, "Linear learning-rate warm-up: steps (>= 1) or a fraction of all steps (< 1).",
                              min=0.0, paper="1 epoch of 20 (App. A)")
    tune_final_layer: bool = option(True, "On files of `encode-dense --final-layer-inputs`: train copies of the "
                                    "towers' final layers with the heads (the paper trains its encoders); "
                                    "--freeze-final-layer keeps the backbone's.",
                                    flag="--tune-final-layer/--freeze-final-layer", paper="tuned (whole encoders)")
    final_lr: float | None = option(None, "AdamW peak learning rate of the final layers (default: --lr, one rate "
                                    "for the whole model as the paper).", min=0.0)
    batch_by: str = option("caption", "What a batch is drawn by: caption = B captions of (mostly) distinct images, "
                           "as CLIP and VDR; image = B captions from ~B/5 images, each with all its captions "
                           "(the image tower runs once per image and epoch, 5x less image work on Flickr8k/MSCOCO; "
                           "not in the paper).", choices=("caption", "image"), paper="caption (CLIP)")
    vdr_buffer_rows: int = option(4096, "Captions whose inputs are held in the shuffle buffer (memory ~ this x L x "
                                  "h x 2 bytes); they stream from the HDF5 files.", min=1)


@dataclass
class VDRConfig(PairSchedule, VocabConfig):
    """The shared fields with VDR's defaults, then the paper's own."""

    sparsify_options = {"vdr_query_k": (None, "Top-k of parametric (vdr) queries, plus their bag of words "
                                              "(default: the head's, set by train-head --vdr-query-k).", int),
                        "vdr_doc_k": (None, "Top-k terms kept per image document (default: the head's).", int)}

    vocab_min_df: int = option(0, "Keep only terms in >= N training captions (0 = the whole tokenizer vocabulary). "
                               "Both towers cost ∝ |V|.", min=0, paper="0 (BERT's 30,522 terms)")
    vdr_train_k: int = option(512, "Query-side top-k of G_q (eq. 4) during training; images stay fully activated "
                              "(§3.3 a).", min=1, paper="512 = d of the dense model, 1.7 % of 30,522 (§4.3, App. A)")
    vdr_query_k: int = option(512, "Default top-k of parametric queries at sparsify time (stored in the head).",
                              min=1, paper="512 (k = d)")
    vdr_doc_k: int = option(512, "Default top-k of documents (images) at sparsify time and validation.", min=1,
                            paper="512 (k = d)")
    vdr_temperature: float = option(0.07, "Initial τ of eq. 5 on L2-normalised vectors, learnable.", min=1e-4,
                                    paper="0.07 (App. A)")
    vdr_cts_mask: bool = option(True, "Contrastive mask (§3.3 c): deal the dimensions no caption of the batch "
                                "opens to the in-batch pairs as negatives-only dimensions.")
    vdr_np_entry: bool = option(True, "Add the nonparametric entry SCE(bow(q), V_p) to the loss (§3.2).")
    vdr_image_init: str = option("random", "Initial W of the image head: random = N(0, 0.02²) (§3.3 a); words = "
                                 "each term's dense text vector (the term alone through the text tower) mapped back "
                                 "through the image projection, W[v] = P_imgᵀ t_v, scaled to the text head's "
                                 "spread, so each position starts as a zero-shot word detector (not in the paper; "
                                 "needs final-layer files and a backbone with projections).",
                                 choices=("random", "words"), paper="random (image side, §3.3 a)")
    vdr_image_cls: bool = option(False, "ViT image towers with a [CLS] position (final-layer kind vit: BLIP, ALBEF, "
                                 "CLIP): --vdr-image-cls pools the image head over [CLS] and the patches; the default "
                                 "pools over the patch positions only, as the paper's image encoder (49 patches of "
                                 "ViT-B/32, no [CLS]: App. A). No effect on towers without one (EfficientNet, SigLIP) "
                                 "nor on stored patch_states.", paper="patches only (App. A: 49 positions)")
    vdr_pool: str = option("max", "Pooling over positions: max (eq. 3) or mean (the Figure 3 ablation).",
                           choices=("max", "mean"), paper="max (eq. 3)")
    target_flops: float | None = option(None, "A FLOPs budget F (FLOPs, eq. 1: expected shared terms per "
                                        "query-image pair). After training, the saved epoch's head is swept over "
                                        "the inference top-k of each side (k_query x k_doc on the ksweep grid, "
                                        "16 ... 512) on the validation files (never test), and the head keeps the "
                                        "pair of best R@10 with FLOPs <= F whose VDR^α keeps >= 0.75 of it "
                                        "(ksweep.choose); none under F: a warning and the fewest-FLOPs pair. "
                                        "Without validation files a seeded sample of 1,000 training images and "
                                        "their captions decides (said in the log). Training k (--vdr-train-k) does "
                                        "not move. Recorded in config.json (training.flops_budget). docs/vdr.md. "
                                        "Default: off.", min=1e-3, paper="– (not in the paper)")
