"""Joint sparse-dense self-distillation as a Method (Song et al., CIKM 2025, §2.3).

Trains, on stored pre-projection states only (no image passes through the backbone), the D2S
sparse head together with copies of the backbone's final projections (head.py), on eq. 3
(loss.py). Expansion control masks the caption sparse vectors as in D2S. An epoch (default)
visits every image once with one of its captions drawn at random, so a batch holds distinct pairs
as eq. 2 assumes; --all-captions walks every caption instead. Sparsify re-projects the stored
stored states through the tuned layers, writes those dense vectors, and sparsifies them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ...errors import InputError
from ...formats.sharded import open_read  # a file or a sharded directory
from ...metrics.exhaustive import dense_retrieval_metrics
from ...vocab import document_frequency, indicator, load_vocab, restrict_to_frequent
from ..d2s.expansion import ExpansionControl
from ..d2s.head import top_k_rows
from ..d2s.loss import drop_coordinates
from ...trainer import warmup_steps
from ..d2s.method import D2S, evaluate_head, image_words
from ..pairs import PairData, check_inputs, load_pairs, training_record
from ..towers import FLAG, backbone_final_layers, read_final, tuned_dense
from .config import JointConfig
from .head import JointHead
from .loss import joint_loss


@dataclass
class StatePairs:
    """A split's pairs (PairData: vectors = the backbone's own projected vectors) plus
    pre_img [Ni, h_img] / pre_cap [Nc, h_txt] float32 pre-projection states and the backbone's
    projection weights proj {"image_proj_weight" [d, h_img], "text_proj_weight" [d, h_txt], ...}.
    final=True: pre_img [Ni, C, H, W] / pre_cap [Nc, L, h_txt] (float16 or float32) are instead the
    final layers' inputs, with mask_cap [Nc, L] uint8 (then proj may be empty)."""

    pairs: PairData
    pre_img: torch.Tensor
    pre_cap: torch.Tensor
    proj: dict
    mask_cap: torch.Tensor | None = None
    final: bool = False

    def to(self, device) -> "StatePairs":
        self.pairs.to(device)
        self.pre_img, self.pre_cap = self.pre_img.to(device), self.pre_cap.to(device)
        if self.mask_cap is not None:
            self.mask_cap = self.mask_cap.to(device)
        return self

    def subset(self, img_rows) -> "StatePairs":
        """The images at rows `img_rows` with their captions and states (PairData.subset)."""
        pairs, caps = self.pairs.subset(img_rows)
        rows = torch.as_tensor(img_rows, dtype=torch.int64).to(self.pre_img.device)
        caps = caps.to(self.pre_cap.device)
        return StatePairs(pairs, self.pre_img[rows], self.pre_cap[caps], self.proj,
                          None if self.mask_cap is None else self.mask_cap[caps], self.final)

    def rows(self, idx, modality: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(states, mask or None) of rows `idx` (an index tensor or a slice) of one modality."""
        if modality == "image":
            return self.pre_img[idx], None
        return self.pre_cap[idx], None if self.mask_cap is None else self.mask_cap[idx]


def load_final_pairs(images: str | Path, captions: str | Path, qrels: str | Path | None = None) -> StatePairs:
    """Pairs + final-layer inputs of one split (StatePairs with final=True). InputError as read_final,
    or when the row counts differ from the ids."""
    pairs = load_pairs(images, captions, qrels)
    x_i, _, _ = read_final(images, "--method joint")
    x_c, m_c, _ = read_final(captions, "--method joint")
    for x, n, path in ((x_i, len(pairs.img_ids), images), (x_c, len(pairs.cap_ids), captions)):
        if x.shape[0] != n:
            raise InputError(f"{path}: final_input has {x.shape[0]} rows for {n} ids; re-encode the file")
    return StatePairs(pairs, torch.from_numpy(x_i), torch.from_numpy(x_c), {}, torch.from_numpy(m_c), True)


def check_reproduces(head, data: StatePairs, path: str | Path, tol: float = 5e-3) -> None:
    """InputError unless the head's dense vectors of the first rows equal the stored `vectors`
    (within `tol`: float16 states): the weights are the ones that made the file."""
    head.eval()
    for side, vec in (("image", data.pairs.z_img), ("text", data.pairs.z_cap)):
        k = min(64, vec.shape[0])
        if not k:
            continue
        x, m = data.rows(slice(0, k), side)
        with torch.no_grad():
            h = head.dense(x, side, m) if data.final else head.project(x, side)
        err = float((h - vec[:k]).abs().max())
        if err > tol:
            raise InputError(f"{path}: the {side} final layer and projection reproduce `vectors` only within {err:.3g}; "
                             f"the model is not the one that encoded the file: re-encode with {FLAG}")


def read_states(path: str | Path) -> tuple[np.ndarray, dict]:
    """(pre_projection [N, h] float32, {name: array} of the file's *_proj_weight / *_proj_bias).
    Raises InputError when the file has no pre-projection states."""
    with open_read(path) as f:
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


def dense_rows(head, data: StatePairs, idx, modality: str) -> torch.Tensor:
    """Tuned dense vectors [len(idx), d] of rows `idx`: through the final layer when `data` holds
    final-layer inputs, else the projection of pre-projection states."""
    x, m = data.rows(idx, modality)
    return head.dense(x, modality, m) if data.final else head.project(x, modality)


def _by_batch(fn, data: StatePairs, modality: str, batch: int = 512) -> list[torch.Tensor]:
    """fn(rows) for consecutive slices of `batch` rows of one modality's states."""
    n = (data.pre_img if modality == "image" else data.pre_cap).shape[0]
    return [fn(slice(s, s + batch)) for s in range(0, n, batch)]


@torch.no_grad()
def dense_all(head, data: StatePairs, modality: str) -> torch.Tensor:
    """Tuned dense vectors [N, d] of every row of one modality."""
    parts = _by_batch(lambda rows: dense_rows(head, data, rows, modality), data, modality)
    return torch.cat(parts) if parts else torch.zeros(0, head.dim)


@torch.no_grad()
def pooled(head, data: StatePairs) -> StatePairs:
    """`data` with its final-layer inputs replaced by the (frozen) final layers' outputs: the
    pre-projection states, computed once (training with --freeze-final-layer)."""
    def pool_rows(rows, modality):
        x, mask = data.rows(rows, modality)
        return head.pool(x, modality, mask)

    p = {m: torch.cat(_by_batch(lambda rows, m=m: pool_rows(rows, m), data, m)) for m in ("image", "text")}
    return StatePairs(data.pairs, p["image"], p["text"], data.proj)


@torch.no_grad()
def evaluate_joint(head, data: StatePairs, query_mode: str = "expand") -> dict:
    """Sparse caption->image figures of the tuned vectors (evaluate_head) with the dense figures
    of the tuned projections under "dense" (brute force)."""
    head.eval()
    hi, hc = dense_all(head, data, "image"), dense_all(head, data, "text")
    sparse = evaluate_head(head, replace(data.pairs, z_img=hi, z_cap=hc), query_mode)
    return {**sparse, "dense": dense_retrieval_metrics(hc.cpu().numpy(), hi.cpu().numpy(),
                                                       data.pairs.cap_img.cpu().numpy())}


class Joint(D2S):
    """The D2S head and the backbone's two projections, tuned together on eq. 3."""

    name = "joint"
    config_class = JointConfig
    head_class = JointHead

    def setup(self, inputs, progress=None):
        cfg = self.cfg
        if cfg.center != "none":
            raise InputError("--center: joint heads train the projections themselves; use --center none")
        final = cfg.dense_side == "final-layer"
        flag = FLAG if final else "--pre-projection"
        check_inputs(inputs, f"use files encoded with the same backbone and model (encode-dense {flag})")
        load = load_final_pairs if final else load_state_pairs
        train = load(inputs.train_images, inputs.train_captions, inputs.qrels)
        val = load(inputs.val_images, inputs.val_captions, inputs.val_qrels) if inputs.val_images else None
        if val is None and self.budget is not None:   # the budget needs figures of images it does not train on
            train, val = self.holdout(train, progress)
        voc = load_vocab(cfg.vocab_model, train.pairs.attrs_cap)
        train.pairs.tokenize(voc.tokenizer)
        voc = restrict_to_frequent(voc, train.pairs.raw_ids, cfg.vocab_min_df)
        self.training = {**training_record(inputs, train.pairs.attrs_cap, vocab_min_df=cfg.vocab_min_df),
                         **({"holdout": self._holdout} if getattr(self, "_holdout", None) else {})}
        if final:   # the layers' weights from the model the files name (checked by fingerprint)
            text_l, image_l, train.proj = backbone_final_layers(train.pairs.attrs_cap, inputs.train_captions)
        torch.manual_seed(cfg.seed)
        head = JointHead.from_backbone(voc, train.proj, self.training, init_bias=cfg.init_bias, tau_init=cfg.tau_init,
                                       doc_top_k=cfg.doc_top_k, query_top_k=cfg.query_top_k,
                                       doc_max_share=cfg.doc_max_share)
        if final:
            a = train.pairs.attrs_cap
            head.set_final_layers(text_l, image_l, {k: a[k] for k in ("model", "model_fingerprint") if k in a},
                                  cfg.tune_final_layer)
            check_reproduces(head, train, inputs.train_captions)
            if not cfg.tune_final_layer:   # frozen: the pooled states once, then as --dense-side pre-projection
                train = pooled(head, train)
                val = pooled(head, val) if val is not None else None
        cols = head.token_ids.numpy()
        train.pairs.set_columns(cols)
        if val is not None:
            val.pairs.tokenize(voc.tokenizer)
            val.pairs.set_columns(cols)
        self.fingerprint = {"inputs": dict(self.training), "vocab_size": len(voc.terms),
                            "n_captions": len(train.pairs.cap_ids), "dense_side": cfg.dense_side}
        self.pec = ExpansionControl(cfg.expansion, document_frequency(train.pairs.token_ids, len(voc.terms)),
                                    cfg.epochs, cfg.mask_caption_terms, cfg.pec_end)
        if cfg.doc_words_weight > 0:   # D2S's image-side word loss (its targets from the training captions)
            self.img_words, self.word_weight = image_words(train.pairs, head.vocab, cfg.doc_words_target,
                                                           cfg.doc_words_max_df)
        self._order(train)
        self.l1_warm = warmup_steps(cfg.l1_warmup, self.steps_per_epoch(train) * cfg.epochs)
        if val is not None:   # the backbone's own figures, kept for the validation curve (curve.py)
            d0 = evaluate_joint(head, val)["dense"]
            self.training["val_before"] = {"dense": d0}
            if progress is not None:
                progress.log(f"before training: val dense R@1 {d0['R@1']:.4f} R@10 {d0['R@10']:.4f}")
        return head, train, val

    def _order(self, train: StatePairs) -> None:
        """Captions grouped by image, for drawing one caption per image and epoch."""
        cap_img = train.pairs.cap_img
        self.by_image = torch.argsort(cap_img, stable=True)
        self.counts = torch.bincount(cap_img, minlength=train.pre_img.shape[0])
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        self.images = torch.nonzero(self.counts > 0).squeeze(1)

    def param_groups(self, head) -> list[dict]:
        """W1 (lr) and the vocabulary LayerNorm + W2 (vocab_lr), with weight decay; τ (lr, no decay);
        the projections (proj_lr, no decay; frozen with --freeze-projection); the final layers
        (final_lr, no decay; frozen with --freeze-final-layer)."""
        cfg = self.cfg
        proj = [*head.image_proj.parameters(), *head.text_proj.parameters()]
        for p in proj:
            p.requires_grad_(cfg.tune_projection)
        final = [*head.text_final.parameters(), *head.image_final.parameters()] if head.has_final else []
        for p in final:
            p.requires_grad_(cfg.tune_final_layer)
        vocab = [*head.norm.parameters(), *head.w2.parameters()]
        return [{"params": list(head.w1.parameters()), "lr": cfg.lr, "weight_decay": cfg.weight_decay},
                {"params": vocab, "lr": cfg.vocab_lr, "weight_decay": cfg.weight_decay},
                {"params": [head.log_tau], "lr": cfg.lr, "weight_decay": 0.0},
                {"params": [p for p in proj if p.requires_grad], "lr": cfg.proj_lr, "weight_decay": 0.0},
                {"params": [p for p in final if p.requires_grad], "lr": cfg.final_lr, "weight_decay": 0.0}]

    def steps_per_epoch(self, train: StatePairs) -> int:
        n = len(self.images) if self.cfg.caption_per_image else train.pre_cap.shape[0]
        return math.ceil(n / self.cfg.batch_size)

    def batches(self, train: StatePairs, generator, epoch: int):
        if self.cfg.caption_per_image:
            n = len(self.images)
            imgs = self.images[torch.randperm(n, generator=generator)]
            pick = (torch.rand(n, generator=generator) * self.counts[imgs]).long()
            perm = self.by_image[self.starts[imgs] + pick]
        else:
            perm = torch.randperm(train.pre_cap.shape[0], generator=generator)
        for b in range(self.steps_per_epoch(train)):
            yield perm[b * self.cfg.batch_size:(b + 1) * self.cfg.batch_size], train

    def loss(self, head, batch, step, generator, device):
        """Eq. 3 on one batch, with D2S's options through D2S's code: the top-k gates of each side
        (in training, as D2S), the expansion mask, --image-dropout on the tuned image vectors the
        sparse head sees (s_dense sees them whole), --l1-caption, --sparsity-loss, the caption-term
        queries (--caption-terms-weight, joint_loss), the image-side word loss and the budget's
        multiplier of η (--target-flops)."""
        idx, train = batch
        cfg = self.cfg
        v = int(head.config["vocab_size"])
        idx = idx.to(train.pre_cap.device)
        uimg, pos = torch.unique(train.pairs.cap_img[idx], return_inverse=True)
        h_cap = dense_rows(head, train, idx, "text")
        h_img = dense_rows(head, train, uimg, "image")
        # one sparse head for both modalities (eq. 1); gate=False: no posting floor in training, the gates below
        z_all_cap = head(h_cap, side="text", gate=False)
        z_cap = top_k_rows(z_all_cap, head.top_k("text"))
        z_img = top_k_rows(head(drop_coordinates(h_img, cfg.image_dropout, generator), side="image", gate=False),
                           head.top_k("image"))
        own = indicator(train.pairs.tok[idx], v).to(z_cap.device)
        m = self.pec.mask(own, generator)
        raw = z_cap
        if m is not None:
            z_cap = z_cap * m.to(z_cap.device)
        ramp = self.eta_at(step, 1.0)   # the warm-up ramp times the budget's multiplier (D2S.eta_at)
        eta_i = cfg.eta if cfg.eta_image is None else cfg.eta_image
        loss, parts = joint_loss(h_cap, h_img, z_cap, z_img, pos, head.tau, cfg, cfg.eta * ramp, eta_i * ramp,
                                 z_cap_l1=raw if cfg.l1_caption == "raw" else None,
                                 z_terms=z_all_cap * own if cfg.caption_terms_weight > 0 else None)
        if cfg.doc_words_weight > 0:   # rank the image's own caption words first (doc_Exact@k), as D2S
            dw = self.doc_words_term(z_img, uimg, torch.arange(v, device=z_img.device), v)
            loss = loss + cfg.doc_words_weight * dw
            parts["doc_words"] = float(dw.detach())
        with torch.no_grad():
            parts["flops"] = float(((z_cap > 0).float().mean(0) * (z_img > 0).float().mean(0)).sum())
        self.tau = float(head.tau.detach())
        return loss, parts

    def validate(self, head, val: StatePairs) -> dict:
        return {**evaluate_joint(head, val, self.query_mode_of_head()), "query_mode": self.query_mode_of_head()}

    def epoch_figures(self) -> dict:
        return {"p_c": self.pec.p_c, "tau": getattr(self, "tau", self.cfg.tau_init), **self.budget_figures()}

    def rows(self, data: StatePairs) -> int:
        return int(data.pairs.z_img.shape[0])

    def take(self, data: StatePairs, rows) -> StatePairs:
        return data.subset(rows)

    def probe_pairs(self, head, val: StatePairs):
        """The validation pairs with the tuned dense vectors the sparse head sees (budget.GateProbe)."""
        return replace(val.pairs, z_img=dense_all(head, val, "image"), z_cap=dense_all(head, val, "text"))

    def doc_vectors(self, head, train: StatePairs) -> torch.Tensor:
        """The tuned dense vectors of the training images (the posting floor is cut on them)."""
        return dense_all(head, train.to(next(head.parameters()).device), "image")

    def epoch_line(self, r: dict) -> str:
        v = r.get("val") or {}
        scale = f" η×{r['eta_scale']:.3g}" if "eta_scale" in r else ""
        return (f"epoch {r['epoch']}: loss {r['loss']:.3f} (dense {r['dense']:.3f} sparse {r['sparse']:.3f} "
                f"inter {r['inter']:.3f}) τ {r['tau']:.4f} batch-FLOPs {r['flops']:.1f}{scale}"
                + (f" | val sparse R@1 {v['R@1']:.4f} FLOPs {v['FLOPs']:.1f} | dense R@1 {v['dense']['R@1']:.4f} "
                   f"R@10 {v['dense']['R@10']:.4f}" if v else "") + f" ({r['seconds']:.0f}s)")

    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Recompute DENSE's dense vectors through the tuned final layers and projections (from its
        final_input, or its pre_projection for a projections-only head), write them
        (options["dense_out"], default OUT without .h5 + '.dense.h5'), then sparsify them as D2S."""
        dense_out = options.get("dense_out") or Path(str(out).removesuffix(".h5") + ".dense.h5")
        tuned = tuned_dense(head, dense, dense_out, head_dir=head_dir)
        res = D2S.sparsify(head, head_dir, tuned, out, mode, {}, batch_size, progress)
        res.attrs["tuned_dense"] = str(Path(tuned).resolve())
        return res


def grid_table(head_dirs: list[str | Path]) -> str:
    """Markdown w1 x w2 table of validation R@1 (sparse / dense, x100) of joint head directories."""
    cells, w1s, w2s = {}, set(), set()
    for d in head_dirs:
        tr = json.loads((Path(d) / "config.json").read_text(encoding="utf-8"))["training"]
        w1, w2 = tr["config"]["w1"], tr["config"]["w2"]
        w1s.add(w1)
        w2s.add(w2)
        cells[(w1, w2)] = (tr["val"]["R@1"], tr["val"]["dense"]["R@1"], tr["val"]["FLOPs"])
    cols = sorted(w2s)
    lines = ["val R@1 x100, sparse / dense (sparse FLOPs)", "",
             "| w1 \\ w2 | " + " | ".join(f"{c:g}" for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in sorted(w1s):
        row = [f"{100 * cells[(r, c)][0]:.1f} / {100 * cells[(r, c)][1]:.1f} ({cells[(r, c)][2]:.1f})"
               if (r, c) in cells else "-" for c in cols]
        lines.append(f"| {r:g} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def se_table(items: list[str]) -> str:
    """Markdown table of `mmsparse eval` JSON files given as "label=path": R@1, R@5, R@10 x100 each
    with its standard error sqrt(p(1 - p) / n) over the n queries (R@k is 0 or 1 per query; captions
    of one image are treated as independent, so the error is a lower bound), and FLOPs."""
    lines = ["| run | R@1 | R@5 | R@10 | FLOPs |", "|---|---:|---:|---:|---:|"]
    for item in items:
        label, _, path = item.rpartition("=")
        r = json.loads(Path(path).read_text(encoding="utf-8"))
        n = int(r.get("queries") or 0)
        cells = [f"{100 * r[k]:.1f} ± {100 * math.sqrt(r[k] * (1 - r[k]) / n):.1f}" if n else f"{100 * r[k]:.1f}"
                 for k in ("R@1", "R@5", "R@10")]
        flops = f"{r['FLOPs']:.2f}" if r.get("FLOPs") is not None else "–"
        lines.append(f"| {label or path} | " + " | ".join(cells) + f" | {flops} |")
    return "\n".join(lines) + f"\n\nx100 ± standard error over {n} queries\n"
