"""VDR training and sparsification on frozen token / patch states (VDR paper §3, App. A).

Training (one step, a batch of B caption-image pairs; a batch holds each image at most once
where possible, and a repeated image is one column whose row spreads its target over its captions):

    V_q = V_text(token states), V_p = V_image(patch states)           (heads/vdr.py, eq. 2-3)
    G_q = top_k(V_q) ∪ bow(q)                                          (eq. 4, k = --vdr-train-k)
    M   = contrastive mask: the dimensions no G_q of the batch opens, dealt out to the B captions
          (M_j opens them in q_j and closes them in q_j's own image)    (§3.3 c)
    q   = l2n(V_q ⊙ (G_q ∨ M)),  p = l2n(V_p ⊙ ¬M_img)  (documents fully activated, §3.3 a)
    L   = SCE(q, p) + SCE(l2n(bow(q)), p)       parametric + nonparametric entry (eq. 5, §3.2)
    SCE(a, b) = CE_rows(a bᵀ/τ) + CE_cols(a bᵀ/τ), τ learnable, initial 0.07 (App. A)

Inference: documents E_p = top_{k_doc}(l2n(V_p)) (the training-time normalisation, then gated);
queries `vdr`: l2n(V_q ⊙ G_q) with k = k_query; `bow`: the binary bag of words (VDR^α, no network).

Token states stream from HDF5 in shuffled blocks (memory O(buffer), default 4096 captions).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import h5py
import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from ..atomic import atomic_path, kill_point
from ..errors import InputError
from ..heads.vdr import VDRHead, gate, l2n, topk_mask
from ..training import load_checkpoint

STATE_SETS = {"text": "token_states", "image": "patch_states"}


# ---------------------------------------------------------------------------------------------
# loss


def contrastive_mask(g: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """§3.3 (c): the dimensions no row of gate `g` [B, |V|] opens (V \\ T(B)), shuffled and dealt
    round-robin to the B rows. Returns M [B, |V|] float 0/1: rows disjoint, their union exactly
    the unused dimensions, each row ⌊|U|/B⌋ or ⌈|U|/B⌉ of them, M ∧ g = 0."""
    b = g.shape[0]
    unused = torch.nonzero(~(g > 0).any(0)).squeeze(1)
    m = torch.zeros_like(g)
    if unused.numel():
        perm = unused[torch.randperm(unused.numel(), generator=gen)]
        m[torch.arange(perm.numel()) % b, perm] = 1.0
    return m


def sce(q: torch.Tensor, p: torch.Tensor, cap_img: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric cross-entropy (eq. 5) of query rows q [B, |V|] against image rows p [U, |V|];
    cap_img [B] int64: the column of each caption's image. q→p: CE to that column; p→q: CE to
    the image's captions (uniform over them when an image has several in the batch)."""
    logits = scale * (q @ p.T)                                   # [B, U]
    qp = F.cross_entropy(logits, cap_img)
    tgt = torch.zeros(p.shape[0], q.shape[0])
    tgt[cap_img, torch.arange(q.shape[0])] = 1.0
    tgt = tgt / tgt.sum(1, keepdim=True).clamp_min(1.0)
    pq = -(tgt * F.log_softmax(logits.T, dim=1)).sum(1).mean()
    return qp + pq


def vdr_loss(v_q: torch.Tensor, v_p: torch.Tensor, bow: torch.Tensor, cap_img: torch.Tensor, k: int,
             scale: torch.Tensor, cts_mask: bool = True, np_entry: bool = True,
             gen: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """VDR loss on one batch (§3.2-3.3). v_q [B, |V|] caption weights, v_p [U, |V|] image weights
    (both > 0), bow [B, |V|] 0/1, cap_img [B] image column of each caption, k: query top-k,
    scale = 1/τ. Returns (loss, {"param", "nonparam", "unused"}: the two entries and |V \\ T(B)|)."""
    g = gate(v_q.detach(), k, bow)
    m = contrastive_mask(g, gen) if cts_mask else torch.zeros_like(g)
    closed = torch.zeros(v_p.shape[0], v_p.shape[1]).index_add_(0, cap_img, m).clamp_(max=1.0)
    p = l2n(v_p * (1.0 - closed))
    param = sce(l2n(v_q * torch.maximum(g, m)), p, cap_img, scale)
    nonparam = sce(l2n(bow), p, cap_img, scale) if np_entry else torch.zeros(())
    loss = param + nonparam
    return loss, {"param": float(param.detach()), "nonparam": float(nonparam.detach()),
                  "unused": float(m.sum())}


# ---------------------------------------------------------------------------------------------
# data


class States:
    """Position states of one dense file, read lazily: token_states (+ token_mask) of captions,
    patch_states of images, or the pooled `vectors` as one position where neither is stored.
    read(lo, hi) -> (x [n, L, h] float16/32 numpy, mask [n, L] uint8 or None)."""

    def __init__(self, path: str | Path, side: str, prefer_states: bool = True):
        self.path = Path(path)
        self.f = h5py.File(self.path, "r")
        name = STATE_SETS[side]
        self.name = name if (prefer_states and name in self.f) else "vectors"
        ds = self.f[self.name]
        self.n = int(ds.shape[0])
        self.hidden = int(ds.shape[-1])
        self.has_mask = self.name == "token_states" and "token_mask" in self.f
        # trim the trailing padding columns no caption uses: fewer bytes read per batch
        self.length = int(ds.shape[1]) if ds.ndim == 3 else 1
        if self.has_mask:
            end = 1
            for s in range(0, self.n, 65536):
                m = self.f["token_mask"][s:s + 65536].astype(bool)
                if m.size:
                    end = max(end, int((m.shape[1] - np.argmax(m[:, ::-1], axis=1))[m.any(1)].max(initial=1)))
            self.length = end

    def read(self, lo: int, hi: int):
        ds = self.f[self.name]
        x = ds[lo:hi, :self.length] if ds.ndim == 3 else ds[lo:hi][:, None, :]
        return x, (self.f["token_mask"][lo:hi, :self.length] if self.has_mask else None)

    def read_rows(self, rows: np.ndarray):
        """Rows (any order, may repeat) -> (x, mask) in that order; reads contiguous runs."""
        uniq, inv = np.unique(rows, return_inverse=True)
        parts, masks = [], []
        # consecutive runs of the sorted unique rows are one slice each
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        for run in np.split(uniq, breaks):
            x, m = self.read(int(run[0]), int(run[-1]) + 1)
            parts.append(x)
            masks.append(m)
        x = np.concatenate(parts)[inv]
        return x, (np.concatenate(masks)[inv] if self.has_mask else None)

    def close(self) -> None:
        self.f.close()


def caption_token_sets(path: str | Path, tokenizer, special_ids) -> list[np.ndarray]:
    """Bag of words of each caption as sorted unique tokenizer ids (int64, special tokens dropped):
    the stored token_ids where the file has them, else the tokenized `texts`."""
    from ..vocab import caption_token_ids

    special = np.asarray(sorted(special_ids), dtype=np.int64)
    with h5py.File(path, "r") as f:
        if "token_ids" in f and "token_mask" in f:
            ids = []
            for s in range(0, f["token_ids"].shape[0], 65536):
                t, m = f["token_ids"][s:s + 65536], f["token_mask"][s:s + 65536].astype(bool)
                for row, mk in zip(t, m):
                    a = np.unique(row[mk].astype(np.int64))
                    ids.append(a[~np.isin(a, special)])
            return ids
        if "texts" not in f:
            raise InputError(f"{path}: neither token_ids nor texts; re-run encode-dense on captions")
        from ..formats._h5 import read_strings
        texts = read_strings(f["texts"])
    if tokenizer is None:
        raise InputError(f"{path}: no token_ids and no tokenizer to make bags of words from its texts")
    return caption_token_ids(tokenizer, texts)


@dataclass
class Split:
    """A split of paired files: caption states, image states, each caption's image row, bows."""

    captions: States
    images: States
    cap_img: np.ndarray          # [Nc] int64 row in images
    bows: list[np.ndarray]       # per caption, head columns
    img_ids: list[str]
    cap_ids: list[str]

    def bow_matrix(self, rows, v: int) -> torch.Tensor:
        from ..vocab import indicator, pad_ids
        return indicator(pad_ids([self.bows[i] for i in rows], v), v)


def open_split(images: Path, captions: Path, qrels: Path | None, prefer_states: bool = True) -> Split:
    """Open an image and a caption dense file of one split and pair them (InputError on mismatch)."""
    from ..formats._h5 import read_strings
    from ..training import caption_image_ids

    with h5py.File(images, "r") as f:
        img_ids = read_strings(f["ids"])
    with h5py.File(captions, "r") as f:
        cap_ids = read_strings(f["ids"])
    of = caption_image_ids(captions, cap_ids, qrels)
    row = {i: k for k, i in enumerate(img_ids)}
    bad = [c for c, i in zip(cap_ids, of) if i not in row]
    if bad:
        raise InputError(f"{captions}: {len(bad)} caption(s) name images not in {images}, e.g. {bad[0]!r}; "
                         "use files of the same split")
    return Split(States(captions, "text", prefer_states), States(images, "image", prefer_states),
                 np.array([row[i] for i in of], dtype=np.int64), [], img_ids, cap_ids)


def batches(split: Split, batch_size: int, gen: torch.Generator, block: int = 256,
            buffer_rows: int = 4096) -> Iterator[tuple]:
    """One epoch of batches (rows, x_cap, mask, x_img, cap_img): caption rows [B] int64, their
    states [B, L, h] and masks [B, L] (or None), the batch's distinct images' states [U, P, h]
    (numpy, stored dtype) and each caption's image column [B] int64.

    Captions are read in contiguous blocks of `block` rows; the blocks are shuffled and loaded
    `buffer_rows` captions (plus their images) at a time, so memory is O(buffer) and every read is
    a slice. Inside a buffer each caption gets a random rank among the buffer's captions of its
    image and batches follow rank order, so a batch rarely holds an image twice."""
    n = split.captions.n
    starts = np.arange(0, n, block)
    order = starts[torch.randperm(len(starts), generator=gen).numpy()]
    per = max(1, buffer_rows // block)
    for s in range(0, len(order), per):
        rows = np.sort(np.concatenate([np.arange(b, min(n, b + block)) for b in order[s:s + per]]))
        xs, ms = split.captions.read_rows(rows)
        img_rows, img_pos = np.unique(split.cap_img[rows], return_inverse=True)
        xi, _ = split.images.read_rows(img_rows)
        noise = torch.rand(len(rows), generator=gen).numpy()
        o = np.lexsort((noise, img_pos))                  # group by image, random inside
        grp_start = np.r_[0, np.flatnonzero(np.diff(img_pos[o]) != 0) + 1]
        rank = np.empty(len(rows), dtype=np.int64)
        rank[o] = np.arange(len(rows)) - np.repeat(grp_start, np.diff(np.r_[grp_start, len(rows)]))
        seq = np.lexsort((torch.rand(len(rows), generator=gen).numpy(), rank))   # positions in the buffer
        for b in range(0, len(seq), batch_size):
            sel = seq[b:b + batch_size]
            u, local = np.unique(img_pos[sel], return_inverse=True)
            yield (rows[sel], xs[sel], ms[sel] if ms is not None else None, xi[u],
                   local.astype(np.int64))


def load_batch(split: Split, batch: tuple, v: int):
    """A `batches` item -> torch (x_cap [B, L, h] f32 trimmed to the batch's longest caption,
    mask [B, L] or None, x_img [U, P, h] f32, cap_img [B], bow [B, |V|])."""
    rows, xs, ms, xi, local = batch
    mc = None
    if ms is not None:
        longest = max(1, int(ms.sum(1).max()))
        xs, ms = xs[:, :longest], ms[:, :longest]
        mc = torch.from_numpy(ms.astype(np.float32))
    return (torch.from_numpy(np.asarray(xs, dtype=np.float32)), mc,
            torch.from_numpy(np.asarray(xi, dtype=np.float32)), torch.from_numpy(local), split.bow_matrix(rows, v))


# ---------------------------------------------------------------------------------------------
# inference


@torch.no_grad()
def encode_rows(head: VDRHead, x: torch.Tensor, mask, side: str, k: int, mode: str = "vdr",
                bow: torch.Tensor | None = None) -> torch.Tensor:
    """Sparse representations of one batch, dense [B, |V|] float32 (zeros off the gate):
    side image: top_k(l2n(V_p)); side text, mode vdr: l2n(V_q ⊙ (top_k(V_q) ∪ bow)); mode bow: bow."""
    if side == "text" and mode == "bow":
        return bow.clone()
    v = head(x, mask, side)
    if side == "image":
        p = l2n(v)
        return p * topk_mask(p, k)
    return l2n(v * gate(v, k, bow))


@torch.no_grad()
def encode_split(head: VDRHead, states: States, side: str, k: int, mode: str = "vdr",
                 bows: list[np.ndarray] | None = None, batch: int = 256,
                 on_batch: Callable[[int], None] | None = None) -> sp.csr_matrix:
    """All rows of `states` through encode_rows, streamed in `batch` rows -> CSR [N, |V|] float32."""
    from ..vocab import indicator, pad_ids
    v = int(head.config["vocab_size"])
    parts = []
    for s in range(0, states.n, batch):
        e = min(states.n, s + batch)
        bw = indicator(pad_ids(bows[s:e], v), v) if bows is not None else None
        if side == "text" and mode == "bow":
            out = bw
        else:
            x, m = states.read(s, e)
            out = encode_rows(head, torch.from_numpy(np.asarray(x, dtype=np.float32)),
                              torch.from_numpy(m.astype(np.float32)) if m is not None else None,
                              side, k, mode, bw)
        parts.append(sp.csr_matrix(out.numpy()))
        if on_batch is not None:
            on_batch(e - s)
        kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)


def evaluate(head: VDRHead, split: Split, k_query: int, k_doc: int) -> dict:
    """Caption->image metrics (brute force) of parametric (vdr) and bag-of-words queries."""
    from ..training import sparse_retrieval_metrics
    head.eval()
    d = encode_split(head, split.images, "image", k_doc)
    q = encode_split(head, split.captions, "text", k_query, "vdr", split.bows)
    out = sparse_retrieval_metrics(q, d, split.cap_img)
    b = encode_split(head, split.captions, "text", k_query, "bow", split.bows)
    out["bow"] = sparse_retrieval_metrics(b, d, split.cap_img)
    return out


# ---------------------------------------------------------------------------------------------
# training


@dataclass
class VDRConfig:
    """Hyper-parameters of `train-head --method vdr` (see its --help)."""

    epochs: int = 1
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.1       # linear LR warm-up over this fraction of the steps, then cosine to 0
    train_k: int = 512             # query-side top-k during training (App. A: 512)
    tau: float = 0.07              # initial temperature (App. A), learnable
    cts_mask: bool = True
    np_entry: bool = True
    seed: int = 0
    buffer_rows: int = 4096


def _lr_lambda(cfg: VDRConfig, total: int):
    warm = max(1, int(round(cfg.warmup_frac * total)))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))
    return f


def train_vdr(head: VDRHead, train: Split, val: Split | None, cfg: VDRConfig,
              ckpt_dir: Path | None = None, fingerprint: dict | None = None,
              on_step: Callable[[dict], None] | None = None,
              on_epoch: Callable[[dict], None] | None = None) -> tuple[int, list[dict], dict]:
    """Train `head` in place; returns (chosen epoch 1-based, history, chosen state dict). The chosen
    epoch is the best validation R@1 of parametric queries (the last epoch without validation).
    ckpt_dir/last.pt after each epoch lets a killed run resume (same settings and inputs)."""
    v = int(head.config["vocab_size"])
    n = train.captions.n
    spe = math.ceil(n / cfg.batch_size)
    total = spe * cfg.epochs
    decay = [p for n_, p in head.named_parameters() if n_ != "logit_scale"]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": [head.logit_scale], "weight_decay": 0.0}], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg, total))
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best_state, best, start = None, -math.inf, 0
    fp = {"config": asdict(cfg), **(fingerprint or {})}
    ckpt = Path(ckpt_dir) / "last.pt" if ckpt_dir is not None else None
    st = load_checkpoint(ckpt, fp, head, opt, sched, gen)
    if st is not None:
        history, best_state, best, start = st["history"], st["best_state"], st["best"], st["epoch"]
    step = start * spe
    for epoch in range(start, cfg.epochs):
        head.train()
        t0 = time.time()
        sums = {"loss": 0.0, "param": 0.0, "nonparam": 0.0, "unused": 0.0}
        nb = 0
        for item in batches(train, cfg.batch_size, gen, buffer_rows=cfg.buffer_rows):
            xc, mc, xi, cap_img, bow = load_batch(train, item, v)
            v_q = head(xc, mc, "text")
            v_p = head(xi, None, "image")
            loss, parts = vdr_loss(v_q, v_p, bow, cap_img, cfg.train_k, head.scale, cfg.cts_mask,
                                   cfg.np_entry, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            nb += 1
            for key, x in (("loss", float(loss.detach())), *parts.items()):
                sums[key] += x
            if on_step is not None:
                on_step({"epoch": epoch + 1, "step": step, "loss": float(loss.detach()),
                         "tau": float(1.0 / head.scale.detach()), **parts})
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        rec = {"epoch": epoch + 1, "step": step, "seconds": time.time() - t0,
               "tau": float(1.0 / head.scale.detach()), **{key: x / max(nb, 1) for key, x in sums.items()}}
        if val is not None:
            rec["val"] = evaluate(head, val, int(head.config["k_query"]), int(head.config["k_doc"]))
        history.append(rec)
        score = rec["val"]["R@1"] if val is not None else float(epoch)
        if score > best:                    # ties keep the earlier epoch
            best = score
            best_state = {key: t.detach().clone() for key, t in head.state_dict().items()}
        if on_epoch is not None:
            on_epoch(rec)
        if ckpt is not None:
            st = {"fingerprint": fp, "epoch": epoch + 1, "model": head.state_dict(), "optimizer": opt.state_dict(),
                  "scheduler": sched.state_dict(), "rng": gen.get_state(), "history": history,
                  "best_state": best_state, "best": best}
            with atomic_path(ckpt) as tmp:
                torch.save(st, tmp)
    chosen = max(range(len(history)), key=lambda i: (history[i]["val"]["R@1"] if "val" in history[i] else i, -i))
    return chosen + 1, history, copy.deepcopy(best_state) if best_state else head.state_dict()


# ---------------------------------------------------------------------------------------------
# commands (called by mmsparse/commands/train_head.py and sparsify.py)

# Shared train-head options whose D2S defaults do not suit VDR; used when not given explicitly.
# |V| sets the cost of both towers (B·L·h·|V| per step): terms in >= 5 training captions (2,812 of
# Flickr8k's 6,640 caption terms) keep one epoch to a few minutes on 2 cores.
VDR_DEFAULTS = {"epochs": 1, "batch_size": 256, "vocab_min_df": 5}


def _explicit(name: str) -> bool:
    """Whether the running click command got option `name` from the command line (or env)."""
    try:
        try:
            from typer._click.globals import get_current_context
        except ImportError:
            from click import get_current_context
        ctx = get_current_context(silent=True)
        if ctx is None:
            return True
        src = ctx.get_parameter_source(name)
        return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")
    except Exception:  # noqa: BLE001 — no click context: treat the value as given
        return True


def train_cli(a: dict) -> None:
    """`train-head --method vdr`: a = the command's parameters (after --backbone resolution)."""
    import shutil

    from rich.console import Console

    from ..checks import check_compatible
    from ..formats.dense import read_dense_attrs
    from ..progress import epoch_progress
    from ..vocab import load_vocab_model, to_columns, vocab_from_dense_attrs

    err = Console(stderr=True)
    for key, dflt in VDR_DEFAULTS.items():
        if not _explicit(key):
            a[key] = dflt
    if a.get("device", "cpu") != "cpu":
        raise InputError("--method vdr trains on the CPU only; drop --device")
    out = Path(a["out"])
    t_load = time.time()
    ai, ac = read_dense_attrs(a["train_images"]), read_dense_attrs(a["train_captions"])
    fix = "use dense files encoded with the same backbone and model"
    check_compatible(ai, ac, ("backbone", "model", "dataset", "split"), str(a["train_images"]),
                     str(a["train_captions"]), fix)
    train = open_split(a["train_images"], a["train_captions"], a.get("qrels"))
    val = None
    if a.get("val_images") is not None:
        check_compatible(ai, read_dense_attrs(a["val_images"]), ("backbone", "model"), str(a["train_images"]),
                         str(a["val_images"]), fix)
        val = open_split(a["val_images"], a["val_captions"], a.get("val_qrels"))
        for side, t, w in (("text", train.captions, val.captions), ("image", train.images, val.images)):
            if (t.name, t.hidden) != (w.name, w.hidden):
                raise InputError(f"{w.path}: {w.name} h={w.hidden} but the training {side} file has {t.name} "
                                 f"h={t.hidden}; encode both splits with the same encode-dense flags")
    voc = load_vocab_model(a["vocab_model"]) if a.get("vocab_model") else vocab_from_dense_attrs(ac)
    special = set(int(i) for i in (getattr(voc.tokenizer, "all_special_ids", None) or []))
    raw = caption_token_sets(a["train_captions"], voc.tokenizer, special)
    if a.get("vocab_min_df", 0) > 0:
        full = np.asarray(voc.token_ids, dtype=np.int64)
        cols = to_columns(raw, full)
        counts = np.bincount(np.concatenate(cols) if cols else np.zeros(0, np.int64), minlength=len(full))
        voc = voc.restrict(counts >= a["vocab_min_df"])
        if not voc.terms:
            raise InputError(f"--vocab-min-df {a['vocab_min_df']}: no term occurs that often in the training captions")
    cfg = VDRConfig(epochs=a["epochs"], batch_size=a["batch_size"], lr=a["lr"], weight_decay=a["weight_decay"],
                    train_k=a["vdr_train_k"], tau=a["vdr_temperature"], cts_mask=a["vdr_cts_mask"],
                    np_entry=a["vdr_np_entry"], seed=a["seed"], buffer_rows=a["vdr_buffer_rows"])
    training = {"backbone": ac.get("backbone"), "model": ac.get("model"), "dataset": ac.get("dataset"),
                "train_images": str(Path(a["train_images"]).resolve()),
                "train_captions": str(Path(a["train_captions"]).resolve()),
                "val_images": str(Path(a["val_images"]).resolve()) if val else None,
                "val_captions": str(Path(a["val_captions"]).resolve()) if val else None,
                "vocab_min_df": a.get("vocab_min_df", 0)}
    torch.manual_seed(cfg.seed)
    head = VDRHead.from_vocab(voc, int(ac["dim"]), train.captions.hidden, train.images.hidden, train.captions.name,
                              train.images.name, a["vdr_query_k"], a["vdr_doc_k"], cfg.tau, training)
    tids = head.token_ids.numpy()
    train.bows = to_columns(raw, tids)
    if val is not None:
        val.bows = to_columns(caption_token_sets(a["val_captions"], voc.tokenizer, special), tids)
    err.print(f"train-head vdr: {train.images.n} images ({train.images.name}, h={train.images.hidden}), "
              f"{train.captions.n} captions ({train.captions.name}, h={train.captions.hidden}), |V|={len(voc.terms)}, "
              f"train k={cfg.train_k} (loaded in {time.time() - t_load:.0f}s)")

    ckpt_dir = Path(str(out).rstrip("/") + ".ckpt")
    if a.get("restart") and ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {"inputs": training, "vocab_size": len(voc.terms), "n_captions": train.captions.n,
                   "k_query": a["vdr_query_k"], "k_doc": a["vdr_doc_k"]}
    spe = -(-train.captions.n // cfg.batch_size)
    t0 = time.time()
    with epoch_progress(err, spe * cfg.epochs, cfg.epochs) as (prog, update):

        def on_step(r):
            update(r, f"loss {r['loss']:.3f} (param {r['param']:.3f}, bow {r['nonparam']:.3f}) τ {r['tau']:.3f}")

        def on_epoch(r):
            v = r.get("val")
            line = (f"epoch {r['epoch']}: loss {r['loss']:.3f} τ {r['tau']:.3f}"
                    + (f" | val VDR R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f}; VDR^α R@1 "
                       f"{v['bow']['R@1']:.4f} R@10 {v['bow']['R@10']:.4f} FLOPs {v['bow']['FLOPs']:.1f}" if v else "")
                    + f" ({r['seconds']:.0f}s)")
            prog.console.print(line)

        best, history, state = train_vdr(head, train, val, cfg, ckpt_dir, fingerprint, on_step, on_epoch)
    head.load_state_dict(state)
    chosen = history[best - 1]
    head.config["training"].update(config=asdict(cfg), best_epoch=best, val=chosen.get("val"),
                                   seconds=round(time.time() - t0, 1))
    head.save_pretrained(out)
    if not a.get("keep_checkpoint"):
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    err.print(f"saved epoch {best} to {out} in {time.time() - t0:.0f}s")


def sparsify_cli(head_dir: Path, dense: Path, out: Path, query_mode: str | None, k_query: int | None,
                 k_doc: int | None, batch_size: int, threads: int, force: bool) -> None:
    """`sparsify` with a VDR head: images -> top-k_doc documents; captions -> `vdr` (parametric,
    top-k_query + bag of words) or `bow` (binary bag of words, VDR^α) queries."""
    from rich.console import Console
    from rich.progress import Progress

    from ..checks import check_compatible
    from ..formats._h5 import read_strings
    from ..formats.dense import read_dense_attrs
    from ..formats.sparse import write_sparse
    from ..heads.base import SparseHead
    from ..vocab import to_columns

    torch.set_num_threads(threads)
    head = SparseHead.from_pretrained(head_dir)
    if head.method != "vdr":
        raise InputError(f"{head_dir}: a {head.method} head, not vdr")
    attrs = read_dense_attrs(dense)
    side = "image" if attrs["modality"] == "image" else "text"
    if side == "image":
        if query_mode not in (None, "doc"):
            raise InputError(f"{dense}: --query-mode {query_mode} applies to captions; this is an image file")
        mode = "doc"
    else:
        mode = {"expand": "vdr", None: "vdr"}.get(query_mode, query_mode)
        if mode not in ("vdr", "bow"):
            raise InputError(f"--query-mode {query_mode!r}: a VDR head takes vdr (parametric) or bow (VDR^α)")
    check_compatible(attrs, head.config.get("training", {}), ("backbone", "model"), str(dense),
                     f"head {head_dir} (its training vectors)", "sparsify vectors of the backbone the head "
                     "was trained on", force)
    want = head.config[f"{side}_input"]
    states = States(dense, side, prefer_states=want != "vectors")
    if states.name != want:
        raise InputError(f"{dense}: no {want} dataset, which head {head_dir} was trained on; re-run encode-dense "
                         f"with --{want.replace('_', '-')}")
    if states.hidden != int(head.config[f"{side}_hidden"]):
        raise InputError(f"{dense}: {want} h={states.hidden} but head {head_dir} expects "
                         f"h={head.config[f'{side}_hidden']}; use the head trained on this backbone")
    k = int(k_doc if side == "image" and k_doc is not None else k_query if side == "text" and k_query is not None
            else head.config["k_doc" if side == "image" else "k_query"])
    v = int(head.config["vocab_size"])
    bows = None
    if side == "text":
        tok = None
        if (Path(head_dir) / "tokenizer" / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(str(Path(head_dir) / "tokenizer"))
        raw = caption_token_sets(dense, tok, set(head.config.get("special_ids", [])))
        bows = to_columns(raw, head.token_ids.numpy())
    with Progress(console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task(f"sparsify vdr {mode}", total=states.n)
        m = encode_split(head, states, side, k, mode if side == "text" else "vdr", bows, batch_size,
                         on_batch=lambda n: prog.advance(task, n))
    with h5py.File(dense, "r") as f:
        ids = read_strings(f["ids"])
        texts = read_strings(f["texts"]) if "texts" in f else None
    states.close()
    out_attrs = {"modality": attrs["modality"], "head": str(Path(head_dir).resolve()), "method": "vdr",
                 "query_mode": mode, "vocab_size": v, "top_k": k if mode != "bow" else 0}
    for key in ("backbone", "model", "dataset", "split", "normalized"):
        if key in attrs:
            out_attrs[key] = attrs[key]
    out_attrs["dense"] = str(Path(dense).resolve())
    write_sparse(out, ids, m, head.vocab, out_attrs, texts)
    nnz = np.diff(m.indptr)
    kk = f", k={k}" if mode != "bow" else ""
    Console(stderr=True).print(f"sparsify: {len(ids)} {attrs['modality']} rows -> {out} (vdr {mode}{kk}; "
                               f"{nnz.mean() if len(nnz) else 0:.1f} terms/row)")
