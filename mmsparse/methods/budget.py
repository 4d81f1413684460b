"""`--target-flops F`: a FLOPs budget the sparsity weights adapt to during training (not in the papers).

SPLADE-style training (D2S eq. 7, SPLADE's FLOPs regulariser, sentence-transformers' FlopsLoss)
sets the regulariser weight η by hand, and a head lands wherever η, its gates and its schedule
put it. With a budget, the methods built on the D2S head (d2s, inference-free, joint) multiply
every sparsity weight of their loss by one factor m, and after each epoch that may be saved
(Method.eligible: the sparsity warm-up is over) `FlopsBudget.update` moves m from the FLOPs
measured that epoch, F_e (D2S eq. 1 on the validation split, on the vectors `sparsify` writes:
top-k gates and the posting floor applied):

    e    = log(F_e / F)                                     (> 0: too many FLOPs, raise η)
    log m ← log m + sign(e) · step · min(1, |e| / log(1 + tol)),   m kept in [1e-4, 1e4]
    step ← min(log 2, step · 1.5) if e has the sign it had at the last update, else step · 0.5

A multiplicative (log-space) integral update whose step halves each time FLOPs cross F, as
Rprop adapts its steps (Riedmiller and Braun 1993), and never exceeds x2 per epoch: FLOPs answer
a change of η with a lag (the weights move at the learning rate, which decays), so a faster
update overshoots, and an η large enough to kill a term's every weight (ReLU) cannot be undone
(tiny heads in tests/test_flops_budget.py did both at x8 steps). On Flickr8k's D2S head
ten times η lowers the FLOPs about 2x (docs/d2s.md), so a budget 2-4x below where η puts the
head is reached within about 5-10 epochs. Inside the tolerance band the move shrinks in
proportion to the error, so m settles when F_e ≈ F. The saved epoch is then chosen as
--max-val-flops chooses it, with F·(1 + tol) as the limit (mmsparse.trainer.pick_epoch). No
torch here.
"""

from __future__ import annotations

import math

TOLERANCE = 0.15   # the saved epoch's FLOPs may exceed the budget by this share (its limit is F·(1 + TOLERANCE))
MAX_STEP = math.log(2.0)           # no update moves m by more than x2 (the first one included)
MIN_STEP = 0.02
GROW, SHRINK = 1.5, 0.5
MIN_LOG_SCALE, MAX_LOG_SCALE = math.log(1e-4), math.log(1e4)


class FlopsBudget:
    """The multiplier m (`scale`, starts at 1) of a method's sparsity weights under a FLOPs budget
    `target` (> 0, D2S eq. 1: expected shared terms per query-image pair).

    update(flops) after each eligible epoch returns the new m; state_dict/load_state_dict make a
    resumed run continue exactly; `record` is what a head's config.json keeps of the run
    (target, limit, the multiplier per epoch)."""

    def __init__(self, target: float, tolerance: float = TOLERANCE):
        if not target > 0:
            raise ValueError(f"target FLOPs {target} must be > 0")
        self.target, self.tolerance = float(target), float(tolerance)
        self.log_scale = 0.0
        self.step = MAX_STEP
        self.last_sign = 0
        self.last_err: float | None = None
        self.trace: list[dict] = []   # one entry per update: epoch, FLOPs measured, multiplier after

    @property
    def scale(self) -> float:
        """m, the factor every sparsity weight is multiplied by (float > 0)."""
        return math.exp(self.log_scale)

    @property
    def limit(self) -> float:
        """The most validation FLOPs a saved epoch may have: target·(1 + tolerance)."""
        return self.target * (1.0 + self.tolerance)

    def update(self, flops: float, epoch: int | None = None) -> float:
        """Move m from the FLOPs measured after an epoch (> 0; 0 = an empty head: m halves its way
        down as for any reading below the target). Returns the new m."""
        err = math.log(max(float(flops), 1e-6) / self.target)
        # the error one epoch ahead at the current trend: FLOPs follow η with a lag, so a reading
        # still above F but falling fast towards it must not raise η further (a PD controller)
        drive = err if self.last_err is None else 2 * err - self.last_err
        self.last_err = err
        err = drive
        sign = (err > 0) - (err < 0)
        if sign:
            if self.last_sign:
                self.step = min(MAX_STEP, max(MIN_STEP, self.step * (GROW if sign == self.last_sign else SHRINK)))
            self.last_sign = sign
            move = sign * self.step * min(1.0, abs(err) / math.log1p(self.tolerance))
            self.log_scale = min(MAX_LOG_SCALE, max(MIN_LOG_SCALE, self.log_scale + move))
        self.trace.append({"epoch": epoch, "FLOPs": float(flops), "scale": self.scale})
        return self.scale

    def record(self) -> dict:
        """{"target", "limit", "scale" (the last m), "trace"} for a head's config.json."""
        return {"target": self.target, "limit": self.limit, "scale": self.scale, "trace": list(self.trace)}

    def state_dict(self) -> dict:
        return {"log_scale": self.log_scale, "step": self.step, "last_sign": self.last_sign, "last_err": self.last_err,
                "trace": list(self.trace)}

    def load_state_dict(self, state: dict) -> None:
        self.log_scale, self.step = float(state["log_scale"]), float(state["step"])
        self.last_sign, self.last_err, self.trace = int(state["last_sign"]), state["last_err"], list(state["trace"])
