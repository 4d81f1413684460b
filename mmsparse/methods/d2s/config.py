"""Options of D2S training (Nguyen et al., "Multimodal Learned Sparse Retrieval with Probabilistic
Expansion Control", eq. 4-7, Algorithm 1). No torch here: `train-head --help` reads it."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import TrainConfig, VocabConfig, option

# Expansion-control modes and the paper's names for them (Tables 2-3).
EXPANSION_MODES = ("none", "full", "caption", "caption-word")
PAPER_NAMES = {"none": "exp=0", "full": "exp=1", "caption": "exp=c", "caption-word": "exp=c+w"}


@dataclass
class D2SConfig(TrainConfig, VocabConfig):
    """D2S hyper-parameters; the fields after the shared ones are eq. 7 and Algorithm 1's."""

    eta: float = option(3e-3, "η, weight of the L1 sparsity term (eq. 7).", min=0.0)
    lam: float = option(0.5, "λ in eq. 7: (1-λ)·contrastive + λ·η·L1.", aliases=("--lambda",), min=0.0, max=1.0)
    temperature: float = option(1e-3, "τ of the dense teacher softmax z_Aᵀz_B/τ (eq. 7).", min=1e-6)
    warmup_steps: int = option(60, "L1 warm-up: η ramps quadratically η·min(1,(step/N)²) over the first N "
                               "optimizer steps (0 = full η from the start); epochs ending before step N "
                               "are not eligible as the saved epoch.", min=0)
    expansion: str = option("caption-word", "Probabilistic expansion control: "
                            + ", ".join(f"{m} ({PAPER_NAMES[m]})" for m in EXPANSION_MODES) + ".",
                            choices=EXPANSION_MODES)
    mask_caption_terms: bool = option(True, "caption-word only: also drop a caption's own term v when its "
                                      "word-level draw E_v is 0 (Algorithm 1 as printed) or always keep own "
                                      "terms (the prose's reading).", flag="--mask-caption-terms/--keep-caption-terms")
    l1_caption: str = option("raw", "Which caption vectors the L1 term sees: raw (the head's output before "
                             "expansion masking) or masked (s̄_C, Algorithm 1's loss input).",
                             choices=("raw", "masked"))
    pec_schedule: str = option("epoch", "epoch: raise p_c, p_v after each epoch (eq. 6); step: the same linear "
                               "ramp updated every step.", choices=("epoch", "step"))
    init_bias: float = option(0.0, "Initial W2 bias (negative = sparser start).")
    vocab_min_df: int = option(1, "Keep only terms in >= N training captions (0 = the whole tokenizer vocabulary, "
                               "the paper's setting). 1 drops terms no caption uses.", min=0,
                               paper="0 (full vocabulary)")
