"""One training loop for every method: `fit(method, head, train, val)`.

What it owns, so each method gets all of it: AdamW (fused where PyTorch supports it) over the
method's parameter groups; the learning-rate schedule (warm-up, then linear, cosine or constant);
a CPU torch.Generator for shuffling and random masks (the same batches and masks on every device);
the device and bf16 autocast (`--amp`: CUDA, or a CPU with AMX/AVX512-BF16); per-epoch history and
validation; choosing the saved epoch
(best `select_metric` among eligible epochs under the method's FLOPs limit, --max-val-flops
or --target-flops); atomic epoch checkpoints and
exact resume (model, optimizer, scheduler, RNG and the method's own state); progress.

The method supplies the data, batches, loss and validation (mmsparse.methods.base.Method).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .atomic import atomic_path, kill_point
from .errors import InputError
from .progress import reporter
from .runtime import autocast, resolve_precision


@dataclass
class Stage:
    """One budget of a budget path (`--target-flops 12,9.4,6`): its label as written, the FLOPs
    target (> 0), its epochs (>= 1) and the peak learning rate's factor of its own schedule (the
    first stage: 1, the run's own schedule)."""

    label: str
    target: float
    epochs: int
    lr_scale: float = 1.0


@dataclass
class TrainResult:
    """best_epoch: the saved epoch (1-based; 0 when stopped early); history: one record per epoch
    ({"epoch", "step", "seconds", mean loss parts, "val": {...}}, and "stage" on a path); state:
    that epoch's state dict; finished: False when stopped by `stop_after_epoch`; precision: fp32 or
    bf16 (--amp resolved); stages: (saved epoch, state) per Stage of a path, the last one being
    best_epoch / state."""

    best_epoch: int
    history: list[dict]
    state: dict
    finished: bool
    precision: str = "fp32"   # what the forward passes computed in: fp32, or bf16 (--amp)
    stages: list = None


def warmup_steps(warmup: float, total: int) -> int:
    """Steps of a warm-up given as steps (>= 1) or as a fraction of `total` steps (< 1); 0 = none."""
    if warmup >= 1:
        return int(warmup)
    return max(1, round(warmup * total)) if warmup > 0 else 0


def lr_factor(step: int, total: int, warmup: float, schedule: str) -> float:
    """Learning-rate multiplier at optimizer step `step` (0-based) of `total`: a linear warm-up over
    `warmup` steps (a fraction of `total` when < 1), then `schedule`: linear (from 1 at the end of
    the warm-up to 0 at the last step, as transformers' get_linear_schedule_with_warmup), cosine
    (likewise, half a cosine), or constant."""
    warm = warmup_steps(warmup, total)
    if step < warm:
        return (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, total - warm))
    if schedule == "linear":
        return max(0.0, 1.0 - frac)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * frac))
    return 1.0


def staged_lr_factor(step: int, stages: list[Stage], spe: int, warmup: float, schedule: str) -> float:
    """Learning-rate multiplier at optimizer step `step` (0-based) of a budget path: the first stage
    runs the run's own schedule (lr_factor over its steps: a single budget is unchanged); each
    later stage restarts it at its lr_scale, without warm-up (the head is trained already), decaying
    over that stage's own steps. spe: optimizer steps per epoch."""
    start = 0
    for i, st in enumerate(stages):
        n = st.epochs * spe
        if step < start + n or i == len(stages) - 1:
            if i == 0:
                return lr_factor(step, n, warmup, schedule)
            return st.lr_scale * lr_factor(step - start, n, 0.0, schedule)
        start += n
    return 0.0


def make_optimizer(groups: list[dict], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over parameter groups, fused where this PyTorch build supports it (CPU and CUDA since
    2.4): one kernel per parameter instead of ~10 passes, 10x faster on a 23M-parameter W2."""
    groups = [g for g in groups if g["params"]]
    try:
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)


def pick_epoch(history: list[dict], method, select_metric: str, max_val_flops: float | None,
               min_val_flops: float | None = None, stage: int | None = None) -> int:
    """Index of the epoch to save: the best validation `select_metric` (later epoch on ties) among
    eligible epochs (method.eligible, e.g. after the L1 warm-up) whose validation FLOPs are <=
    `max_val_flops` and, where any is, >= `min_val_flops` (a budget's band: a head at F, not one
    sparser by chance); if none is under the cap, the lowest-FLOPs eligible epoch; without
    validation, the last epoch. stage: on a budget path, only that stage's epochs compete."""
    if not history or not history[-1].get("val"):
        return len(history) - 1
    own = [i for i, h in enumerate(history) if stage is None or h.get("stage", 0) == stage]   # a path's stage
    cand = [i for i in own if method.eligible(history[i])] or own
    ok = [i for i in cand if max_val_flops is None or history[i]["val"]["FLOPs"] <= max_val_flops]
    band = [i for i in ok if min_val_flops is None or history[i]["val"]["FLOPs"] >= min_val_flops]
    if band or ok:
        return max(band or ok, key=lambda i: (history[i]["val"][select_metric], i))
    return min(cand, key=lambda i: history[i]["val"]["FLOPs"])


def fit(method, head, train, val=None, *, ckpt_dir: str | Path | None = None, device: str = "cpu",
        progress=None, stop_after_epoch: int | None = None, stages: list[Stage] | None = None,
        on_stage=None) -> TrainResult:
    """Train `head` in place with `method` (its `cfg` holds the options) and return the saved epoch.

    train/val: what method.setup returned. ckpt_dir: where `last.pt` is written after every
    epoch (None: no checkpoints); an existing one written with the same method.fingerprint and
    config is resumed, a different one raises InputError. device: cpu, cuda, cuda:N. progress: a
    mmsparse.progress.Reporter. stop_after_epoch: return after that many finished epochs
    (simulates an interruption in tests). stages: a budget path (Stage per budget, largest first;
    None: one stage of cfg.epochs): the epochs run stage after stage, each later one starting with
    `on_stage(i, last_record)` (the method moves to the stage's budget) and its own learning-rate
    schedule (staged_lr_factor); each stage's saved epoch is chosen among its own epochs within its
    own band, and kept before the next stage starts (TrainResult.stages).
    """
    cfg = method.cfg
    rep = reporter(progress)
    precision = "fp32" if cfg.amp == "none" else resolve_precision(cfg.amp, device, flag="--amp")
    if cfg.amp == "auto":
        rep.log(f"--amp auto: {'bf16 autocast' if precision == 'bf16' else 'none (no native bf16 here)'}")
    path = stages is not None and len(stages) > 1
    stages = stages or [Stage("", 0.0, cfg.epochs)]
    head.to(device)
    train, val = method.place(train, device), (method.place(val, device) if val is not None else None)
    spe = method.steps_per_epoch(train)
    n_epochs = sum(st.epochs for st in stages)
    total = spe * n_epochs
    first = [sum(st.epochs for st in stages[:i]) for i in range(len(stages))]   # each stage's first epoch
    opt = make_optimizer(method.param_groups(head), cfg.lr, cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: staged_lr_factor(s, stages, spe, cfg.lr_warmup, cfg.lr_schedule))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best: list = [None] * len(stages)   # each stage's best state so far
    start = 0
    fp = {"method": method.name, "config": asdict(cfg), **method.fingerprint,
          **({"stages": [asdict(st) for st in stages]} if path else {})}
    ckpt = Path(ckpt_dir) / "last.pt" if ckpt_dir is not None else None
    st = load_checkpoint(ckpt, fp, head, opt, sched, gen)
    if st is not None:
        method.load_state_dict(st["method"])
        method.resumed(head)
        history, best, start = st["history"], st["best_states"], st["epoch"]
    else:
        method.prepare(head, train)
    step = start * spe

    def stage_of(epoch: int) -> int:
        return max(i for i in range(len(stages)) if first[i] <= epoch)

    def band():   # the saved epoch's FLOPs: at most, at least (the method's current budget)
        return method.val_flops_limit(), method.val_flops_floor()

    with rep.task(f"epoch {start + 1}/{n_epochs}", total=total) as bar:
        bar.update(completed=step)
        for epoch in range(start, n_epochs):
            if stop_after_epoch is not None and epoch >= stop_after_epoch:
                return TrainResult(0, history, best[stage_of(epoch)] or {}, False, precision)
            i = stage_of(epoch)
            if path and epoch == first[i] and i > 0:
                on_stage(i, history[-1])   # from the head the last stage left, towards this stage's budget
                rep.log(f"budget path: stage {i + 1}/{len(stages)}, --target-flops {stages[i].label}, "
                        f"{stages[i].epochs} epochs at lr x{stages[i].lr_scale:g}")
            head.train()
            method.start_epoch(epoch)
            t0 = time.time()
            sums: dict[str, float] = {}
            n = 0
            for batch in method.batches(train, gen, epoch):
                with autocast(device, precision):
                    loss, parts = method.loss(head, batch, step, gen, device)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                method.after_step(head)
                step += 1
                n += 1
                parts = {"loss": float(loss.detach()), **parts}
                for k, x in parts.items():
                    sums[k] = sums.get(k, 0.0) + x
                info = f"loss {parts['loss']:.4f}" + (f" FLOPs~{parts['flops']:.1f}" if "flops" in parts else "")
                bar.update(completed=step, description=f"epoch {epoch + 1}/{n_epochs}", info=info)
                kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
            rec = {"epoch": epoch + 1, "step": step, "seconds": time.time() - t0, **({"stage": i} if path else {}),
                   **method.epoch_figures(), **{k: x / max(n, 1) for k, x in sums.items()}}
            lim = band()   # this epoch trained under the budget the band is read from
            method.end_epoch(head, train, val, rec)   # validation (rec["val"]), and what the method adapts
            history.append(rec)
            if pick_epoch(history, method, cfg.select_metric, *lim, stage=i if path else None) == len(history) - 1:
                best[i] = {k: t.detach().clone() for k, t in head.state_dict().items()}
            rep.log(method.epoch_line(rec))
            if ckpt is not None:
                st = {"fingerprint": fp, "epoch": epoch + 1, "model": head.state_dict(),
                      "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                      "method": method.state_dict(), "rng": gen.get_state(), "history": history,
                      "best_states": best}
                with atomic_path(ckpt) as tmp:
                    torch.save(st, tmp)
    saved = []
    for i, stg in enumerate(stages):
        limits = method.budget.band(stg.target)[::-1] if path else band()   # (limit, floor), as pick_epoch takes
        b = pick_epoch(history, method, cfg.select_metric, *limits, stage=i if path else None)
        saved.append((b + 1, copy.deepcopy(best[i]) if best[i] else head.state_dict()))
    return TrainResult(saved[-1][0], history, saved[-1][1], True, precision, saved)


def load_checkpoint(ckpt: Path | None, fingerprint: dict, head, opt, sched, gen) -> dict | None:
    """Restore head, optimizer, scheduler and RNG from `ckpt` (a last.pt written after an epoch)
    and return the whole checkpoint dict; None when there is none. Raises InputError when the
    checkpoint was written with other settings or inputs."""
    if ckpt is None or not ckpt.is_file():
        return None
    st = torch.load(ckpt, map_location="cpu", weights_only=False)
    if st.get("fingerprint") != fingerprint:
        raise InputError(f"{ckpt}: checkpoint of a run with different settings or inputs; "
                         "pass --restart (or delete the directory) to start over")
    head.load_state_dict(st["model"])
    opt.load_state_dict(st["optimizer"])
    sched.load_state_dict(st["scheduler"])
    gen.set_state(st["rng"])
    return st
