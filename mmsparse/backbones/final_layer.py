"""The final layer of a dual encoder's towers, run on its stored input (joint, VDR).

Song et al. (CIKM 2025, §2, Fig. 1) tune "the final layer of each dense encoder" with the sparse
head. To train without running images through the backbone at every step, `encode-dense
--final-layer-inputs` stores what enters that layer (dataset `final_input`, captions also
`final_mask`), and `FinalLayer` — a copy of the layer built from a JSON description — maps those
inputs to the pooled pre-projection state p, so vectors = normalize(projection(p)); its
per-position outputs before pooling (`FinalLayer.positions`, the tower's `last_hidden_state`) are
what VDR's heads max-pool.

What "final layer" is, per tower kind (`final_layer_spec` refuses any other tower):
  bert          text towers with `encoder.layer` (BERT, RoBERTa, MiniLM, BLIP's text encoder, ALBEF's
                text-only BERT layers): the last transformer layer (its cross-attention, BLIP's, is left
                out: the dual encoder never runs it) and the pooler (dense + tanh of [CLS]; the [CLS]
                state where there is none). Input: hidden states entering the last layer [L, h]
                (L = max caption tokens) and the attention mask [L].
  efficientnet  EfficientNet image towers: the top 1x1 convolution, its batch norm (running
                statistics kept frozen), activation and the global pooling. Input: the feature map
                that feeds the top convolution [C, H, W] (EfficientNet-Lite0 at 224 px: 320 x 7 x 7).
  vit           ViT image towers (CLIP, SigLIP, BLIP vision models; transformers' ViTModel, ALBEF's
                ViT-B/16): the last encoder block, the post-layernorm and the tower's pooling. Input:
                the hidden states entering the last block [P, h] (P = patches + 1 with [CLS]; SigLIP
                has no [CLS]). Per position: the block's output, after the post-layernorm where the
                tower applies it to the sequence (BLIP, SigLIP, ViT) and before it where the tower
                applies it to the pooled [CLS] only (CLIP). Pooling: [CLS] (BLIP, ALBEF: the ITC
                path's last_hidden_state[:, 0]); post-layernorm of [CLS] (CLIP); SigLIP's
                attention-pooling head (probe attention + layernorm + MLP).
  clip-text     CLIP text transformers: the last encoder layer under the causal mask, the final
                layernorm, and the EOS token's state (the caption's last token, where CLIP's
                tokenizer puts it). Input: hidden states entering the last layer [L, h] + mask [L].
  siglip-text   SigLIP text transformers: the last encoder layer, the final layernorm and the
                tower's head (a linear map of the last position's state). Input as clip-text, but
                rows keep all L positions (spec `fixed_length`): captions are padded to max_length and
                SigLIP pools the last position, padding or not.
Text kinds record `attend_padding` (the tower was given no attention mask, as with SigLIP's own
tokenizer: every position attends to every other); `final_mask` still marks the real tokens.
"""

from __future__ import annotations

import importlib
import inspect

import torch
from torch import nn

from ..errors import InputError

KINDS = {"bert": "last transformer layer + pooler",
         "efficientnet": "top conv + batch norm + activation + pooling",
         "vit": "last ViT block + post-layernorm + the tower's pooling ([CLS] or SigLIP's attention head)",
         "clip-text": "last CLIP text layer (causal) + final layernorm + EOS token",
         "siglip-text": "last SigLIP text layer + final layernorm + head of the last position"}

# ViT towers by config.model_type: (post-layernorm module, where it applies, pooling)
VIT_TOWERS = {"clip_vision_model": ("post_layernorm", "pooled", "cls"),
              "blip_vision_model": ("post_layernorm", "sequence", "cls"),
              "siglip_vision_model": ("post_layernorm", "sequence", "attention"),
              "vit": ("layernorm", "sequence", "cls")}
TEXT_TOWERS = {"clip_text_model": "clip-text", "siglip_text_model": "siglip-text"}


def _class_path(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__name__}"


def _load_class(path: str):
    mod, _, name = path.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def _blocks(tower) -> tuple[str, nn.ModuleList] | None:
    """(name, blocks) of a transformer tower's layer list: encoder.layers (CLIP, SigLIP, BLIP), layers
    (ViTModel in transformers 5) or encoder.layer (ViTModel in 4.x)."""
    for name in ("encoder.layers", "layers", "encoder.layer"):
        try:
            mods = tower.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(mods, nn.ModuleList) and len(mods):
            return name, mods
    return None


def final_layer_spec(tower, modality: str, attend_padding: bool = False) -> dict:
    """JSON description of `tower`'s final layer (kind, module names, config; no weights).
    tower: a transformers text or vision model; modality: "text" | "image"; attend_padding: the
    text tower runs without an attention mask (text kinds). Raises InputError naming the tower
    class when its final layer is not one of KINDS."""
    cfg = getattr(tower, "config", None)
    enc = getattr(tower, "encoder", None)
    mt = str(getattr(cfg, "model_type", ""))
    if modality == "text" and isinstance(getattr(enc, "layer", None), nn.ModuleList) and cfg is not None:
        n = len(enc.layer)
        pooler = getattr(tower, "pooler", None)
        extra = {"attend_padding": True, "fixed_length": True} if attend_padding else {}
        return {"kind": "bert", "modality": "text", "tower_config": cfg.to_dict(),
                "layer_class": _class_path(enc.layer[-1]), "pooler_class": _class_path(pooler) if pooler else None,
                "modules": [f"encoder.layer.{n - 1}"] + (["pooler"] if pooler else []), **extra,
                "input": f"hidden states entering encoder.layer.{n - 1} [L, {cfg.hidden_size}] + attention mask"}
    if modality == "image" and enc is not None and hasattr(enc, "top_conv") and cfg is not None:
        conv = enc.top_conv
        return {"kind": "efficientnet", "modality": "image", "in_channels": int(conv.in_channels),
                "out_channels": int(conv.out_channels), "eps": float(enc.top_bn.eps),
                "activation": str(cfg.hidden_act), "pooling": str(getattr(cfg, "pooling_type", "mean")),
                "modules": ["encoder.top_conv", "encoder.top_bn", "encoder.top_activation", "pooler"],
                "input": f"feature map entering encoder.top_conv [{conv.in_channels}, H, W]"}
    blocks = _blocks(tower) if cfg is not None else None
    if blocks is not None and (modality == "image" and mt in VIT_TOWERS or modality == "text" and mt in TEXT_TOWERS):
        return _transformer_spec(tower, modality, blocks, attend_padding)
    what = "an image" if modality == "image" else "a text"
    raise InputError(f"{type(tower).__name__}: no known final layer for {what} tower (mmsparse knows "
                     f"{', '.join(f'{k}: {v}' for k, v in KINDS.items())}); train joint heads with "
                     "--dense-side pre-projection (projections only) instead")


def _transformer_spec(tower, modality: str, blocks: tuple[str, nn.ModuleList], attend_padding: bool) -> dict:
    """final_layer_spec of a ViT (kind vit) or CLIP/SigLIP text tower: the last of `blocks`, the norm
    after it and (SigLIP) the pooling head, by the module names in `parts`."""
    cfg, mt = tower.config, tower.config.model_type
    name, layers = blocks
    parts = {"layer": f"{name}.{len(layers) - 1}"}
    if modality == "image":
        parts["norm"], norm_on, pooling = VIT_TOWERS[mt]
        kind, extra = "vit", {"norm_on": norm_on, "pooling": pooling}
        entering = f"[P, {cfg.hidden_size}] (P = patches{'' if mt.startswith('siglip') else ' + 1 with [CLS]'})"
    else:
        kind, parts["norm"] = TEXT_TOWERS[mt], "final_layer_norm"
        extra = {"attend_padding": bool(attend_padding), "fixed_length": kind == "siglip-text"}
        entering = f"[L, {cfg.hidden_size}] + attention mask"
    if kind == "siglip-text" or extra.get("pooling") == "attention":   # SigLIP pools with its own head
        head = getattr(tower, "head", None)
        if head is None:
            raise InputError(f"{type(tower).__name__}: its pooling head is missing (vision_use_head=False?); "
                             "mmsparse pools SigLIP towers with their head")
        parts["head"] = "head"
        extra["head_class"] = _class_path(head)
        if isinstance(head, nn.Linear):
            extra["head_features"] = [int(head.in_features), int(head.out_features)]
    return {"kind": kind, "modality": modality, "tower_config": cfg.to_dict(),
            "layer_class": _class_path(layers[-1]), "norm_eps": float(tower.get_submodule(parts["norm"]).eps),
            "parts": parts, "modules": list(parts.values()), **extra,
            "input": f"hidden states entering {parts['layer']} {entering}"}


def parts(spec: dict) -> dict[str, str]:
    """{FinalLayer submodule: the tower's module it copies} of a description (names relative to the
    tower, as final_layer_spec made them; specs of bert/efficientnet predate the `parts` field)."""
    if "parts" in spec:
        return dict(spec["parts"])
    if spec["kind"] == "efficientnet":
        return {"conv": "encoder.top_conv", "bn": "encoder.top_bn"}
    n = int(spec["tower_config"]["num_hidden_layers"])
    return {"layer": f"encoder.layer.{n - 1}", **({"pooler": "pooler"} if spec.get("pooler_class") else {})}


def entry_module(tower, spec: dict) -> nn.Module:
    """The module of `tower` whose input `encode-dense --final-layer-inputs` stores."""
    p = parts(spec)
    return tower.get_submodule(p["conv"] if spec["kind"] == "efficientnet" else p["layer"])


class InputCapture:
    """Context manager: the first positional input (or `hidden_states`) of `module`'s forward, kept in
    `self.x` (the final layer's input while the tower runs); on=False captures nothing."""

    def __init__(self, module, on: bool):
        self.module, self.on, self.x = module, on, None

    def _hook(self, _mod, args, kwargs):
        self.x = args[0] if args else kwargs["hidden_states"]

    def __enter__(self):
        self.handle = self.module.register_forward_pre_hook(self._hook, with_kwargs=True) if self.on else None
        return self

    def __exit__(self, *exc):
        if self.handle is not None:
            self.handle.remove()


def _build_layer(path: str, config) -> nn.Module:
    """A transformer layer of class `path` for `config` as the last of its tower (layer index)."""
    cls = _load_class(path)
    params = list(inspect.signature(cls.__init__).parameters)
    idx = int(config.num_hidden_layers) - 1
    if "layer_idx" in params:
        return cls(config, layer_idx=idx)
    return cls(config, idx) if len(params) > 2 else cls(config)   # BlipTextLayer(config, layer_num)


def _run_layer(layer: nn.Module, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """One transformer layer's output [B, L, h] (4.x layers return tuples; vision layers of some
    towers take no mask)."""
    kw = {"attention_mask": attention_mask} if "attention_mask" in inspect.signature(layer.forward).parameters else {}
    h = layer(x, **kw)
    return h[0] if isinstance(h, tuple) else h


def _copy(src: nn.Module, dst: nn.Module, keys, what: str) -> None:
    """dst's weights `keys` (a FinalLayer part's: a tower's layer may hold more, BLIP's
    cross-attention, left out of the copy) <- src's. InputError if either side lacks one."""
    have, want = src.state_dict(), dst.state_dict()
    missing = [k for k in keys if k not in have or k not in want]
    if missing:
        raise InputError(f"{what}: {', '.join(missing[:3])} missing; it is not the layer the description names")
    dst.load_state_dict({k: have[k] for k in keys}, strict=False)


class FinalLayer(nn.Module):
    """A tower's final layer, built from `final_layer_spec`'s description (weights: load_from).

    forward(x, mask=None) -> p [B, h] float32, the pooled pre-projection state, = pool(positions(x, mask)):
      bert, clip-text, siglip-text: x [B, L, h] hidden states entering the last layer, mask [B, L] (1 = token)
      efficientnet: x [B, C, H, W] the feature map entering the top convolution
      vit:          x [B, P, h] the hidden states entering the last block
    positions(x, mask) -> the per-position outputs before pooling (VDR pools them itself).
    Submodules (their names are the head's state-dict keys): bert `layer`, `pooler`; efficientnet
    `conv`, `bn`; vit and the text transformers `layer`, `norm` and (SigLIP) `head`.
    Batch norm always runs on its frozen running statistics (train() leaves it in eval mode), so a
    training batch's statistics never enter the dense vectors. Dropout of the transformer layer
    follows train()/eval() as in fine-tuning.
    """

    def __init__(self, spec: dict):
        super().__init__()
        self.spec = dict(spec)
        kind = spec["kind"]
        if kind == "efficientnet":
            from transformers.activations import ACT2FN

            cin, cout = int(spec["in_channels"]), int(spec["out_channels"])
            self.conv = nn.Conv2d(cin, cout, kernel_size=1, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=float(spec["eps"]))
            self.act = ACT2FN[spec["activation"]]
            self.bn.eval()
            return
        if kind not in KINDS:
            raise InputError(f"final layer kind {kind!r}: unknown; known: {', '.join(KINDS)}")
        from transformers import AutoConfig

        tc = dict(spec["tower_config"])
        self.tcfg = AutoConfig.for_model(tc.pop("model_type"), **tc)
        self.tcfg._attn_implementation = "eager"   # standalone layers get no dispatch; eager is exact
        if kind == "bert":   # the dual encoder runs its text tower as an encoder: no cross-attention
            self.tcfg.is_decoder, self.tcfg.add_cross_attention = False, False
        self.layer = _build_layer(spec["layer_class"], self.tcfg)
        if kind == "bert":
            self.pooler = _load_class(spec["pooler_class"])(self.tcfg) if spec.get("pooler_class") else None
            return
        self.norm = nn.LayerNorm(int(self.tcfg.hidden_size), eps=float(spec["norm_eps"]))
        if spec.get("head_class"):
            cls = _load_class(spec["head_class"])
            self.head = nn.Linear(*spec["head_features"]) if cls is nn.Linear else cls(self.tcfg)

    @classmethod
    def from_tower(cls, tower, modality: str) -> FinalLayer:
        """A copy of `tower`'s final layer with its weights (InputError as final_layer_spec)."""
        layer = cls(final_layer_spec(tower, modality))
        layer.load_from(tower)
        return layer

    def load_from(self, tower) -> None:
        """Copy the weights of `tower`'s final layer into this one (InputError if it has other modules)."""
        for own, name in parts(self.spec).items():
            mine = getattr(self, own)
            _copy(tower.get_submodule(name), mine, mine.state_dict(), f"{type(tower).__name__}.{name}")

    def copy_to(self, tower) -> None:
        """Write this layer's (tuned) weights into `tower`'s final layer, so the tower itself computes
        what this layer does (the inverse of load_from; the tower's other weights stay)."""
        for own, name in parts(self.spec).items():
            mine = getattr(self, own)
            _copy(mine, tower.get_submodule(name), mine.state_dict(), f"{type(tower).__name__}.{name}")

    def train(self, mode: bool = True) -> FinalLayer:
        super().train(mode)
        if self.spec["kind"] == "efficientnet":
            self.bn.eval()
        return self

    def positions(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final layer's per-position outputs, before the tower's pooling (what VDR pools):
          bert, clip-text: x [B, L, h], mask [B, L] -> (token states [B, L', h] float32, mask [B, L'] int64),
                        L' = the batch's longest row (right padding: later positions are masked anyway;
                        CLIP's causal mask never lets them reach earlier ones)
          siglip-text:  the same with L' = L (every position: SigLIP pools the last one)
          efficientnet: x [B, C, H, W] -> (activations [B, H·W, C_out] float32, positions row-major, None)
          vit:          x [B, P, h] -> (block outputs [B, P, h] float32, [CLS] first where the tower has
                        one; after the post-layernorm for BLIP, SigLIP, ViT; before it for CLIP, None)
        Equal to the tower's `last_hidden_state` (token_states / patch_states of encode-dense)."""
        x = x.float()
        kind = self.spec["kind"]
        if kind == "efficientnet":
            return self.act(self.bn(self.conv(x))).flatten(2).transpose(1, 2), None
        if kind == "vit":
            h = _run_layer(self.layer, x)
            return (self.norm(h) if self.spec["norm_on"] == "sequence" else h), None
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        mask = mask.long()
        if not self.spec.get("fixed_length"):
            n = max(1, int(mask.sum(1).max()))
            x, mask = x[:, :n], mask[:, :n]
        attend = torch.ones_like(mask) if self.spec.get("attend_padding") else mask
        am = _attention_mask(self.tcfg, x, attend, causal=kind == "clip-text")
        h = _run_layer(self.layer, x, am)
        return (h if kind == "bert" else self.norm(h)), mask

    def pool(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The tower's own pooling of `positions` output -> p [B, h] float32: bert the pooler of the
        [CLS] state (the state itself where there is none); efficientnet the mean (or max) over
        positions; vit [CLS] (CLIP: post-layernorm of [CLS]; SigLIP: its attention-pooling head);
        clip-text the last real token's state (EOS); siglip-text head(last position)."""
        kind = self.spec["kind"]
        if kind == "efficientnet":
            return h.amax(dim=1) if self.spec["pooling"] == "max" else h.mean(dim=1)
        if kind == "bert":
            return self.pooler(h) if self.pooler is not None else h[:, 0]
        if kind == "vit":
            if self.spec["pooling"] == "attention":
                return self.head(h)
            return self.norm(h[:, 0]) if self.spec["norm_on"] == "pooled" else h[:, 0]
        if kind == "siglip-text":
            return self.head(h[:, -1])
        last = (mask.sum(1) - 1).clamp(min=0)   # clip-text: positions() always returns the mask
        return h[torch.arange(h.shape[0], device=h.device), last.to(h.device)]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """p [B, h] float32: pool(positions(x, mask)), the pooled pre-projection state."""
        return self.pool(*self.positions(x, mask))


def _attention_mask(config, x: torch.Tensor, mask: torch.Tensor, causal: bool = False):
    """The mask a transformers layer takes: the library's own builder where it has one (5.x), else
    the additive mask of 4.x ([B, 1, 1, L]; causal: [B, 1, L, L])."""
    try:
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
    except ImportError:
        keep = mask[:, None, None, :].bool()
        if causal:
            keep = keep & torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        return (~keep).to(x.dtype) * torch.finfo(x.dtype).min
    if causal:
        return create_causal_mask(config=config, inputs_embeds=x, attention_mask=mask, cache=None)
    return create_bidirectional_mask(config=config, inputs_embeds=x, attention_mask=mask)
