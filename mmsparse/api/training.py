"""`train_head`: train any method's head on dense files; `load_head`: load any method's head."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from .. import provenance
from ..atomic import locks_output
from ..errors import BudgetMissed, InputError
from ..methods import canonical, get_config_class, get_method
from ..methods.base import TrainInputs, make_config, preset_values
from ..methods.head import load_head
from ..progress import reporter
from ..runtime import default_threads

__all__ = ["train_head", "load_head", "resolve_config", "workspace_inputs"]


@provenance.recorded("train_images", "train_captions", "val_images", "val_captions", "qrels", "val_qrels", "config")
@locks_output("out")  # one writer of OUT and OUT.ckpt/ at a time
def train_head(train_images: str | Path | None = None, train_captions: str | Path | None = None, *,
               out: str | Path, method: str = "d2s", val_images: str | Path | None = None,
               val_captions: str | Path | None = None, qrels: str | Path | None = None,
               val_qrels: str | Path | None = None, backbone: str | None = None,
               config: str | Path | None = None, device: str = "cpu", threads: int | None = None,
               restart: bool = False, keep_checkpoint: bool = False, preset: str = "default", progress=None,
               **options) -> Path:
    """Train a sparse head with `method` (d2s, joint, vdr, bm25v, or a plugin) and save it to `out`.

    train_images / train_captions: dense HDF5 files (mmsparse.encode_dense); bm25v needs only the
    images (with patch_states). val_images / val_captions pick the saved epoch by validation.
    qrels / val_qrels pair captions with images when the caption files lack `image_ids`.
    backbone: instead of paths, read $MMSPARSE_WORK/dense/NAME/{train,val}-{images,captions}.h5.
    config: a TOML or JSON file of options (or a head's config.json, to train with its config).
    preset: "default" (the defaults: what works best on validation) or "paper" (each paper's
    settings where the defaults differ: the method config's PAPER); `config` and `options` override it.
    **options: the method's options (`mmsparse train-head --help` lists them; keywords are the
    flags without dashes, e.g. eta=1e-3, expansion="caption"); they override `config`.
    device: cpu, cuda, cuda:N. threads: torch CPU threads (None: every available core,
    mmsparse.runtime.default_threads).
    A run writes OUT.ckpt/last.pt after every epoch; a rerun with the same inputs and options
    resumes from it (restart=True starts over); it is removed on success unless keep_checkpoint.
    Returns `out`. Raises InputError on bad inputs or options.
    """
    import torch

    from ..trainer import fit

    rep = reporter(progress)
    method = canonical(method, "--method")
    cls = get_config_class(method)
    values = {**preset_values(cls, preset), **resolve_config(config, options, method)}
    budgets = _budgets(values, method)
    cfg = make_config(cls, values, f"{config}" if config else "options")
    if device != "cpu" and not (str(device).startswith("cuda") and torch.cuda.is_available()):
        raise InputError(f"--device {device}: not available here; use --device cpu")
    inputs = _inputs(train_images, train_captions, val_images, val_captions, qrels, val_qrels, backbone)
    torch.set_num_threads(threads or default_threads())
    out = Path(out)
    t0 = time.time()
    m = get_method(method)(cfg)
    head, train, val = m.setup(inputs, rep)
    rep.log(f"train-head {method}: loaded in {time.time() - t0:.0f}s")
    ckpt_dir = Path(str(out).rstrip("/") + ".ckpt")
    if restart and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stages = path_stages(budgets, cfg) if len(budgets) > 1 else None
    t0 = time.time()
    res = fit(m, head, train, val, ckpt_dir=ckpt_dir, device=device, progress=rep, stages=stages,
              on_stage=lambda i, rec: m.retarget(stages[i].target, rec))
    seconds = round(time.time() - t0, 1)
    head.to("cpu")
    missed = []
    if stages is None:
        missed += _write_head(m, head, res.best_epoch, res.state, res, out, method, preset, cfg, train, rep, seconds)
    else:
        out.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, (st, (best, state)) in enumerate(zip(stages, res.stages)):
            path = {"budgets": [s.label for s in stages], "budget": st.label, "stage": i + 1,
                    "epochs": [sum(s.epochs for s in stages[:i]) + 1, sum(s.epochs for s in stages[:i + 1])],
                    "lr_scale": st.lr_scale, "from": stages[i - 1].label if i else None}
            missed += _write_head(m, head, best, state, res, out / f"flops-{st.label}", method, preset, cfg, train,
                                  rep, seconds, target=st.target, path=path)
            v = res.history[best - 1].get("val") or {}
            lines.append(f"--target-flops {st.label}: {out / f'flops-{st.label}'} epoch {best}"
                         + (f", val FLOPs {v['FLOPs']:.2f}, R@1 {v['R@1']:.4f}, R@10 {v['R@10']:.4f}" if "R@1" in v else "")
                         + (" OFF BUDGET" if any(mi[0] == st.label for mi in missed) else ""))
        for line in lines:
            rep.log(line)
    if not keep_checkpoint:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    if missed:
        raise BudgetMissed("; ".join(f"{where}: --target-flops {label}: {why}" for label, where, why in missed))
    return out


def path_stages(budgets: list[tuple[str, float]], cfg) -> list:
    """The trainer's Stages of a budget path: the first budget gets cfg.epochs and the run's own
    schedule, each later one cfg.path_epochs (a share of cfg.epochs when < 1, at least 1) at
    cfg.path_lr x the peak learning rate."""
    from ..trainer import Stage

    pe = cfg.path_epochs
    later = int(pe) if pe >= 1 else max(1, round(pe * cfg.epochs))
    return [Stage(label, f, cfg.epochs if i == 0 else later, 1.0 if i == 0 else float(cfg.path_lr))
            for i, (label, f) in enumerate(budgets)]


def _budgets(values: dict, method: str) -> list[tuple[str, float]]:
    """--target-flops as given (a number or "12,9.4,6"), parsed (budget.parse_budgets); the config
    keeps the first budget as a number. InputError on a malformed list or a method with no path."""
    from ..methods.budget import parse_budgets

    raw = values.get("target_flops")
    try:
        budgets = parse_budgets(raw)
    except ValueError as e:
        raise InputError(f"--target-flops {raw}: {e}") from None
    if len(budgets) > 1 and not get_method(method).supports_path:
        raise InputError(f"--target-flops {raw}: --method {method} trains one budget per run; give one number")
    if budgets:
        values["target_flops"] = budgets[0][1]
    return budgets


def _write_head(m, head, best: int, state: dict, res, out: Path, method: str, preset: str, cfg, train, rep,
                seconds: float, target: float | None = None, path: dict | None = None) -> list:
    """Load the saved epoch `best` (1-based) with its `state` into `head`, finish it and write it to
    `out` with its training record (a path's head: its own budget `target` and `path`); print the
    budget's report line and the warnings. Returns [(budget label, out, why)] when the head landed
    outside its budget's band (recorded as off_budget in training.flops_budget), else []."""
    from dataclasses import replace

    head.load_state_dict(state)
    chosen = res.history[best - 1]
    m.load_epoch(head, chosen)
    m.finish(head, train, rep)
    v = chosen.get("val") or {}
    # without validation files, the density a near-dense head is caught by: a sample of the training pairs
    sample = {} if v else m.sample_figures(head, train)
    budget = getattr(m, "budget", None)
    record = None
    missed = []
    if budget is not None:
        target = budget.target if target is None else target
        record = budget.record()
        lo, hi = budget.band(target)
        if path is not None:   # this budget's own epochs of the trace
            first, last = path["epochs"]
            record["trace"] = [t for t in record["trace"] if t.get("epoch") is not None and first - 1 <= t["epoch"] <= last]
        record.update(target=target, limit=hi, scale=chosen.get("eta_scale", record["scale"]),
                      gates=dict(chosen.get("gates") or record["gates"]))
        if "FLOPs" in v and not lo <= v["FLOPs"] <= hi:
            from ..methods.budget import MAX_LOG_SCALE, diagnose

            stage_hist = [h for h in res.history if path is None or h.get("stage", 0) == path["stage"] - 1]
            why = (f"saved epoch {best} has validation FLOPs {v['FLOPs']:.3g}, outside {lo:.3g}..{hi:.3g}; "
                   + diagnose(stage_hist, target, budget.refused, budget.log_scale >= MAX_LOG_SCALE))
            record.update(landed=v["FLOPs"], off_budget=True)
            missed.append((f"{target:g}" if path is None else path["budget"], out, why))
    conf = asdict(cfg) if target is None else asdict(replace(cfg, target_flops=target))
    head.config["training"] = {**m.training, "method": method, "preset": preset, "config": conf,
                               "precision": res.precision,
                               "best_epoch": best,
                               "val": chosen.get("val"), "seconds": seconds,
                               **({"train_sample": sample} if sample else {}),
                               **({"flops_budget": record} if record is not None else {}),
                               **({"path": path} if path is not None else {}),
                               "history": res.history}
    head.save_pretrained(out)
    vocab_size = int(head.config.get("vocab_size", 0))
    if v:
        _warn_if_dense(out, v, vocab_size)
    else:
        _warn_if_dense(out, sample, vocab_size, f"a sample of {sample.get('images', 0):,} training",
                       "training sample's")
    if budget is not None and "FLOPs" in v and not missed:
        _report_budget(rep, out, chosen, target, m.training.get("holdout"))
    _warn_if_collapsed(out, res.history, best - 1, cfg.select_metric, m.eligible)
    rep.log(f"saved epoch {best} to {out}"
            + (f" (val R@1 {v['R@1']:.4f}, R@10 {v['R@10']:.4f}" + (f", FLOPs {v['FLOPs']:.1f}" if "FLOPs" in v else "")
               + ")" if "R@1" in v else "")
            + (" at the training-time k; with the budget's inference k see the line above"
               if (m.training.get("flops_budget") or {}).get("point") else "")
            + f" in {seconds:.0f}s")
    return missed


def _warn_if_dense(out: Path, val: dict, vocab_size: int, split: str = "validation",
                   flops_of: str = "validation") -> None:
    """One warning line when the saved head's vectors of `split` ("validation", or a sample of the
    training pairs when there are no validation files) hold over checks.NEAR_DENSE of the
    vocabulary (d_nnz: per image, q_nnz: per caption): a head that is not sparse yet."""
    from ..checks import DENSE_FIX, near_dense, terms_share, warn

    dense = [terms_share(what, val[k], vocab_size) for k, what in (("d_nnz", f"{split} images"),
                                                                   ("q_nnz", f"{split} captions"))
             if k in val and near_dense(val[k], vocab_size)]
    if dense:
        flops = f" ({flops_of} FLOPs {val['FLOPs']:,.0f}: the terms a query and an image share, eq. 1)" \
            if "FLOPs" in val else ""
        warn(f"{out}: the saved head is near dense: {' and '.join(dense)}{flops}; sparsify, index and search of its "
             f"vectors will be slow; {DENSE_FIX}")


def _report_budget(rep, out: Path, chosen: dict, target: float, holdout: dict | None) -> None:
    """--target-flops: one line saying where the saved epoch landed within its band (its FLOPs, gates
    and multiplier, and which images measured them); a head outside the band is an error instead
    (BudgetMissed, mmsparse.methods.budget.diagnose says why)."""
    flops = chosen["val"]["FLOPs"]
    split = f"{holdout['source']} ({holdout['images']:,} images)" if holdout else "validation"
    gates = chosen.get("gates") or {}
    gated = ", gates " + " / ".join(f"{s} {k or 'none'}" for s, k in gates.items()) if gates else ""
    rep.log(f"--target-flops {target:g}: {split} FLOPs {flops:.2f} ({flops / target:.2f} x the "
            f"budget){gated}, sparsity weights x{chosen.get('eta_scale', 1.0):.3g}")


def _warn_if_collapsed(out: Path, history: list[dict], saved: int, metric: str, eligible=None) -> None:
    """One warning line when the saved epoch kept under half the best validation `metric` of the run
    (mmsparse.methods.budget.collapsed), or when over 1 % of its validation queries share no term
    with any image."""
    from ..checks import warn
    from ..methods.budget import collapsed

    hit = collapsed(history, saved, metric, eligible)
    if hit:
        warn(f"{out}: the saved head collapsed: validation {metric} {hit[0]:.4f} against {hit[1]:.4f} at epoch "
             f"{hit[2]}; its FLOPs limit left no better epoch: raise --target-flops / --max-val-flops or --epochs")
    empty = (history[saved].get("val") or {}).get("q_empty", 0.0)
    if empty > 0.01:
        warn(f"{out}: {empty:.1%} of the validation queries share no term with any image: the head is too sparse "
             "for its queries; raise --target-flops or lower --eta")


def resolve_config(config: str | Path | None, options: dict, method: str | None = None) -> dict:
    """Options from a config file (TOML, or JSON; a head's config.json gives the config it was
    trained with), overridden by `options` (keys with dashes or underscores). InputError when the
    file is unreadable or names another method."""
    values: dict = {}
    if config is not None:
        p = Path(config)
        if not p.is_file():
            raise InputError(f"{p}: config file not found")
        try:
            if p.suffix == ".toml":
                import tomllib
                values = tomllib.loads(p.read_text(encoding="utf-8"))
            else:
                values = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{p}: not a TOML/JSON config ({e})") from None
        if isinstance(values.get("training"), dict) and "config" in values["training"]:  # a head's config.json
            values = {"method": values.get("method"), **values["training"]["config"]}
        named = values.pop("method", None)
        if named and method and canonical(named, f"{p}: method") != method:
            raise InputError(f"{p}: method = {named!r} but training method {method!r}; pass --method {named}")
    values = {k.replace("-", "_"): v for k, v in values.items()}
    values.update({k.replace("-", "_"): v for k, v in options.items()})
    return values


def workspace_inputs(name: str) -> dict[str, Path | None]:
    """Dense inputs of backbone `name` under $MMSPARSE_WORK/dense/NAME (default ./work/dense/NAME).
    Raises InputError naming every missing file."""
    root = Path(os.environ.get("MMSPARSE_WORK", "work")) / "dense" / name
    files: dict = {f"{s}_{k}": root / f"{s}-{k}.h5" for s in ("train", "val") for k in ("images", "captions")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise InputError(f"--backbone {name}: missing {', '.join(missing)}; run `mmsparse encode-dense "
                         f"--backbone {name} -o {root}` for the train and val splits (or set MMSPARSE_WORK)")
    for s in ("train", "val"):
        q = root / f"{s}.qrels"
        files[f"{s}_qrels"] = q if q.is_file() else None
    return files


def _inputs(train_images, train_captions, val_images, val_captions, qrels, val_qrels, backbone) -> TrainInputs:
    if backbone is not None:
        if train_images or train_captions:
            raise InputError("give either TRAIN_IMAGES TRAIN_CAPTIONS or --backbone, not both")
        ws = workspace_inputs(backbone)
        train_images, train_captions = ws["train_images"], ws["train_captions"]
        val_images, val_captions = val_images or ws["val_images"], val_captions or ws["val_captions"]
        qrels, val_qrels = qrels or ws["train_qrels"], val_qrels or ws["val_qrels"]
        provenance.add_inputs([train_images, train_captions, val_images, val_captions, qrels, val_qrels])
    if train_images is None:
        raise InputError("missing TRAIN_IMAGES TRAIN_CAPTIONS (or --backbone NAME)")
    p = (lambda x: Path(x) if x is not None else None)
    return TrainInputs(Path(train_images), p(train_captions), p(val_images), p(val_captions), p(qrels), p(val_qrels))
