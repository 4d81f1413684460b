"""Probabilistic expansion control (PEC), D2S paper Algorithm 1 and eq. 6.

Modes (`--expansion`; the paper's exp= values in brackets):
  none          [exp=0]   a caption keeps only its own terms, never expands
  full          [exp=1]   no masking
  caption       [exp=c]   caption-level control only: non-caption terms kept iff E_C = 1
  caption-word  [exp=c+w] caption- and word-level control: non-caption term v kept iff
                          E_C = 1 and E_v = 1

Schedules after epoch e (0-based, E epochs), reaching 1 at a fraction `end` of training:
  p_c = min(1, e / (end·E))                   starts at 0, +1/(end·E) per epoch
  p_v = min(1, 1 - df_v + df_v · p_c)         starts at 1 - df_v, +df_v/(end·E) per epoch
end = 1 is eq. 6 applied e times (p_c = (E-1)/E in the last epoch); the authors' code uses 0.95.

Draws per batch, as Algorithm 1 prints them: E_C ~ Ber(p_c) once per batch (every caption of a
batch expands, or none does) and E_v ~ Ber(p_v) once per vocabulary term ([1, |V|]).
One E_C per batch matters: with one draw per caption, a batch mixes expanded captions (hundreds
of terms) with caption-term-only ones, and in the image→caption softmax the expanded captions
outscore every paired caption; on Flickr8k that drove the head to ~6 terms per image within an
epoch of expansion starting.

Caption terms: Algorithm 1 as printed multiplies a caption's own terms by E_v too
(`mask_caption_terms=True`, only meaningful for caption-word); the prose only speaks of
controlling expansion (`mask_caption_terms=False`); the printed algorithm is the default.
"""

from __future__ import annotations

# torch/numpy are imported inside the methods so that importing the config stays light.

from .config import EXPANSION_MODES as MODES

class ExpansionControl:
    """Per-epoch expansion probabilities and per-batch Bernoulli masks.

    mode: one of MODES; df: [|V|] normalised document frequency of each term over the training
    captions (fraction of captions containing it, in [0, 1]); epochs: total epochs E.
    """

    def __init__(self, mode: str, df, epochs: int, mask_caption_terms: bool = True, end: float = 1.0):
        import numpy as np
        import torch

        if mode not in MODES:
            raise ValueError(f"expansion mode {mode!r} not in {MODES}")
        self.mode = mode
        self.df = torch.as_tensor(np.asarray(df), dtype=torch.float32).clamp(0, 1)
        self.epochs = max(int(epochs), 1)
        self.end = float(end)
        self.mask_caption_terms = bool(mask_caption_terms)
        self.epoch = 0
        self.p_c = 0.0
        self.p_v = 1.0 - self.df
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Probabilities for (0-based) `epoch`: eq. 6 applied `epoch` times from the initial values."""
        self.epoch = int(epoch)
        self.set_progress(self.epoch / self.epochs)

    def set_progress(self, frac: float) -> None:
        """Probabilities at a fraction `frac` of training (epoch e of E: e/E). With few epochs the
        trainer may call this every step (`schedule="step"`): the same linear ramp as eq. 6 without
        its jumps of 1/E at epoch boundaries."""
        self.p_c = min(1.0, max(0.0, float(frac) / self.end))
        self.p_v = (1.0 - self.df + self.df * self.p_c).clamp(0, 1)

    def step_epoch(self) -> None:
        """f_incr (eq. 6): call after each epoch."""
        self.set_epoch(self.epoch + 1)

    def mask(self, caption_terms: "torch.Tensor", generator: "torch.Generator | None" = None,
             cols: "torch.Tensor | None" = None) -> "torch.Tensor | None":
        """Bernoulli keep-mask for a batch of caption vectors.

        caption_terms: [B, |V|] float32 0/1, 1 where term v occurs in caption b; or [B, K] when
        `cols` [K] int64 says which vocabulary columns they are (the trainer's live columns), or
        [B, K] with `cols` [B, K]: each entry's own column (the gated trainer's top columns). The
        draws are the same either way (E_v is drawn for all |V| terms, then indexed), so a masked
        subset of columns equals the same columns of the full mask.
        Returns a tensor shaped like caption_terms, float32 0/1 to multiply s_C by, or None (mode
        full: keep everything).
        """
        import torch

        if self.mode == "full":
            return None
        t = caption_terms
        if self.mode == "none":
            return t.clone()
        # draws on the (CPU) generator, then moved: the same masks on every device
        e_c = (torch.rand(1, 1, generator=generator) < self.p_c).to(t.device, t.dtype)        # one per batch
        if self.mode == "caption":
            # keep = T + (1 - T) * E_C
            return t + (1.0 - t) * e_c
        e_v = (torch.rand(1, len(self.p_v), generator=generator) < self.p_v).to(t.device, t.dtype)[0]  # [|V|]
        if cols is not None:
            e_v = e_v[cols.to(t.device)]
        expand = e_c * e_v                                                            # [B, |V|]
        own = e_v if self.mask_caption_terms else torch.ones_like(e_v)
        # keep = T * own + (1 - T) * E_C * E_v, without a Python loop over |V|
        return expand + t * (own - expand)

    def state_dict(self) -> dict:
        return {"mode": self.mode, "epoch": self.epoch, "p_c": self.p_c, "p_v": self.p_v.clone(),
                "mask_caption_terms": self.mask_caption_terms}

    def load_state_dict(self, state: dict) -> None:
        import torch

        self.set_epoch(int(state["epoch"]))
        self.p_c = float(state["p_c"])
        self.p_v = torch.as_tensor(state["p_v"], dtype=torch.float32)
