"""The dense side a method tunes from stored final-layer inputs: copies of the towers' final
layers (mmsparse/backbones/final_layer.py) and of their projections, with a learnable temperature.
One mechanism for every method that tunes them: joint (Song et al., CIKM 2025, §2: "the final layer
of each dense encoder"), VDR (Zhou et al., ICLR 2024: its encoders are trained) and the dense
baseline trained alike (methods/dense).

`encode-dense --final-layer-inputs` stores what enters each final layer (`final_input`, captions
also `final_mask`); `read_final` reads it, `backbone_final_layers` loads the layers' weights from
the model the file names (checked by fingerprint), and `TunedTowers` gives a head those layers:

    positions(x, side, mask) -> per-position outputs [B, P, h]   (VDR max-pools these)
    pool(x, side, mask)      -> pooled pre-projection state p [B, h]
    dense(x, side, mask)     -> normalize(W_side p (+ b)) [B, d]  (joint, the dense baseline)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from ..formats._h5 import read_strings
from ..formats.dense import DenseWriter, read_dense_attrs
from ..formats.sharded import open_read  # a file or a sharded directory

FLAG = "--final-layer-inputs"
SIDES = ("image", "text")


def read_final(path: str | Path, what: str = "this method") -> tuple[np.ndarray, np.ndarray | None, dict]:
    """(final_input [N, ...] as stored (float16 by default), final_mask [N, L] uint8 or None for
    images, the file's final-layer description). Caption states are cut to the longest caption
    (positions past it are padding in every row) unless the layer pools the last position
    (description `fixed_length`: SigLIP). Raises InputError when the file lacks them, naming `what`
    needs them."""
    with open_read(path) as f:
        if "final_input" not in f:
            raise InputError(f"{path}: no 'final_input' dataset; {what} tunes the towers' final layers on their "
                             f"stored inputs: re-encode with `mmsparse encode-dense {FLAG}`")
        spec = json.loads(str(f.attrs.get("final_layer", "{}")))
        if "final_mask" in f:
            mask = f["final_mask"][()]
            n = max(1, int(mask.sum(1).max())) if len(mask) and not spec.get("fixed_length") else mask.shape[1]
            return f["final_input"][:, :n], mask[:, :n], spec
        return f["final_input"][()], None, spec


def backbone_final_layers(attrs: dict, path: str | Path) -> tuple[object, object, dict]:
    """(text FinalLayer, image FinalLayer, projection weights) of the model a final-input file names:
    loaded from its `model` path and checked against its `model_fingerprint` and `final_layer`
    description. InputError when the model is missing, changed, or has other final layers."""
    bb = final_layer_backbone(attrs, path)
    return bb.final_layer_weights("text"), bb.final_layer_weights("image"), bb.projections()


def final_layer_backbone(attrs: dict, path: str | Path):
    """The backbone (mmsparse.backbones) a final-input file names, checked as backbone_final_layers."""
    from ..backbones.base import backbone_from_attrs
    bb = backbone_from_attrs(attrs)
    want = attrs.get("model_fingerprint")
    if want and bb.fingerprint() and bb.fingerprint() != want:
        raise InputError(f"{path}: the model at {attrs['model']} is not the one that encoded this file (fingerprint "
                         f"{bb.fingerprint()} != model_fingerprint {want}); re-encode with {FLAG}")
    stored = json.loads(str(attrs.get("final_layer", "{}")))
    if stored.get("modules") and stored["modules"] != bb.final_layer_spec(attrs.get("modality", "text"))["modules"]:
        raise InputError(f"{path}: final_layer names modules {stored['modules']}, the model's are "
                         f"{bb.final_layer_spec(attrs.get('modality', 'text'))['modules']}; re-encode with {FLAG}")
    return bb


class TunedTowers:
    """Mixin for heads (nn.Module with a JSON `config`) holding copies of the towers' final layers
    and, optionally, their projections and a temperature.

    config keys: final_layers {"text": spec, "image": spec} (specs of backbones/final_layer.py;
    spec["modules"] names the backbone modules), final_layers_source {"model", "model_fingerprint"},
    final_layers_tuned (bool); image_dim, text_dim, proj_bias, tau_init (projections).
    Modules (state-dict names): text_final, image_final; image_proj, text_proj (nn.Linear [d, h]),
    log_tau (τ = exp(log_tau), >= 0.01 as CLIP clamps its logit scale).
    """

    def _build_final_layers(self) -> None:
        from ..backbones.final_layer import FinalLayer
        spec = self.config["final_layers"]
        self.text_final, self.image_final = FinalLayer(spec["text"]), FinalLayer(spec["image"])

    @property
    def has_final(self) -> bool:
        """Whether inputs are final-layer inputs run through the head's own final layers."""
        return bool(self.config.get("final_layers"))

    def set_final_layers(self, text, image, source: dict, tuned: bool) -> None:
        """Attach copies of the towers' final layers (FinalLayer with weights) and record them in
        the config (final_layers, final_layers_source, final_layers_tuned)."""
        self.config.update(final_layers={"text": text.spec, "image": image.spec}, final_layers_source=dict(source),
                           final_layers_tuned=bool(tuned))
        self.text_final, self.image_final = text, image

    def final_params(self) -> list:
        """The final layers' parameters ([] without final layers)."""
        return [*self.text_final.parameters(), *self.image_final.parameters()] if self.has_final else []

    def positions(self, x: torch.Tensor, side: str, mask: torch.Tensor | None = None):
        """Final-layer input x (text [B, L, h] with mask [B, L]; image [B, C, H, W]; any float dtype)
        -> (per-position outputs [B, P, h] float32, mask [B, P] or None); inputs unchanged (as
        float32) for heads without final layers (stored position states)."""
        if not self.has_final:
            return x.float(), mask
        return (self.text_final if side == "text" else self.image_final).positions(x, mask)

    def pool(self, x: torch.Tensor, side: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final-layer input -> pooled pre-projection state p [B, h] float32 through the final layer
        (x itself, pooled states, for heads without final layers)."""
        if not self.has_final:
            return x
        return self.text_final(x, mask) if side == "text" else self.image_final(x)

    # -- projections and temperature ----------------------------------------------------------
    def _build_projections(self) -> None:
        c = self.config
        bias = bool(c.get("proj_bias", False))
        self.image_proj = nn.Linear(int(c["image_dim"]), int(c["dim"]), bias=bias)
        self.text_proj = nn.Linear(int(c["text_dim"]), int(c["dim"]), bias=bias)
        self.log_tau = nn.Parameter(torch.tensor(math.log(float(c.get("tau_init", 0.05)))))

    def set_projections(self, proj: dict, tau_init: float) -> None:
        """Build the projections from the backbone's: proj {"image_proj_weight" [d, h_img],
        "text_proj_weight" [d, h_txt], optional "*_proj_bias" [d]} (numpy or torch); records
        image_dim, text_dim, proj_bias, tau_init in the config. ValueError when the outputs differ."""
        w_img = torch.as_tensor(np.asarray(proj["image_proj_weight"]), dtype=torch.float32)
        w_txt = torch.as_tensor(np.asarray(proj["text_proj_weight"]), dtype=torch.float32)
        if w_img.shape[0] != w_txt.shape[0]:
            raise ValueError(f"projection outputs differ: image {tuple(w_img.shape)}, text {tuple(w_txt.shape)}")
        bias = "image_proj_bias" in proj and "text_proj_bias" in proj
        self.config.update(image_dim=int(w_img.shape[1]), text_dim=int(w_txt.shape[1]), proj_bias=bias,
                           tau_init=float(tau_init))
        self._build_projections()
        with torch.no_grad():
            self.image_proj.weight.copy_(w_img)
            self.text_proj.weight.copy_(w_txt)
            if bias:
                self.image_proj.bias.copy_(torch.as_tensor(np.asarray(proj["image_proj_bias"])))
                self.text_proj.bias.copy_(torch.as_tensor(np.asarray(proj["text_proj_bias"])))

    def proj_params(self) -> list:
        return [*self.image_proj.parameters(), *self.text_proj.parameters()]

    @property
    def tau(self) -> torch.Tensor:
        """Dense temperature τ (scalar tensor, >= 0.01)."""
        return self.log_tau.exp().clamp(min=0.01)

    def project(self, pre: torch.Tensor, modality: str) -> torch.Tensor:
        """pre [B, h_img or h_txt] float32 -> h [B, d] float32, L2-normalised (the tuned dense vectors)."""
        if modality not in SIDES:
            raise ValueError(f"modality {modality!r} not in {SIDES}")
        lin = self.image_proj if modality == "image" else self.text_proj
        return F.normalize(lin(pre), dim=-1)

    def dense(self, x: torch.Tensor, modality: str, mask: torch.Tensor | None = None) -> torch.Tensor:
        """h [B, d] float32, L2-normalised: project(pool(x)) (final-layer heads) or project(x)."""
        return self.project(self.pool(x, modality, mask), modality)


def tuned_dense(head, src: str | Path, out: str | Path, batch: int = 512, head_dir: str | Path | None = None) -> Path:
    """Write a TunedTowers head's dense vectors [N, d] float32 of `src` (images or captions) to `out`:
    same ids / texts / image_ids / attributes, vectors = head.dense(final_input, final_mask) for
    heads with final layers, head.project(pre_projection) otherwise. Returns `out`. Raises
    InputError when `src` lacks those states (naming the encode-dense flag that stores them)."""
    attrs = read_dense_attrs(src)
    modality = attrs["modality"]
    keep = {k: attrs[k] for k in ("modality", "backbone", "model", "model_fingerprint", "dataset", "split")
            if k in attrs}
    keep.update(normalized=True, states_source=str(Path(src).resolve()),
                tuned_head=str(Path(head_dir).resolve()) if head_dir else "")
    final = head.has_final
    key = "final_input" if final else "pre_projection"
    with open_read(src) as f:
        if key not in f:
            how = f"encode-dense {FLAG}" if final else "encode-dense --pre-projection"
            raise InputError(f"{src}: no {key!r} dataset; this joint head recomputes dense vectors from it: use the "
                             f"file written by `{how}`")
        n = f["ids"].shape[0]
        texts, img_ids = "texts" in f, "image_ids" in f
        masked = final and "final_mask" in f
        with DenseWriter(out, head.dim, keep, with_texts=texts) as w:
            for s in range(0, n, batch):
                x = torch.from_numpy(f[key][s:s + batch])
                m = torch.from_numpy(f["final_mask"][s:s + batch]) if masked else None
                with torch.no_grad():
                    h = (head.dense(x, modality, m) if final else head.project(x.float(), modality)).numpy()
                w.append(read_strings(f["ids"][s:s + batch]), h,
                         read_strings(f["texts"][s:s + batch]) if texts else None,
                         read_strings(f["image_ids"][s:s + batch]) if img_ids else None)
    return Path(out)
