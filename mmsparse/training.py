"""D2S training loop (paper Algorithm 1 + eq. 7), validation and resumable checkpoints.

Data: a training set is every caption paired with its own image (dense vectors of both, the
caption's term ids). One epoch = one pass over the captions in a seeded random order, in batches
of `batch_size` captions; a batch's images are its captions' distinct images (see losses.py).

Checkpoints: after every epoch `ckpt_dir/last.pt` holds the model, AdamW and LR-scheduler state,
the expansion-control state, the shuffling/masking RNG state, the validation history and the best
epoch's weights, so a killed run restarted with the same settings continues from the last
finished epoch and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import scipy.sparse as sp
import torch

from .atomic import atomic_path, kill_point
from .errors import InputError
from .formats.dense import read_dense
from .formats.trec import read_qrels
from .losses import d2s_loss, eta_at
from .pec import DEFAULT_MASK_CAPTION_TERMS, ExpansionControl
from .vocab import caption_token_ids, document_frequency, indicator, indicator_cols, pad_ids, to_columns


@dataclass
class TrainConfig:
    """Hyper-parameters of `train-head` (see its --help for units and defaults)."""

    eta: float = 3e-3
    lam: float = 0.5
    tau: float = 1e-3
    epochs: int = 6
    batch_size: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.01
    lr_warmup_steps: int = 0
    lr_decay: str = "linear"          # linear (to 0 at the last step) | constant
    seed: int = 0
    expansion: str = "caption-word"
    mask_caption_terms: bool = DEFAULT_MASK_CAPTION_TERMS
    warmup_steps: int = 60            # L1 (η) quadratic warm-up, optimizer steps
    init_bias: float = 0.0
    max_val_flops: float | None = None
    pec_schedule: str = "epoch"       # epoch: eq. 6 steps after each epoch | step: same ramp per step
    select_metric: str = "R@1"        # validation metric that picks the saved epoch
    l1_caption: str = "raw"           # raw: L1 on the unmasked s_C (eq. 7) | masked: on s̄_C


@dataclass
class PairData:
    """Dense vectors of one split, captions paired with images.

    z_img [Ni, d] float32, z_cap [Nc, d] float32, cap_img [Nc] int64 (row of the caption's image
    in z_img), img_ids / cap_ids / texts (lists), attrs_img / attrs_cap (file attributes),
    After `tokenize`: raw_ids (tokenizer ids of each caption); after `set_columns`: token_ids
    (head columns of each caption's terms) and tok [Nc, L] int64 padded with |V|.
    """

    z_img: torch.Tensor
    z_cap: torch.Tensor
    cap_img: torch.Tensor
    img_ids: list[str]
    cap_ids: list[str]
    texts: list[str]
    attrs_img: dict
    attrs_cap: dict
    tok: torch.Tensor | None = None
    token_ids: list[np.ndarray] = field(default_factory=list)
    raw_ids: list[np.ndarray] = field(default_factory=list)

    def to(self, device) -> "PairData":
        """Move the tensors (vectors, pairing, padded term ids) to `device`, in place; returns self."""
        self.z_img, self.z_cap, self.cap_img = (t.to(device) for t in (self.z_img, self.z_cap, self.cap_img))
        if self.tok is not None:
            self.tok = self.tok.to(device)
        return self

    def tokenize(self, tokenizer) -> None:
        self.raw_ids = caption_token_ids(tokenizer, self.texts)

    def set_columns(self, head_token_ids) -> None:
        """Map raw_ids onto the head's columns (head.token_ids) and build `tok`."""
        tid = np.asarray(head_token_ids, dtype=np.int64)
        self.token_ids = to_columns(self.raw_ids, tid)
        self.tok = torch.from_numpy(pad_ids(self.token_ids, len(tid)))


def caption_image_ids(captions_path: str | Path, cap_ids: list[str], qrels_path: str | Path | None) -> list[str]:
    """Image id of each caption: the captions file's `image_ids` dataset if present, else the
    (caption id -> image id) qrels file. Raises InputError if neither gives every caption one."""
    with h5py.File(captions_path, "r") as f:
        if "image_ids" in f:
            out = [x.decode() if isinstance(x, bytes) else str(x) for x in f["image_ids"][()]]
            if len(out) != len(cap_ids):
                raise InputError(f"{captions_path}: image_ids: {len(out)} entries for {len(cap_ids)} captions")
            return out
    if qrels_path is None:
        raise InputError(f"{captions_path}: no 'image_ids' dataset; pass --qrels/--val-qrels "
                         "(caption id -> image id, TREC qrels) to pair captions with images")
    qrels = read_qrels(qrels_path)
    out, missing = [], []
    for c in cap_ids:
        rel = [d for d, r in qrels.get(c, {}).items() if r > 0]
        if not rel:
            missing.append(c)
            out.append("")
        else:
            out.append(rel[0])
    if missing:
        raise InputError(f"{qrels_path}: no relevant image for {len(missing)} caption(s) of {captions_path}, "
                         f"e.g. {missing[:3]}; pass the qrels of the same split")
    return out


def load_pairs(images_path: str | Path, captions_path: str | Path, qrels_path: str | Path | None = None) -> PairData:
    """Read an image and a caption dense file and pair them. Raises InputError on any mismatch."""
    im = read_dense(images_path)
    ca = read_dense(captions_path)
    if im.modality != "image":
        raise InputError(f"{images_path}: modality={im.modality!r}, expected an image dense file")
    if ca.modality != "text":
        raise InputError(f"{captions_path}: modality={ca.modality!r}, expected a caption (text) dense file")
    if im.dim != ca.dim:
        raise InputError(f"{captions_path}: dim {ca.dim} differs from {images_path} dim {im.dim}; "
                         "encode both with the same backbone")
    if ca.texts is None:
        raise InputError(f"{captions_path}: no 'texts' dataset; re-run encode-dense on captions")
    img_of = caption_image_ids(captions_path, ca.ids, qrels_path)
    row = {i: k for k, i in enumerate(im.ids)}
    unknown = [c for c, i in zip(ca.ids, img_of) if i not in row]
    if unknown:
        raise InputError(f"{captions_path}: {len(unknown)} caption(s) name images not in {images_path}, "
                         f"e.g. caption {unknown[0]!r}; use files of the same split")
    cap_img = torch.tensor([row[i] for i in img_of], dtype=torch.int64)
    return PairData(torch.from_numpy(im.vectors), torch.from_numpy(ca.vectors), cap_img,
                    im.ids, ca.ids, list(ca.texts), im.attrs, ca.attrs)


# ---------------------------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def encode_sparse(head, z: torch.Tensor | np.ndarray, batch: int = 1024,
                  keep: torch.Tensor | None = None) -> sp.csr_matrix:
    """Head outputs as CSR [N, |V|] float32. keep: optional [N, L] padded term ids (pad = |V|):
    zero every term not listed (caption-terms queries)."""
    z = torch.as_tensor(z, dtype=torch.float32).to(next(head.parameters()).device)
    v = int(head.config["vocab_size"])
    parts = []
    for s in range(0, z.shape[0], batch):
        out = head(z[s:s + batch])
        if keep is not None:
            out = out * indicator(keep[s:s + batch], v).to(out.device)
        parts.append(sp.csr_matrix(out.cpu().numpy()))
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)


def flops(q: sp.csr_matrix, d: sp.csr_matrix) -> float:
    """Eq. 1: Σ_t q_t d_t / (|Q||D|), q_t (d_t) = number of queries (docs) where term t is non-zero."""
    qt = np.bincount(q.indices, minlength=q.shape[1]).astype(np.float64)
    dt = np.bincount(d.indices, minlength=d.shape[1]).astype(np.float64)
    return float(qt @ dt) / max(q.shape[0] * d.shape[0], 1)


def rank_metrics(scores: np.ndarray, gold: np.ndarray) -> dict:
    """scores [Nq, Nd], gold [Nq] column of each query's one relevant doc.
    Rank = 1 + #docs scoring strictly higher; a gold doc scoring 0 counts as not retrieved
    (an inverted index never returns it)."""
    g = scores[np.arange(len(gold)), gold]
    rank = 1 + (scores > g[:, None]).sum(1)
    rank = np.where(g > 0, rank, np.iinfo(np.int64).max)
    return {"R@1": float((rank <= 1).mean()), "R@5": float((rank <= 5).mean()),
            "R@10": float((rank <= 10).mean()),
            "MRR@10": float(np.where(rank <= 10, 1.0 / np.minimum(rank, 10**9), 0.0).mean())}


def sparse_retrieval_metrics(q: sp.csr_matrix, d: sp.csr_matrix, gold: np.ndarray, chunk: int = 2048) -> dict:
    """Caption->image metrics of sparse dot products (brute force), plus FLOPs and mean non-zeros."""
    acc = {"R@1": 0.0, "R@5": 0.0, "R@10": 0.0, "MRR@10": 0.0}
    dt = d.T.tocsc()
    for s in range(0, q.shape[0], chunk):
        sc = (q[s:s + chunk] @ dt).toarray()
        m = rank_metrics(sc, gold[s:s + chunk])
        for k in acc:
            acc[k] += m[k] * sc.shape[0]
    out = {k: v / max(q.shape[0], 1) for k, v in acc.items()}
    out.update(FLOPs=flops(q, d), q_nnz=float(np.diff(q.indptr).mean()) if q.shape[0] else 0.0,
               d_nnz=float(np.diff(d.indptr).mean()) if d.shape[0] else 0.0)
    return out


def evaluate_head(head, data: PairData, query_mode: str = "expand") -> dict:
    """Caption->image retrieval on a whole split with sparse dot products."""
    head.eval()
    d = encode_sparse(head, data.z_img)
    q = encode_sparse(head, data.z_cap, keep=data.tok if query_mode == "caption-terms" else None)
    return sparse_retrieval_metrics(q, d, data.cap_img.cpu().numpy())


# ---------------------------------------------------------------------------------------------
# training


def _lr_lambda(cfg: TrainConfig, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        w = min(1.0, (step + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps > 0 else 1.0
        if cfg.lr_decay == "linear":
            w *= max(0.0, 1.0 - step / max(total, 1))
        return w
    return f


def make_adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused where this PyTorch build supports it (CPU and CUDA since 2.4): one kernel over
    each parameter instead of ~10 passes, 10x faster on the 23M-parameter W2 (bench/train.py)."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _pick(history: list[dict], cfg: TrainConfig) -> int:
    """Index of the epoch to keep: best val `select_metric` (R@1) among epochs that ended after the L1 warm-up
    (earlier ones are not yet sparse) and, if set, under max_val_flops; with no such epoch the
    lowest-FLOPs post-warm-up epoch; without validation the last epoch."""
    if not history or "val" not in history[-1]:
        return len(history) - 1
    cand = [i for i, h in enumerate(history) if h["step"] >= cfg.warmup_steps] or list(range(len(history)))
    ok = [i for i in cand if cfg.max_val_flops is None or history[i]["val"]["FLOPs"] <= cfg.max_val_flops]
    if ok:
        return max(ok, key=lambda i: (history[i]["val"][cfg.select_metric], i))
    return min(cand, key=lambda i: history[i]["val"]["FLOPs"])


@dataclass
class TrainResult:
    best_epoch: int            # 1-based
    history: list[dict]
    state: dict                # best epoch's state dict
    finished: bool


def train_step(head, train: PairData, idx: torch.Tensor, pec: ExpansionControl, gen: torch.Generator,
               cfg: TrainConfig, eta: float, opt, sched) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
    """One optimizer step of Algorithm 1 on the captions `idx` [B] int64 and their distinct images:
    one head projection of [B + U, d], the expansion mask, eq. 7, backward, AdamW and LR step.
    Returns (loss, loss parts, s̄_C [B, |V|], s_I [U, |V|]) for logging."""
    v = int(head.config["vocab_size"])
    idx = idx.to(train.z_cap.device)
    uimg = torch.unique(train.cap_img[idx])
    zc, zi = train.z_cap[idx], train.z_img[uimg]
    # one projection for both modalities, restricted to the columns live in the batch (exact)
    s, cols = head.forward_live(torch.cat([zc, zi]))
    s_cap, s_img = s[: len(idx)], s[len(idx):]
    m = pec.mask(indicator_cols(train.tok[idx], cols, v), gen, cols)
    raw = s_cap
    if m is not None:
        s_cap = s_cap * m
    loss, parts = d2s_loss(s_cap, s_img, zc, zi, cfg.tau, cfg.lam, eta,
                           s_cap_l1=raw if cfg.l1_caption == "raw" else None)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss, parts, s_cap, s_img


def train_d2s(head, train: PairData, val: PairData | None, cfg: TrainConfig,
              ckpt_dir: str | Path | None = None, fingerprint: dict | None = None,
              stop_after_epoch: int | None = None, on_step: Callable[[dict], None] | None = None,
              on_epoch: Callable[[dict], None] | None = None, device: str = "cpu") -> TrainResult:
    """Train `head` in place (Algorithm 1 with eq. 7) and return the chosen epoch's weights.

    device: where the head and all training tensors live (cpu, cuda); shuffling and expansion
    draws stay on a CPU generator, so a run's batches and masks do not depend on the device.

    train/val: PairData with `tok` set. ckpt_dir: where last.pt lives (None: no checkpoints);
    a checkpoint with a different `fingerprint` raises InputError. stop_after_epoch: return
    after that many finished epochs (to simulate an interruption in tests).
    """
    v = int(head.config["vocab_size"])
    head.to(device)
    train.to(device)
    if val is not None:
        val.to(device)
    df = document_frequency(train.token_ids, v)
    pec = ExpansionControl(cfg.expansion, df, cfg.epochs, cfg.mask_caption_terms)
    n = train.z_cap.shape[0]
    spe = math.ceil(n / cfg.batch_size)
    total = spe * cfg.epochs
    opt = make_adamw(head.parameters(), cfg.lr, cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, total))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best_state = None
    start = 0
    fp = {"config": asdict(cfg), **(fingerprint or {})}
    ckpt = Path(ckpt_dir) / "last.pt" if ckpt_dir is not None else None
    st = load_checkpoint(ckpt, fp, head, opt, sched, gen)
    if st is not None:
        pec.load_state_dict(st["pec"])
        history, best_state, start = st["history"], st["best_state"], st["epoch"]
    step = start * spe
    for epoch in range(start, cfg.epochs):
        if stop_after_epoch is not None and epoch >= stop_after_epoch:
            return TrainResult(0, history, best_state or {}, False)
        head.train()
        pec.set_epoch(epoch)
        perm = torch.randperm(n, generator=gen)
        t0 = time.time()
        sums = {"loss": 0.0, "ci": 0.0, "ic": 0.0, "l1_img": 0.0, "l1_cap": 0.0, "flops": 0.0}
        for b in range(spe):
            idx = perm[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            if cfg.pec_schedule == "step":
                pec.set_progress((epoch + b / spe) / cfg.epochs)
            eta = eta_at(step, cfg.eta, cfg.warmup_steps)
            loss, parts, s_cap, s_img = train_step(head, train, idx, pec, gen, cfg, eta, opt, sched)
            step += 1
            with torch.no_grad():   # batch FLOPs proxy (eq. 1 on the batch)
                fl = float(((s_cap > 0).float().mean(0) * (s_img > 0).float().mean(0)).sum())
            for k, x in (("loss", float(loss.detach())), ("flops", fl), *parts.items()):
                sums[k] += x
            if on_step is not None:
                on_step({"epoch": epoch + 1, "step": step, "loss": float(loss.detach()), "flops": fl, "eta": eta})
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        rec = {"epoch": epoch + 1, "step": step, "seconds": time.time() - t0, "p_c": pec.p_c,
               **{k: x / spe for k, x in sums.items()}}
        if val is not None:
            rec["val"] = evaluate_head(head, val)
        history.append(rec)
        if _pick(history, cfg) == len(history) - 1:
            best_state = {k: t.detach().clone() for k, t in head.state_dict().items()}
        if on_epoch is not None:
            on_epoch(rec)
        if ckpt is not None:
            st = {"fingerprint": fp, "epoch": epoch + 1, "model": head.state_dict(),
                  "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                  "pec": pec.state_dict(), "rng": gen.get_state(), "history": history,
                  "best_state": best_state}
            with atomic_path(ckpt) as tmp:
                torch.save(st, tmp)
    best = _pick(history, cfg)
    return TrainResult(best + 1, history, copy.deepcopy(best_state) if best_state else head.state_dict(), True)


def load_checkpoint(ckpt, fingerprint: dict, head, opt, sched, gen) -> dict | None:
    """Restore head, optimizer, scheduler and RNG from `ckpt` (a last.pt written after an epoch)
    and return the whole checkpoint dict for method-specific state; None when there is none.
    Raises InputError when the checkpoint was written with other settings or inputs."""
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
