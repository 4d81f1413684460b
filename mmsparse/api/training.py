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
from ..errors import InputError
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
    cfg = make_config(cls, {**preset_values(cls, preset), **resolve_config(config, options, method)},
                      f"{config}" if config else "options")
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
    t0 = time.time()
    res = fit(m, head, train, val, ckpt_dir=ckpt_dir, device=device, progress=rep)
    head.to("cpu")
    head.load_state_dict(res.state)
    chosen = res.history[res.best_epoch - 1]
    m.load_epoch(head, chosen)
    m.finish(head, train, rep)
    v = chosen.get("val") or {}
    # without validation files, the density a near-dense head is caught by: a sample of the training pairs
    sample = {} if v else m.sample_figures(head, train)
    budget = getattr(m, "budget", None)
    head.config["training"] = {**m.training, "method": method, "preset": preset, "config": asdict(cfg),
                               "precision": res.precision,
                               "best_epoch": res.best_epoch,
                               "val": chosen.get("val"), "seconds": round(time.time() - t0, 1),
                               **({"train_sample": sample} if sample else {}),
                               **({"flops_budget": budget.record()} if budget is not None else {}),
                               "history": res.history}
    head.save_pretrained(out)
    if not keep_checkpoint:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    vocab_size = int(head.config.get("vocab_size", 0))
    if v:
        _warn_if_dense(out, v, vocab_size)
    else:
        _warn_if_dense(out, sample, vocab_size, f"a sample of {sample.get('images', 0):,} training",
                       "training sample's")
    if budget is not None and "FLOPs" in v:
        _report_budget(rep, out, chosen, budget, m.training.get("holdout"), res.history)
    _warn_if_collapsed(out, res.history, res.best_epoch - 1, cfg.select_metric)
    rep.log(f"saved epoch {res.best_epoch} to {out}"
            + (f" (val R@1 {v['R@1']:.4f}, R@10 {v['R@10']:.4f}" + (f", FLOPs {v['FLOPs']:.1f}" if "FLOPs" in v else "")
               + ")" if "R@1" in v else "")
            + (" at the training-time k; with the budget's inference k see the line above"
               if (m.training.get("flops_budget") or {}).get("point") else "")
            + f" in {time.time() - t0:.0f}s")
    return out


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


def _report_budget(rep, out: Path, chosen: dict, budget, holdout: dict | None, history: list[dict]) -> None:
    """--target-flops: one line saying where the saved epoch landed (its FLOPs, gates and multiplier,
    and which images measured them); over the limit, a warning saying why the schedule was too short:
    the FLOPs of the first validated epoch, the epochs the budget needs from there at the controller's
    fastest tightening (x2 an epoch, mmsparse.methods.budget.RATIO) and the epochs that followed."""
    import math

    from ..checks import warn
    from ..methods.budget import RATIO

    flops = chosen["val"]["FLOPs"]
    split = f"{holdout['source']} ({holdout['images']:,} images)" if holdout else "validation"
    gates = chosen.get("gates") or {}
    gated = ", gates " + " / ".join(f"{s} {k or 'none'}" for s, k in gates.items()) if gates else ""
    if flops > budget.limit:
        seen = [(h["epoch"], h["val"]["FLOPs"]) for h in history if "FLOPs" in (h.get("val") or {})]
        e0, f0 = seen[0]
        need = max(1, math.ceil(math.log(f0 / budget.limit) / math.log(RATIO)))
        warn(f"{out}: --target-flops {budget.target:g}: no epoch kept {split} FLOPs <= {budget.limit:.3g}; saved the "
             f"lowest, {flops:.2f}; the schedule is too short: from {f0:,.1f} at epoch {e0} the budget tightens at most "
             f"x{RATIO:g} an epoch, so it needs about {need} more epochs and {len(seen) - 1} followed; raise --epochs "
             f"(or start sparser: a larger --eta, smaller --query-top-k / --doc-top-k)")
    else:
        rep.log(f"--target-flops {budget.target:g}: {split} FLOPs {flops:.2f} ({flops / budget.target:.2f} x the "
                f"budget){gated}, sparsity weights x{chosen.get('eta_scale', 1.0):.3g}")


def _warn_if_collapsed(out: Path, history: list[dict], saved: int, metric: str) -> None:
    """One warning line when the saved epoch kept under half the best validation `metric` of the run
    (mmsparse.methods.budget.collapsed), or when over 1 % of its validation queries share no term
    with any image."""
    from ..checks import warn
    from ..methods.budget import collapsed

    hit = collapsed(history, saved, metric)
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
