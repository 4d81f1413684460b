"""Joint sparse-dense self-distillation (Song et al., CIKM 2025, §2.3, eq. 2-3): `train-head --method joint`.

Trains, on stored pre-projection states only (no image passes through the backbone), the D2S
sparse head together with copies of the backbone's final projections (heads/joint.py):

    L_final = λ1 L(s_dense) + λ2 L(s_sparse) + λ3 L(s_inter)                      (eq. 2, contrastive)
            + ½ [CE(p(s_inter), p(s_dense)) + CE(p(s_inter), p(s_sparse))]         (L', teacher without gradient)
            + η_t L1(z_t) + η_i L1(z_i)                                            (eq. 3, η ramps quadratically)

L(s) = ½ [L_t→i + L_i→t] (InfoNCE, eq. 2). A batch is `batch_size` captions and their *distinct*
images (as D2S, losses.py): t→i has one positive per caption; i→t takes every caption of the image
as a positive (-log Σ_pos softmax), which is eq. 2 exactly when each image occurs once. The
distillation CE is averaged over both directions too (the paper does not say which it uses).
Probabilistic expansion control masks the caption sparse vectors as in D2S (pec.py).

A joint epoch (default) visits every image once with one of its captions drawn at random, so a batch
holds N distinct pairs as in eq. 2; --all-captions walks every caption instead.

Reused from D2S (imported, not copied): the head (D2SHead), PEC, vocab helpers, the η warm-up
(losses.eta_at), soft_ce / sparse_scores, the LR schedule, epoch selection and evaluation
(training.py).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError
from ..losses import eta_at, soft_ce, sparse_scores
from ..pec import DEFAULT_MASK_CAPTION_TERMS, ExpansionControl
from ..training import PairData, TrainResult, _lr_lambda, _pick, evaluate_head, load_pairs, rank_metrics
from ..vocab import document_frequency, indicator


@dataclass
class JointConfig:
    """Hyper-parameters of `train-head --method joint` (see its --help for units and defaults)."""

    w1: float = 0.3                   # s_inter = w1 s_dense + w2 s_sparse
    w2: float = 1.0
    lam_dense: float = 1.0            # λ1, λ2, λ3 of eq. 2's weighted sum
    lam_sparse: float = 1.0
    lam_inter: float = 1.0
    distill: bool = True              # L' (ablation: False = contrastive only, Table 3 row 2)
    tune_projection: bool = True      # train the projections (ablation: False = frozen, Table 3 row 1)
    tau_init: float = 0.05
    eta: float = 1e-3                 # η_t
    eta_image: float | None = None    # η_i (None: = eta)
    warmup_steps: int = 0             # η quadratic ramp, optimizer steps
    epochs: int = 5
    batch_size: int = 512
    lr: float = 1e-3                  # sparse head and τ
    proj_lr: float = 1e-4             # projections (pre-trained: a smaller step)
    weight_decay: float = 0.01        # sparse head only
    lr_warmup_steps: int = 0
    lr_decay: str = "linear"
    seed: int = 0
    expansion: str = "caption-word"
    mask_caption_terms: bool = DEFAULT_MASK_CAPTION_TERMS
    init_bias: float = 0.0
    max_val_flops: float | None = None
    caption_per_image: bool = True    # epoch = each image once with one random caption (else every caption)
    select_metric: str = "R@1"        # validation sparse metric that picks the saved epoch (training._pick)


# ---------------------------------------------------------------------------------------------
# data


@dataclass
class StatePairs:
    """A split's pairs (training.PairData: vectors = the backbone's own projected vectors) plus
    pre_img [Ni, h_img] / pre_cap [Nc, h_txt] float32 pre-projection states and the backbone's
    projection weights proj {"image_proj_weight" [d, h_img], "text_proj_weight" [d, h_txt], ...}."""

    pairs: PairData
    pre_img: torch.Tensor
    pre_cap: torch.Tensor
    proj: dict


def read_states(path: str | Path) -> tuple[np.ndarray, dict]:
    """(pre_projection [N, h] float32, {name: array} of the file's *_proj_weight / *_proj_bias).
    Raises InputError when the file has no pre-projection states."""
    with h5py.File(path, "r") as f:
        if "pre_projection" not in f:
            raise InputError(f"{path}: no 'pre_projection' dataset; --method joint trains on pre-projection "
                             "states: re-encode with `mmsparse encode-dense --pre-projection`")
        pre = f["pre_projection"][()].astype(np.float32)
        if pre.shape[0] != f["ids"].shape[0]:
            raise InputError(f"{path}: pre_projection has {pre.shape[0]} rows for {f['ids'].shape[0]} ids")
        proj = {k: f[k][()].astype(np.float32) for k in f if k.endswith(("_proj_weight", "_proj_bias"))}
    return pre, proj


def load_state_pairs(images: str | Path, captions: str | Path, qrels: str | Path | None = None) -> StatePairs:
    """Pairs + pre-projection states of one split. Raises InputError if the projection weights are
    missing or do not reproduce the stored vectors (normalize(p Wᵀ + b) must equal `vectors`)."""
    pairs = load_pairs(images, captions, qrels)
    pre_i, proj_i = read_states(images)
    pre_c, proj_c = read_states(captions)
    proj = {**proj_c, **proj_i}
    for side, pre, vec, path in (("image", pre_i, pairs.z_img, images), ("text", pre_c, pairs.z_cap, captions)):
        w = proj.get(f"{side}_proj_weight")
        if w is None:
            raise InputError(f"{path}: no '{side}_proj_weight' dataset; re-encode with --pre-projection")
        if w.shape[1] != pre.shape[1]:
            raise InputError(f"{path}: {side}_proj_weight is {w.shape} but pre_projection has width {pre.shape[1]}")
        k = min(256, pre.shape[0])
        h = pre[:k] @ w.T + proj.get(f"{side}_proj_bias", 0.0)
        h /= np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)
        err = float(np.abs(h - vec[:k].numpy()).max()) if k else 0.0
        if err > 1e-3:
            raise InputError(f"{path}: normalize(pre_projection @ {side}_proj_weightᵀ) differs from `vectors` by "
                             f"{err:.3g}; the stored weights are not the projection that made the vectors")
    return StatePairs(pairs, torch.from_numpy(pre_i), torch.from_numpy(pre_c), proj)


# ---------------------------------------------------------------------------------------------
# loss


def integrated_score(s_dense: torch.Tensor, s_sparse: torch.Tensor, w1: float, w2: float) -> torch.Tensor:
    """s_inter = w1·s_dense + w2·s_sparse (§2.3), any matching shapes."""
    return w1 * s_dense + w2 * s_sparse


def info_nce(s: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """½ (L_t→i + L_i→t) of eq. 2. s [B, U] caption x distinct-image logits, pos [B] int64 column
    of each caption's image (every column must be some caption's image)."""
    t2i = F.cross_entropy(s, pos)
    m = F.one_hot(pos, s.shape[1]).bool()                         # [B, U] positives
    logp = F.log_softmax(s, dim=0).masked_fill(~m, float("-inf"))  # softmax over captions per image
    i2t = -torch.logsumexp(logp, dim=0).mean()
    return 0.5 * (t2i + i2t)


def distill(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """L_distill(s_inter, s) = -p(s_inter)·log p(s), averaged over the t→i (rows) and i→t (columns)
    softmax; the teacher gets no gradient. Both [B, U]."""
    t = teacher.detach()
    return 0.5 * (soft_ce(t, student) + soft_ce(t.T, student.T))


def joint_loss(h_cap: torch.Tensor, h_img: torch.Tensor, z_cap: torch.Tensor, z_img: torch.Tensor,
               pos: torch.Tensor, tau: torch.Tensor | float, cfg: JointConfig, eta_t: float, eta_i: float
               ) -> tuple[torch.Tensor, dict]:
    """Eq. 3 on one batch. h_cap [B, d], h_img [U, d] normalised projected vectors; z_cap [B, |V|]
    (expansion-masked), z_img [U, |V|]; pos [B] image column of each caption; tau: temperature.
    Returns (loss, {"dense", "sparse", "inter", "kd_dense", "kd_sparse", "l1_cap", "l1_img"} floats)."""
    s_dense = (h_cap @ h_img.T) / tau
    s_sparse = sparse_scores(z_cap, z_img)
    s_inter = integrated_score(s_dense, s_sparse, cfg.w1, cfg.w2)
    parts = {"dense": info_nce(s_dense, pos), "sparse": info_nce(s_sparse, pos), "inter": info_nce(s_inter, pos)}
    loss = cfg.lam_dense * parts["dense"] + cfg.lam_sparse * parts["sparse"] + cfg.lam_inter * parts["inter"]
    if cfg.distill:
        parts["kd_dense"], parts["kd_sparse"] = distill(s_inter, s_dense), distill(s_inter, s_sparse)
        loss = loss + 0.5 * (parts["kd_dense"] + parts["kd_sparse"])
    parts["l1_cap"], parts["l1_img"] = z_cap.sum(1).mean(), z_img.sum(1).mean()
    loss = loss + eta_t * parts["l1_cap"] + eta_i * parts["l1_img"]
    return loss, {k: float(x.detach()) for k, x in parts.items()}


# ---------------------------------------------------------------------------------------------
# evaluation and training


@torch.no_grad()
def project_all(head, pre: torch.Tensor, modality: str, batch: int = 4096) -> torch.Tensor:
    """Tuned dense vectors [N, d] of pre-projection states [N, h]."""
    return torch.cat([head.project(pre[s:s + batch], modality) for s in range(0, pre.shape[0], batch)]) \
        if pre.shape[0] else torch.zeros(0, head.dim)


@torch.no_grad()
def evaluate_joint(head, data: StatePairs) -> tuple[dict, dict]:
    """(sparse, dense) caption->image metrics on a whole split (brute force; training.rank_metrics)."""
    head.eval()
    hi, hc = project_all(head, data.pre_img, "image"), project_all(head, data.pre_cap, "text")
    sparse = evaluate_head(head, replace(data.pairs, z_img=hi, z_cap=hc))
    sc = (hc @ hi.T).numpy()
    dense = rank_metrics(sc - sc.min() + 1.0, data.pairs.cap_img.numpy())  # shift: rank_metrics needs gold > 0
    return sparse, dense


def train_joint(head, train: StatePairs, val: StatePairs | None, cfg: JointConfig,
                on_step: Callable[[dict], None] | None = None,
                on_epoch: Callable[[dict], None] | None = None) -> TrainResult:
    """Train `head` (heads.joint.JointHead) in place on eq. 3; return the chosen epoch's weights
    (best validation sparse R@1 after the η warm-up, training._pick). train/val: `pairs.tok` set."""
    v = int(head.config["vocab_size"])
    pec = ExpansionControl(cfg.expansion, document_frequency(train.pairs.token_ids, v), cfg.epochs,
                           cfg.mask_caption_terms)
    for p in (*head.image_proj.parameters(), *head.text_proj.parameters()):
        p.requires_grad_(cfg.tune_projection)
    proj = [p for p in (*head.image_proj.parameters(), *head.text_proj.parameters()) if p.requires_grad]
    sparse = [p for n, p in head.named_parameters() if n.split(".")[0] in ("w1", "norm", "w2")]
    groups = [{"params": sparse, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
              {"params": [head.log_tau], "lr": cfg.lr, "weight_decay": 0.0}]
    if proj:
        groups.append({"params": proj, "lr": cfg.proj_lr, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups)
    cap_img = train.pairs.cap_img
    if cfg.caption_per_image:   # captions of each image, padded: one is drawn per image and epoch
        order = torch.argsort(cap_img, stable=True)
        counts = torch.bincount(cap_img, minlength=train.pre_img.shape[0])
        keep = counts > 0
        starts = torch.cumsum(counts, 0) - counts
        n = int(keep.sum())
    else:
        n = train.pre_cap.shape[0]
    spe = math.ceil(n / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, spe * cfg.epochs))
    gen = torch.Generator().manual_seed(cfg.seed)
    eta_i = cfg.eta if cfg.eta_image is None else cfg.eta_image
    history: list[dict] = []
    best_state = None
    step = 0
    for epoch in range(cfg.epochs):
        head.train()
        pec.set_epoch(epoch)
        perm = torch.randperm(n, generator=gen)
        if cfg.caption_per_image:
            imgs = torch.nonzero(keep).squeeze(1)[perm]
            pick = (torch.rand(n, generator=gen) * counts[imgs]).long()
            perm = order[starts[imgs] + pick]
        t0 = time.time()
        sums: dict[str, float] = {}
        for b in range(spe):
            idx = perm[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            uimg, pos = torch.unique(cap_img[idx], return_inverse=True)
            h_cap = head.project(train.pre_cap[idx], "text")
            h_img = head.project(train.pre_img[uimg], "image")
            z = head(torch.cat([h_cap, h_img]))          # one sparse head for both modalities (eq. 1)
            z_cap, z_img = z[: len(idx)], z[len(idx):]
            m = pec.mask(indicator(train.pairs.tok[idx], v), gen)
            if m is not None:
                z_cap = z_cap * m
            ramp = eta_at(step, 1.0, cfg.warmup_steps)
            loss, parts = joint_loss(h_cap, h_img, z_cap, z_img, pos, head.tau, cfg, cfg.eta * ramp, eta_i * ramp)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            with torch.no_grad():   # batch FLOPs proxy (eq. 1 of D2S on the batch)
                fl = float(((z_cap > 0).float().mean(0) * (z_img > 0).float().mean(0)).sum())
            for k, x in (("loss", float(loss.detach())), ("flops", fl), *parts.items()):
                sums[k] = sums.get(k, 0.0) + x
            if on_step is not None:
                on_step({"epoch": epoch + 1, "step": step, "loss": float(loss.detach()), "flops": fl})
        rec = {"epoch": epoch + 1, "step": step, "seconds": time.time() - t0, "p_c": pec.p_c,
               "tau": float(head.tau.detach()), **{k: x / spe for k, x in sums.items()}}
        if val is not None:
            rec["val"], rec["val_dense"] = evaluate_joint(head, val)
        history.append(rec)
        if _pick(history, cfg) == len(history) - 1:
            best_state = {k: t.detach().clone() for k, t in head.state_dict().items()}
        if on_epoch is not None:
            on_epoch(rec)
    best = _pick(history, cfg)
    return TrainResult(best + 1, history, copy.deepcopy(best_state) if best_state else head.state_dict(), True)


# ---------------------------------------------------------------------------------------------
# commands


def run_train_head(a: dict) -> None:
    """`train-head --method joint`: `a` holds train_head.main's (resolved) arguments."""
    import numpy as np
    from rich.console import Console

    from ..checks import check_compatible
    from ..heads.joint import JointHead
    from ..progress import epoch_progress
    from ..vocab import load_vocab_model, vocab_from_dense_attrs

    err = Console(stderr=True)
    t_load = time.time()
    train = load_state_pairs(a["train_images"], a["train_captions"], a["qrels"])
    val = load_state_pairs(a["val_images"], a["val_captions"], a["val_qrels"]) if a["val_images"] else None
    fix = "use files encoded with the same backbone and model (encode-dense --pre-projection)"
    check_compatible(train.pairs.attrs_img, train.pairs.attrs_cap, ("backbone", "model", "dataset", "split"),
                     str(a["train_images"]), str(a["train_captions"]), fix)
    if val is not None:
        check_compatible(train.pairs.attrs_img, val.pairs.attrs_img, ("backbone", "model"),
                         str(a["train_images"]), str(a["val_images"]), fix)
    voc = load_vocab_model(a["vocab_model"]) if a["vocab_model"] else vocab_from_dense_attrs(train.pairs.attrs_cap)
    train.pairs.tokenize(voc.tokenizer)
    if a["vocab_min_df"] > 0:
        counts = np.bincount(np.concatenate(train.pairs.raw_ids), minlength=len(voc.terms))[:len(voc.terms)]
        voc = voc.restrict(counts >= a["vocab_min_df"])
    cfg = JointConfig(w1=a["w1"], w2=a["w2"], lam_dense=a["lambda_dense"], lam_sparse=a["lambda_sparse"],
                      lam_inter=a["lambda_inter"], distill=a["distill"], tune_projection=a["tune_projection"],
                      tau_init=a["tau_init"], eta=a["eta"], eta_image=a["eta_image"], warmup_steps=a["warmup_steps"],
                      epochs=a["epochs"], batch_size=a["batch_size"], lr=a["lr"], proj_lr=a["proj_lr"],
                      weight_decay=a["weight_decay"], lr_warmup_steps=a["lr_warmup_steps"], lr_decay=a["lr_decay"],
                      seed=a["seed"], expansion=a["expansion"], mask_caption_terms=a["mask_caption_terms"],
                      init_bias=a["init_bias"], max_val_flops=a["max_val_flops"],
                      caption_per_image=a["caption_per_image"], select_metric=a.get("select_metric", "R@1"))
    at = train.pairs.attrs_cap
    training = {"backbone": at.get("backbone"), "model": at.get("model"), "dataset": at.get("dataset"),
                "train_images": str(Path(a["train_images"]).resolve()),
                "train_captions": str(Path(a["train_captions"]).resolve()),
                "val_images": str(Path(a["val_images"]).resolve()) if a["val_images"] else None,
                "val_captions": str(Path(a["val_captions"]).resolve()) if a["val_captions"] else None,
                "vocab_min_df": a["vocab_min_df"]}
    torch.manual_seed(cfg.seed)
    head = JointHead.from_backbone(voc, train.proj, training, init_bias=cfg.init_bias, tau_init=cfg.tau_init)
    train.pairs.set_columns(head.token_ids.numpy())
    if val is not None:
        val.pairs.tokenize(voc.tokenizer)
        val.pairs.set_columns(head.token_ids.numpy())
        s0, d0 = evaluate_joint(head, val)
        err.print(f"before training: val dense R@1 {d0['R@1']:.4f} R@10 {d0['R@10']:.4f}")
    err.print(f"train-head --method joint: {len(train.pairs.img_ids)} images, {len(train.pairs.cap_ids)} captions, "
              f"pre-projection widths {head.config['image_dim']}/{head.config['text_dim']} -> d={head.dim}, "
              f"|V|={len(voc.terms)} (loaded in {time.time() - t_load:.0f}s)")
    spe = -(-(len(set(train.pairs.cap_img.tolist())) if cfg.caption_per_image else len(train.pairs.cap_ids))
            // cfg.batch_size)
    t0 = time.time()
    with epoch_progress(err, spe * cfg.epochs, cfg.epochs) as (prog, update):

        def on_step(r):
            update(r, f"loss {r['loss']:.3f} FLOPs~{r['flops']:.1f}")

        def on_epoch(r):
            vs, vd = r.get("val"), r.get("val_dense")
            prog.console.print(f"epoch {r['epoch']}: loss {r['loss']:.3f} (dense {r['dense']:.3f} sparse {r['sparse']:.3f} "
                               f"inter {r['inter']:.3f}) τ {r['tau']:.4f} batch-FLOPs {r['flops']:.1f}"
                               + (f" | val sparse R@1 {vs['R@1']:.4f} FLOPs {vs['FLOPs']:.1f} | dense R@1 "
                                  f"{vd['R@1']:.4f} R@10 {vd['R@10']:.4f}" if vs else "") + f" ({r['seconds']:.0f}s)")

        res = train_joint(head, train, val, cfg, on_step=on_step, on_epoch=on_epoch)
    head.load_state_dict(res.state)
    chosen = res.history[res.best_epoch - 1]
    head.config["training"].update(config=asdict(cfg), best_epoch=res.best_epoch, val=chosen.get("val"),
                                   val_dense=chosen.get("val_dense"), tau=chosen["tau"],
                                   seconds=round(time.time() - t0, 1))
    head.save_pretrained(a["out"])
    v = chosen.get("val")
    err.print(f"saved epoch {res.best_epoch} to {a['out']}" + (
        f" (val sparse R@1 {v['R@1']:.4f} FLOPs {v['FLOPs']:.1f}, dense R@1 {chosen['val_dense']['R@1']:.4f})" if v else "")
        + f" in {time.time() - t0:.0f}s")


def tuned_dense(head, src: str | Path, out: str | Path, batch: int = 4096, head_dir: str | Path | None = None) -> Path:
    """Write the joint head's dense vectors of a pre-projection file `src` (images or captions) to
    `out`: same ids / texts / image_ids / attributes, vectors = head.project(pre_projection).
    Returns `out`. Raises InputError when `src` has no pre-projection states."""
    from ..formats import DenseWriter
    from ..formats._h5 import read_strings
    from ..formats.dense import read_dense_attrs

    attrs = read_dense_attrs(src)
    modality = attrs["modality"]
    keep = {k: attrs[k] for k in ("modality", "backbone", "model", "dataset", "split") if k in attrs}
    keep.update(normalized=True, pre_projection_source=str(Path(src).resolve()),
                joint_head=str(Path(head_dir).resolve()) if head_dir else "")
    with h5py.File(src, "r") as f:
        if "pre_projection" not in f:
            raise InputError(f"{src}: no 'pre_projection' dataset; a joint head re-projects pre-projection states: "
                             "use the file written by `encode-dense --pre-projection`")
        n = f["ids"].shape[0]
        texts = "texts" in f
        img_ids = "image_ids" in f
        with DenseWriter(out, head.dim, keep, with_texts=texts) as w:
            for s in range(0, n, batch):
                pre = torch.from_numpy(f["pre_projection"][s:s + batch].astype(np.float32))
                with torch.no_grad():
                    h = head.project(pre, modality).numpy()
                w.append(read_strings(f["ids"][s:s + batch]), h,
                         read_strings(f["texts"][s:s + batch]) if texts else None,
                         read_strings(f["image_ids"][s:s + batch]) if img_ids else None)
    return Path(out)


def grid_table(head_dirs: list[str | Path]) -> str:
    """Markdown w1 x w2 table of validation R@1 (sparse / dense, x100) of joint head directories."""
    cells, w1s, w2s = {}, set(), set()
    for d in head_dirs:
        cfg = json.loads((Path(d) / "config.json").read_text(encoding="utf-8"))["training"]
        w1, w2 = cfg["config"]["w1"], cfg["config"]["w2"]
        w1s.add(w1)
        w2s.add(w2)
        cells[(w1, w2)] = (cfg["val"]["R@1"], cfg["val_dense"]["R@1"], cfg["val"]["FLOPs"])
    cols = sorted(w2s)
    lines = ["val R@1 x100, sparse / dense (sparse FLOPs)", "",
             "| w1 \\ w2 | " + " | ".join(f"{c:g}" for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in sorted(w1s):
        row = [f"{100 * cells[(r, c)][0]:.1f} / {100 * cells[(r, c)][1]:.1f} ({cells[(r, c)][2]:.1f})"
               if (r, c) in cells else "-" for c in cols]
        lines.append(f"| {r:g} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m mmsparse.methods.joint grid HEAD_DIR... [-o table.md]
    import sys

    args = sys.argv[1:]
    if not args or args[0] != "grid":
        sys.exit("usage: python -m mmsparse.methods.joint grid HEAD_DIR... [-o OUT.md]")
    out = args[args.index("-o") + 1] if "-o" in args else None
    dirs = [x for x in args[1:] if x != "-o" and x != out]
    table = grid_table(dirs)
    print(table)
    if out:
        from ..atomic import write_text_atomic
        write_text_atomic(out, table)
