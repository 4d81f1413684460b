"""VDR over the towers' final layers: checks and initialisation that need the backbone.

check_layers: the final layers rebuilt from the model reproduce the stored vectors (the file was
encoded by this model). position_width: h of a tower's position states. init_image_from_words: the
image head's W from the dense model's own word vectors (`--vdr-image-init words`, not in the paper).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import InputError
from ...progress import reporter
from ..towers import FLAG


def _rows(states, n: int):
    x, m = states.read(0, min(n, states.n))
    return torch.from_numpy(np.asarray(x, dtype=np.float32)), (None if m is None else torch.from_numpy(m.astype(np.int64)))


@torch.no_grad()
def check_layers(layers: dict, proj: dict, split, tol: float = 5e-3) -> None:
    """InputError unless normalize(W_side · final_side(x) (+ b)) of the first 64 rows of each file of
    `split` (data.Split over final_input) equals its stored `vectors` within `tol` (float16 inputs):
    layers {"text", "image"}: FinalLayer copies; proj: the backbone's projections (may be empty
    where the towers have none, e.g. SigLIP)."""
    for side, states in (("text", split.captions), ("image", split.images)):
        if not states.n:
            continue
        x, m = _rows(states, 64)
        p = layers[side].eval()(x, m)
        w = proj.get(f"{side}_proj_weight")
        if w is not None:
            p = p @ torch.as_tensor(np.asarray(w), dtype=torch.float32).T
            if f"{side}_proj_bias" in proj:
                p = p + torch.as_tensor(np.asarray(proj[f"{side}_proj_bias"]), dtype=torch.float32)
        want = torch.from_numpy(np.asarray(states.f["vectors"][:len(x)], dtype=np.float32))
        err = float((F.normalize(p, dim=-1) - want).abs().max())
        if err > tol:
            raise InputError(f"{states.path}: the {side} final layer reproduces `vectors` only within {err:.3g}; the "
                             f"model is not the one that encoded the file: re-encode with {FLAG}")


@torch.no_grad()
def position_width(layers: dict | None, states, side: str) -> int:
    """h of the position states a tower's DST head reads: the stored states' width, or the width
    of the final layer's per-position outputs (run on one stored row)."""
    if layers is None:
        return states.hidden
    x, m = _rows(states, 1)
    return int(layers[side].eval().positions(x, m)[0].shape[-1])


@torch.no_grad()
def init_image_from_words(head, backbone, split, progress=None, batch: int = 512) -> None:
    """`--vdr-image-init words`: W_img[v] = P_imgᵀ t_v, t_v the dense text vector [d] of term v alone
    (WordPiece's "##" dropped) through the text tower, P_img [d, h_img] the image projection (the
    identity where the towers have none and d = h_img), then scaled so the image head's
    pre-activations W·LN(x_l) on the first 64 training images spread (std) as the text head's do on
    the first 64 captions; b_img = 0. Each image position starts as a zero-shot detector of the
    words the dense model aligns with it. InputError when no such projection exists."""
    terms = [t[2:] if t.startswith("##") and len(t) > 2 else t for t in head.vocab]
    vecs = []
    with reporter(progress).task("vdr: word vectors for the image head", total=len(terms)) as bar:
        for s in range(0, len(terms), batch):
            vecs.append(torch.from_numpy(backbone.encode_texts(terms[s:s + batch])))
            bar.advance(min(batch, len(terms) - s))
    t = F.normalize(torch.cat(vecs).float(), dim=-1)                           # [|V|, d]
    proj = backbone.projections().get("image_proj_weight")
    h_img = head.image.proj.weight.shape[1]
    if proj is None and t.shape[1] != h_img:
        raise InputError(f"--vdr-image-init words: the backbone has no image projection and d={t.shape[1]} != "
                         f"h_img={h_img}; use --vdr-image-init random")
    w = t @ torch.as_tensor(np.asarray(proj), dtype=torch.float32) if proj is not None else t
    spread = {}
    for side, states in (("text", split.captions), ("image", split.images)):
        x, m = _rows(states, 64)
        pos, pm = head.positions(x, side, m)
        ln = F.layer_norm(pos.float(), (pos.shape[-1],))
        tower = head.tower(side)
        u = ln @ (w if side == "image" else tower.proj.weight).T
        keep = torch.ones(u.shape[:2], dtype=torch.bool) if pm is None else pm.bool()
        spread[side] = float(u[keep].std())
    head.image.proj.weight.copy_(w * (spread["text"] / max(spread["image"], 1e-12)))
    head.image.proj.bias.zero_()
    head.config["image_init"] = "words"
