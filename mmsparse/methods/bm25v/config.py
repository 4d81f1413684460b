"""Options of BM25-V's visual words: a top-k sparse autoencoder on patch features (BM25-V paper
§3.3, §3.6), and of pooling them into image documents (eq. 6-8, §3.4)."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import TrainConfig, option


@dataclass
class BM25VConfig(TrainConfig):
    """The shared fields with §3.6's defaults (5 epochs, batch 4096, Adam with cosine decay: AdamW
    without weight decay), then the SAE's."""

    sparsify_options = {"k_post": (16, "Visual words kept per image after sum-pooling (eq. 8, paper 16)."),
                        "quantize": (True, "Store weights as uint16 round(v·100), read back ÷100 (§3.4).")}

    epochs: int = option(5, "Passes over all training patches.", min=1, paper="5 (§3.6)")
    batch_size: int = option(4096, "Patches per optimizer step.", min=1, paper="4096 (§3.6)")
    lr: float = option(4e-4, "Peak learning rate, cosine-decayed to 0 over all steps.", min=0.0)
    weight_decay: float = option(0.0, "Weight decay (0: Adam, as §3.6).", min=0.0)
    lr_schedule: str = option("cosine", "Learning rate schedule: linear, cosine or constant.",
                              choices=("linear", "cosine", "constant"))
    sae_k: int = option(16, "Visual words kept per patch: top-k of ReLU(W_e z + b_e) (eq. 3).", min=1,
                        paper="16")
    sae_expansion: int = option(16, "Expansion factor e: a vocabulary of e·D visual words.", min=1, paper="16")
    sae_lambda: float = option(1e-3, "λ of the L1 term in ||ẑ - z||² + λ||h||_1.", min=0.0, paper="1e-3 (§3.6)")
    patch_skip: int = option(0, "Leading patch positions to ignore (1 for a ViT's [CLS]; 0 for conv maps); "
                             "sparsify applies the same.", min=0)
    sae_buffer_images: int = option(8192, "Images whose patches are held in the shuffle buffer (memory ~ this x "
                                    "P x D x 4 bytes); patches stream from the HDF5 file.", min=1)
