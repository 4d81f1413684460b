"""Options of D2S training (Nguyen et al., "Multimodal Learned Sparse Retrieval with Probabilistic
Expansion Control", eq. 4-7, Algorithm 1). No torch here: `train-head --help` reads it.

The defaults are the settings that work best on validation on 2 CPU cores (docs/d2s.md "The
defaults, and why they differ from the paper" measures each); `--preset paper` (PAPER below) gives
the paper's settings, and where the paper is silent its authors' released code (lsr-multimodal:
optimiser groups, warm-ups, the end of the expansion schedule); each field's `paper` note says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import TrainConfig, VocabConfig, option

# Expansion-control modes and the paper's names for them (Tables 2-3).
EXPANSION_MODES = ("none", "full", "caption", "caption-word")
PAPER_NAMES = {"none": "exp=0", "full": "exp=1", "caption": "exp=c", "caption-word": "exp=c+w"}


@dataclass
class D2SLossConfig(TrainConfig, VocabConfig):
    """The head and eq. 7's fields with the paper's values: what every method built on the D2S head and
    its dense teacher shares (D2S, inference-free). Expansion control (Algorithm 1) is D2SConfig's.
    PAPER: the fields whose default is not the paper's, at the paper's value (`--preset paper`)."""

    PAPER: ClassVar[dict] = {"epochs": 200, "vocab_lr": 5e-5, "weight_decay": 0.0, "lr_warmup": 0.2, "eta": 1e-3,
                             "l1_warmup": 0.2, "sparsity_loss": "l1", "doc_top_k": 0, "image_dropout": 0.0,
                             "vocab_min_df": 0}

    vocab_min_df: int = option(1, "Keep only terms in >= N training captions (0 = the whole tokenizer "
                               "vocabulary, the papers' setting): 1 drops the terms no caption uses (Flickr8k: "
                               "6,740 of 30,522 kept, 4.5x faster steps).", min=0, paper="0 (full vocabulary)")

    epochs: int = option(30, "Passes over the training captions; also the length of the expansion schedule "
                         "(eq. 6).", min=1, paper="200 (§5.1)")
    batch_size: int = option(512, "Captions per step, with their distinct images as in-batch candidates.", min=1,
                             paper="512 (§5.1)")
    lr: float = option(1e-3, "AdamW peak learning rate of W1 (the dense-side projection).", min=0.0,
                       paper="1e-3 (authors' code)")
    vocab_lr: float = option(1e-3, "AdamW peak learning rate of the vocabulary LayerNorm and W2 (initialised from "
                             "word embeddings, so they move slowly).", min=0.0, paper="5e-5 (authors' code)")
    weight_decay: float = option(0.01, "AdamW weight decay of every parameter.", min=0.0, paper="0 (authors' code)")
    lr_warmup: float = option(0.0, "Linear learning-rate warm-up: steps (>= 1) or a fraction of all steps (< 1); "
                              "then linear decay to 0.", min=0.0, paper="0.2 (authors' code)")
    eta: float = option(0.05, "η, weight of the sparsity term (eq. 7).", min=0.0, paper="1e-3 (Table 1)")
    lam: float = option(0.5, "λ in eq. 7: (1-λ)·contrastive + λ·η·sparsity.", aliases=("--lambda",), min=0.0,
                        max=1.0, paper="0.5 (authors' code: both halves)")
    temperature: float = option(1e-3, "τ of the dense teacher softmax z_Aᵀz_B/τ (eq. 7).", min=1e-6,
                                paper="1e-3 (§5.1)")
    l1_warmup: float = option(60, "Sparsity warm-up: η ramps quadratically η·min(1,(step/N)²) over N steps (>= 1) "
                              "or a fraction of all steps (< 1); 0 = full η from the start. Epochs ending before "
                              "the ramp ends are not eligible as the saved epoch.", aliases=("--warmup-steps",),
                              min=0.0, paper="0.2 (authors' code)")
    sparsity_loss: str = option("flops", "l1: η·(L1(s_I) + L1(s_C)), eq. 7; flops: SPLADE's FLOPs regulariser η·Σ_t "
                                "(mean_i s_it)² per side (Paria et al. 2020), which penalises most the terms present "
                                "in every vector.", choices=("l1", "flops"), paper="l1 (eq. 7)")
    init_bias: float = option(0.0, "Initial W2 bias (negative = sparser start).", paper="0")
    center: str = option("none", "none: the head sees the dense vectors as they are; mean: subtract the training "
                         "mean of each modality first (stored in the head). Frozen vision-language vectors share "
                         "one dominant direction per modality; projected onto the vocabulary it lights the same "
                         "few 'hub' terms in every vector (docs/d2s.md).", choices=("none", "mean"),
                         paper="none")
    doc_top_k: int = option(128, "Keep only each image vector's k largest weights, in training (the gradient "
                            "reaches the kept terms) and in sparsify; 0 = every positive weight. A bound on "
                            "terms per image, as VDR's top-k gating.", min=0, paper="0 (no gate)")
    image_dropout: float = option(0.4, "Dropout on the image vectors the head sees in training (the teacher sees "
                                  "them whole): the probability of zeroing each of the d coordinates. A "
                                  "regulariser against learning the training images' words by heart. 0 = off.",
                                  min=0.0, max=0.9, paper="0 (off)")
    target_flops: float | None = option(None, "A FLOPs budget F (eq. 1: expected shared terms per query-image "
                                        "pair). After each epoch the validation vectors, as sparsify writes them "
                                        "(gates and posting floor applied), move a multiplier of every sparsity "
                                        "weight (--eta and the method's others; x2 an epoch at most, never up after "
                                        "the metric fell 5 % below its best of the last 3 epochs) and, only far "
                                        "from F or where the multiplier cannot move it, the top-k gates of each "
                                        "side (the pair with the best --select-metric whose FLOPs reach a goal at "
                                        "most 2x nearer F, at most 5 % of the metric a step); the saved epoch keeps "
                                        "validation FLOPs within F / 1.15 .. F x 1.15, else the run exits 3. "
                                        "Several budgets, largest first (12,9.4,6): one run through all of them, a "
                                        "head per budget at OUT/flops-F (--path-epochs, --path-lr). "
                                        "Without validation files 1,000 training images (a sixth of small sets) are "
                                        "held out to measure them. Recorded in config.json (training.flops_budget). "
                                        "docs/d2s.md measures where it lands. Default: off.",
                                        min=1e-3, paper="– (not in the papers)", text=True)
    path_epochs: float = option(0.34, "A budget path (several --target-flops): epochs of each budget after the "
                                "first, which gets --epochs. < 1: that share of --epochs (rounded, at least 1); "
                                ">= 1: a count. docs/d2s.md \"One run through every budget\" says how it was "
                                "chosen on validation.", min=0.0, paper="– (not in the papers)")
    path_lr: float = option(1.0, "A budget path: each later budget's peak learning rate as a share of --lr (its "
                            "own schedule, without warm-up, decaying over its epochs).", min=0.0,
                            paper="– (not in the papers)")


@dataclass
class D2SConfig(D2SLossConfig):
    """D2S hyper-parameters: D2SLossConfig's, then Algorithm 1's (probabilistic expansion control)."""

    PAPER: ClassVar[dict] = {**D2SLossConfig.PAPER, "pec_end": 0.95, "mask_caption_terms": True,
                             "l1_caption": "masked", "query_top_k": 0, "caption_terms_weight": 0.0,
                             "doc_words_weight": 0.0, "doc_words_target": "idf", "doc_words_max_df": 0.5,
                             "doc_max_share": 1.0}

    expansion: str = option("caption-word", "Probabilistic expansion control: "
                            + ", ".join(f"{m} ({PAPER_NAMES[m]})" for m in EXPANSION_MODES) + ".",
                            choices=EXPANSION_MODES, paper="caption-word (Algorithm 1)")
    pec_end: float = option(1.0, "Fraction of training at which the expansion probabilities p_c, p_v reach 1 "
                            "(1 = eq. 6 literally: p_c = (E-1)/E in the last epoch).", min=0.01, max=1.0,
                            paper="0.95 (authors' code)")
    mask_caption_terms: bool = option(False, "caption-word only: also drop a caption's own term v when its "
                                      "word-level draw E_v is 0 (Algorithm 1 as printed) or always keep own "
                                      "terms (the prose's reading).", flag="--mask-caption-terms/--keep-caption-terms",
                                      paper="mask (Algorithm 1)")
    l1_caption: str = option("raw", "Which caption vectors the sparsity term sees: masked (s̄_C, Algorithm 1's "
                             "loss input) or raw (the head's output before expansion masking).",
                             choices=("raw", "masked"), paper="masked (Algorithm 1, authors' code)")
    query_top_k: int = option(64, "Keep only each caption vector's k largest weights (expanded queries), in "
                              "training before the expansion mask and in sparsify; 0 = every positive weight.",
                              min=0, paper="0 (no gate)")
    caption_terms_weight: float = option(1.0, "Weight of a second eq. 7 contrastive term whose caption vectors keep "
                                         "only their own terms (caption-term queries, no top-k gate), added to every "
                                         "batch: trains the head for both query modes. 0 = eq. 7 alone.", min=0.0,
                                         paper="0 (eq. 7)")
    doc_words_weight: float = option(3.0, "Weight of an image-side word loss: a listwise cross-entropy between "
                                     "softmax(s_I) over the vocabulary and the image's training-caption words "
                                     "(weighted as --doc-words-target says), added to every batch. Aims the image "
                                     "vector's top terms at its captions' words (doc_Exact@k); not in the paper. "
                                     "docs/d2s.md measures what it buys and costs. 0 = off.", min=0.0,
                                     paper="0 (not in the paper)")
    doc_words_temperature: float = option(0.2, "Temperature τ_w of --doc-words-weight's softmax(s_I / τ_w): "
                                          "smaller concentrates it on the image's top terms (a ranking loss on "
                                          "the top-k); at 1 the softmax over |V| stays near uniform for weights "
                                          "of a few units.", min=1e-4, paper="– (not in the paper)")
    doc_words_target: str = option("uniform", "Word weights of --doc-words-weight's target. idf: each caption word "
                                   "weighs its image IDF (rare words dominate); uniform: each weighs 1 (frequent "
                                   "content words dominate).", choices=("idf", "uniform"),
                                   paper="– (not in the paper)")
    doc_words_max_df: float = option(0.35, "Leave out of --doc-words-weight's target the words found in the "
                                     "captions of more than this share (0-1) of the training images: a word the "
                                     "loss asks of most images ends up in most image vectors (doc_max_df). 1 = "
                                     "every word. Words are alphabetic word-start pieces (no '##', no "
                                     "punctuation).", min=0.0, max=1.0, paper="– (not in the paper)")
    doc_max_share: float = option(0.4, "Cap on each term's posting list: after training, a term positive in more "
                                  "than this share (0-1] of the training images' vectors gets a floor, its weight "
                                  "at that rank there, and every image weight at or below the floor is zeroed in "
                                  "sparsify. Term-centric static pruning with its cut estimated on the training "
                                  "images (stored in the head), so it streams; bounds doc_max_df. 1 = off.",
                                  min=0.01, max=1.0, paper="1 (no pruning)")
    pec_schedule: str = option("epoch", "epoch: raise p_c, p_v after each epoch (eq. 6); step: the same ramp "
                               "updated every step.", choices=("epoch", "step"), paper="epoch (eq. 6)")
