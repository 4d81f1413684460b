"""`blip`: BLIP image-text retrieval model (BlipForImageTextRetrieval), ITC embeddings.

image vector = normalize(vision_proj(vision_model(...).last_hidden_state[:, 0]))
text vector  = normalize(text_proj(text_encoder(input_ids, attention_mask).last_hidden_state[:, 0]))
(d = image_text_hidden_size, 256 for released checkpoints) — the `use_itm_head=False` path of
BlipForImageTextRetrieval.forward, i.e. BLIP's image-text contrastive (ITC) space.
"""

from __future__ import annotations

from .base import Backbone, register_backbone, resolve_model
from .hf_dual import ImagePreprocessor, _l2, _np, final_text_extras, load_hf, patch_grid, token_extras


@register_backbone("blip")
class BlipBackbone(Backbone):
    """BLIP ITC dual encoder; pre-projection states are the [CLS] states of each tower."""

    def __init__(self, model_path: str, device: str = "cpu", max_length: int | None = None):
        from transformers import BlipForImageTextRetrieval
        self.model = resolve_model(model_path)
        self.device = device
        net, self.tokenizer, ip = load_hf(self.model, BlipForImageTextRetrieval)
        self.net = net.to(device)
        self.image_preprocessor = ImagePreprocessor(ip)
        self.dim = int(net.vision_proj.out_features)
        self.normalized = True
        npos = int(net.config.text_config.max_position_embeddings)
        self.max_length = int(max_length) if max_length else min(64, npos)

    def encode_pixels(self, pixel_values, extras=(), layer=-1):
        import torch
        with torch.inference_mode():
            want_layer = "patch_states" in extras and layer != -1
            with self.final_capture("image", extras) as cap:
                out = self.net.vision_model(pixel_values=pixel_values.to(self.device, non_blocking=True),
                                            return_dict=True, output_hidden_states=want_layer)
            cls = out.last_hidden_state[:, 0, :]
            res = {"vectors": _np(_l2(self.net.vision_proj(cls)))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(cls)
            if "patch_states" in extras:
                h = out.hidden_states[layer] if want_layer else out.last_hidden_state
                res["patch_states"] = _np(patch_grid(h))
            if cap.on:
                res["final_input"] = _np(cap.x)
        return res

    def encode_tokens(self, batch, extras=()):
        import torch
        with torch.inference_mode():
            with self.final_capture("text", extras) as cap:
                out = self.net.text_encoder(input_ids=batch["input_ids"].to(self.device),
                                            attention_mask=batch["attention_mask"].to(self.device), return_dict=True)
            cls = out.last_hidden_state[:, 0, :]
            res = {"vectors": _np(_l2(self.net.text_proj(cls)))}
            if "pre_projection" in extras:
                res["pre_projection"] = _np(cls)
            if "token_states" in extras:
                res.update(token_extras(batch, out.last_hidden_state, self.tokenizer.pad_token_id))
            if cap.on:
                res.update(final_text_extras(cap, batch, self.tokenizer.pad_token_id))
        return res

    def final_tower(self, modality: str):
        """BLIP's text_encoder (kind bert, its cross-attention left out) or vision_model (kind vit)."""
        part = "text_encoder" if modality == "text" else "vision_model"
        return part, getattr(self.net, part)

    def word_embeddings(self):
        return self.net.text_encoder.get_input_embeddings().weight.detach().float().cpu().clone()

    def projections(self):
        out = {}
        for side, lin in (("image", self.net.vision_proj), ("text", self.net.text_proj)):
            out[f"{side}_proj_weight"] = _np(lin.weight)
            out[f"{side}_proj_bias"] = _np(lin.bias)
        return out
