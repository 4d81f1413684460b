"""Backbone interface: a frozen vision-language dual encoder that maps images and captions
into one d-dimensional space, plus its text vocabulary (the sparse head's default vocabulary).

Extra outputs an encoder can return besides the pooled vectors ("vectors" [B, d] float32):
  pre_projection   [B, h] float32  pooled tower state before the projection layer (the [CLS]/
                   pooled state), so `vectors = normalize(pre_projection @ W.T (+ b))`
  token_states     [B, L, h_text]  text last-layer token states (texts only), with
  token_mask       [B, L] uint8    1 for real tokens, 0 for padding, and
  token_ids        [B, L] int32    the input token ids
  patch_states     [B, P, h_img]   image patch/grid states of layer `layer` (images only)
  final_input      what enters the tower's final layer (backbones/final_layer.py): texts [B, L,
                   h_text] with final_mask [B, L] uint8; images the feature map [B, C, H, W]
                   (convolutional towers) or the hidden states [B, P, h_img] (ViTs)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputError
from ..provenance import model_fingerprint

EXTRAS = ("pre_projection", "token_states", "patch_states", "final_input")

_REGISTRY: dict[str, type["Backbone"]] = {}


def register_backbone(name: str) -> Callable[[type["Backbone"]], type["Backbone"]]:
    """Class decorator: make a Backbone subclass loadable by `name`."""
    def deco(cls: type["Backbone"]) -> type["Backbone"]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def backbone_names() -> list[str]:
    """Registered backbone names."""
    _import_all()
    return sorted(_REGISTRY)


def _import_all() -> None:
    from . import albef, blip, hf_dual  # noqa: F401  (registration side effect)


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' if available, else 'mps' if available, else 'cpu'; others unchanged."""
    import torch
    if device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise InputError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_model(model: str | Path) -> str:
    """A local path becomes absolute; anything else (a hub id) is returned unchanged."""
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else str(model)


class Backbone(ABC):
    """A frozen dual encoder.

    Attributes: name (registry name), model (hub id or absolute local path), dim (embedding
    dim d), normalized (True if vectors are L2-normalised), tokenizer (HF tokenizer; its
    vocabulary is the sparse head's default vocabulary), device (torch device string).
    Subclasses set `image_preprocessor` and implement `encode_pixels`, `encode_tokens`,
    `word_embeddings` and set the attributes in __init__.
    """

    name: str = ""
    model: str = ""
    dim: int = 0
    normalized: bool = True
    tokenizer = None
    device: str = "cpu"
    max_length: int = 64          # caption truncation, in tokens
    text_padding: str | bool = True   # tokenizer padding mode ("max_length" for SigLIP)

    # picklable callable list[PIL.Image] -> pixel_values float32 [B, 3, H, W] (CPU), run in
    # DataLoader workers; set by subclasses from the model's saved image processor
    image_preprocessor: Callable | None = None
    channels_last: bool = False   # image batches enter the tower channels-last (set_memory_format)
    onnx = None                   # onnx_towers.OnnxTowers when the towers run in ONNX Runtime (set_runtime)
    ONNX_EXTRAS = ("pre_projection", "token_states", "patch_states")   # extras the ONNX graphs give too

    def image_tower(self):
        """The image tower's torch module, for set_memory_format; None where there is none to lay out."""
        return None

    def set_memory_format(self, memory_format: str = "auto") -> str:
        """Lay out a convolutional image tower (more than one Conv2d) and its input batches
        channels-last or contiguous. memory_format: channels-last, contiguous, or auto (channels-last
        on the CPU, contiguous elsewhere). Why: on the CPU oneDNN's channels-last convolutions were
        faster on every CPU measured, AVX2 and AVX-512 alike (EfficientNet-Lite0, batch 32-64, 2
        threads: 37.7 vs 33.3 images/s on a 2-core AVX2 AMD EPYC, 21.0 vs 13.8 on a 2-core AMX Intel
        Xeon; docs/speed.md), so auto no longer keeps contiguous on AVX2; on CUDA its faster batches
        (22 vs 29 ms per 256 images on an H200) never show, decoding bounds the stage, while its
        first batch costs 2-4 s more of kernel set-up. Returns the layout used ("contiguous" for a
        transformer tower, whatever was asked)."""
        import torch

        tower = self.image_tower()
        convs = sum(isinstance(m, torch.nn.Conv2d) for m in tower.modules()) if tower is not None else 0
        want = memory_format == "channels-last" or memory_format == "auto" and str(self.device) == "cpu"
        self.channels_last = bool(want and convs > 1)
        if tower is not None:
            tower.to(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        return "channels-last" if self.channels_last else "contiguous"

    def onnx_towers(self, threads: int, log=None):
        """onnx_towers.OnnxTowers of this backbone's towers; OnnxUnavailable here (a backbone without
        an ONNX export: BLIP, ALBEF)."""
        from .onnx_towers import OnnxUnavailable
        raise OnnxUnavailable(f"the {self.name} backbone has no ONNX export")

    def set_runtime(self, runtime: str = "torch", threads: int | None = None, log=None) -> str:
        """Run the towers in PyTorch or in ONNX Runtime (backbones/onnx_towers.py). runtime: torch, onnx
        or auto (onnx on the CPU where onnxruntime is installed and the towers export, torch elsewhere:
        docs/speed.md measures it faster than PyTorch fp32 and bf16 on AVX2 and AMX CPUs). threads: ONNX
        Runtime's intra-op threads (None: torch's setting now). log: str -> None, told about an export
        and about auto falling back to torch. Returns the runtime used ("onnx" | "torch").
        InputError (one line, naming the model and the fix --runtime torch) when onnx cannot run."""
        from .onnx_towers import OnnxUnavailable
        self.onnx = None
        if runtime == "torch":
            return "torch"
        if runtime not in ("onnx", "auto"):
            raise InputError(f"--runtime {runtime!r}: choose one of torch, onnx, auto")
        if str(self.device) != "cpu":
            reason = f"it runs on {self.device} and mmsparse runs ONNX Runtime on the CPU only"
        else:
            import torch
            try:
                self.onnx = self.onnx_towers(int(threads or torch.get_num_threads()), log)
                return "onnx"
            except OnnxUnavailable as e:
                reason = str(e)
        if runtime == "onnx":
            raise InputError(f"--runtime onnx: {self.model} ({self.name}) cannot run in ONNX Runtime: {reason}; "
                             f"use --runtime torch")
        if log:
            log(f"--runtime auto: torch ({reason})")
        return "torch"

    def runs_onnx(self, extras=(), layer: int = -1) -> bool:
        """Whether a batch asking for `extras` (patch states of hidden layer `layer`) runs in ONNX Runtime:
        set_runtime chose it and the graphs give those extras (not final_input, nor patch states of a
        layer other than the last); otherwise the batch runs in PyTorch."""
        return self.onnx is not None and set(extras) <= set(self.ONNX_EXTRAS) and (
            "patch_states" not in extras or layer == -1)

    # -- images ---------------------------------------------------------------------------
    def preprocess_images(self, images: list) -> "torch.Tensor":  # noqa: F821
        """list[PIL.Image] (any mode) -> pixel_values float32 [B, 3, H, W] on the CPU."""
        return self.image_preprocessor(images)

    @abstractmethod
    def encode_pixels(self, pixel_values, extras: tuple[str, ...] = (), layer: int = -1) -> dict[str, np.ndarray]:
        """pixel_values [B, 3, H, W] -> {"vectors": [B, d] float32, plus requested extras
        ("pre_projection", "patch_states" of hidden layer `layer`, -1 = last)}."""

    def encode_images(self, images: list) -> np.ndarray:
        """list[PIL.Image] -> [B, d] float32 (L2-normalised if `normalized`)."""
        return self.encode_pixels(self.preprocess_images(images))["vectors"]

    # -- texts ----------------------------------------------------------------------------
    def tokenize(self, texts: list[str]) -> dict:
        """list[str] -> tokenizer batch (input_ids, attention_mask, ...) as CPU torch tensors."""
        return dict(self.tokenizer(list(texts), padding=self.text_padding, truncation=True,
                                   max_length=self.max_length, return_tensors="pt"))

    @abstractmethod
    def encode_tokens(self, batch: dict, extras: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """Tokenizer batch -> {"vectors": [B, d] float32, plus requested extras
        ("pre_projection", "token_states" with "token_mask" and "token_ids")}."""

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """list[str] -> [B, d] float32 (L2-normalised if `normalized`)."""
        return self.encode_tokens(self.tokenize(texts))["vectors"]

    # -- vocabulary -----------------------------------------------------------------------
    @abstractmethod
    def word_embeddings(self) -> "torch.Tensor":  # noqa: F821
        """Text tower input word embeddings, float32 torch tensor [|V|, h] (a detached copy)."""

    def projections(self) -> dict[str, np.ndarray]:
        """Projection weights mapping pre-projection states to vectors: e.g. {"image_proj_weight"
        [d, h_img], "text_proj_weight" [d, h_txt], optional "*_proj_bias" [d]}; empty if none."""
        return {}

    def final_tower(self, modality: str):
        """(name, module) of the `modality` ("text" | "image") tower whose final layer
        --final-layer-inputs stores the input of (name: its place in the model, prefixing the
        description's module names); None: this backbone stores no final-layer inputs."""
        return None

    def final_layer_spec(self, modality: str) -> dict:
        """JSON description of the final layer of the `modality` ("text" | "image") tower, whose
        input the "final_input" extra holds (backbones/final_layer.py), module names prefixed with
        the tower's name. InputError for a backbone without final towers or a tower of no known kind."""
        from .final_layer import final_layer_spec
        part = self.final_tower(modality)
        if part is None:
            raise InputError(f"--final-layer-inputs: the {self.name} backbone cannot store its final layers' inputs "
                             "(see `encode-dense --help` for the towers that can); drop the flag and train joint "
                             "heads with --dense-side pre-projection")
        name, tower = part
        # a text tower run without an attention mask (SigLIP's tokenizer gives none) attends to padding
        unmasked = modality == "text" and "attention_mask" not in getattr(self.tokenizer, "model_input_names",
                                                                         ["attention_mask"])
        spec = final_layer_spec(tower, modality, attend_padding=unmasked)
        return {**spec, "modules": [f"{name}.{m}" for m in spec["modules"]]}

    def final_layer_weights(self, modality: str):
        """A FinalLayer copy (final_layer.py) of the `modality` tower's final layer, with its weights."""
        from .final_layer import FinalLayer
        layer = FinalLayer(self.final_layer_spec(modality))
        layer.load_from(self.final_tower(modality)[1])
        return layer

    def final_capture(self, modality: str, extras):
        """final_layer.InputCapture of the `modality` tower's final-layer input while the tower runs,
        on only when "final_input" is in `extras`."""
        from .final_layer import InputCapture, entry_module
        if "final_input" not in extras:
            return InputCapture(None, False)
        return InputCapture(entry_module(self.final_tower(modality)[1], self.final_layer_spec(modality)), True)

    def vocab(self) -> list[str]:
        """Token strings ordered by token id, one per row of `word_embeddings()`; ids the
        tokenizer does not know become "[unused_<id>]"."""
        n = int(self.word_embeddings().shape[0])
        return vocab_list(self.tokenizer, n)

    def fingerprint(self) -> str | None:
        """The model's content fingerprint (provenance.model_fingerprint), computed once; None
        when it cannot be found (a hub model outside the local cache)."""
        if "_fingerprint" not in self.__dict__:
            try:
                self._fingerprint = model_fingerprint(self.model)
            except InputError:
                self._fingerprint = None
        return self._fingerprint

    def attrs(self) -> dict:
        """Attributes for dense files written with this backbone: backbone, model (where it was
        loaded from), model_fingerprint (what it is), normalized, max_length."""
        fp = self.fingerprint()
        return {"backbone": self.name, "model": self.model, **({"model_fingerprint": fp} if fp else {}),
                "normalized": bool(self.normalized), "max_length": int(self.max_length)}


def vocab_list(tokenizer, n: int) -> list[str]:
    """Token strings for ids 0..n-1 of `tokenizer`; unknown ids -> "[unused_<id>]"."""
    inv = {i: t for t, i in tokenizer.get_vocab().items()}
    return [inv.get(i, f"[unused_{i}]") for i in range(n)]


def load_backbone(name: str, model_path: str | Path, device: str = "auto", **kwargs) -> Backbone:
    """Load backbone `name` (see `backbone_names()`) from a local path or hub id onto `device`
    ("auto", "cpu", "cuda", "cuda:1", "mps"). Raises InputError for an unknown name or a
    path that does not hold a loadable model."""
    _import_all()
    if name not in _REGISTRY:
        raise InputError(f"--backbone {name!r}: unknown backbone; choose one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](str(model_path), resolve_device(device), **kwargs)


def backbone_from_attrs(attrs: dict, device: str = "cpu") -> Backbone:
    """Rebuild the backbone named by a dense file's `backbone` and `model` attributes (to get its
    tokenizer, vocab() and word_embeddings(), e.g. to initialise a sparse head's W2).
    Raises InputError if the attributes are missing or the model cannot be found."""
    for k in ("backbone", "model"):
        if k not in attrs:
            raise InputError(f"dense file attributes lack {k!r}; re-run encode-dense")
    kw = {"max_length": int(attrs["max_length"])} if "max_length" in attrs else {}
    return load_backbone(str(attrs["backbone"]), str(attrs["model"]), device, **kw)


def quiet_transformers() -> None:
    """Silence transformers' weight-loading progress bars and info logs (we draw our own)."""
    import transformers
    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
