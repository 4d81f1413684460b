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
DEFAULTS = dict(eta=3e-3, lam=0.5, tau=1e-3, epochs=6, batch_size=512, lr=1e-3, warmup_steps=60,
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
                                            "word-level draw E_v is 0 (default: Algorithm 1 as printed; frequent "
                                            "words such as 'a', 'in' (df 0.4-0.9) are then often absent, so queries "
                                            "cannot lean on their long posting lists) or always keep own terms (the "
                                            "prose's reading). The Flickr8k settings use the default."),
    l1_caption: str = typer.Option("raw", "--l1-caption", help="Which caption vectors the L1 term sees: raw "
                                   "(default; eq. 7's L1(s_C), the head's output before expansion masking, so "
                                   "masked expansion terms are kept small too and do not flood the scores when "
                                   "p_c rises) or masked (s̄_C, Algorithm 1's loss input)."),
    init_bias: float = typer.Option(0.0, "--init-bias", help="Initial W2 bias (negative = sparser start)."),
    max_val_flops: Optional[float] = typer.Option(None, "--max-val-flops", min=0.0,
                                                  help="Only epochs with validation FLOPs (eq. 1) <= this may be "
                                                  "saved (else the lowest-FLOPs epoch)."),
    select_metric: str = typer.Option("R@1", "--select-metric", help="Validation metric (caption->image, "
                                      "expanded queries) that picks the saved epoch: R@1, R@5, R@10 or MRR@10."),
    pec_schedule: str = typer.Option("epoch", "--pec-schedule", help="epoch (default): raise p_c, p_v after "
                                     "each epoch (eq. 6); step: the same linear ramp updated every step (no jumps "
                                     "of 1/E; on Flickr8k it gave ~2x the FLOPs at the same recall)."),
    seed: int = typer.Option(0, "--seed", help="Seed of init, shuffling and expansion draws (deterministic)."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch CPU threads."),
    device: str = typer.Option("cpu", "--device", help="cpu (default) or cuda."),
    restart: bool = typer.Option(False, "--restart", help="Ignore an existing HEAD_DIR.ckpt checkpoint "
                                 "(default: resume from it when its settings match)."),
    keep_checkpoint: bool = typer.Option(False, "--keep-checkpoint", help="Keep HEAD_DIR.ckpt/ after success."),
    method: str = typer.Option("d2s", "--method", help="Training method: d2s (default; paper eq. 4-7) or joint "
                               "(joint sparse-dense self-distillation, CIKM 2025: needs dense files written with "
                               "`encode-dense --pre-projection`; see the JOINT options); sae (BM25-V visual "
                               "words: a top-k sparse autoencoder on TRAIN_IMAGES' patch_states, no captions; see "
                               "the SAE options); vdr (VDR: elu1p weights over token/patch states, top-k + bag-of-words "
                               "gating, nonparametric entry, contrastive mask; see the VDR options)."),
    w1: float = typer.Option(0.3, "--w1", min=0.0, rich_help_panel="JOINT options",
                             help="Weight of s_dense in s_inter = w1·s_dense + w2·s_sparse."),
    w2: float = typer.Option(1.0, "--w2", min=0.0, rich_help_panel="JOINT options", help="Weight of s_sparse in s_inter."),
    lambda_dense: float = typer.Option(1.0, "--lambda-dense", min=0.0, rich_help_panel="JOINT options",
                                       help="λ1: weight of the InfoNCE loss of s_dense (eq. 2)."),
    lambda_sparse: float = typer.Option(1.0, "--lambda-sparse", min=0.0, rich_help_panel="JOINT options",
                                        help="λ2: weight of the InfoNCE loss of s_sparse."),
    lambda_inter: float = typer.Option(1.0, "--lambda-inter", min=0.0, rich_help_panel="JOINT options",
                                       help="λ3: weight of the InfoNCE loss of s_inter."),
    distill: bool = typer.Option(True, "--distill/--no-distill", rich_help_panel="JOINT options",
                                 help="Add the self-distillation loss L' (s_inter teaches s_dense and s_sparse); "
                                 "--no-distill = contrastive only (paper Table 3, row 2)."),
    tune_projection: bool = typer.Option(True, "--tune-projection/--freeze-projection", rich_help_panel="JOINT options",
                                         help="Train copies of the backbone's image and text projections "
                                         "(--freeze-projection: paper Table 3, row 1)."),
    proj_lr: float = typer.Option(1e-4, "--proj-lr", min=0.0, rich_help_panel="JOINT options",
                                  help="AdamW peak learning rate of the projections (no weight decay); --lr "
                                  "applies to the sparse head and τ."),
    tau_init: float = typer.Option(0.05, "--tau-init", min=0.01, rich_help_panel="JOINT options",
                                   help="Initial learnable dense temperature τ (s_dense = ⟨h_t, h_i⟩/τ; kept >= 0.01)."),
    eta_image: Optional[float] = typer.Option(None, "--eta-image", min=0.0, rich_help_panel="JOINT options",
                                              help="η_i, L1 weight of image vectors (default: --eta, which is η_t). "
                                              "Both ramp quadratically over --warmup-steps. joint ignores --lambda, "
                                              "--temperature and checkpoints (--restart/--keep-checkpoint)."),
    caption_per_image: bool = typer.Option(True, "--caption-per-image/--all-captions", rich_help_panel="JOINT options",
                                           help="An epoch visits every image once with one random caption of it "
                                           "(batches of distinct pairs, as eq. 2; default) or every caption."),
    sae_k: int = typer.Option(16, "--sae-k", min=1, rich_help_panel="SAE options (BM25-V)",
                              help="Visual words kept per patch: top-k of ReLU(W_e z + b_e) (eq. 3, paper k = 16)."),
    sae_expansion: int = typer.Option(16, "--sae-expansion", min=1, rich_help_panel="SAE options (BM25-V)",
                                      help="Expansion factor e: vocabulary of e·D visual words (paper e = 16)."),
    sae_lambda: float = typer.Option(1e-3, "--sae-lambda", min=0.0, rich_help_panel="SAE options (BM25-V)",
                                     help="λ of the L1 term in ||ẑ - z||² + λ||h||_1 (§3.6, 1e-3)."),
    sae_epochs: int = typer.Option(5, "--sae-epochs", min=1, rich_help_panel="SAE options (BM25-V)",
                                   help="Passes over all training patches (§3.6: 5)."),
    sae_batch_size: int = typer.Option(4096, "--sae-batch-size", min=1, rich_help_panel="SAE options (BM25-V)",
                                       help="Patches per Adam step (§3.6: 4096)."),
    sae_lr: float = typer.Option(4e-4, "--sae-lr", min=0.0, rich_help_panel="SAE options (BM25-V)",
                                 help="Adam peak learning rate, cosine-decayed to 0 over all steps."),
    patch_skip: int = typer.Option(0, "--patch-skip", min=0, rich_help_panel="SAE options (BM25-V)",
                                   help="Leading patch positions to ignore (1 for a ViT's [CLS]; 0 for conv maps); "
                                   "sparsify applies the same."),
    sae_buffer_images: int = typer.Option(8192, "--sae-buffer-images", min=1, rich_help_panel="SAE options (BM25-V)",
                                          help="Images whose patches are held in the shuffle buffer (memory "
                                          "~ this x P x D x 4 bytes); patches stream from the HDF5 file."),
    vdr_train_k: int = typer.Option(512, "--vdr-train-k", min=1, rich_help_panel="VDR options",
                                    help="Query-side top-k of G_q (eq. 4) during training; images stay fully "
                                    "activated (§3.3 a; App. A: 512). VDR's defaults for shared options when not "
                                    "given: --epochs 1, --batch-size 256 (pairs per step), --vocab-min-df 5 "
                                    "(both towers cost ∝ |V|)."),
    vdr_query_k: int = typer.Option(512, "--vdr-query-k", min=1, rich_help_panel="VDR options",
                                    help="Default top-k of parametric queries at sparsify time (stored in the head; "
                                    "sparsify --vdr-query-k overrides)."),
    vdr_doc_k: int = typer.Option(512, "--vdr-doc-k", min=1, rich_help_panel="VDR options",
                                  help="Default top-k of documents (images) at sparsify time and validation "
                                  "(stored in the head; sparsify --vdr-doc-k overrides)."),
    vdr_temperature: float = typer.Option(0.07, "--vdr-temperature", min=1e-4, rich_help_panel="VDR options",
                                          help="Initial τ of eq. 5 on L2-normalised vectors, learnable (App. A: 0.07)."),
    vdr_cts_mask: bool = typer.Option(True, "--vdr-cts-mask/--vdr-no-cts-mask", rich_help_panel="VDR options",
                                      help="Contrastive mask (§3.3 c): deal the dimensions no caption of the batch "
                                      "opens to the in-batch pairs as negatives-only dimensions."),
    vdr_np_entry: bool = typer.Option(True, "--vdr-np-entry/--vdr-no-np-entry", rich_help_panel="VDR options",
                                      help="Add the nonparametric entry SCE(bow(q), V_p) to the loss (§3.2)."),
    vdr_buffer_rows: int = typer.Option(4096, "--vdr-buffer-rows", min=1, rich_help_panel="VDR options",
                                        help="Captions whose token states are held in the shuffle buffer (memory "
                                        "~ this x L x h x 2 bytes); states stream from the HDF5 file."),
) -> None:
    """Train a D2S head (paper eq. 4-7, Algorithm 1) from dense vectors to sparse vocabulary terms."""
    import shutil
    import time

    import numpy as np
    import torch
    from rich.console import Console

    from ..heads.d2s import D2SHead
    from ..progress import epoch_progress
    from ..training import TrainConfig, load_pairs, train_d2s
    from ..vocab import load_vocab_model, vocab_from_dense_attrs

    err = Console(stderr=True)
    if method == "sae":  # BM25-V visual words: top-k SAE on TRAIN_IMAGES' patch_states (mmsparse/methods/bm25v.py)
        from ..methods.bm25v import train_cli
        return train_cli(train_images, out, sae_k, sae_expansion, sae_lambda, sae_epochs, sae_batch_size, sae_lr,
                         patch_skip, sae_buffer_images, seed, threads, device)
    if expansion not in MODES:
        raise InputError(f"--expansion {expansion!r}: choose one of {', '.join(MODES)}")
    if select_metric not in ("R@1", "R@5", "R@10", "MRR@10"):
        raise InputError(f"--select-metric {select_metric!r}: choose R@1, R@5, R@10 or MRR@10")
    if pec_schedule not in ("epoch", "step"):
        raise InputError(f"--pec-schedule {pec_schedule!r}: choose epoch or step")
    if l1_caption not in ("raw", "masked"):
        raise InputError(f"--l1-caption {l1_caption!r}: choose raw or masked")
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
    if method == "joint":   # joint sparse-dense self-distillation: mmsparse/methods/joint.py
        from ..methods.joint import run_train_head
        return run_train_head(dict(locals()))
    if method == "vdr":     # VDR on frozen token/patch states: mmsparse/methods/vdr.py
        from ..methods.vdr import train_cli as vdr_train
        return vdr_train(dict(locals()))
    if method != "d2s":
        raise InputError(f"--method {method!r}: choose d2s, joint, sae or vdr")

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
                      init_bias=init_bias, max_val_flops=max_val_flops, l1_caption=l1_caption,
                      select_metric=select_metric, pec_schedule=pec_schedule)
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
    with epoch_progress(err, spe * epochs, epochs) as (prog, update):
        state = {"epoch_info": ""}

        def on_step(r):
            update(r, f"loss {r['loss']:.3f} FLOPs~{r['flops']:.1f} {state['epoch_info']}")

        def on_epoch(r):
            v = r.get("val", {})
            line = (f"epoch {r['epoch']}: loss {r['loss']:.3f} batch-FLOPs {r['flops']:.1f} p_c {r['p_c']:.2f}"
                    + (f" | val R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f} "
                       f"terms/img {v['d_nnz']:.0f} terms/cap {v['q_nnz']:.0f}" if v else "")
                    + f" ({r['seconds']:.0f}s)")
            prog.console.print(line)
            state["epoch_info"] = f"| val R@1 {v['R@1']:.3f}" if v else ""

        res = train_d2s(head, train, val, cfg, ckpt_dir, fingerprint, on_step=on_step, on_epoch=on_epoch,
                        device=device)
    head.to("cpu")
    head.load_state_dict(res.state)
    chosen = res.history[res.best_epoch - 1]
    head.config["training"].update(config={k: v for k, v in cfg.__dict__.items()}, best_epoch=res.best_epoch,
                                   val=chosen.get("val"), seconds=round(time.time() - t0, 1))
    head.save_pretrained(out)
    if not keep_checkpoint:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    v = chosen.get("val")
    err.print(f"saved epoch {res.best_epoch} to {out}" + (f" (val R@1 {v['R@1']:.4f}, R@10 {v['R@10']:.4f}, FLOPs {v['FLOPs']:.1f})" if v else "")
              + f" in {time.time() - t0:.0f}s")
