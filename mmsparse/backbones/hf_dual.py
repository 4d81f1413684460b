"""`hf-dual`, `clip`, `siglip`: transformers dual encoders with separate towers.

Works for any model whose class has `vision_model`, `text_model` and (optionally)
`visual_projection` / `text_projection` — VisionTextDualEncoderModel, CLIPModel, SiglipModel —
loaded with AutoModel / AutoProcessor `from_pretrained(path)`. The vector of an image is
normalize(visual_projection(vision_model(...).pooler_output)), exactly what
`get_image_features` computes (transformers 5 returns an output object whose pooler_output is
the projected vector; 4.x returned the tensor); likewise for texts. SigLIP has no projection
layers (the towers' pooling heads are the output) and wants captions padded to max_length.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np

from ..errors import InputError
from .base import Backbone, quiet_transformers, register_backbone, resolve_model


def features_tensor(out):
    """`get_image_features`/`get_text_features` result -> [B, d] tensor (4.x: tensor; 5.x: output
    object with the projected vector in `pooler_output`)."""
    if hasattr(out, "pooler_output"):
        return out.pooler_output
    if isinstance(out, (tuple, list)):
        return out[1] if len(out) > 1 else out[0]
    return out


def load_hf(model_path: str, model_cls=None):
    """(model, processor-or-None, tokenizer, image_processor) from a local path or hub id.
    Raises InputError naming the path if nothing loadable is there."""
    quiet_transformers()
    from transformers import AutoImageProcessor, AutoModel, AutoProcessor, AutoTokenizer
    local = Path(model_path).exists()
    if not local and Path(model_path).is_absolute():
        raise InputError(f"{model_path}: model directory not found (set --model or MMSPARSE_MODEL)")
    kw = {"local_files_only": True} if local else {}
    try:
        model, info = (model_cls or AutoModel).from_pretrained(model_path, output_loading_info=True, **kw)
    except (OSError, ValueError) as e:
        raise InputError(f"{model_path}: cannot load a transformers model ({str(e).splitlines()[0]})") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # weights left randomly initialised: the checkpoint is for another class
        arch = ",".join(getattr(model.config, "architectures", None) or ["?"])
        raise InputError(f"{model_path}: checkpoint ({arch}) lacks {len(missing)} weight(s) of "
                         f"{type(model).__name__} (e.g. {', '.join(missing[:3])}); pick the --backbone "
                         f"that matches the checkpoint (blip for BlipForImageTextRetrieval)")
    proc = None
    try:
        proc = AutoProcessor.from_pretrained(model_path, **kw)
    except (OSError, ValueError, TypeError):
        pass
    tok = getattr(proc, "tokenizer", None)
    if tok is None:
        try:
            tok = AutoTokenizer.from_pretrained(model_path, **kw)
        except (OSError, ValueError) as e:
            raise InputError(f"{model_path}: no tokenizer saved beside the model ({str(e).splitlines()[0]})") from None
    ip = getattr(proc, "image_processor", None)
    if ip is None:
        try:
            ip = AutoImageProcessor.from_pretrained(model_path, **kw)
        except (OSError, ValueError) as e:
            raise InputError(f"{model_path}: no image processor saved beside the model "
                             f"({str(e).splitlines()[0]})") from None
    model.eval()
    return model, tok, ip


def caption_tokens(config, max_length: int | None = None) -> int:
    """Caption truncation, in tokens, of a dual encoder with transformers `config`: max_length when
    given, else SigLIP's text positions (it pools the last one), else min(64, text positions)."""
    npos = int(getattr(config.text_config, "max_position_embeddings", 512))
    if max_length:
        return int(max_length)
    return npos if config.model_type.startswith("siglip") else min(64, npos)


class ImagePreprocessor:
    """Picklable callable list[PIL.Image] -> pixel_values [B, 3, H, W] float32, via the model's
    saved image processor (so resize/crop/normalisation match training). A batch whose images are
    all already at the processor's input size goes through a lookup table of the processor's own
    outputs instead, bit for bit the same values (mmsparse/backbones/pixel_table.py: 0.6-0.8 instead
    of 2.2-3.3 ms of CPU per image on a 2-core AVX2 EPYC)."""

    def __init__(self, image_processor):
        self.ip = image_processor
        self._table = False  # not built yet; None: no fast path for this processor

    def __call__(self, images: list):
        import torch

        from .pixel_table import build_table, lookup

        rgb = [im if im.mode == "RGB" else im.convert("RGB") for im in images]
        if self._table is False:
            self._table = build_table(self.ip)
        if self._table is not None and rgb:
            (h, w), table = self._table
            if all(im.size == (w, h) for im in rgb):
                return torch.from_numpy(lookup(rgb, table))
        return self.ip(images=rgb, return_tensors="pt")["pixel_values"]


def _l2(x):
    import torch
    return torch.nn.functional.normalize(x.float(), dim=-1)


def _np(x) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def patch_grid(h):
    """Hidden state [B, P, h] or conv map [B, C, H, W] -> [B, P, h]."""
    return h.flatten(2).transpose(1, 2) if h.dim() == 4 else h


def token_extras(batch: dict, last_hidden, pad_id) -> dict[str, np.ndarray]:
    """token_states [B, L, h] float32, token_mask [B, L] uint8, token_ids [B, L] int32."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    if mask is None:
        mask = ids != (pad_id if pad_id is not None else -1)
    return {"token_states": _np(last_hidden), "token_mask": mask.cpu().numpy().astype(np.uint8),
            "token_ids": ids.cpu().numpy().astype(np.int32)}


def final_text_extras(cap, batch: dict, pad_id) -> dict[str, np.ndarray]:
    """final_input [B, L, h] float32 (what entered the text tower's final layer, from an
    final_layer.InputCapture) and final_mask [B, L] uint8 (1 = real token: the attention mask, else
    input_ids != pad_id)."""
    mask = batch.get("attention_mask")
    mask = batch["input_ids"] != pad_id if mask is None else mask
    return {"final_input": _np(cap.x), "final_mask": mask.cpu().numpy().astype(np.uint8)}


def check_last_token_pooling(pooled, last_hidden, mask, model: str) -> None:
    """InputError unless the text tower's pooled state [B, h] is its state at each caption's last real
    token (CLIP pools the EOS token, which its tokenizer puts last): the clip-text final layer pools
    that position of the stored inputs (final_layer.py)."""
    import torch
    last = (mask.to(last_hidden.device).long().sum(1) - 1).clamp(min=0)
    if not torch.equal(pooled, last_hidden[torch.arange(len(last), device=last.device), last]):
        raise InputError(f"--final-layer-inputs: {model}'s text tower pools a token other than each caption's last "
                         "one (its EOS token is not last: another tokenizer?); its final-layer inputs would not "
                         "reproduce its vectors")


@register_backbone("hf-dual")
class HFDualEncoder(Backbone):
    """A transformers dual encoder (VisionTextDualEncoderModel, CLIPModel, SiglipModel, ...);
    vectors are L2-normalised projected pooled states, d = projection dim."""

    model_cls_name: str | None = None   # subclasses pin a class (e.g. "CLIPModel")

    def __init__(self, model_path: str, device: str = "cpu", max_length: int | None = None):
        import transformers
        cls = getattr(transformers, self.model_cls_name) if self.model_cls_name else None
        self.model = resolve_model(model_path)
        self.device = device
        net, self.tokenizer, ip = load_hf(self.model, cls)
        for part in ("vision_model", "text_model"):
            if not hasattr(net, part):
                raise InputError(f"{model_path}: {type(net).__name__} has no {part}; "
                                 f"use --backbone blip for BLIP or another dual encoder")
        self.net = net.to(device)
        self.image_preprocessor = ImagePreprocessor(ip)
        self.vproj = getattr(net, "visual_projection", None)
        self.tproj = getattr(net, "text_projection", None)
        cfg = net.config
        if self.vproj is not None:
            self.dim = int(self.vproj.out_features)
        else:
            self.dim = int(cfg.vision_config.hidden_size)
        self.text_padding = "max_length" if cfg.model_type.startswith("siglip") else True
        self.max_length = caption_tokens(cfg, max_length)
        self.normalized = True
        self._text_args = set(inspect.signature(net.text_model.forward).parameters)
        # the tokenizer's arrays the text tower takes, in the tokenizer's order (the ONNX text graph's inputs)
        self.text_inputs = [k for k in self.tokenize(["a"]) if k in self._text_args]

    def onnx_towers(self, threads: int, log=None):
        """Both towers exported to ONNX once per model and run by ONNX Runtime (onnx_towers.py)."""
        from .onnx_towers import OnnxTowers
        return OnnxTowers.load(self, threads, log)

    def _onnx_pixels(self, pixel_values, extras) -> dict:
        want = ["vectors"] + ["pooled"] * ("pre_projection" in extras) + ["hidden"] * ("patch_states" in extras)
        got = self.onnx.image(pixel_values.cpu(), want)
        res = {"vectors": got["vectors"].astype(np.float32)}
        if "pre_projection" in extras:
            res["pre_projection"] = got["pooled"]
        if "patch_states" in extras:
            import torch
            res["patch_states"] = _np(patch_grid(torch.from_numpy(got["hidden"])))
        return res

    def _onnx_tokens(self, batch, extras) -> dict:
        want = ["vectors"] + ["pooled"] * ("pre_projection" in extras) + ["hidden"] * ("token_states" in extras)
        got = self.onnx.text(batch, want)
        res = {"vectors": got["vectors"].astype(np.float32)}
        if "pre_projection" in extras:
            res["pre_projection"] = got["pooled"]
        if "token_states" in extras:
            import torch
            res.update(token_extras(batch, torch.from_numpy(got["hidden"]), self.tokenizer.pad_token_id))
        return res

    def encode_pixels(self, pixel_values, extras=(), layer=-1):
        import torch
        if self.runs_onnx(extras, layer):
            return self._onnx_pixels(pixel_values, extras)
        with torch.inference_mode():
            want_layer = "patch_states" in extras and layer != -1
            pv = pixel_values.to(self.device, non_blocking=True)
            if self.channels_last:
                pv = pv.contiguous(memory_format=torch.channels_last)
            with self.final_capture("image", extras) as cap:
                out = self.net.vision_model(pixel_values=pv, return_dict=True, output_hidden_states=want_layer)
            pooled = out.pooler_output
            vec = self.vproj(pooled) if self.vproj is not None else pooled
            res = {"vectors": _np(_l2(vec))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(pooled)
            if "patch_states" in extras:
                h = out.hidden_states[layer] if want_layer else out.last_hidden_state
                res["patch_states"] = _np(patch_grid(h))
            if cap.on:
                res["final_input"] = _np(cap.x.contiguous())
        return res

    def encode_tokens(self, batch, extras=()):
        import torch
        if self.runs_onnx(extras):
            return self._onnx_tokens(batch, extras)
        inp = {k: v.to(self.device) for k, v in batch.items() if k in self._text_args}
        with torch.inference_mode():
            with self.final_capture("text", extras) as cap:
                out = self.net.text_model(**inp, return_dict=True)
            pooled = out.pooler_output
            vec = self.tproj(pooled) if self.tproj is not None else pooled
            res = {"vectors": _np(_l2(vec))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(pooled)
            if "token_states" in extras:
                res.update(token_extras(batch, out.last_hidden_state, self.tokenizer.pad_token_id))
            if cap.on:
                res.update(final_text_extras(cap, batch, self.tokenizer.pad_token_id))
                if self.final_layer_spec("text")["kind"] == "clip-text":
                    check_last_token_pooling(pooled, out.last_hidden_state, torch.from_numpy(res["final_mask"]),
                                             self.model)
        return res

    def final_tower(self, modality: str):
        """The text_model or vision_model (final_layer.py: BERT-like, CLIP and SigLIP text towers;
        EfficientNet, CLIP and SigLIP vision towers)."""
        part = "text_model" if modality == "text" else "vision_model"
        return part, getattr(self.net, part)

    def image_tower(self):
        return self.net.vision_model

    def word_embeddings(self):
        return self.net.text_model.get_input_embeddings().weight.detach().float().cpu().clone()

    def projections(self):
        out = {}
        for side, lin in (("image", self.vproj), ("text", self.tproj)):
            if lin is not None:
                out[f"{side}_proj_weight"] = _np(lin.weight)
                if lin.bias is not None:
                    out[f"{side}_proj_bias"] = _np(lin.bias)
        return out


@register_backbone("clip")
class CLIPBackbone(HFDualEncoder):
    """CLIPModel (d = projection_dim; text pooled state = final-layer-norm EOS token)."""

    model_cls_name = "CLIPModel"


@register_backbone("siglip")
class SiglipBackbone(HFDualEncoder):
    """SiglipModel (no projection layers: projections() are identities; d = hidden size; captions
    padded to max_length)."""

    model_cls_name = "SiglipModel"

    def projections(self):
        """SigLIP has no projection layers (its towers' pooling heads end in the shared space):
        identity weights [d, d] float32, so vectors = normalize(pre_projection @ Iᵀ) still holds and
        joint heads have a projection to tune (initialised to the identity)."""
        eye = np.eye(self.dim, dtype=np.float32)
        return {"image_proj_weight": eye, "text_proj_weight": eye.copy()}
