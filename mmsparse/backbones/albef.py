"""`albef`: ALBEF's image-text contrastive (ITC) encoders from an official checkpoint.

The model directory holds the official checkpoint (ALBEF*.pth / *.pt with a "model" state dict,
or model.safetensors with the same keys), the BERT tokenizer files (bert-base-uncased,
saved with save_pretrained) and optionally albef.json {"vision_heads", "text_heads"} (default
width // 64 = 12 for the released ViT-B/16 + BERT-base). Rebuilt with transformers modules:
  vision: ViTModel (timm ViT-B/16 layout: qkv bias, LayerNorm eps 1e-6, final norm), image size
          and depth read from the checkpoint
  text:   BertModel with only the first `fusion_layer` (text-only) layers, as ALBEF's
          text_encoder(..., mode="text")
  vectors = normalize(vision_proj(ViT[CLS])), normalize(text_proj(BERT[CLS])) (d = 256)
Checkpoint keys are mapped exactly; a missing key or an unexpected key (other than the known
unused parts: momentum encoders, queues, temp, ITM/MLM heads, fusion layers) is an InputError.
Images: resize to image_res x image_res (bicubic), CLIP mean/std (ALBEF's test transform);
captions: ALBEF's pre_caption (lower-case, punctuation removed, 30 words), 30 tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import InputError
from .base import Backbone, quiet_transformers, register_backbone, resolve_model
from .hf_dual import ImagePreprocessor, _l2, _np, final_text_extras, patch_grid, token_extras

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
UNUSED = ("visual_encoder_m.", "text_encoder_m.", "vision_proj_m.", "text_proj_m.", "image_queue",
          "text_queue", "idx_queue", "queue_ptr", "temp", "itm_head.", "text_encoder.cls.",
          "text_encoder.embeddings.position_ids")


def pre_caption(caption: str, max_words: int = 30) -> str:
    """ALBEF's caption normalisation (dataset/utils.py pre_caption)."""
    c = re.sub(r"([,.'!?\"()*#:;~])", "", caption.lower()).replace("-", " ").replace("/", " ")
    c = re.sub(r"\s{2,}", " ", c.replace("<person>", "person")).strip()
    return " ".join(c.split(" ")[:max_words])


def _checkpoint_file(d: Path) -> Path:
    for pat in ("model.safetensors", "*.pth", "*.pt"):
        hits = sorted(d.glob(pat))
        if hits:
            return hits[0]
    raise InputError(f"{d}: no ALBEF checkpoint (model.safetensors, *.pth or *.pt) in the model directory")


def load_albef_state(path: Path) -> dict:
    """The checkpoint's state dict (tensors), with pretraining's 'text_encoder.bert.' prefix folded
    to 'text_encoder.' as ALBEF's Retrieval.py does."""
    import torch
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        sd = load_file(str(path))
    else:
        try:
            ck = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 — pickle/format errors all mean "not loadable"
            raise InputError(f"{path}: cannot load as a torch checkpoint ({type(e).__name__}: {e})") from None
        sd = ck.get("model", ck) if isinstance(ck, dict) else None
        if not isinstance(sd, dict):
            raise InputError(f"{path}: expected a dict with a 'model' state dict")
    return {k.replace("text_encoder.bert.", "text_encoder."): v for k, v in sd.items()}


def _need(sd: dict, key: str, path) -> "torch.Tensor":  # noqa: F821
    if key not in sd:
        raise InputError(f"{path}: checkpoint lacks {key!r}; is this an ALBEF checkpoint?")
    return sd[key]


def build_albef(sd: dict, path, vision_heads: int | None = None, text_heads: int | None = None) -> tuple:
    """(vit, bert, vision_proj, text_proj, image_res) with the checkpoint's weights loaded strictly.
    Heads default to width // 64 (ViT-B/16 and BERT-base: 12)."""
    import torch
    from transformers import BertConfig, BertModel, ViTConfig, ViTModel
    pos = _need(sd, "visual_encoder.pos_embed", path)
    patch_w = _need(sd, "visual_encoder.patch_embed.proj.weight", path)
    width, patch = int(pos.shape[-1]), int(patch_w.shape[-1])
    grid = int(round((pos.shape[1] - 1) ** 0.5))
    depth = len({k.split(".")[2] for k in sd if k.startswith("visual_encoder.blocks.")})
    mlp = int(_need(sd, "visual_encoder.blocks.0.mlp.fc1.weight", path).shape[0])
    vit = ViTModel(ViTConfig(hidden_size=width, num_hidden_layers=depth, num_attention_heads=vision_heads or width // 64,
                             intermediate_size=mlp, image_size=grid * patch, patch_size=patch, qkv_bias=True,
                             layer_norm_eps=1e-6, hidden_act="gelu"), add_pooling_layer=False)
    text_layers = sorted({int(k.split(".")[3]) for k in sd if k.startswith("text_encoder.encoder.layer.")})
    fusion = min([int(k.split(".")[3]) for k in sd
                  if k.startswith("text_encoder.encoder.layer.") and ".crossattention." in k] or [len(text_layers)])
    we = _need(sd, "text_encoder.embeddings.word_embeddings.weight", path)
    tw = int(we.shape[1])
    bert = BertModel(BertConfig(vocab_size=int(we.shape[0]), hidden_size=tw, num_hidden_layers=fusion,
                                num_attention_heads=text_heads or tw // 64,
                                intermediate_size=int(_need(sd, "text_encoder.encoder.layer.0.intermediate.dense.weight", path).shape[0]),
                                max_position_embeddings=int(_need(sd, "text_encoder.embeddings.position_embeddings.weight", path).shape[0]),
                                type_vocab_size=int(_need(sd, "text_encoder.embeddings.token_type_embeddings.weight", path).shape[0])),
                     add_pooling_layer=False)
    vp_w, tp_w = _need(sd, "vision_proj.weight", path), _need(sd, "text_proj.weight", path)
    vproj, tproj = torch.nn.Linear(vp_w.shape[1], vp_w.shape[0]), torch.nn.Linear(tp_w.shape[1], tp_w.shape[0])

    vit_sd, bert_sd, used = {}, {}, set()
    vit_sd.update({"embeddings.cls_token": sd["visual_encoder.cls_token"], "embeddings.position_embeddings": pos,
                   "embeddings.patch_embeddings.projection.weight": patch_w})
    used |= {"visual_encoder.cls_token", "visual_encoder.pos_embed", "visual_encoder.patch_embed.proj.weight"}
    # transformers 5 renamed ViT's modules; map onto whichever layout this version builds
    if "layers.0.attention.q_proj.weight" in vit.state_dict():
        layer, qkv_names = "layers", ("attention.q_proj", "attention.k_proj", "attention.v_proj")
        timm = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.o_proj",
                "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
    else:
        layer = "encoder.layer"
        qkv_names = tuple(f"attention.attention.{n}" for n in ("query", "key", "value"))
        timm = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
                "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    for k, v in sd.items():
        if k == "visual_encoder.patch_embed.proj.bias":
            vit_sd["embeddings.patch_embeddings.projection.bias"] = v
        elif k.startswith("visual_encoder.norm."):
            vit_sd["layernorm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("visual_encoder.blocks."):
            _, _, i, rest = k.split(".", 3)
            mod, p = rest.rsplit(".", 1)
            if mod == "attn.qkv":  # timm packs q, k, v row blocks into one linear
                for name, part in zip(qkv_names, v.chunk(3, dim=0)):
                    vit_sd[f"{layer}.{i}.{name}.{p}"] = part
            elif mod in timm:
                vit_sd[f"{layer}.{i}.{timm[mod]}.{p}"] = v
            else:
                continue
        elif k.startswith("text_encoder.embeddings.") and k not in UNUSED:
            bert_sd[k[len("text_encoder."):]] = v
        elif k.startswith("text_encoder.encoder.layer.") and int(k.split(".")[3]) < fusion:
            bert_sd[k[len("text_encoder."):]] = v
        else:
            continue
        used.add(k)
    for lin, pre in ((vproj, "vision_proj"), (tproj, "text_proj")):
        lin.load_state_dict({"weight": sd[f"{pre}.weight"], "bias": _need(sd, f"{pre}.bias", path)})
        used |= {f"{pre}.weight", f"{pre}.bias"}
    unexpected = [k for k in sd if k not in used and not k.startswith(UNUSED)
                  and not (k.startswith("text_encoder.encoder.layer.") and int(k.split(".")[3]) >= fusion)]
    if unexpected:
        raise InputError(f"{path}: {len(unexpected)} unexpected checkpoint key(s), e.g. {', '.join(unexpected[:3])}")
    for net, part, name in ((vit, vit_sd, "vision"), (bert, bert_sd, "text")):
        res = net.load_state_dict(part, strict=False)
        missing = [m for m in res.missing_keys if not m.endswith("position_ids")]
        if missing or res.unexpected_keys:
            raise InputError(f"{path}: {name} encoder: missing {missing[:3]} unexpected {res.unexpected_keys[:3]} "
                             f"after mapping the ALBEF keys")
    return vit.eval(), bert.eval(), vproj.eval(), tproj.eval(), grid * patch


@register_backbone("albef")
class AlbefBackbone(Backbone):
    """ALBEF ITC dual encoder (ViT-B/16 + 6-layer BERT, d = 256 for released checkpoints)."""

    def __init__(self, model_path: str, device: str = "cpu", max_length: int | None = None):
        quiet_transformers()
        from transformers import AutoImageProcessor, AutoTokenizer, ViTImageProcessor
        self.model = resolve_model(model_path)
        d = Path(self.model)
        if not d.is_dir():
            raise InputError(f"{model_path}: ALBEF model directory not found (checkpoint + tokenizer files)")
        ck = _checkpoint_file(d)
        cfg = json.loads((d / "albef.json").read_text()) if (d / "albef.json").is_file() else {}
        self.vit, self.bert, self.vproj, self.tproj, res = build_albef(
            load_albef_state(ck), ck, cfg.get("vision_heads"), cfg.get("text_heads"))
        for m in (self.vit, self.bert, self.vproj, self.tproj):
            m.to(device)
        self.device = device
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(d, local_files_only=True)
        except (OSError, ValueError) as e:
            raise InputError(f"{d}: no BERT tokenizer files beside the checkpoint ({str(e).splitlines()[0]})") from None
        if (d / "preprocessor_config.json").is_file():
            ip = AutoImageProcessor.from_pretrained(d, local_files_only=True)
        else:
            from PIL import Image
            ip = ViTImageProcessor(size={"height": res, "width": res}, resample=Image.BICUBIC,
                                   image_mean=list(MEAN), image_std=list(STD))
        self.image_preprocessor = ImagePreprocessor(ip)
        self.dim = int(self.vproj.out_features)
        self.normalized = True
        self.max_length = int(max_length) if max_length else 30

    def tokenize(self, texts):
        return super().tokenize([pre_caption(t) for t in texts])

    def encode_pixels(self, pixel_values, extras=(), layer=-1):
        import torch
        with torch.inference_mode():
            want_layer = "patch_states" in extras and layer != -1
            with self.final_capture("image", extras) as cap:
                out = self.vit(pixel_values=pixel_values.to(self.device, non_blocking=True),
                               output_hidden_states=want_layer, return_dict=True)
            cls = out.last_hidden_state[:, 0]
            res = {"vectors": _np(_l2(self.vproj(cls)))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(cls)
            if "patch_states" in extras:
                res["patch_states"] = _np(patch_grid(out.hidden_states[layer] if want_layer else out.last_hidden_state))
            if cap.on:
                res["final_input"] = _np(cap.x)
        return res

    def encode_tokens(self, batch, extras=()):
        import torch
        with torch.inference_mode():
            with self.final_capture("text", extras) as cap:
                out = self.bert(input_ids=batch["input_ids"].to(self.device),
                                attention_mask=batch["attention_mask"].to(self.device), return_dict=True)
            cls = out.last_hidden_state[:, 0]
            res = {"vectors": _np(_l2(self.tproj(cls)))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(cls)
            if "token_states" in extras:
                res.update(token_extras(batch, out.last_hidden_state, self.tokenizer.pad_token_id))
            if cap.on:
                res.update(final_text_extras(cap, batch, self.tokenizer.pad_token_id))
        return res

    def final_tower(self, modality: str):
        """The rebuilt BERT's text-only layers (`bert`, kind bert: its last layer is ALBEF's last
        text-only layer, text_encoder.encoder.layer.5 of the released checkpoints; the fusion layers
        are not part of the dual encoder) or the ViT (`vit`, kind vit: the last block and the final
        norm, the checkpoint's visual_encoder.blocks.11 and visual_encoder.norm)."""
        return ("bert", self.bert) if modality == "text" else ("vit", self.vit)

    def word_embeddings(self):
        return self.bert.get_input_embeddings().weight.detach().float().cpu().clone()

    def projections(self) -> dict[str, np.ndarray]:
        return {"image_proj_weight": _np(self.vproj.weight), "image_proj_bias": _np(self.vproj.bias),
                "text_proj_weight": _np(self.tproj.weight), "text_proj_bias": _np(self.tproj.bias)}
