"""`--target-flops F`: a FLOPs budget reached by the sparsity weight and the top-k gates together
(not in the papers).

SPLADE-style training (D2S eq. 7, SPLADE's FLOPs regulariser, sentence-transformers' FlopsLoss)
sets the regulariser weight η by hand, and a head lands wherever η, its gates and its schedule put
it. With a budget, after each epoch that may be saved (Method.eligible: the sparsity warm-up is
over) the controller reads the validation split's vectors as `sparsify` writes them (posting floor
cut, gates applied) and moves two actuators toward D2S eq. 1's FLOPs = F:

1. **The sparsity weight multiplier m** (`FlopsBudget.update`), the primary actuator: every
   sparsity weight of the loss (d2s: η; inference-free: η and --eta-query-flops; joint: η_t, η_i)
   is multiplied by m, which moves in log space against e = log(F_e / F) extrapolated one epoch at
   its trend (2e − e_prev), by at most ×2 an epoch, its step halved at each crossing (Rprop,
   Riedmiller and Braun 1993), in proportion to the error inside ±15 %, m in [1e-4, 1e4]; never up
   after an epoch whose validation metric fell by more than MAX_DROP (what drove a paper-preset head
   from R@1 18.9 to 0.3 in issue 49: m doubled for 11 epochs while the head died), and not in an
   epoch where the gates moved (two actuators on one reading overshoot). The multiplier chooses
   which terms to drop, the gates only how many: at equal FLOPs it kept more recall (docs/d2s.md).
2. **The top-k gates** (`GateProbe`, `FlopsBudget.plan`) where the multiplier cannot do the job
   (`gates_turn`): FLOPs more than FAR × F (the paper's ungated head starts near FLOPs 7,500), the
   multiplier's rise refused, m at or above HIGH_SCALE, or FLOPs under the band with m at or below
   LOW_SCALE (a head whose gates cap it below F). FLOPs = Σ_t p_q(t)·p_d(t) answer a gate at once, and the validation
   vectors re-gated at any k tell exactly what a gate costs in FLOPs and in the select metric before
   training takes it: the goal moves toward F by at most ×2 (`RATIO`: "tighten gradually"), and of
   the gate pairs k_q × k_d (a √2 ladder, queries and images apart) whose FLOPs reach it the one
   with the best validation metric is taken, provided it keeps at least (1 − MAX_DROP) of the
   epoch's metric; otherwise the goal is halved in log space (at most three times), else the gates
   hold. Training then adapts the head to the gates it is given (the loss sees gated vectors).

The saved epoch is chosen as --max-val-flops chooses it, with F·(1 + tol) as the limit and F / (1 +
tol) as the floor where an epoch reaches it (mmsparse.trainer.pick_epoch); `collapsed` says when it
kept less than half the run's best metric. No torch here.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

TOLERANCE = 0.15   # the saved epoch's FLOPs may exceed the budget by this share (its limit is F·(1 + TOLERANCE))
MAX_STEP = math.log(2.0)           # no update moves m by more than x2 (the first one included)
MIN_STEP = 0.02
GROW, SHRINK = 1.5, 0.5
MIN_LOG_SCALE, MAX_LOG_SCALE = math.log(1e-4), math.log(1e4)
RATIO = 2.0        # a gate step moves the FLOPs goal by at most this factor an epoch
MAX_DROP = 0.05    # a gate step may cost at most this share of the epoch's validation metric
COLLAPSE = 0.5     # a saved metric below this share of the run's best is reported as a collapse
GUARD_WINDOW = 3   # the 5 % guard compares with the best metric of this many epochs before (not just the last)
INEFFECTIVE = 2    # cuts of m that did not raise FLOPs under the band before m holds (anti-windup)
LADDER = sorted({int(round(4 * 2 ** (i / 2))) for i in range(0, 24)})   # 4, 6, 8, 11, 16, 23, 32, 45, 64, ... 8192
SHORTLIST = 6      # gate pairs whose metric is measured per goal (those with the most FLOPs under it)
EFFECT = 0.05      # gates whose FLOPs differ from the current ones' by less than this share are not a move
FAR = 4.0          # FLOPs above this many times F: the gates step down (nearer, the multiplier alone)
LOW_SCALE = 1 / 16 # FLOPs under the band with the multiplier at or below this: the gates step up
HIGH_SCALE = 16.0  # FLOPs above the band with the multiplier at or above this: the gates step down


class GateProbe:
    """The validation vectors of one epoch before the top-k gates, re-gated at any k without the head.

    q_cols / d_cols [N, K] int64: each query's / image's K largest-weight columns, in descending
    weight order; q_vals / d_vals [N, K] float32 their weights (0 = not positive, and for images
    at or below the posting floor, which `sparsify` applies after the gate). gold [Nq] int64: the
    row of each query's image. `fixed_queries`: a CSR [Nq, |V|] used as is (inference-free
    queries, which have no gate); then q_cols / q_vals are None. `metric`: the select metric's key
    of mmsparse.metrics.exhaustive.sparse_retrieval_metrics (R@1, R@5, R@10, MRR@10).
    """

    def __init__(self, vocab_size: int, d_cols: np.ndarray, d_vals: np.ndarray, gold: np.ndarray,
                 q_cols: np.ndarray | None = None, q_vals: np.ndarray | None = None,
                 fixed_queries: sp.csr_matrix | None = None, metric: str = "R@1"):
        self.v, self.gold, self.metric = int(vocab_size), np.asarray(gold), metric
        self.d_cols, self.d_vals = d_cols, d_vals
        self.q_cols, self.q_vals, self.fixed = q_cols, q_vals, fixed_queries
        self._p: dict = {}

    @property
    def sides(self) -> tuple[str, ...]:
        """The gated sides: ("text", "image"), or ("image",) with fixed queries."""
        return ("image",) if self.fixed is not None else ("text", "image")

    def widest(self, side: str) -> int:
        """The most positive weights any row of `side` holds before the gate (the K it was read at)."""
        vals = self.d_vals if side == "image" else self.q_vals
        return int((vals > 0).sum(1).max()) if vals.size else 0

    def _arrays(self, side):
        return (self.d_cols, self.d_vals) if side == "image" else (self.q_cols, self.q_vals)

    def matrix(self, side: str, k: int) -> sp.csr_matrix:
        """Side `side` gated at k (0 = no gate: every column read), CSR [N, |V|] float32."""
        if side == "text" and self.fixed is not None:
            return self.fixed
        cols, vals = self._arrays(side)
        k = cols.shape[1] if not k else min(int(k), cols.shape[1])
        c, w = cols[:, :k], vals[:, :k]
        keep = w > 0
        indptr = np.zeros(len(c) + 1, dtype=np.int64)
        np.cumsum(keep.sum(1), out=indptr[1:])
        m = sp.csr_matrix((w[keep], c[keep], indptr), shape=(len(c), self.v))
        m.sort_indices()
        return m

    def share(self, side: str, k: int) -> np.ndarray:
        """p(t) [|V|] float64: the share of `side`'s rows holding term t when gated at k."""
        key = (side, k)
        if key not in self._p:
            if side == "text" and self.fixed is not None:
                m = self.fixed
                p = np.bincount(m.indices[m.data > 0], minlength=self.v) / max(m.shape[0], 1)
            else:
                cols, vals = self._arrays(side)
                kk = cols.shape[1] if not k else min(int(k), cols.shape[1])
                c = cols[:, :kk][vals[:, :kk] > 0]
                p = np.bincount(c, minlength=self.v) / max(len(cols), 1)
            self._p[key] = p
        return self._p[key]

    def flops(self, gates: dict) -> float:
        """D2S eq. 1 of the gated vectors: Σ_t p_q(t)·p_d(t). gates: {side: k} (0 = none)."""
        return float(self.share("text", gates.get("text", 0)) @ self.share("image", gates.get("image", 0)))

    def figures(self, gates: dict) -> dict:
        """sparse_retrieval_metrics of the vectors gated at `gates` (R@k, MRR@10, FLOPs, q_nnz, d_nnz)."""
        from ..metrics.exhaustive import sparse_retrieval_metrics

        return sparse_retrieval_metrics(self.matrix("text", gates.get("text", 0)),
                                        self.matrix("image", gates.get("image", 0)), self.gold)


def candidates(current: int, widest: int) -> list[int]:
    """The gate values one step may take on a side now at `current` (0 = no gate) whose rows hold at
    most `widest` positive weights: the ladder between current / 8 and 2 × current (an ungated side:
    every ladder value below `widest`, and 0 to stay ungated)."""
    if not current:
        return [0] + [k for k in LADDER if k < widest]
    return sorted({k for k in LADDER if current / 8 <= k <= 2 * current} | {current})


class FlopsBudget:
    """The controller of one training run under a FLOPs budget `target` (> 0, D2S eq. 1: expected
    shared terms per query-image pair): the multiplier m (`scale`) of the method's sparsity weights
    and the top-k gates (`gates`, {side: k}, 0 = none; {} until the method reports its gates).

    Per eligible epoch: `plan(probe, figures)` may move the gates; `update(flops, epoch, moved,
    metric)` moves m. `state_dict` / `load_state_dict` resume exactly; `record` is what a head's
    config.json keeps (target, limit, m, gates and the trace per epoch)."""

    def __init__(self, target: float, tolerance: float = TOLERANCE):
        if not target > 0:
            raise ValueError(f"target FLOPs {target} must be > 0")
        self.target, self.tolerance = float(target), float(tolerance)
        self.log_scale = 0.0
        self.step = MAX_STEP
        self.last_sign = 0
        self.last_err: float | None = None
        self.metrics: list[float] = []   # the select metric of the epochs since the (re)start, for the guard
        self.last_flops: float | None = None
        self.ineffective = 0          # consecutive cuts of m under the band that did not raise FLOPs
        self.refused = False          # the multiplier's last rise was refused (the metric fell)
        self.gates: dict = {}
        self.trace: list[dict] = []   # one entry per update: epoch, FLOPs measured, multiplier and gates after

    @property
    def scale(self) -> float:
        """m, the factor every sparsity weight is multiplied by (float > 0)."""
        return math.exp(self.log_scale)

    def band(self, target: float | None = None) -> tuple[float, float]:
        """(floor, limit) of `target`'s band (default this budget's): target / (1 + tolerance) and
        target·(1 + tolerance), the FLOPs a saved epoch may have."""
        t = self.target if target is None else float(target)
        return t / (1.0 + self.tolerance), t * (1.0 + self.tolerance)

    @property
    def limit(self) -> float:
        """The most validation FLOPs a saved epoch may have: target·(1 + tolerance)."""
        return self.band()[1]

    @property
    def floor(self) -> float:
        """The lower edge of the band: target / (1 + tolerance)."""
        return self.band()[0]

    def in_band(self, flops: float) -> bool:
        """Whether `flops` is within the target's ±tolerance band."""
        return self.floor <= flops <= self.limit

    def gates_turn(self, flops: float) -> bool:
        """Whether the gates move after an epoch that measured `flops`: outside the band, and only
        where the multiplier cannot do the job: FLOPs more than FAR × F (a head far from its budget,
        e.g. the paper's ungated head, which η would take many epochs and risk the head to bring
        down), the multiplier's last rise refused (the metric fell), the multiplier at or above
        HIGH_SCALE (more pressure than that destroyed heads), or FLOPs under the band with the
        multiplier at or below LOW_SCALE (less sparsity pressure no longer raises them)."""
        if self.in_band(flops):
            return False
        if flops > self.target:
            return flops > FAR * self.target or self.refused or self.scale >= HIGH_SCALE
        return self.scale <= LOW_SCALE or self.saturated

    @property
    def saturated(self) -> bool:
        """m has been cut INEFFECTIVE times in a row under the target without raising FLOPs (the gates
        cap the head): m holds, and below the band the gates may turn instead."""
        return self.ineffective >= INEFFECTIVE

    def retarget(self, target: float, flops: float, epoch: int | None = None) -> float:
        """Move to a new budget `target` (> 0) mid-run (a budget path, `--target-flops 12,9.4,6`):
        the Rprop step, the trend, the metric guard and the anti-windup count start afresh (the
        metric is expected to fall with the FLOPs), and the first step is taken at once from the
        FLOPs the last epoch measured (`flops`), so the next epoch already trains under the new
        pressure. Returns the new m. Raises ValueError when target <= 0."""
        if not target > 0:
            raise ValueError(f"target FLOPs {target} must be > 0")
        self.target = float(target)
        self.step, self.last_sign, self.last_err = MAX_STEP, 0, None
        self.metrics, self.last_flops, self.ineffective, self.refused = [], None, 0, False
        self.update(flops, epoch)
        self.trace[-1]["retarget"] = self.target
        return self.scale

    def plan(self, probe, figures: dict) -> dict:
        """New gates {side: k} from this epoch's validation vectors `probe` (a GateProbe, or a
        callable returning one, called only when needed) and figures (its "FLOPs" and the probe's
        metric at the current gates): unchanged inside the band; otherwise the best
        metric among the gate pairs whose FLOPs reach a goal at most RATIO × nearer F, the goal
        halved (in log space) while the best pair would cost more than MAX_DROP of the metric;
        unchanged too when the best pair's FLOPs are within EFFECT of the current ones (the gates do
        not bind: the multiplier moves instead). Sets and returns self.gates."""
        f_now = float(figures["FLOPs"])
        if not self.gates_turn(f_now):
            return self.gates
        probe = probe() if callable(probe) else probe
        sides = probe.sides
        cur = {s: int(self.gates.get(s, 0)) for s in sides}
        m_now = float(figures[probe.metric])
        down = f_now > self.target
        grid = [{}]
        for s in sides:
            grid = [{**g, s: k} for g in grid for k in candidates(cur[s], probe.widest(s))]
        flops = [probe.flops(g) for g in grid]
        goal = max(self.target, f_now / RATIO) if down else min(self.target, f_now * RATIO)
        for _ in range(4):
            under = sorted((f, i) for i, f in enumerate(flops) if f <= goal * (1 + self.tolerance / 3))
            short = [i for _, i in under[-SHORTLIST:]]
            scored = [(probe.figures(grid[i])[probe.metric], flops[i], i) for i in short]
            if scored:
                best = max(scored)
                if abs(math.log(max(best[1], 1e-9) / max(probe.flops(cur), 1e-9))) < math.log(1 + EFFECT):
                    break   # the gates do not bind here (rows hold fewer weights): the multiplier's turn
                if not down or best[0] >= (1 - MAX_DROP) * m_now:
                    self.gates = grid[best[2]]
                    return self.gates
            goal = math.sqrt(goal * f_now) if down else goal
        self.gates = cur
        return cur

    def update(self, flops: float, epoch: int | None = None, moved: bool = False,
               metric: float | None = None) -> float:
        """Move m from the FLOPs measured after an epoch (> 0; 0 = an empty head: m halves its way
        down as for any reading below the target). moved: the gates moved this epoch (m holds);
        metric: the epoch's validation metric (m never rises after it fell by more than MAX_DROP).
        Returns the new m."""
        err = math.log(max(float(flops), 1e-6) / self.target)
        # the error one epoch ahead at the current trend: FLOPs follow η with a lag, so a reading
        # still above F but falling fast towards it must not raise η further (a PD controller)
        drive = err if self.last_err is None else 2 * err - self.last_err
        self.last_err = err
        # the guard reads the best metric of the last GUARD_WINDOW epochs: a slow fall (4 % an
        # epoch) is caught within two epochs, not only a sudden one
        ref = max(self.metrics[-GUARD_WINDOW:]) if self.metrics else None
        fell = metric is not None and ref is not None and metric < (1 - MAX_DROP) * ref
        if metric is not None:
            self.metrics.append(float(metric))
        sign = (drive > 0) - (drive < 0)
        self.refused = bool(fell and sign > 0)
        if self.refused:   # the head paid for the last rise: no further rise, a smaller step, the gates' turn
            sign, self.step = 0, max(MIN_STEP, self.step * SHRINK)
        # anti-windup: under the target (in the band or below it), a cut of m that did not raise
        # FLOPs (the gates cap the head) is not repeated without end; m holds after INEFFECTIVE of
        # them, so a later, tighter budget does not have to climb back from 1e-4 (it sank to 0.05
        # within 8 epochs inside the band of 12 on Flickr8k)
        if sign < 0:
            flat = self.last_sign < 0 and self.last_flops is not None and flops <= self.last_flops * (1 + EFFECT)
            self.ineffective = self.ineffective + 1 if flat else 0
            if self.saturated:
                sign = 0
        else:
            self.ineffective = 0
        self.last_flops = float(flops)
        if sign and not moved:
            if self.last_sign:
                self.step = min(MAX_STEP, max(MIN_STEP, self.step * (GROW if sign == self.last_sign else SHRINK)))
            self.last_sign = sign
            move = sign * self.step * min(1.0, abs(drive) / math.log1p(self.tolerance))
            self.log_scale = min(MAX_LOG_SCALE, max(MIN_LOG_SCALE, self.log_scale + move))
        self.trace.append({"epoch": epoch, "FLOPs": float(flops), "scale": self.scale,
                           **({"gates": dict(self.gates)} if self.gates else {})})
        return self.scale

    def record(self) -> dict:
        """{"target", "limit", "scale" (the last m), "gates" (the last), "trace"} for a head's config.json."""
        return {"target": self.target, "limit": self.limit, "scale": self.scale, "gates": dict(self.gates),
                "trace": list(self.trace)}

    def state_dict(self) -> dict:
        return {"target": self.target, "log_scale": self.log_scale, "step": self.step, "last_sign": self.last_sign,
                "last_err": self.last_err, "metrics": list(self.metrics),
                "last_flops": self.last_flops, "ineffective": self.ineffective, "refused": self.refused,
                "gates": dict(self.gates), "trace": list(self.trace)}

    def load_state_dict(self, state: dict) -> None:
        self.log_scale, self.step = float(state["log_scale"]), float(state["step"])
        self.last_sign, self.last_err, self.trace = int(state["last_sign"]), state["last_err"], list(state["trace"])
        self.gates = dict(state.get("gates") or {})
        self.refused = bool(state.get("refused", False))
        self.target = float(state.get("target", self.target))
        self.metrics, self.last_flops = list(state.get("metrics", [])), state.get("last_flops")
        self.ineffective = int(state.get("ineffective", 0))


def collapsed(history: list[dict], saved: int, metric: str, eligible=None) -> tuple[float, float, int] | None:
    """(saved metric, the run's best, its epoch) when the saved epoch `saved` (0-based index of
    `history`, whose records carry "val" figures) kept less than COLLAPSE × the best validation
    `metric` any epoch that may be saved reached (`eligible(record)`, e.g. Method.eligible: epochs
    inside the sparsity warm-up are near dense and not a fair best); None otherwise (or without
    validation figures)."""
    vals = [(h.get("val") or {}).get(metric) if eligible is None or eligible(h) else None for h in history]
    seen = [(v, i) for i, v in enumerate(vals) if v is not None]
    here = (history[saved].get("val") or {}).get(metric)
    if not seen or here is None:
        return None
    best, at = max(seen)
    return (here, best, at + 1) if here < COLLAPSE * best else None


def parse_budgets(value) -> list[tuple[str, float]]:
    """--target-flops as given: a number, or budgets separated by commas ("12,9.4,6"), largest
    first. Returns [(label as written, e.g. "9.4", value)], [] for None. Raises ValueError naming
    the entry when one is not a number > 0 or when they are not strictly decreasing."""
    if value is None:
        return []
    if isinstance(value, (int, float)):
        items = [(f"{float(value):g}", float(value))]
    else:
        items = []
        for part in str(value).split(","):
            text = part.strip()
            try:
                f = float(text)
            except ValueError:
                raise ValueError(f"{text!r} is not a number (give budgets as 12,9.4,6)") from None
            items.append((text, f))
    for text, f in items:
        if not (f > 0 and math.isfinite(f)):
            raise ValueError(f"{text} must be a number > 0")
    if any(b[1] >= a[1] for a, b in zip(items, items[1:])):
        raise ValueError(f"{','.join(t for t, _ in items)}: give the budgets largest first, each below the one before")
    return items


def diagnose(history: list[dict], target: float, refused: bool = False, at_bound: bool = False) -> str:
    """Why no epoch of `history` (records with "val" FLOPs) kept validation FLOPs within target's
    band, and what to change, as one clause. "too short" only where more epochs would help: the
    FLOPs were still falling at the last epochs and the multiplier neither refused nor at its bound;
    otherwise the head's recall (the guard) or the multiplier's bound stopped it, or it lands under
    the band. Never fails on FLOPs of 0."""
    seen = [(h["epoch"], float(h["val"]["FLOPs"])) for h in history if "FLOPs" in (h.get("val") or {})]
    if not seen:
        return "no epoch was validated; give validation files"
    last = seen[-1][1]
    if last < target / (1 + TOLERANCE):
        return (f"it ends under the band (FLOPs {last:.3g}): the gates or the posting floor cap the head; raise "
                "--doc-top-k / --query-top-k or lower --eta")
    falling = len(seen) >= 2 and seen[-1][1] < seen[-2][1] * (1 - EFFECT)
    if falling and not refused and not at_bound:
        e0, f0 = seen[0]
        need = max(1, math.ceil(math.log(max(last, 1e-9) / (target * (1 + TOLERANCE))) / math.log(RATIO)))
        return (f"the schedule is too short: from {f0:,.1f} at epoch {e0} the FLOPs were still falling ({last:.3g} at "
                f"the last epoch), at most x{RATIO:g} an epoch, so it needs about {need} more epochs; raise --epochs "
                "(or start sparser: a larger --eta, smaller --query-top-k / --doc-top-k)")
    why = ("the multiplier's rise was refused because validation recall fell" if refused else
           "the multiplier reached its bound" if at_bound else "the FLOPs stopped falling")
    return (f"{why}, so more epochs would not help; raise --target-flops, or tighten the gates "
            "(--query-top-k / --doc-top-k) to start nearer the budget")
