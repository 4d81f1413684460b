"""D2S as a Method: Algorithm 1 with eq. 7 on frozen dense vectors, validation, sparsify.

Data: every caption paired with its own image (mmsparse.methods.pairs). One epoch = one pass
over the captions in a seeded random order, in batches of `batch_size` captions; a batch's
images are its captions' distinct images (loss.py). Per batch, one head projection of the
captions and images restricted to the vocabulary columns live in the batch (exact, head.py),
the expansion mask (expansion.py), then eq. 7.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch

from ...atomic import kill_point
from ...errors import InputError
from ...formats._h5 import read_strings
from ...formats.dense import iter_dense
from ...formats.sharded import open_read
from ...metrics.exhaustive import sparse_retrieval_metrics
from ...vocab import (caption_token_ids, document_frequency, indicator, indicator_cols, load_vocab, pad_ids,
                      restrict_to_frequent, to_columns)
from ..base import Method, Sparsified
from ..budget import FlopsBudget, GateProbe
from ..head import require_tokenizer, to_csr
from ...trainer import warmup_steps
from ..pairs import PairData, check_inputs, load_pairs, sample_rows, training_record
from .config import D2SConfig
from .expansion import ExpansionControl
from .head import D2SHead, top_k_rows
from .loss import (ScoreSide, d2s_loss, doc_words_loss, drop_coordinates, eta_at, gathered_doc_words_loss,
                   gathered_scores, gathered_sparsity, soft_ce, sparse_scores, teacher_logits)

HOLDOUT = 1000       # images held out of training for a budget without validation files
MIN_HOLDOUT = 20     # fewer than this to spare: the budget reads a sample of the training pairs instead


@torch.no_grad()
def encode_sparse(head, z: torch.Tensor | np.ndarray, batch: int = 1024, keep: torch.Tensor | None = None,
                  side: str = "image") -> sp.csr_matrix:
    """Head outputs of z [N, d] (of modality `side`) as CSR [N, |V|] float32. keep: optional [N, L]
    padded term columns (pad = |V|): zero every term not listed (caption-term queries, which skip
    the head's top-k gate)."""
    z = torch.as_tensor(z, dtype=torch.float32).to(next(head.parameters()).device)
    v = int(head.config["vocab_size"])
    parts = []
    for s in range(0, z.shape[0], batch):
        if keep is None:
            parts.append(head.encode_csr(z[s:s + batch], side=side))
        else:
            parts.append(to_csr(head(z[s:s + batch], side=side, gate=False)
                                * indicator(keep[s:s + batch], v).to(z.device)))
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)


def encode_queries(head, data: PairData, query_mode: str = "expand") -> sp.csr_matrix:
    """The captions of `data` as queries, CSR [N, |V|] float32: the head's whole output (expand)
    or only each caption's own terms (caption-terms; needs data.tok)."""
    return encode_sparse(head, data.z_cap, keep=data.tok if query_mode == "caption-terms" else None, side="text")


def evaluate_head(head, data: PairData, query_mode: str = "expand") -> dict:
    """Caption->image retrieval on a whole split, sparse dot products of every pair: R@1/5/10,
    MRR@10, FLOPs (eq. 1), q_nnz / d_nnz. query_mode caption-terms keeps only each caption's own
    terms (needs data.tok)."""
    head.eval()
    d = encode_sparse(head, data.z_img, side="image")
    return sparse_retrieval_metrics(encode_queries(head, data, query_mode), d, data.cap_img.cpu().numpy())


def format_epoch_line(r: dict, extra: str = "", cap_digits: int = 0) -> str:
    """The log line of one epoch record `r` (trainer history): loss, batch FLOPs, `extra`, and the
    validation figures when the epoch was validated."""
    v = r.get("val") or {}
    if "eta_scale" in r:   # --target-flops: the multiplier of the sparsity weights this epoch trained with
        extra += f" η×{r['eta_scale']:.3g}"
    if r.get("gates"):     # and the gates (query / image top-k; 0 = none)
        extra += " top-k " + "/".join(str(k) for k in r["gates"].values())
    return (f"epoch {r['epoch']}: loss {r['loss']:.3f} batch-FLOPs {r['flops']:.1f}{extra}"
            + (f" | val R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f} "
               f"terms/img {v['d_nnz']:.0f} terms/cap {v['q_nnz']:.{cap_digits}f}" if v else "")
            + f" ({r['seconds']:.0f}s)")


class D2S(Method):
    """Dense2Sparse with probabilistic expansion control (D2S paper §4)."""

    name = "d2s"
    config_class = D2SConfig
    head_class = D2SHead
    query_modes = ("expand", "caption-terms")

    # -- data and head --------------------------------------------------------------------
    def setup(self, inputs, progress=None):
        head, train, val = self.load_data(inputs, progress)
        cfg = self.cfg
        self.pec = ExpansionControl(cfg.expansion, document_frequency(train.token_ids, len(head.vocab)), cfg.epochs,
                                    cfg.mask_caption_terms, cfg.pec_end)
        if cfg.doc_words_weight > 0:
            self.img_words, self.word_weight = image_words(train, head.vocab, cfg.doc_words_target,
                                                           cfg.doc_words_max_df)
        return head, train, val

    def load_data(self, inputs, progress=None):
        """Read and check the pairs, choose the vocabulary, tokenize the captions onto its columns and
        build a fresh head (seeded): (head, train, val). Records training provenance, the checkpoint
        fingerprint and the sparsity warm-up in steps."""
        cfg = self.cfg
        train = load_pairs(inputs.train_images, inputs.train_captions, inputs.qrels)
        val = load_pairs(inputs.val_images, inputs.val_captions, inputs.val_qrels) if inputs.val_images else None
        check_inputs(inputs)
        if val is None and self.budget is not None:   # the budget needs figures of images it does not train on
            train, val = self.holdout(train, progress)
        voc = load_vocab(cfg.vocab_model, train.attrs_cap)
        train.tokenize(voc.tokenizer)
        voc = restrict_to_frequent(voc, train.raw_ids, cfg.vocab_min_df)
        self.training = {**training_record(inputs, train.attrs_cap, vocab_min_df=cfg.vocab_min_df),
                         **({"holdout": self._holdout} if getattr(self, "_holdout", None) else {})}
        torch.manual_seed(cfg.seed)
        head = self.new_head(train, voc)
        train.set_columns(head.token_ids.numpy())
        if val is not None:
            val.tokenize(voc.tokenizer)
            val.set_columns(head.token_ids.numpy())
        self.fingerprint = {"inputs": dict(self.training), "vocab_size": len(voc.terms), "n_captions": len(train.cap_ids)}
        self.l1_warm = warmup_steps(cfg.l1_warmup, self.steps_per_epoch(train) * cfg.epochs)
        if progress is not None:
            progress.log(f"train-head {self.name}: {len(train.img_ids)} images, {len(train.cap_ids)} captions, "
                         f"d={head.dim}, |V|={len(voc.terms)}, ω={head.config['omega']}")
        return head, train, val

    def new_head(self, train: PairData, voc) -> D2SHead:
        """A fresh head over `voc` for vectors of train's dimension (W2 <- word embeddings); with
        --center mean, the training mean of each modality is stored in it."""
        head = self.head_class.from_vocab(train.z_img.shape[1], voc, self.training, init_bias=self.cfg.init_bias,
                                          center=self.cfg.center, doc_top_k=self.cfg.doc_top_k,
                                          query_top_k=getattr(self.cfg, "query_top_k", 0),
                                          doc_max_share=getattr(self.cfg, "doc_max_share", 1.0))
        if self.cfg.center == "mean":
            with torch.no_grad():
                head.center_image.copy_(train.z_img.mean(0))
                head.center_text.copy_(train.z_cap.mean(0))
        return head

    def param_groups(self, head) -> list[dict]:
        """W1 at --lr; the vocabulary LayerNorm and W2 (word embeddings) at --vocab-lr (authors' code)."""
        vocab = [*head.norm.parameters(), *head.w2.parameters()]
        return [{"params": list(head.w1.parameters()), "lr": self.cfg.lr},
                {"params": vocab, "lr": self.cfg.vocab_lr}]

    def steps_per_epoch(self, train) -> int:
        return math.ceil(train.z_cap.shape[0] / self.cfg.batch_size)

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.pec.set_epoch(epoch)

    def batches(self, train: PairData, generator, epoch: int):
        """Captions in a seeded random order: (caption rows [B], their distinct images [U], train)."""
        perm = torch.randperm(train.z_cap.shape[0], generator=generator)
        spe = self.steps_per_epoch(train)
        for b in range(spe):
            if self.cfg.pec_schedule == "step":
                self.pec.set_progress((epoch + b / spe) / self.cfg.epochs)
            yield perm[b * self.cfg.batch_size:(b + 1) * self.cfg.batch_size], train

    def loss(self, head, batch, step, generator, device):
        """Eq. 7 on one batch: one head projection of [B + U, d], the expansion mask on the
        captions, L1 weight η ramped by the warm-up; on the entries the top-k gates keep when the
        head has both (_gated_loss), else restricted to the live columns (_dense_loss)."""
        idx, train = batch
        cfg = self.cfg
        idx = idx.to(train.z_cap.device)
        uimg = torch.unique(train.cap_img[idx])
        zc, zi = train.z_cap[idx], train.z_img[uimg]
        zi_in = drop_coordinates(head.centered(zi, "image"), cfg.image_dropout, generator)   # teacher: zi whole
        z = torch.cat([head.centered(zc, "text"), zi_in])
        gated = head.top_k("text") and head.top_k("image")
        return (self._gated_loss if gated else self._dense_loss)(head, z, idx, uimg, zc, zi, train, step, generator)

    def _dense_loss(self, head, z, idx, uimg, zc, zi, train, step, generator):
        """`loss` on [B + U, live columns] matrices (forward_live): any head, gated or not."""
        cfg = self.cfg
        v = int(head.config["vocab_size"])
        s, cols = head.forward_live(z)
        s_cap, s_img = top_k_rows(s[: len(idx)], head.top_k("text")), top_k_rows(s[len(idx):], head.top_k("image"))
        own = indicator_cols(train.tok[idx], cols, v)
        m = self.pec.mask(own, generator, cols)
        raw = s_cap
        if m is not None:
            s_cap = s_cap * m
        loss, parts = d2s_loss(s_cap, s_img, zc, zi, cfg.temperature, cfg.lam, self.eta_at(step),
                               s_cap_l1=raw if cfg.l1_caption == "raw" else None, kind=cfg.sparsity_loss)
        if cfg.caption_terms_weight > 0:   # the same teacher for caption-term queries (own terms, no gate)
            t = teacher_logits(zc, zi, cfg.temperature)
            sc = sparse_scores(s[: len(idx)] * own, s_img)
            ct = soft_ce(t, sc) + soft_ce(t.T, sc.T)
            loss = loss + (1.0 - cfg.lam) * cfg.caption_terms_weight * ct
            parts["caption_terms"] = float(ct.detach())
        if cfg.doc_words_weight > 0:   # rank the image's own caption words first (doc_Exact@k)
            dw = self.doc_words_term(s_img, uimg, cols, v)
            loss = loss + cfg.doc_words_weight * dw
            parts["doc_words"] = float(dw.detach())
        with torch.no_grad():   # batch FLOPs proxy (eq. 1 on the batch)
            parts["flops"] = float(((s_cap > 0).float().mean(0) * (s_img > 0).float().mean(0)).sum())
        return loss, parts

    def doc_words_term(self, s_img: torch.Tensor, uimg: torch.Tensor, cols: torch.Tensor, v: int) -> torch.Tensor:
        """--doc-words-weight's loss (doc_words_loss) of the training images `uimg` [U], whose
        weights s_img [U, K] sit at vocabulary columns cols [K] (every other weight 0)."""
        if self.img_words.device != uimg.device:   # once, not a copy per step on a GPU
            self.img_words, self.word_weight = self.img_words.to(uimg.device), self.word_weight.to(uimg.device)
        words = self.img_words[uimg]   # distinct per image, padded with |V|
        target = indicator_cols(words, cols, v, values=self.word_weight[words])
        return doc_words_loss(s_img, v, target, self.cfg.doc_words_temperature)

    def _gated_loss(self, head, z, idx, uimg, zc, zi, train, step, generator):
        """`loss` of a head gated on both sides, on the entries the gates keep (forward_gated): the
        same terms and random draws as the dense path, from [B, k] and [U, k] gathered weights
        instead of [B + U, live columns] matrices (tests/test_d2s.py checks they agree)."""
        cfg = self.cfg
        v = int(head.config["vocab_size"])
        b = len(idx)
        own = train.tok[idx]
        own = own[:, :max(1, int((own < v).sum(1).max()))]     # the batch's longest caption
        s_cap, s_img, cap_top, img_top, live = head.forward_gated(z, b, own)
        k_t = cap_top.shape[1]
        raw, own_s = s_cap[:, :k_t], s_cap[:, k_t:]              # gated caption weights; own terms, ungated
        is_own = (cap_top.unsqueeze(2) == own.unsqueeze(1)).any(2).to(raw.dtype)
        m = self.pec.mask(is_own, generator, cap_top)
        s_q = raw if m is None else raw * m
        t = teacher_logits(zc, zi, cfg.temperature)              # [B, U]
        side = ScoreSide(s_img, img_top, v)                      # the images, shared by both scores
        sc = gathered_scores(s_q, cap_top, side)
        ci, ic = soft_ce(t, sc), soft_ce(t.T, sc.T)
        l1_img = gathered_sparsity(s_img, img_top, v, cfg.sparsity_loss)
        l1_cap = gathered_sparsity(raw if cfg.l1_caption == "raw" else s_q, cap_top, v, cfg.sparsity_loss)
        loss = (1.0 - cfg.lam) * (ci + ic) + cfg.lam * self.eta_at(step) * (l1_img + l1_cap)
        parts = {k: float(x.detach()) for k, x in (("ci", ci), ("ic", ic), ("l1_img", l1_img), ("l1_cap", l1_cap))}
        if cfg.caption_terms_weight > 0:   # the same teacher for caption-term queries (own terms, no gate)
            so = gathered_scores(own_s, own, side)
            ct = soft_ce(t, so) + soft_ce(t.T, so.T)
            loss = loss + (1.0 - cfg.lam) * cfg.caption_terms_weight * ct
            parts["caption_terms"] = float(ct.detach())
        if cfg.doc_words_weight > 0:   # rank the image's own caption words first (doc_Exact@k)
            if self.img_words.device != uimg.device:
                self.img_words, self.word_weight = self.img_words.to(uimg.device), self.word_weight.to(uimg.device)
            words = self.img_words[uimg]
            words = words[:, :max(1, int((words < v).sum(1).max()))]
            dw = gathered_doc_words_loss(s_img, img_top, v, words, self.word_weight, live, cfg.doc_words_temperature)
            loss = loss + cfg.doc_words_weight * dw
            parts["doc_words"] = float(dw.detach())
        with torch.no_grad():   # batch FLOPs proxy (eq. 1 on the batch)
            count = lambda x, c: torch.zeros(v + 1, device=x.device).index_add_(  # noqa: E731
                0, c.flatten(), (x > 0).flatten().float())[:v] / x.shape[0]
            parts["flops"] = float((count(s_q, cap_top) * count(s_img, img_top)).sum())
        return loss, parts

    def query_mode_of_head(self) -> str:
        """The query mode the head is used in: a head trained without expansion (exp=0) never
        learned expansion terms, so its queries are the captions' own terms (paper Table 3)."""
        return "caption-terms" if self.cfg.expansion == "none" else "expand"

    def validate(self, head, val: PairData) -> dict:
        return {**evaluate_head(head, val, self.query_mode_of_head()), "query_mode": self.query_mode_of_head()}

    def finish(self, head, train, progress=None) -> None:
        """--doc-max-share < 1: the head's posting floor from the training images' vectors
        (D2SHead.prune_postings), so no term stays in more than that share of them."""
        n = self.set_floor(head, train)
        if n is not None and progress is not None:
            progress.log(f"train-head {self.name}: posting floor on {n} terms (each kept in at most "
                         f"{self.cfg.doc_max_share:.0%} of the training images)")

    def set_floor(self, head, train) -> int | None:
        """The posting floor of --doc-max-share < 1 for the head's current weights, estimated on the
        training images (D2SHead.prune_postings): the number of terms given a floor; None without one."""
        share = getattr(self.cfg, "doc_max_share", 1.0)
        if share >= 1:
            return None
        head.eval()
        return head.prune_postings(self.doc_vectors(head, train), share)

    def doc_vectors(self, head, train) -> torch.Tensor:
        """The dense vectors [Ni, d] the head sees for the training images (those the floor is cut on)."""
        return train.z_img

    # -- --target-flops (mmsparse.methods.budget) -------------------------------------------
    @property
    def budget(self) -> FlopsBudget | None:
        """The FLOPs budget of --target-flops (None without it)."""
        if "_budget" not in self.__dict__:
            target = getattr(self.cfg, "target_flops", None)
            self._budget = FlopsBudget(target) if target else None
        return self._budget

    def eta_at(self, step: int, eta: float | None = None) -> float:
        """A sparsity weight at optimizer step `step`: `eta` (default --eta) times the budget's
        multiplier, ramped in over the sparsity warm-up (loss.eta_at)."""
        scale = self.budget.scale if self.budget is not None else 1.0
        return eta_at(step, (self.cfg.eta if eta is None else eta) * scale, self.l1_warm)

    def holdout(self, train, progress=None):
        """(training pairs, validation pairs) for a budget without validation files: HOLDOUT images
        (a sixth of a set under 6,000) and their captions held out of training, seeded; a set too
        small to spare MIN_HOLDOUT images keeps them all and measures a sample of its own pairs,
        which the log and the head's config ("holdout") say."""
        n = self.rows(train)
        k = min(HOLDOUT, n // 6)
        if k < MIN_HOLDOUT:
            self._holdout = {"images": min(n, HOLDOUT), "source": "a sample of the training pairs"}
            held = self.take(train, sample_rows(n, HOLDOUT, self.cfg.seed))
        else:
            rows = sample_rows(n, k, self.cfg.seed)
            rest = torch.ones(n, dtype=torch.bool)
            rest[rows] = False
            held, train = self.take(train, rows), self.take(train, torch.nonzero(rest).squeeze(1))
            self._holdout = {"images": k, "source": "images held out of training"}
        if progress is not None:
            progress.log(f"--target-flops without validation files: the budget reads {self._holdout['source']} "
                         f"({self._holdout['images']:,} images)")
        return train, held

    def rows(self, data) -> int:
        """How many images `data` holds."""
        return int(data.z_img.shape[0])

    def take(self, data, rows):
        """The images at `rows` of `data` with their captions, in the data's own type."""
        return data.subset(rows)[0]

    def prepare(self, head, train) -> None:
        if self.budget is not None and not self.budget.gates:
            self.budget.gates = self.head_gates(head)

    def resumed(self, head) -> None:
        if self.budget is not None and self.budget.gates:
            self.set_gates(head, self.budget.gates)

    def load_epoch(self, head, record: dict) -> None:
        if record.get("gates"):
            self.set_gates(head, record["gates"])

    def head_gates(self, head) -> dict:
        """{side: k} of the head's top-k gates (0 = none) on the sides the budget may gate: both, or
        only the images when queries are the captions' own terms."""
        if self.query_mode_of_head() == "caption-terms":
            return {"image": head.top_k("image")}
        return {"text": head.top_k("text"), "image": head.top_k("image")}

    @staticmethod
    def set_gates(head, gates: dict) -> None:
        """Set the head's top-k gates from {side: k} (read at every call: training, validation, sparsify)."""
        for side, k in gates.items():
            head.config["doc_top_k" if side == "image" else "query_top_k"] = int(k)

    def probe_pairs(self, head, val):
        """The validation pairs as the head sees them (PairData: z_img, z_cap, cap_img, tok)."""
        return val

    def probe_queries(self, head, data) -> sp.csr_matrix | None:
        """Queries the gates do not touch, CSR [Nq, |V|] (caption-term queries), or None."""
        return encode_queries(head, data, "caption-terms") if self.query_mode_of_head() == "caption-terms" else None

    @torch.no_grad()
    def gate_probe(self, head, val) -> GateProbe:
        """This epoch's validation vectors before the gates (budget.GateProbe): each side read at
        twice its gate (or at its widest row when ungated), images with the posting floor applied."""
        head.eval()
        data = self.probe_pairs(head, val)
        v = int(head.config["vocab_size"])
        fixed = self.probe_queries(head, data)
        gates = self.budget.gates

        def top(z, side):
            k = gates.get(side, 0)
            if not k:
                k = max(int((head(z[s:s + 1024], side=side, gate=False) > 0).sum(1).max()) for s in range(0, len(z), 1024))
            k = max(1, min(v, 2 * k if gates.get(side) else k))
            cols, vals = [], []
            for s in range(0, len(z), 1024):
                out = head(z[s:s + 1024], side=side, gate=False).topk(k, dim=1)
                w, c = out.values, out.indices
                if side == "image" and hasattr(head, "doc_floor"):
                    w = w * (w > head.doc_floor[c])
                cols.append(c.to(torch.int32).cpu())
                vals.append(w.float().cpu())
            return torch.cat(cols).numpy(), torch.cat(vals).numpy()

        # the head centres its inputs itself (--center mean): the raw vectors go in, as in sparsify
        d_cols, d_vals = top(data.z_img, "image")
        q_cols, q_vals = (None, None) if fixed is not None else top(data.z_cap, "text")
        return GateProbe(v, d_cols, d_vals, data.cap_img.cpu().numpy(), q_cols, q_vals, fixed, self.cfg.select_metric)

    def end_epoch(self, head, train, val, record: dict) -> None:
        """Validation after the posting floor of this epoch's weights is cut (so the figures
        recorded are those of the vectors sparsify would write); with --target-flops then, after
        epochs that may be saved, the budget's gates (FlopsBudget.plan on this epoch's validation
        vectors) and its multiplier of the sparsity weights (FlopsBudget.update)."""
        if val is not None or self.budget is not None:
            self.set_floor(head, train)
        super().end_epoch(head, train, val, record)
        if self.budget is None or not self.eligible(record):
            return
        fig = record["val"]
        old = dict(self.budget.gates)
        new = self.budget.plan(lambda: self.gate_probe(head, val), fig)
        if new != old:
            self.set_gates(head, new)
        self.budget.update(fig["FLOPs"], record["epoch"], new != old, fig[self.cfg.select_metric])

    supports_path = True

    def retarget(self, target: float, record: dict) -> None:
        """The next budget of a path (FlopsBudget.retarget): the multiplier's first step towards
        `target` is taken at once from the last epoch's validation FLOPs; the gates stay where they
        are (FlopsBudget.plan moves them after the next epoch if the multiplier cannot)."""
        self.budget.retarget(target, float((record.get("val") or {}).get("FLOPs", target)), record.get("epoch"))

    def val_flops_limit(self) -> float | None:
        """--max-val-flops, or with --target-flops F the smaller of it and F·(1 + 15 %)."""
        limits = [x for x in (self.cfg.max_val_flops, self.budget.limit if self.budget else None) if x is not None]
        return min(limits) if limits else None

    def val_flops_floor(self) -> float | None:
        """With --target-flops F: F / (1 + 15 %), the lower edge of the budget's band."""
        return self.budget.floor if self.budget else None

    def budget_figures(self) -> dict:
        """{"eta_scale": the budget's multiplier, "gates": the gates this epoch trained with} for an
        epoch's record ({} without --target-flops)."""
        if self.budget is None:
            return {}
        return {"eta_scale": self.budget.scale, **({"gates": dict(self.budget.gates)} if self.budget.gates else {})}

    def sample(self, train, n: int = 1000):
        """A seeded sample of about n training images with their captions, in the data's own type."""
        return self.take(train, sample_rows(self.rows(train), n))

    def sample_figures(self, head, train, n: int = 1000) -> dict:
        """`validate`'s figures on `sample`, plus "images": how many images the sample holds."""
        data = self.place(self.sample(train, n), next(head.parameters()).device)
        return {**self.validate(head, data), "images": len(getattr(data, "pairs", data).img_ids)}

    def eligible(self, record: dict) -> bool:
        return record["step"] >= self.l1_warm   # before the sparsity warm-up ends the head is not sparse

    def epoch_figures(self) -> dict:
        return {"p_c": self.pec.p_c, **self.budget_figures()}

    def state_dict(self) -> dict:
        return {"pec": self.pec.state_dict(), **({"budget": self.budget.state_dict()} if self.budget else {})}

    def load_state_dict(self, state: dict) -> None:
        self.pec.load_state_dict(state["pec"])
        if self.budget is not None:
            self.budget.load_state_dict(state["budget"])

    def epoch_line(self, r: dict) -> str:
        return format_epoch_line(r, f" p_c {r['p_c']:.2f}")

    # -- inference ------------------------------------------------------------------------
    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Rows of `dense` through the head: documents and `expand` queries keep every term;
        `caption-terms` queries keep only the caption's own tokens (the paper's exp=0 query)."""
        v = int(head.config["vocab_size"])
        n, texts_ds, dim = _shape(dense)
        if dim != head.dim:
            raise InputError(f"{dense}: vectors have d={dim} but head {head_dir} expects d={head.dim}; "
                             "use the head trained on this backbone's vectors")
        if mode == "caption-terms":
            if not texts_ds:
                raise InputError(f"{dense}: no 'texts' dataset, needed for --query-mode caption-terms")
            tok = require_tokenizer(head, head_dir)
            tids = head.token_ids.numpy()
        ids, parts, texts = [], [], []
        with torch.no_grad(), open_read(dense) as f, progress.task(f"sparsify {mode}", total=n) as bar:
            for chunk_ids, vec in iter_dense(dense, chunk_rows=batch_size):
                side = "image" if mode == "doc" else "text"
                t = read_strings(f["texts"][len(ids):len(ids) + len(chunk_ids)]) if texts_ds else None
                if mode == "caption-terms":
                    s = head(torch.from_numpy(vec), side=side, gate=False)
                    parts.append(to_csr(s * indicator(pad_ids(to_columns(caption_token_ids(tok, t), tids), v), v)))
                else:
                    parts.append(head.encode_csr(torch.from_numpy(vec), side=side))
                ids.extend(chunk_ids)
                texts.extend(t or [])
                bar.advance(len(chunk_ids))
                kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
        m = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)
        return Sparsified(ids, m, texts if texts_ds else None, {})


def image_words(train: PairData, vocab: list[str], target: str = "idf",
                max_df: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Each training image's caption words, for --doc-words-weight: (words [Ni, L] int64, the head
    columns of the words (alphabetic word-start pieces) of all its captions, padded with |V|; weight
    [|V| + 1] float32, 0 for other pieces, the pad and words with df > max_df·Ni). With df the number
    of images whose captions hold the term, target "idf" weighs log(Ni / df) (a term in every image's
    captions, "a", weighs 0) and "uniform" weighs 1. ValueError on another target."""
    if target not in ("idf", "uniform"):
        raise ValueError(f"doc_words_target: {target!r} is not one of idf, uniform")
    v = len(vocab)
    start = np.array([t.isalpha() for t in vocab] + [False])   # words: no "##" piece, no punctuation or digits
    per: list[set] = [set() for _ in range(train.z_img.shape[0])]
    for c, i in zip(train.token_ids, train.cap_img.cpu().numpy()):
        per[int(i)].update(int(t) for t in c if start[t])
    words = [np.array(sorted(w), dtype=np.int64) for w in per]
    df = np.bincount(np.concatenate(words) if words else np.zeros(0, np.int64), minlength=v + 1)[:v + 1]
    # df counts words only, so df > 0 already excludes other pieces and the pad
    if target == "idf":
        weight = np.where(df > 0, np.log(len(words) / np.maximum(df, 1)), 0.0)
    else:
        weight = (df > 0).astype(np.float64)
    weight = weight * (df <= max_df * len(words))   # a word asked of most images ends up in most vectors
    return torch.from_numpy(pad_ids(words, v)), torch.from_numpy(weight.astype(np.float32))


def _shape(dense) -> tuple[int, bool, int]:
    """(rows, has texts, vector dim) of a dense file."""
    with open_read(dense) as f:  # a file or a sharded directory
        return int(f["ids"].shape[0]), "texts" in f, int(f["vectors"].shape[1])

