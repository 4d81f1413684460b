"""Inference-free multimodal sparse retrieval as a Method: D2S's image head and dense teacher,
with captions encoded by a learned term-weight table instead of a model.

Per batch (the captions' distinct images as candidates, as D2S):

    s_I = head(z_I) [U, |V|]                  D2S eq. 4-5 (the live columns only, exact)
    q_C = max(0, w) ⊙ 1[t ∈ C] [B, |V|]         the table (queries.py): no model on the query side
    L   = (1 - λ)[ℓ(I→C) + ℓ(C→I)] + λ·η_t·R(s_I) + λ·η_q,t·Σ_t p_q(t)·mean_i s_it

ℓ is D2S eq. 7's cross-entropy between the dense teacher softmax(z_Cᵀz_I/τ) and the student
softmax(q_Cᵀs_I). The sparsity term R sees the images only (FLOPs by default): the queries'
sparsity is their captions' length. With w initialised from IDF, the student score weights each
matched term by its rarity, so a FLOPs penalty on the documents removes low-IDF expansion terms
first: the "IDF-aware FLOPS" of Geng et al. 2024 ("Towards Competitive Search Relevance for
Inference-Free Learned Sparse Retrievers", arXiv 2411.04403), here with the table learned, as
sentence-transformers' SparseStaticEmbedding allows (OpenSearch's doc-only encoders freeze it).
Adopted from that literature: IDF query weights, document-only FLOPs; not adopted: their ℓ0
relaxation (Shen et al. 2025) and ensemble teachers (one dense teacher here, as D2S).

The last term (--eta-query-flops, off by default) is the expected FLOPs of the training queries,
D2S eq. 1 with the query side known: p_q(t) is the share of training captions holding term t, so
a document term costs in proportion to how many queries walk its posting list ("." and "a" most).
DF-FLOPS (Porco et al. 2025, arXiv 2505.15070) weights the FLOPs term by document frequency for
the same end; here the weight is the query side's, which an inference-free head knows exactly.
--image-dropout (D2SLossConfig) drops coordinates of the image vectors the head sees (never the
teacher's): the image side otherwise learns the training captions' words by heart.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from ...errors import InputError
from ...formats._h5 import read_strings
from ...formats.sharded import open_read
from ...metrics.exhaustive import sparse_retrieval_metrics
from ...vocab import document_frequency
from ..d2s.loss import ScoreSide, drop_coordinates, gathered_scores, soft_ce, sparsity, teacher_logits
from ..d2s.head import top_k_rows
from ..d2s.method import D2S, encode_sparse, format_epoch_line
from ..pairs import PairData
from .config import InferenceFreeConfig
from .head import InferenceFreeHead, idf
from .queries import sparsify_texts


def encode_table_queries(head: InferenceFreeHead, data: PairData) -> sp.csr_matrix:
    """The captions of `data` (data.tok: their head columns) as table queries, CSR [N, |V|] float32."""
    with torch.no_grad():
        w = head.query_weight.detach().clamp(min=0).cpu().numpy()
    tok = data.tok.cpu().numpy()
    v = len(w)
    val = np.append(w, 0.0).astype(np.float32)[tok]
    keep = val > 0                                   # pads and terms the table weighs 0 are left out
    indptr = np.zeros(len(tok) + 1, dtype=np.int32)
    np.cumsum(keep.sum(1), out=indptr[1:])
    return sp.csr_matrix((val[keep], tok[keep].astype(np.int32), indptr), shape=(len(tok), v))


def evaluate_head(head: InferenceFreeHead, data: PairData) -> dict:
    """Caption->image retrieval on a whole split with table queries (exhaustive): R@1/5/10, MRR@10,
    FLOPs (D2S eq. 1), q_nnz, d_nnz."""
    head.eval()
    d = encode_sparse(head, data.z_img, side="image")
    return sparse_retrieval_metrics(encode_table_queries(head, data), d, data.cap_img.cpu().numpy())


class InferenceFree(D2S):
    """Documents through D2S's head, queries through a term-weight table (module docstring)."""

    name = "inference-free"
    config_class = InferenceFreeConfig
    head_class = InferenceFreeHead
    query_modes = ("inference-free",)

    def setup(self, inputs, progress=None):
        head, train, val = self.load_data(inputs, progress)
        if self.cfg.query_init == "idf":
            head.set_query_weights(idf(train.token_ids, len(head.vocab)))
        # p_q(t): the share of training captions holding term t, the weights of the expected-FLOPs term
        self.query_df = torch.as_tensor(document_frequency(train.token_ids, len(head.vocab)), dtype=torch.float32)
        return head, train, val

    def param_groups(self, head) -> list[dict]:
        """D2S's groups (W1; LayerNorm + W2) and the term-weight table at --query-lr (frozen at 0)."""
        groups = super().param_groups(head)
        head.query_weight.requires_grad_(self.cfg.query_lr > 0)
        if self.cfg.query_lr > 0:   # no weight decay: it would pull rare terms' IDF towards 0
            groups.append({"params": [head.query_weight], "lr": self.cfg.query_lr, "weight_decay": 0.0})
        return groups

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, train: PairData, generator, epoch: int):
        perm = torch.randperm(train.z_cap.shape[0], generator=generator)
        for b in range(self.steps_per_epoch(train)):
            yield perm[b * self.cfg.batch_size:(b + 1) * self.cfg.batch_size], train

    def loss(self, head, batch, step, generator, device):
        """The module docstring's L on one batch: image vectors restricted to the live columns, the
        captions' table vectors on the same columns, the teacher, the images' sparsity term."""
        idx, train = batch
        cfg = self.cfg
        idx = idx.to(train.z_cap.device)
        uimg = torch.unique(train.cap_img[idx])
        zc, zi = train.z_cap[idx], train.z_img[uimg]
        s_img, cols = head.forward_live(drop_coordinates(head.centered(zi, "image"), cfg.image_dropout, generator))
        s_img = top_k_rows(s_img, head.top_k("image"))
        v = len(head.vocab)
        tok = train.tok[idx]
        tok = tok[:, :max(1, int((tok < v).sum(1).max()))]      # the batch's longest caption
        q = torch.cat([head.query_weight.clamp(min=0), head.query_weight.new_zeros(1)])[tok]   # [B, T], 0 at pads
        t = teacher_logits(zc, zi, cfg.temperature)
        s = gathered_scores(q, tok, ScoreSide(s_img, cols, v))   # q_Cᵀ s_I: the captions' terms stay sparse
        ci, ic = soft_ce(t, s), soft_ce(t.T, s.T)
        reg = sparsity(s_img, cfg.sparsity_loss)
        loss = (1.0 - cfg.lam) * (ci + ic) + cfg.lam * self.eta_at(step) * reg
        with torch.no_grad():
            q_df = torch.zeros(v + 1, device=q.device).index_add_(0, tok.flatten(), (q > 0).flatten().float())
            flops = float((q_df[cols] / len(idx) * (s_img > 0).float().mean(0)).sum())
        parts = {"ci": float(ci.detach()), "ic": float(ic.detach()), "l1_img": float(reg.detach()), "flops": flops}
        if cfg.eta_query_flops > 0:   # expected FLOPs of the training queries: Σ_t p_q(t)·mean_i s_it
            qf = (self.query_df[cols.cpu()].to(s_img.device) * s_img.mean(0)).sum()
            loss = loss + cfg.lam * self.eta_at(step, cfg.eta_query_flops) * qf
            parts["query_flops"] = float(qf.detach())
        return loss, parts

    def validate(self, head, val: PairData) -> dict:
        return {**evaluate_head(head, val), "query_mode": "inference-free"}

    def head_gates(self, head) -> dict:
        """Only the images have a gate: queries are the table's weights of the caption's terms."""
        return {"image": head.top_k("image")}

    def probe_queries(self, head, data: PairData) -> sp.csr_matrix:
        return encode_table_queries(head, data)

    def epoch_figures(self) -> dict:
        return self.budget_figures()

    def state_dict(self) -> dict:
        return {"budget": self.budget.state_dict()} if self.budget else {}

    def load_state_dict(self, state: dict) -> None:
        if self.budget is not None:
            self.budget.load_state_dict(state["budget"])

    def epoch_line(self, r: dict) -> str:
        return format_epoch_line(r, cap_digits=1)

    # -- inference ------------------------------------------------------------------------
    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Images: D2S's head on their dense vectors. Captions: their `texts` through the table
        (queries.TermWeightQueryEncoder); the caption vectors are never read."""
        if mode == "doc":
            return D2S.sparsify(head, head_dir, dense, out, mode, options, batch_size, progress)
        with open_read(dense) as f:
            if "texts" not in f:
                raise InputError(f"{dense}: no 'texts' dataset; an inference-free head encodes captions from "
                                 "their text (give a captions file with texts, or a text file of queries)")
            ids = read_strings(f["ids"][:])
            texts = read_strings(f["texts"][:])
        return sparsify_texts(head, head_dir, ids, texts, batch_size, progress)

