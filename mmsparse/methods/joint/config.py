"""Options of joint sparse-dense self-distillation (Song et al., CIKM 2025, "Sparse and Dense
Retrievers Learn Better Together", §2.3, eq. 2-3). The sparse head is D2S's, so its options are
too, through D2S's code: the top-k gates, --caption-terms-weight, --image-dropout, the image-side word
loss, the posting floor, --sparsity-loss and --target-flops (λ and the teacher temperature of eq. 7 are
not used: the dense scores here are trained; the sparsity terms enter eq. 3 as η·R, without λ).

The defaults are the schedule of `make joint` with D2S's sparse options (the gates, the caption-term
loss, image dropout, the word loss, the posting floor, the FLOPs regulariser), so `--target-flops F`
works from them (docs/joint.md); `--preset paper` (PAPER) gives the authors' configs and no D2S option."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..base import option
from ..d2s.config import D2SConfig


@dataclass
class JointConfig(D2SConfig):
    """D2S's fields (with joint's defaults) plus eq. 2-3's weights and the dense projections'."""

    PAPER: ClassVar[dict] = {**D2SConfig.PAPER, "epochs": 5, "batch_size": 512, "vocab_lr": 1e-3,
                             "weight_decay": 0.01, "lr_warmup": 0.0, "eta": 1e-3, "l1_warmup": 0.0, "init_bias": 0.0,
                             "l1_caption": "masked", "final_lr": 1e-5}

    sparsify_options = {"dense_out": (None, "Joint heads: also write the tuned dense vectors here (default: OUT "
                                            "without .h5 + '.dense.h5'). DENSE must hold the states the head was "
                                            "trained on: final_input (encode-dense --final-layer-inputs) or "
                                            "pre_projection (--pre-projection).", Path)}

    dense_side: str = option("final-layer", "What of the dense encoders is trained with the head: final-layer = "
                             "each tower's final layer and its projection, run on the stored final-layer inputs "
                             "(files of `encode-dense --final-layer-inputs`; the model the files name is loaded "
                             "once, by its fingerprint, for the layers' weights). Final layer: BERT-like text towers "
                             "(BLIP, ALBEF) = the last transformer layer + pooler; CLIP/SigLIP text = the last layer + "
                             "final layernorm + EOS token / SigLIP's head; ViT image towers (BLIP, ALBEF, CLIP, "
                             "SigLIP) = the last block + post-layernorm + [CLS] / SigLIP's attention pooling; "
                             "EfficientNet = top conv + batch norm (frozen statistics) + activation + pooling "
                             "(docs/joint.md). pre-projection = the projections only, over pooled "
                             "pre-projection states (files of --pre-projection; faster, not the paper's method).",
                             choices=("final-layer", "pre-projection"), paper="final-layer (§2, Fig. 1)")
    tune_final_layer: bool = option(True, "Train the copies of the towers' final layers with the head "
                                    "(--freeze-final-layer keeps the backbone's; joint with --freeze-projection too: "
                                    "the dense side frozen, paper Table 3, row 1; vdr: VDR on the frozen states).",
                                    flag="--tune-final-layer/--freeze-final-layer")
    final_lr: float = option(1e-4, "AdamW peak learning rate of the final layers (no weight decay; the paper "
                             "gives none).", min=0.0)

    epochs: int = option(15, "Passes over the training data.", min=1, paper="5 (authors' configs)")
    lr: float = option(1e-3, "AdamW peak learning rate of the sparse head and τ.", min=0.0)
    vocab_lr: float = option(1e-3, "Learning rate of the vocabulary LayerNorm and W2 (joint: as --lr).", min=0.0)
    weight_decay: float = option(0.01, "AdamW weight decay of the sparse head.", min=0.0)
    lr_warmup: float = option(0.0, "Linear learning-rate warm-up: steps (>= 1) or a fraction of all steps (< 1).",
                              min=0.0)
    eta: float = option(0.025, "η_t, sparsity weight of caption vectors (eq. 3; D2S's λ·η, 0.5 x 0.05: eq. 3 has "
                        "no λ).", min=0.0, paper="1e-3 (authors' configs)")
    batch_size: int = option(256, "Pairs per step.", min=1, paper="512 (authors' configs)")
    init_bias: float = option(-2.0, "Initial W2 bias (negative = sparser start).", paper="0")
    l1_warmup: float = option(40, "L1 warm-up: η ramps quadratically over N steps (>= 1) or a fraction of all "
                              "steps (< 1).", aliases=("--warmup-steps",), min=0.0)
    l1_caption: str = option("raw", "Which caption vectors the sparsity term sees.",
                             choices=("raw", "masked"))
    expansion: str = option("full", "Expansion control of the caption sparse vectors (D2S's modes); full = none "
                            "applied, as the authors' configs (disable_mask).",
                            choices=("none", "full", "caption", "caption-word"), paper="full (authors' configs)")
    w1: float = option(0.3, "Weight of s_dense in s_inter = w1·s_dense + w2·s_sparse.", min=0.0)
    w2: float = option(1.0, "Weight of s_sparse in s_inter.", min=0.0)
    lambda_dense: float = option(1.0, "λ1: weight of the InfoNCE loss of s_dense (eq. 2).", min=0.0)
    lambda_sparse: float = option(1.0, "λ2: weight of the InfoNCE loss of s_sparse.", min=0.0)
    lambda_inter: float = option(1.0, "λ3: weight of the InfoNCE loss of s_inter.", min=0.0)
    distill: bool = option(True, "Add the self-distillation loss L' (s_inter teaches s_dense and s_sparse); "
                           "--no-distill = contrastive only (paper Table 3, row 2).")
    tune_projection: bool = option(True, "Train copies of the backbone's image and text projections "
                                   "(--freeze-projection: paper Table 3, row 1).",
                                   flag="--tune-projection/--freeze-projection")
    proj_lr: float = option(1e-4, "AdamW peak learning rate of the projections (no weight decay); --lr applies to "
                            "the sparse head and τ.", min=0.0)
    tau_init: float = option(0.05, "Initial learnable dense temperature τ (s_dense = ⟨h_t, h_i⟩/τ; kept >= 0.01).",
                             min=0.01)
    eta_image: float | None = option(None, "η_i, L1 weight of image vectors (default: --eta).", min=0.0)
    caption_per_image: bool = option(True, "An epoch visits every image once with one random caption of it "
                                     "(batches of distinct pairs, as eq. 2) or every caption.",
                                     flag="--caption-per-image/--all-captions")
