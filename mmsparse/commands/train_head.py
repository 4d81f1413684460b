"""`mmsparse train-head`: train a D2S sparse projection head on dense image/caption vectors.

Inputs: dense HDF5 files of the training (and validation) images and captions, either given as
paths or found by `--backbone NAME` in the workspace convention
$MMSPARSE_WORK (default ./work)/dense/NAME/{train,val}-{images,captions}.h5 (+ {split}.qrels).
Output: a head directory (config.json, model.safetensors, vocab.txt, tokenizer/) and, while
training, HEAD_DIR.ckpt/last.pt (removed on success unless --keep-checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from ..pec import DEFAULT_MASK_CAPTION_TERMS, MODES, PAPER_NAMES

# Defaults tuned on Flickr8k (hf-dual backbone, 2 CPU cores, ~10 minutes): see docs/d2s.md.
DEFAULTS = dict(eta=1e-3, lam=0.5, tau=1e-3, epochs=10, batch_size=512, lr=1e-3, warmup_steps=0,
                expansion="caption-word", vocab_min_df=1)


def workspace_inputs(name: str) -> dict[str, Path]:
    """Dense inputs of backbone `name` under $MMSPARSE_WORK/dense/NAME (default ./work/dense/NAME).
    Raises InputError naming every missing file."""
    root = Path(os.environ.get("MMSPARSE_WORK", "work")) / "dense" / name
    files = {f"{s}_{k}": root / f"{s}-{k}.h5" for s in ("train", "val") for k in ("images", "captions")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise InputError(f"--backbone {name}: missing {', '.join(missing)}; run `mmsparse encode-dense "
                         f"--backbone {name} -o {root}` for the train and val splits (or set MMSPARSE_WORK)")
    for s in ("train", "val"):
        q = root / f"{s}.qrels"
        files[f"{s}_qrels"] = q if q.is_file() else None
    return files


def main(
    train_images: Optional[Path] = typer.Argument(None, help="Dense HDF5 of the training images "
                                                  "(omit with --backbone)."),
    train_captions: Optional[Path] = typer.Argument(None, help="Dense HDF5 of the training captions, with "
                                                    "`texts` and an `image_ids` dataset (or pass --qrels)."),
    out: Path = typer.Option(..., "-o", "--out", help="Head directory to write (replaced atomically)."),
    val_images: Optional[Path] = typer.Option(None, "--val-images", help="Dense HDF5 of validation images: "
                                              "caption->image R@1 each epoch picks the saved epoch."),
    val_captions: Optional[Path] = typer.Option(None, "--val-captions", help="Dense HDF5 of validation captions."),
    qrels: Optional[Path] = typer.Option(None, "--qrels", help="Training caption id -> image id (TREC qrels), "
                                         "if the captions file has no `image_ids` dataset."),
    val_qrels: Optional[Path] = typer.Option(None, "--val-qrels", help="Validation caption id -> image id qrels."),
    backbone: Optional[str] = typer.Option(None, "--backbone", help="Read inputs from $MMSPARSE_WORK (default "
                                           "./work)/dense/NAME/{train,val}-{images,captions}.h5 and {train,val}.qrels."),
    vocab_model: Optional[Path] = typer.Option(None, "--vocab-model", help="Local masked-LM / text model "
                                               "directory (e.g. distilbert-base-uncased) whose tokenizer and input "
                                               "embeddings give the vocabulary and W2's init. Default: the text "
                                               "tower of the dense files' `model`."),
    vocab_min_df: int = typer.Option(DEFAULTS["vocab_min_df"], "--vocab-min-df", min=0,
                                     help="Keep only terms occurring in >= N training captions (0 = the whole "
                                     "tokenizer vocabulary, as in the paper). 1 drops terms no caption uses, "
                                     "which could only become latent, non-word dimensions; on Flickr8k it keeps "
                                     "6,640 of 30,522 terms and trains ~4x faster."),
    eta: float = typer.Option(DEFAULTS["eta"], "--eta", min=0.0, help="η, L1 sparsity weight (eq. 7)."),
    lam: float = typer.Option(DEFAULTS["lam"], "--lambda", min=0.0, max=1.0,
                              help="λ in eq. 7: (1-λ)·contrastive + λ·η·L1."),
    temperature: float = typer.Option(DEFAULTS["tau"], "--temperature", min=1e-6,
                                      help="τ of the dense teacher softmax z_Aᵀz_B/τ."),
    epochs: int = typer.Option(DEFAULTS["epochs"], "--epochs", min=1, help="Passes over the training captions; "
                               "also the length of the expansion schedule (eq. 6)."),
    batch_size: int = typer.Option(DEFAULTS["batch_size"], "--batch-size", min=2, help="Captions per step "
                                   "(with their distinct images as in-batch candidates)."),
    lr: float = typer.Option(DEFAULTS["lr"], "--lr", min=0.0, help="AdamW peak learning rate."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", min=0.0, help="AdamW weight decay."),
    lr_warmup_steps: int = typer.Option(0, "--lr-warmup-steps", min=0, help="Linear LR warm-up, optimizer steps."),
    lr_decay: str = typer.Option("linear", "--lr-decay", help="LR after warm-up: linear (to 0 at the last step) "
                                 "or constant."),
    warmup_steps: int = typer.Option(DEFAULTS["warmup_steps"], "--warmup-steps", min=0,
                                     help="L1 warm-up: η ramps quadratically η·min(1,(step/N)²) over the first N "
                                     "optimizer steps (0 = full η from the start). Epochs ending before step N "
                                     "are not eligible as the saved epoch."),
    expansion: str = typer.Option(DEFAULTS["expansion"], "--expansion", help="Probabilistic expansion control: "
                                  + ", ".join(f"{m} ({PAPER_NAMES[m]})" for m in MODES) + "."),
    mask_caption_terms: bool = typer.Option(DEFAULT_MASK_CAPTION_TERMS, "--mask-caption-terms/--keep-caption-terms",
                                            help="caption-word only: also drop a caption's own term v when its "
                                            "word-level draw E_v is 0 (Algorithm 1 as printed; default, because "
                                            "it keeps frequent words such as 'a', 'in' from dominating queries "
                                            "and lowers FLOPs) or always keep own terms (the prose's reading)."),
    init_bias: float = typer.Option(0.0, "--init-bias", help="Initial W2 bias (negative = sparser start)."),
    max_val_flops: Optional[float] = typer.Option(None, "--max-val-flops", min=0.0,
                                                  help="Only epochs with validation FLOPs (eq. 1) <= this may be "
                                                  "saved (else the lowest-FLOPs epoch)."),
    seed: int = typer.Option(0, "--seed", help="Seed of init, shuffling and expansion draws (deterministic)."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch CPU threads."),
    device: str = typer.Option("cpu", "--device", help="cpu (default) or cuda."),
    restart: bool = typer.Option(False, "--restart", help="Ignore an existing HEAD_DIR.ckpt checkpoint "
                                 "(default: resume from it when its settings match)."),
    keep_checkpoint: bool = typer.Option(False, "--keep-checkpoint", help="Keep HEAD_DIR.ckpt/ after success."),
) -> None:
    """Train a D2S head (paper eq. 4-7, Algorithm 1) from dense vectors to sparse vocabulary terms."""
    import shutil
    import time

    import numpy as np
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..heads.d2s import D2SHead
    from ..training import TrainConfig, load_pairs, train_d2s
    from ..vocab import load_vocab_model, vocab_from_dense_attrs

    err = Console(stderr=True)
    if expansion not in MODES:
        raise InputError(f"--expansion {expansion!r}: choose one of {', '.join(MODES)}")
    if lr_decay not in ("linear", "constant"):
        raise InputError(f"--lr-decay {lr_decay!r}: choose linear or constant")
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise InputError(f"--device {device}: not available here; use --device cpu")
    if backbone is not None:
        if train_images or train_captions:
            raise InputError("give either TRAIN_IMAGES TRAIN_CAPTIONS or --backbone, not both")
        ws = workspace_inputs(backbone)
        train_images, train_captions = ws["train_images"], ws["train_captions"]
        val_images, val_captions = val_images or ws["val_images"], val_captions or ws["val_captions"]
        qrels, val_qrels = qrels or ws["train_qrels"], val_qrels or ws["val_qrels"]
        from ..provenance import add_inputs
        add_inputs([train_images, train_captions, val_images, val_captions, qrels, val_qrels])
    if train_images is None or train_captions is None:
        raise InputError("missing TRAIN_IMAGES TRAIN_CAPTIONS (or --backbone NAME)")
    if (val_images is None) != (val_captions is None):
        raise InputError("pass both --val-images and --val-captions (or neither)")
    torch.set_num_threads(threads)

    t_load = time.time()
    train = load_pairs(train_images, train_captions, qrels)
    val = load_pairs(val_images, val_captions, val_qrels) if val_images is not None else None
    from ..checks import check_compatible
    fix = "use dense files encoded with the same backbone and model"
    check_compatible(train.attrs_img, train.attrs_cap, ("backbone", "model", "dataset", "split"),
                     str(train_images), str(train_captions), fix)
    if val is not None:
        check_compatible(train.attrs_img, val.attrs_img, ("backbone", "model"), str(train_images), str(val_images), fix)
        check_compatible(val.attrs_img, val.attrs_cap, ("backbone", "model", "dataset", "split"),
                         str(val_images), str(val_captions), fix)
    if val is not None and val.z_img.shape[1] != train.z_img.shape[1]:
        raise InputError(f"{val_images}: dim {val.z_img.shape[1]} differs from the training dim {train.z_img.shape[1]}")
    voc = load_vocab_model(vocab_model) if vocab_model is not None else vocab_from_dense_attrs(train.attrs_cap)
    train.tokenize(voc.tokenizer)
    if vocab_min_df > 0:
        counts = np.bincount(np.concatenate(train.raw_ids), minlength=len(voc.terms))[:len(voc.terms)]
        voc = voc.restrict(counts >= vocab_min_df)
        if not voc.terms:
            raise InputError(f"--vocab-min-df {vocab_min_df}: no term occurs that often in the training captions")
    a = train.attrs_cap
    training = {"backbone": a.get("backbone"), "model": a.get("model"), "dataset": a.get("dataset"),
                "train_images": str(Path(train_images).resolve()), "train_captions": str(Path(train_captions).resolve()),
                "val_images": str(Path(val_images).resolve()) if val_images else None,
                "val_captions": str(Path(val_captions).resolve()) if val_captions else None,
                "vocab_min_df": vocab_min_df}
    cfg = TrainConfig(eta=eta, lam=lam, tau=temperature, epochs=epochs, batch_size=batch_size, lr=lr,
                      weight_decay=weight_decay, lr_warmup_steps=lr_warmup_steps, lr_decay=lr_decay, seed=seed,
                      expansion=expansion, mask_caption_terms=mask_caption_terms, warmup_steps=warmup_steps,
                      init_bias=init_bias, max_val_flops=max_val_flops)
    torch.manual_seed(seed)
    head = D2SHead.from_vocab(train.z_img.shape[1], voc, training, init_bias=init_bias)
    train.set_columns(head.token_ids.numpy())
    if val is not None:
        val.tokenize(voc.tokenizer)
        val.set_columns(head.token_ids.numpy())
    err.print(f"train-head: {len(train.img_ids)} images, {len(train.cap_ids)} captions, d={head.dim}, "
              f"|V|={len(voc.terms)}, ω={head.config['omega']} (loaded in {time.time() - t_load:.0f}s)")

    ckpt_dir = Path(str(out).rstrip("/") + ".ckpt")
    if restart and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {"inputs": training, "vocab_size": len(voc.terms), "n_captions": len(train.cap_ids)}
    spe = -(-len(train.cap_ids) // batch_size)
    t0 = time.time()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=err) as prog:
        task = prog.add_task("epoch 1", total=spe * epochs, info="")
        state = {"epoch_info": ""}

        def on_step(r):
            prog.update(task, completed=r["step"], description=f"epoch {r['epoch']}/{epochs}",
                        info=f"loss {r['loss']:.3f} FLOPs~{r['flops']:.1f} {state['epoch_info']}")

        def on_epoch(r):
            v = r.get("val", {})
            line = (f"epoch {r['epoch']}: loss {r['loss']:.3f} batch-FLOPs {r['flops']:.1f} p_c {r['p_c']:.2f}"
                    + (f" | val R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f} "
                       f"terms/img {v['d_nnz']:.0f} terms/cap {v['q_nnz']:.0f}" if v else "")
                    + f" ({r['seconds']:.0f}s)")
            prog.console.print(line)
            state["epoch_info"] = f"| val R@1 {v['R@1']:.3f}" if v else ""

        res = train_d2s(head, train, val, cfg, ckpt_dir, fingerprint, on_step=on_step, on_epoch=on_epoch)
    head.load_state_dict(res.state)
    chosen = res.history[res.best_epoch - 1]
    head.config["training"].update(config={k: v for k, v in cfg.__dict__.items()}, best_epoch=res.best_epoch,
                                   val=chosen.get("val"), seconds=round(time.time() - t0, 1))
    head.save_pretrained(out)
    if not keep_checkpoint:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    v = chosen.get("val")
    err.print(f"saved epoch {res.best_epoch} to {out}" + (f" (val R@1 {v['R@1']:.4f}, FLOPs {v['FLOPs']:.1f})" if v else "")
              + f" in {time.time() - t0:.0f}s")
