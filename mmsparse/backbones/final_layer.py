"""The final layer of a dual encoder's towers, run on its stored input (joint, VDR).

Song et al. (CIKM 2025, §2, Fig. 1) tune "the final layer of each dense encoder" with the sparse
head. To train without running images through the backbone at every step, `encode-dense
--final-layer-inputs` stores what enters that layer (dataset `final_input`, captions also
`final_mask`), and `FinalLayer` — a copy of the layer built from a JSON description — maps those
inputs to the pooled pre-projection state p, so vectors = normalize(projection(p)); its
per-position outputs before pooling (`FinalLayer.positions`) are what VDR's heads max-pool.

What "final layer" is, per tower kind (`final_layer_spec` refuses any other tower):
  bert          text towers with `encoder.layer` (BERT, RoBERTa, MiniLM, ...): the last transformer
                layer and the pooler (dense + tanh of [CLS]; the [CLS] state where there is none).
                Input: hidden states entering the last layer [L, h] (L = max caption tokens) and
                the attention mask [L].
  efficientnet  EfficientNet image towers: the top 1x1 convolution, its batch norm (running
                statistics kept frozen), activation and the global pooling. Input: the feature map
                that feeds the top convolution [C, H, W] (EfficientNet-Lite0 at 224 px: 320 x 7 x 7).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from ..errors import InputError

KINDS = {"bert": "last transformer layer + pooler", "efficientnet": "top conv + batch norm + activation + pooling"}


def _class_path(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__name__}"


def _load_class(path: str):
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def final_layer_spec(tower, modality: str) -> dict:
    """JSON description of `tower`'s final layer (kind, module names, config; no weights).
    tower: a transformers text or vision model; modality: "text" | "image". Raises InputError
    naming the tower class when its final layer is not one of KINDS."""
    cfg = getattr(tower, "config", None)
    enc = getattr(tower, "encoder", None)
    if modality == "text" and isinstance(getattr(enc, "layer", None), nn.ModuleList) and cfg is not None:
        n = len(enc.layer)
        pooler = getattr(tower, "pooler", None)
        return {"kind": "bert", "modality": "text", "tower_config": cfg.to_dict(),
                "layer_class": _class_path(enc.layer[-1]), "pooler_class": _class_path(pooler) if pooler else None,
                "modules": [f"encoder.layer.{n - 1}"] + (["pooler"] if pooler else []),
                "input": f"hidden states entering encoder.layer.{n - 1} [L, {cfg.hidden_size}] + attention mask"}
    if modality == "image" and enc is not None and hasattr(enc, "top_conv") and cfg is not None:
        conv = enc.top_conv
        return {"kind": "efficientnet", "modality": "image", "in_channels": int(conv.in_channels),
                "out_channels": int(conv.out_channels), "eps": float(enc.top_bn.eps),
                "activation": str(cfg.hidden_act), "pooling": str(getattr(cfg, "pooling_type", "mean")),
                "modules": ["encoder.top_conv", "encoder.top_bn", "encoder.top_activation", "pooler"],
                "input": f"feature map entering encoder.top_conv [{conv.in_channels}, H, W]"}
    raise InputError(f"{type(tower).__name__}: no known final layer for a {modality} tower (mmsparse knows "
                     f"{', '.join(f'{k}: {v}' for k, v in KINDS.items())}); train joint heads with "
                     "--dense-side pre-projection (projections only) instead")


def entry_module(tower, spec: dict) -> nn.Module:
    """The module of `tower` whose input `encode-dense --final-layer-inputs` stores."""
    return tower.encoder.layer[-1] if spec["kind"] == "bert" else tower.encoder.top_conv


class FinalLayer(nn.Module):
    """A tower's final layer, built from `final_layer_spec`'s description (weights: load_from).

    forward(x, mask=None) -> p [B, h] float32, the pooled pre-projection state, = pool(positions(x, mask)):
      bert:         x [B, L, h] hidden states entering the last layer, mask [B, L] (1 = token)
      efficientnet: x [B, C, H, W] the feature map entering the top convolution
    positions(x, mask) -> the per-position outputs before pooling (VDR pools them itself).
    Batch norm always runs on its frozen running statistics (train() leaves it in eval mode), so a
    training batch's statistics never enter the dense vectors. Dropout of the transformer layer
    follows train()/eval() as in fine-tuning.
    """

    def __init__(self, spec: dict):
        super().__init__()
        self.spec = dict(spec)
        if spec["kind"] == "bert":
            from transformers import AutoConfig

            tc = dict(spec["tower_config"])
            self.tcfg = AutoConfig.for_model(tc.pop("model_type"), **tc)
            self.tcfg._attn_implementation = "eager"   # standalone layers get no dispatch; eager is exact
            layer_cls = _load_class(spec["layer_class"])
            try:
                self.layer = layer_cls(self.tcfg, layer_idx=int(self.tcfg.num_hidden_layers) - 1)
            except TypeError:  # layer classes without layer_idx
                self.layer = layer_cls(self.tcfg)
            self.pooler = _load_class(spec["pooler_class"])(self.tcfg) if spec.get("pooler_class") else None
        elif spec["kind"] == "efficientnet":
            from transformers.activations import ACT2FN

            cin, cout = int(spec["in_channels"]), int(spec["out_channels"])
            self.conv = nn.Conv2d(cin, cout, kernel_size=1, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=float(spec["eps"]))
            self.act = ACT2FN[spec["activation"]]
            self.bn.eval()
        else:
            raise InputError(f"final layer kind {spec['kind']!r}: unknown; known: {', '.join(KINDS)}")

    @classmethod
    def from_tower(cls, tower, modality: str) -> FinalLayer:
        """A copy of `tower`'s final layer with its weights (InputError as final_layer_spec)."""
        layer = cls(final_layer_spec(tower, modality))
        layer.load_from(tower)
        return layer

    def load_from(self, tower) -> None:
        """Copy the weights of `tower`'s final layer into this one."""
        if self.spec["kind"] == "bert":
            self.layer.load_state_dict(tower.encoder.layer[-1].state_dict())
            if self.pooler is not None:
                self.pooler.load_state_dict(tower.pooler.state_dict())
        else:
            self.conv.load_state_dict(tower.encoder.top_conv.state_dict())
            self.bn.load_state_dict(tower.encoder.top_bn.state_dict())

    def train(self, mode: bool = True) -> FinalLayer:
        super().train(mode)
        if self.spec["kind"] == "efficientnet":
            self.bn.eval()
        return self

    def positions(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final layer's per-position outputs, before the tower's pooling (what VDR pools):
          bert:         x [B, L, h], mask [B, L] -> (token states [B, L', h] float32, mask [B, L'] int64),
                        L' = the batch's longest row (right padding: later positions are masked anyway)
          efficientnet: x [B, C, H, W] -> (activations [B, H·W, C_out] float32, positions row-major, None)
        Equal to the tower's `last_hidden_state` (token_states / patch_states of encode-dense)."""
        x = x.float()
        if self.spec["kind"] == "efficientnet":
            return self.act(self.bn(self.conv(x))).flatten(2).transpose(1, 2), None
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        n = max(1, int(mask.sum(1).max()))
        x, mask = x[:, :n], mask[:, :n].long()
        h = self.layer(x, attention_mask=_attention_mask(self.tcfg, x, mask))
        return (h[0] if isinstance(h, tuple) else h), mask

    def pool(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The tower's own pooling of `positions` output -> p [B, h] float32: bert the pooler of the
        [CLS] state (the state itself where there is none); efficientnet the mean (or max) over positions."""
        if self.spec["kind"] == "efficientnet":
            return h.amax(dim=1) if self.spec["pooling"] == "max" else h.mean(dim=1)
        return self.pooler(h) if self.pooler is not None else h[:, 0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """p [B, h] float32: pool(positions(x, mask)), the pooled pre-projection state."""
        return self.pool(*self.positions(x, mask))


def _attention_mask(config, x: torch.Tensor, mask: torch.Tensor):
    """The mask a transformers layer takes: the library's own builder where it has one (5.x), else
    the additive [B, 1, 1, L] mask of 4.x."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:
        return (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    return create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=mask)
