"""BM25-V as a Method: a top-k sparse autoencoder trained on patch features (visual words, §3.3,
§3.6), and images sparsified into bags of visual words (eq. 6-8, §3.4) that `index --weighting
bm25` serves with Okapi BM25 and `search --rerank-dense` reranks densely.

No captions are involved: training reads only TRAIN_IMAGES' patch_states, there is no validation
(the last epoch is saved), and the vocabulary is the SAE's e·D visual words (vw00042, ...).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ...errors import InputError
from ...formats.dense import read_dense_attrs
from ..base import Method, Sparsified
from .config import BM25VConfig
from .data import patch_moments, patch_shape, shuffled_batches
from .head import SAEHead
from .pooling import QUANT_SCALE, sparsify_patches


class BM25V(Method):
    """BM25-V's visual words (an SAE head) and their image documents."""

    name = "bm25v"
    config_class = BM25VConfig
    head_class = SAEHead
    query_modes = ()
    batch_size = 128            # images per SAE pass at sparsify time (memory ~ images x P x e·D x 4 bytes)
    compat_keys = ("backbone", "model", "patch_layer")

    def setup(self, inputs, progress=None):
        cfg = self.cfg
        path = inputs.train_images
        attrs = read_dense_attrs(path)
        if attrs.get("modality") != "image":
            raise InputError(f"{path}: modality={attrs.get('modality')!r}; the SAE trains on image patches")
        n, p, d = patch_shape(path)
        if not 0 <= cfg.patch_skip < p:
            raise InputError(f"--patch-skip {cfg.patch_skip}: {path} has only {p} patch positions")
        self.path, self.shape = Path(path), (n, p - cfg.patch_skip, d)
        self.training = {k: attrs.get(k) for k in ("backbone", "model", "dataset", "split", "patch_layer")}
        if attrs.get("model_fingerprint"):  # (absent from older files: their checkpoints still resume)
            self.training["model_fingerprint"] = attrs["model_fingerprint"]
        self.training.update(train_images=str(Path(path).resolve()), images=n, patches_per_image=p - cfg.patch_skip,
                             patches=n * (p - cfg.patch_skip))
        self.fingerprint = {"inputs": dict(self.training)}
        torch.manual_seed(cfg.seed)
        head = SAEHead.create(d, cfg.sae_expansion, cfg.sae_k, cfg.sae_lambda, cfg.patch_skip, self.training)
        if progress is not None:
            progress.log(f"train-head bm25v: {n} images x {p - cfg.patch_skip} patches, D={d}, vocabulary "
                         f"eD={head.config['vocab_size']} visual words, k={cfg.sae_k}, λ={cfg.sae_lambda}")
        self.fired = torch.zeros(head.config["vocab_size"], dtype=torch.bool)
        return head, self.path, None

    def place(self, data, device):
        return data   # patches stream from disk; loss() moves each batch

    def prepare(self, head, train) -> None:
        """b_d <- the mean patch, input scale s <- sqrt(E||z - mean||² / D), one streaming pass."""
        mean, scale, _ = patch_moments(train, 1024, self.cfg.patch_skip)
        with torch.no_grad():
            head.input_scale.fill_(scale)
            head.b_dec.copy_(torch.from_numpy(mean / scale))

    def steps_per_epoch(self, train) -> int:
        n, p, _ = self.shape
        return math.ceil(n * p / self.cfg.batch_size)

    def start_epoch(self, epoch: int) -> None:
        self.fired.zero_()

    def batches(self, train, generator, epoch: int):
        # the numpy shuffle is seeded from the trainer's generator, so a resumed run draws the same
        rng = np.random.default_rng(int(torch.randint(2 ** 62, (1,), generator=generator)))
        yield from shuffled_batches(train, self.cfg.batch_size, rng, self.cfg.sae_buffer_images, 1024,
                                    self.cfg.patch_skip)

    def loss(self, head, batch, step, generator, device):
        """||x̂ - x||² + λ||h||_1 per patch, averaged (head.loss)."""
        loss, fig = head.loss(torch.from_numpy(batch).to(device))
        self.fired[fig["idx"].unique().cpu()] = True
        return loss, {"mse": fig["mse"], "l1": fig["l1"], "rel_mse": fig["mse"] / self.shape[2]}

    def after_step(self, head) -> None:
        head.normalize_decoder()

    def epoch_figures(self) -> dict:
        return {"alive": float(self.fired.float().mean())}

    def epoch_line(self, r: dict) -> str:
        return (f"epoch {r['epoch']}: loss {r['loss']:.4f} rel. mse {r['rel_mse']:.3f} l1 {r['l1']:.2f} "
                f"alive {100 * r['alive']:.1f}% ({r['seconds']:.0f}s)")

    @classmethod
    def query_mode(cls, modality, query_mode, path) -> str:
        if modality != "image":
            raise InputError(f"{path}: modality={modality!r}; BM25-V heads sparsify images (their patch_states); "
                             "queries are images too (search --exclude-self)")
        return super().query_mode(modality, query_mode, path)

    @classmethod
    def sparsify(cls, head, head_dir, dense, out, mode, options, batch_size, progress):
        """Per image: SAE activations of every patch (eq. 6), sum-pooled (eq. 7), top-k_post
        (eq. 8), uint16-quantised ×100 (§3.4)."""
        n = patch_shape(dense)[0]
        with progress.task("sparsify bm25v", total=n) as bar:
            ids, m = sparsify_patches(head, dense, int(options["k_post"]), batch_size, bool(options["quantize"]),
                                      lambda done: bar.update(completed=done))
        progress.log(f"sparsify bm25v: {int((m.getnnz(axis=0) > 0).sum())} of {m.shape[1]} visual words used")
        return Sparsified(ids, m, None, {"k_post": int(options["k_post"]), "sae_k": int(head.config["k"]),
                                         "quantization": f"uint16 x{QUANT_SCALE}" if options["quantize"] else "none"})
