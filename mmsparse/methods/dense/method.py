"""The dense baseline trained alike as a Method: VDR's data stream (methods/vdr/data.py: caption
and image final-layer inputs streamed from HDF5 in shuffled blocks, a batch holding each image
once where possible), VDR's schedule, CLIP's loss (joint/loss.py info_nce: ½ (L_t→i + L_i→t),
logits = cos/τ with τ learnable):

    h_t = normalize(W_txt final_txt(x_t)),  h_i = normalize(W_img final_img(x_i))
    L   = ½ [CE_rows(h_t h_iᵀ / τ) + CE_cols(h_t h_iᵀ / τ)]

Sparsify writes the tuned dense vectors (a dense HDF5 file), which `index` serves with Faiss.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...errors import InputError
from ...metrics.exhaustive import dense_retrieval_metrics
from ..base import Method
from ..joint.loss import info_nce
from ..pairs import check_inputs, training_record
from ..towers import FLAG, final_layer_backbone, tuned_dense
from ..vdr.data import Split, batches, input_kind, load_states, open_split
from ..vdr.init import check_layers
from .config import DenseConfig
from .head import DenseHead


@torch.no_grad()
def dense_split(head: DenseHead, split: Split, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(caption vectors [Nc, d], image vectors [Ni, d]) float32 of a split through the head."""
    head.eval()
    out = []
    for side, states in (("text", split.captions), ("image", split.images)):
        parts = []
        for s in range(0, states.n, batch):
            x, m = states.read(s, min(states.n, s + batch))
            parts.append(head.dense(torch.from_numpy(np.asarray(x, dtype=np.float32)), side,
                                    None if m is None else torch.from_numpy(m.astype(np.int64))).numpy())
        out.append(np.concatenate(parts) if parts else np.zeros((0, head.dim), np.float32))
    return out[0], out[1]


class Dense(Method):
    """CLIP's contrastive loss on the towers' final layers and projections: the dense model trained
    alike, VDR's baseline (VDR paper Table 2)."""

    name = "dense"
    config_class = DenseConfig
    head_class = DenseHead
    query_modes = ("dense",)
    batch_size = 256
    output = "dense"          # sparsify writes a dense HDF5 file (api.sparsify)

    def setup(self, inputs, progress=None):
        cfg = self.cfg
        _, ac = check_inputs(inputs)
        for path, side in ((inputs.train_images, "image"), (inputs.train_captions, "text"),
                           (inputs.val_images, "image"), (inputs.val_captions, "text")):
            if path is not None and input_kind(path, side) != "final_input":
                raise InputError(f"{path}: no 'final_input' dataset; --method dense tunes the towers' final layers on "
                                 f"their stored inputs: re-encode with `mmsparse encode-dense {FLAG}`")
        want = {"text": "final_input", "image": "final_input"}
        train = open_split(inputs.train_images, inputs.train_captions, inputs.qrels, want)
        val = open_split(inputs.val_images, inputs.val_captions, inputs.val_qrels, want) if inputs.val_images else None
        bb = final_layer_backbone(ac, inputs.train_captions)
        layers = {"text": bb.final_layer_weights("text"), "image": bb.final_layer_weights("image")}
        proj = bb.projections()
        if "image_proj_weight" not in proj:
            raise InputError(f"{inputs.train_images}: the {ac.get('backbone')} backbone has no projection layers to "
                             "tune; --method dense needs a dual encoder with image and text projections")
        check_layers(layers, proj, train)
        self.training = training_record(inputs, ac)
        torch.manual_seed(cfg.seed)
        head = DenseHead.from_backbone(proj, layers["text"], layers["image"],
                                       {k: ac[k] for k in ("model", "model_fingerprint") if k in ac},
                                       cfg.tune_final_layer, cfg.tau_init, self.training)
        self.fingerprint = {"inputs": dict(self.training), "n_captions": train.captions.n}
        if val is not None:
            before = self.validate(head, val)
            self.training["val_before"] = before
            if progress is not None:
                progress.log(f"before training: val R@1 {before['R@1']:.4f} R@10 {before['R@10']:.4f}")
        return head, train, val

    def place(self, data, device):
        return data   # final-layer inputs stream from disk batch by batch; loss() moves each batch

    def param_groups(self, head) -> list[dict]:
        """As VDR's groups: the projections (lr, --weight-decay: they hold the place of VDR's heads), τ
        (lr, no decay), the final layers (final_lr, default lr; no decay; frozen with --freeze-final-layer)."""
        final = head.final_params()
        for p in final:
            p.requires_grad_(self.cfg.tune_final_layer)
        lr = self.cfg.lr if self.cfg.final_lr is None else self.cfg.final_lr
        return [{"params": head.proj_params()}, {"params": [head.log_tau], "weight_decay": 0.0},
                {"params": [p for p in final if p.requires_grad], "lr": lr, "weight_decay": 0.0}]

    def steps_per_epoch(self, train: Split) -> int:
        return math.ceil(train.captions.n / self.cfg.batch_size)

    def batches(self, train: Split, generator, epoch: int):
        yield from batches(train, self.cfg.batch_size, generator, buffer_rows=self.cfg.vdr_buffer_rows,
                           by_image=self.cfg.batch_by == "image")

    def loss(self, head, batch, step, generator, device):
        if not self.cfg.tune_final_layer:   # frozen: no dropout
            head.text_final.eval()
            head.image_final.eval()
        xc, mc, xi, cap_img = (t.to(device) if t is not None else None for t in load_states(batch))
        h_t, h_i = head.dense(xc, "text", mc), head.dense(xi, "image")
        loss = info_nce((h_t @ h_i.T).float() / head.tau, cap_img)
        self.tau = float(head.tau.detach())
        return loss, {}

    def validate(self, head, val: Split) -> dict:
        hc, hi = dense_split(head, val)
        return dense_retrieval_metrics(hc, hi, val.cap_img)

    def epoch_figures(self) -> dict:
        return {"tau": getattr(self, "tau", self.cfg.tau_init)}

    def epoch_line(self, r: dict) -> str:
        v = r.get("val")
        return (f"epoch {r['epoch']}: loss {r['loss']:.3f} τ {r['tau']:.4f}"
                + (f" | val R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f}" if v else "") + f" ({r['seconds']:.0f}s)")

    @classmethod
    def query_mode(cls, modality, query_mode, path) -> str:
        """Images: doc; captions: dense (the tuned vectors)."""
        return super().query_mode(modality, {"expand": "dense"}.get(query_mode, query_mode), path)

    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Write DENSE's rows through the tuned final layers and projections to `out`, a dense HDF5
        file (towers.tuned_dense); returns None (nothing sparse to write)."""
        with progress.task("dense: tuned vectors", total=None):
            tuned_dense(head, dense, out, batch=batch_size, head_dir=head_dir)
        return None
