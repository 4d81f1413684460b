"""VDR as a Method: training on frozen token / patch states, validation and sparsify (VDR paper
§3, App. A).

Training (one step, a batch of B caption-image pairs; a batch holds each image at most once
where possible, and a repeated image is one column whose row spreads its target over its
captions): V_q, V_p from the two towers (head.py), then loss.py. Token states stream from HDF5 in
shuffled blocks (data.py).

Inference: documents E_p = top_{k_doc}(l2n(V_p)) (the training-time normalisation, then gated);
queries `vdr`: l2n(V_q ⊙ G_q) with k = k_query; `bow`: the binary bag of words (VDR^α, no network).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from ...atomic import kill_point
from ...errors import InputError
from ...formats._h5 import read_strings
from ...formats.dense import read_dense_attrs
from ...metrics.exhaustive import sparse_retrieval_metrics
from ...vocab import indicator, load_vocab, pad_ids, restrict_to_frequent, to_columns
from ..base import Method, Sparsified
from ..head import require_tokenizer
from ..pairs import check_inputs, training_record
from .config import VDRConfig
from ..towers import FLAG, final_layer_backbone
from .data import Split, States, batches, caption_token_sets, input_kind, load_batch, open_split, sample_split
from .init import check_layers, init_image_from_words, position_width
from .head import VDRHead, gate, l2n, topk_mask
from .loss import vdr_loss

BUDGET_SAMPLE = 1000   # --target-flops without validation files: training images (and their captions) that decide k


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
    v = int(head.config["vocab_size"])
    dev = next(head.parameters()).device
    parts = []
    for s in range(0, states.n, batch):
        e = min(states.n, s + batch)
        bw = indicator(pad_ids(bows[s:e], v), v).to(dev) if bows is not None else None
        if side == "text" and mode == "bow":
            out = bw
        else:
            x, m = states.read(s, e)
            out = encode_rows(head, torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dev),
                              torch.from_numpy(m.astype(np.float32)).to(dev) if m is not None else None,
                              side, k, mode, bw)
        parts.append(sp.csr_matrix(out.cpu().numpy()))
        if on_batch is not None:
            on_batch(e - s)
        kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, v), dtype=np.float32)


def evaluate(head: VDRHead, split: Split, k_query: int, k_doc: int) -> dict:
    """Caption->image figures (brute force) of parametric (vdr) queries, and of bag-of-words
    queries (VDR^α) under "bow"."""
    head.eval()
    d = encode_split(head, split.images, "image", k_doc)
    q = encode_split(head, split.captions, "text", k_query, "vdr", split.bows)
    out = sparse_retrieval_metrics(q, d, split.cap_img)
    b = encode_split(head, split.captions, "text", k_query, "bow", split.bows)
    out["bow"] = sparse_retrieval_metrics(b, d, split.cap_img)
    return out


def _rows(m: sp.csr_matrix, chunk: int, fn) -> sp.csr_matrix:
    """fn(dense rows [n, |V|] float32 tensor, first row) -> gated rows, applied chunk by chunk to CSR m."""
    parts = [sp.csr_matrix(fn(torch.from_numpy(m[s:s + chunk].toarray()), s).numpy())
             for s in range(0, m.shape[0], chunk)]
    return sp.vstack(parts, format="csr") if parts else m.copy()


class UngatedVectors(NamedTuple):
    """A head's vectors of one split before its top-k gates (ungated_vectors), float32 CSR:
    queries [Nq, |V|] = l2n(V_q), images [Ni, |V|] = l2n(V_p), bows [Nq, |V|] 0/1 (each caption's
    bag of words, which the query gate always keeps open)."""

    queries: sp.csr_matrix
    images: sp.csr_matrix
    bows: sp.csr_matrix

    def gated(self, k_query: int, k_doc: int, chunk: int = 1024) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        """(queries, images) CSR float32 with the gates at k_query / k_doc, as validation and sparsify
        write them: queries l2n(V_q ⊙ (top_k(V_q) ∪ bow)), images top_k(l2n(V_p))."""
        return self.gated_queries(k_query, chunk), self.gated_images(k_doc, chunk)

    def gated_queries(self, k_query: int, chunk: int = 1024) -> sp.csr_matrix:
        """The queries [Nq, |V|] CSR float32 gated at k_query (their bag of words kept open)."""
        return _rows(self.queries, chunk, lambda v, s: l2n(v * gate(v, k_query, torch.from_numpy(
            self.bows[s:s + chunk].toarray()))))

    def gated_images(self, k_doc: int, chunk: int = 1024) -> sp.csr_matrix:
        """The images [Ni, |V|] CSR float32 gated at k_doc."""
        return _rows(self.images, chunk, lambda p, s: p * topk_mask(p, k_doc))

    def figures(self, k_query: int, k_doc: int, cap_img: np.ndarray) -> dict:
        """`validate`'s figures (R@k, MRR@10, FLOPs, q_nnz, d_nnz) at k_query / k_doc; cap_img [Nq]
        int64: each caption's image row."""
        return sparse_retrieval_metrics(*self.gated(k_query, k_doc), cap_img)


@torch.no_grad()
def ungated_vectors(head: VDRHead, split: Split, keep: int | None = None, batch: int = 256) -> UngatedVectors:
    """The vectors of `split` (its captions with split.bows, its images) through `head` without the
    top-k gates, so a controller can choose k per side on validation: UngatedVectors(queries
    l2n(V_q) [Nq, |V|], images l2n(V_p) [Ni, |V|], bows [Nq, |V|] 0/1), CSR float32. keep: each
    row keeps only its `keep` largest terms (queries also their bag of words), bounding memory
    for large vocabularies (then any k <= keep gates exactly as sparsify); None = every term."""
    head.eval()
    v = int(head.config["vocab_size"])
    dev = next(head.parameters()).device
    out = {"text": [], "image": [], "bow": []}
    for side, states in (("text", split.captions), ("image", split.images)):
        for s in range(0, states.n, batch):
            e = min(states.n, s + batch)
            x, m = states.read(s, e)
            u = l2n(head(torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dev),
                         torch.from_numpy(m.astype(np.float32)).to(dev) if m is not None else None, side))
            bw = indicator(pad_ids(split.bows[s:e], v), v).to(dev) if side == "text" else None
            if keep is not None:
                u = u * gate(u, keep, bw)
            out[side].append(sp.csr_matrix(u.cpu().numpy()))
            if bw is not None:
                out["bow"].append(sp.csr_matrix(bw.cpu().numpy()))
    empty = sp.csr_matrix((0, v), dtype=np.float32)
    return UngatedVectors(*(sp.vstack(out[k], format="csr") if out[k] else empty for k in ("text", "image", "bow")))


class VDR(Method):
    """Vocabulary Disentangled Retrieval: elu1p weights over token/patch states, top-k gating
    united with the bag of words, bag-of-words queries (VDR^α)."""

    name = "vdr"
    config_class = VDRConfig
    head_class = VDRHead
    query_modes = ("vdr", "bow")
    batch_size = 256

    def setup(self, inputs, progress=None):
        cfg = self.cfg
        _, ac = check_inputs(inputs)
        kinds = {side: input_kind(path, side) for side, path in (("text", inputs.train_captions),
                                                                  ("image", inputs.train_images))}
        final = kinds["text"] == kinds["image"] == "final_input"
        if "final_input" in kinds.values() and not final:
            raise InputError(f"{inputs.train_images}, {inputs.train_captions}: only one holds final_input; encode both "
                             f"with `encode-dense {FLAG}` (or both with --token-states --patch-states)")
        train = open_split(inputs.train_images, inputs.train_captions, inputs.qrels, kinds)
        val = None
        if inputs.val_images is not None:
            val = open_split(inputs.val_images, inputs.val_captions, inputs.val_qrels, kinds)
            for side, t, w in (("text", train.captions, val.captions), ("image", train.images, val.images)):
                if (t.name, t.hidden) != (w.name, w.hidden):
                    raise InputError(f"{w.path}: {w.name} h={w.hidden} but the training {side} file has {t.name} "
                                     f"h={t.hidden}; encode both splits with the same encode-dense flags")
        voc = load_vocab(cfg.vocab_model, ac)
        special = set(int(i) for i in (getattr(voc.tokenizer, "all_special_ids", None) or []))
        raw = caption_token_sets(inputs.train_captions, voc.tokenizer, special)
        voc = restrict_to_frequent(voc, raw, cfg.vocab_min_df)
        self.training = training_record(inputs, ac, vocab_min_df=cfg.vocab_min_df)
        layers, bb = None, None
        if final:   # the layers' weights from the model the files name (checked by fingerprint)
            bb = final_layer_backbone(ac, inputs.train_captions)
            layers = {"text": bb.final_layer_weights("text"), "image": bb.final_layer_weights("image")}
            check_layers(layers, bb.projections(), train)
        elif cfg.vdr_image_init == "words":
            raise InputError(f"--vdr-image-init words: {inputs.train_images} holds {kinds['image']}, not final_input; "
                             f"encode with `encode-dense {FLAG}` (its model gives the word vectors)")
        hidden = {side: position_width(layers, st, side) for side, st in (("text", train.captions),
                                                                           ("image", train.images))}
        torch.manual_seed(cfg.seed)
        head = VDRHead.from_vocab(voc, int(ac["dim"]), hidden["text"], hidden["image"], train.captions.name,
                                  train.images.name, cfg.vdr_query_k, cfg.vdr_doc_k, cfg.vdr_temperature,
                                  self.training, pool=cfg.vdr_pool, k_train=cfg.vdr_train_k)
        head.config.update(text_input_width=train.captions.hidden, image_input_width=train.images.hidden)
        if final:
            head.set_final_layers(layers["text"], layers["image"],
                                  {k: ac[k] for k in ("model", "model_fingerprint") if k in ac}, cfg.tune_final_layer)
            spec = layers["image"].spec   # a ViT's [CLS] comes first in its positions (backbones/final_layer.py)
            if not cfg.vdr_image_cls and spec["kind"] == "vit" and spec.get("pooling") == "cls":
                head.config["image_skip_cls"] = True
            if cfg.vdr_image_init == "words":
                init_image_from_words(head, bb, train, progress)
        tids = head.token_ids.numpy()
        train.bows = to_columns(raw, tids)
        if val is not None:
            val.bows = to_columns(caption_token_sets(inputs.val_captions, voc.tokenizer, special), tids)
        self.fingerprint = {"inputs": dict(self.training), "vocab_size": len(voc.terms), "n_captions": train.captions.n}
        if progress is not None:
            progress.log(f"train-head vdr: {train.images.n} images ({train.images.name}, h={train.images.hidden}), "
                         f"{train.captions.n} captions ({train.captions.name}, h={train.captions.hidden}), "
                         f"|V|={len(voc.terms)}, train k={cfg.vdr_train_k}"
                         + (f", final layers {'tuned' if cfg.tune_final_layer else 'frozen'}" if final else "")
                         + (", image head over the patches (no [CLS])" if head.config.get("image_skip_cls") else ""))
        self.val_split = val   # finish: --target-flops chooses inference k on it
        return head, train, val

    def place(self, data, device):
        return data   # states stream from disk batch by batch; loss() moves each batch

    def param_groups(self, head) -> list[dict]:
        """The two heads (lr, weight decay); τ (lr, no decay); the final layers (final_lr, default lr;
        no weight decay, as joint; frozen with --freeze-final-layer)."""
        final = head.final_params()
        for p in final:
            p.requires_grad_(self.cfg.tune_final_layer)
        heads = [*head.text.parameters(), *head.image.parameters()]
        lr = self.cfg.lr if self.cfg.final_lr is None else self.cfg.final_lr
        return [{"params": heads}, {"params": [head.logit_scale], "weight_decay": 0.0},
                {"params": [p for p in final if p.requires_grad], "lr": lr, "weight_decay": 0.0}]

    def steps_per_epoch(self, train: Split) -> int:
        return math.ceil(train.captions.n / self.cfg.batch_size)

    def batches(self, train: Split, generator, epoch: int):
        for item in batches(train, self.cfg.batch_size, generator, buffer_rows=self.cfg.vdr_buffer_rows,
                           by_image=self.cfg.batch_by == "image"):
            yield item, train

    def loss(self, head, batch, step, generator, device):
        item, train = batch
        if head.has_final and not self.cfg.tune_final_layer:   # frozen: no dropout, as stored states
            head.text_final.eval()
            head.image_final.eval()
        xc, mc, xi, cap_img, bow = (t.to(device) if t is not None else None
                                    for t in load_batch(train, item, int(head.config["vocab_size"])))
        v_q = head(xc, mc, "text")
        v_p = head(xi, None, "image")
        k = int(head.config.get("k_train", self.cfg.vdr_train_k))   # at call time: a controller may move it
        loss, parts = vdr_loss(v_q, v_p, bow, cap_img, k, head.scale, self.cfg.vdr_cts_mask,
                               self.cfg.vdr_np_entry, generator)
        self.tau = float(1.0 / head.scale.detach())
        return loss, parts

    def finish(self, head, train: Split, progress=None) -> None:
        """--target-flops F: the saved epoch's head takes the inference k_query / k_doc that ksweep
        chooses under F on the validation files (ksweep.set_inference_k), or, without them, on a seeded
        sample of BUDGET_SAMPLE training images and their captions; recorded in self.training
        ("flops_budget", so in the head's training record). The training k is left as it is."""
        target = self.cfg.target_flops
        if target is None:
            return
        from .ksweep import set_inference_k

        val = getattr(self, "val_split", None)
        split, source = (val, "val") if val is not None else (sample_split(train, BUDGET_SAMPLE, self.cfg.seed),
                                                               "train_sample")
        rec = set_inference_k(head, split, target, source, progress=progress)
        self.training = {**self.training, "flops_budget": rec}

    def validate(self, head, val: Split) -> dict:
        return evaluate(head, val, int(head.config["k_query"]), int(head.config["k_doc"]))

    def epoch_figures(self) -> dict:
        return {"tau": getattr(self, "tau", self.cfg.vdr_temperature)}

    def epoch_line(self, r: dict) -> str:
        v = r.get("val")
        return (f"epoch {r['epoch']}: loss {r['loss']:.3f} τ {r['tau']:.3f}"
                + (f" | val VDR R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f}; VDR^α R@1 "
                   f"{v['bow']['R@1']:.4f} R@10 {v['bow']['R@10']:.4f} FLOPs {v['bow']['FLOPs']:.1f}" if v else "")
                + f" ({r['seconds']:.0f}s)")

    @classmethod
    def query_mode(cls, modality, query_mode, path) -> str:
        """Images: doc; captions: vdr (parametric; `expand` is taken as vdr) or bow (VDR^α)."""
        return super().query_mode(modality, {"expand": "vdr"}.get(query_mode, query_mode), path)

    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Images -> top-k_doc documents; captions -> vdr (top-k_query + bag of words) or bow."""
        attrs = read_dense_attrs(dense)
        side = "image" if attrs["modality"] == "image" else "text"
        want = head.config[f"{side}_input"]
        states = States(dense, side, want)
        try:
            width = int(head.config.get(f"{side}_input_width", head.config[f"{side}_hidden"]))
            if states.hidden != width:
                raise InputError(f"{dense}: {want} h={states.hidden} but head {head_dir} expects "
                                 f"h={width}; use the head trained on this backbone")
            opt = options.get("vdr_doc_k" if side == "image" else "vdr_query_k")
            k = int(opt if opt is not None else head.config["k_doc" if side == "image" else "k_query"])
            bows = None
            if side == "text":
                tok = require_tokenizer(head, head_dir) if (head.tokenizer or head.config.get("vocab_source")) else None
                raw = caption_token_sets(dense, tok, set(head.config.get("special_ids", [])))
                bows = to_columns(raw, head.token_ids.numpy())
            with progress.task(f"sparsify vdr {mode}", total=states.n) as bar:
                m = encode_split(head, states, side, k, mode if side == "text" else "vdr", bows, batch_size,
                                 on_batch=bar.advance)
            ids = read_strings(states.f["ids"])
            texts = read_strings(states.f["texts"]) if "texts" in states.f else None
        finally:
            states.close()
        return Sparsified(ids, m, texts, {"top_k": k if mode != "bow" else 0})
