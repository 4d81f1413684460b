"""mmsparse heads as sentence-transformers `SparseEncoder` models (`mmsparse export --format
sentence-transformers`; needs the `st` extra).

A SparseEncoder is a stack of modules whose output is one weight per token id of a tokenizer
(`decode` and sentence-transformers' search-engine helpers read the token strings). An exported
head keeps that contract: its output spans the tokenizer's whole id space (30,522 for a BERT
vocabulary), each head term at its tokenizer id (`token_ids`), every other id 0.

    inference-free head, route "query"   SparseStaticEmbedding alone: w_t = max(0, query_weight_t)
                                         at the term's id, 0 for special tokens and ids outside the
                                         head's vocabulary; the tokenizer's model_max_length = 128,
                                         sentence-transformers tokenizes without special tokens, so
                                         q = max(0, w) ⊙ 1[t among the caption's first 128 tokens]:
                                         queries.py's encoder, loaded with sentence-transformers only
    inference-free head, route "all"     Router: task "query" -> that module; "document" ->
                                         DualEncoderHead (images -> image tower -> projection -> head)
    d2s / joint head                     DualEncoderHead alone: texts through the text tower,
                                         projection and head (D2S's `expand` queries), images through
                                         the image tower (route "query": texts only)

DualEncoderHead is the one module sentence-transformers lacks: mmsparse's backbone (backbones/) and
head, saved in its folder as `dual_encoder/` (the transformers model, tokenizer, image processor)
and `head/` (the head directory). sentence-transformers loads it from modules.json by its class
path, so a full model needs mmsparse importable and, from sentence-transformers 6 on,
`SparseEncoder(DIR, trust_remote_code=True)`. It computes what encode-dense then sparsify compute:
the same backbone calls (tokenize at the dense files' max_length, the image processor, the towers
under autocast at their `precision`), then head.encode_csr on the dense vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from .inference_free.queries import MAX_TOKENS

ST_METHODS = ("d2s", "inference-free", "joint")   # heads with a text vocabulary and a dual-encoder input
PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def require_st():
    """The sentence_transformers module (>= 5.4: SparseEncoder, modules under base/); InputError
    naming the extra to install."""
    try:
        import sentence_transformers
        from sentence_transformers.base.modules import Router  # noqa: F401  (absent before 5.4)
    except ImportError:
        raise InputError("--format sentence-transformers needs sentence-transformers >= 5.4: "
                         "pip install 'mmsparse[st]'") from None
    return sentence_transformers


def output_size(tokenizer, token_ids) -> int:
    """Output dimensions of an exported model: the tokenizer's ids (len(get_vocab()), as
    SparseStaticEmbedding counts them), at least every head term's id + 1."""
    return max(len(tokenizer.get_vocab()), int(np.max(np.asarray(token_ids), initial=-1)) + 1)


def special_ids(tokenizer) -> list[int]:
    """The tokenizer's special token ids (all_special_ids and special added tokens): never query terms."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted(ids | {int(i) for i, t in decoder.items() if getattr(t, "special", False)})


def head_tokenizer(head):
    """The tokenizer whose ids the head's terms are (head.tokenizer, else its vocab_source's), checked:
    every term is its token_ids entry's token. InputError when the head has none, or its terms are
    another tokenizer's."""
    from ..vocab import _clean
    from .head import require_tokenizer

    src = getattr(head, "source_dir", None) or "head"
    try:
        tok = require_tokenizer(head, src)
    except InputError:
        raise InputError(f"{src}: no tokenizer/ (and vocab_source is not a tokenizer directory); an export maps the "
                         "head's terms to tokenizer ids: retrain the head with this mmsparse, which saves it") from None
    names = tok.convert_ids_to_tokens(head.token_ids.cpu().tolist())
    bad = next((c for c, (t, n) in enumerate(zip(head.vocab, names)) if t != _clean(n or "")), None)
    if bad is not None:
        raise InputError(f"{src}/vocab.txt: term {bad} {head.vocab[bad]!r} is token {names[bad]!r} of the head's "
                         "tokenizer; the tokenizer/ beside it is not the one the head was trained with")
    return tok


def static_query_module(head):
    """SparseStaticEmbedding of an inference-free head's term-weight table over its tokenizer's ids:
    weight[token_ids[c]] = max(0, query_weight[c]), 0 at special ids and ids the head lacks; a copy
    of the tokenizer with model_max_length MAX_TOKENS (128). InputError without a tokenizer."""
    import copy

    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding

    tok = copy.deepcopy(head_tokenizer(head))
    tok.model_max_length = MAX_TOKENS
    ids = head.token_ids.cpu()
    weight = torch.zeros(output_size(tok, ids.numpy()), dtype=torch.float32)
    weight[ids] = head.query_weight.detach().float().cpu().clamp(min=0)
    weight[special_ids(tok)] = 0.0
    return SparseStaticEmbedding(tokenizer=tok, weight=weight, frozen=False)


def build_encoder(head, *, route: str, backbone: str | None, model: str | None, max_length: int | None,
                  precision: str):
    """The SparseEncoder of `head` (module docstring): route "query" or "all". backbone, model,
    max_length: the dual encoder DualEncoderHead loads (not needed for an inference-free query
    route); precision fp32 | bf16 | fp16: the towers' autocast. InputError for other heads."""
    require_st()
    from sentence_transformers import SparseEncoder

    if head.method not in ST_METHODS:
        raise InputError(f"{head.source_dir}: a {head.method} head; --format sentence-transformers exports "
                         f"{', '.join(ST_METHODS)} heads (their terms are a tokenizer's)")
    if head.method == "joint" and head.config.get("final_layers"):
        raise InputError(f"{head.source_dir}: a joint head with tuned final layers; its export is not supported "
                         "yet (joint heads with tuned projections only are)")
    head.tokenizer = head_tokenizer(head)      # saved with the head; outputs are its ids
    if head.method == "inference-free" and route == "query":
        return SparseEncoder(modules=[static_query_module(head)], similarity_fn_name="dot")
    if precision not in PRECISION_DTYPES:
        raise InputError(f"--precision {precision!r}: use one of {', '.join(PRECISION_DTYPES)}")
    from ..backbones.base import load_backbone

    enc = load_backbone(backbone, model, "cpu", **({"max_length": int(max_length)} if max_length else {}))
    if head.method == "inference-free":
        docs = DualEncoderHead(enc, head, backbone=backbone, precision=precision, modalities=["image"])
        return SparseEncoder(modules=[_router().for_query_document([static_query_module(head)], [docs])],
                             similarity_fn_name="dot")
    sides = ["text"] if route == "query" else ["image", "text"]
    return SparseEncoder(modules=[DualEncoderHead(enc, head, backbone=backbone, precision=precision,
                                                  modalities=sides)], similarity_fn_name="dot")


def card_usage(method: str, route: str) -> list[str]:
    """The "Use" section of an exported model's card: loading and calling it from sentence-transformers."""
    only_st = method == "inference-free" and route == "query"
    load = 'model = SparseEncoder("DIR")' if only_st else \
        'model = SparseEncoder("DIR", trust_remote_code=True)   # needs `pip install mmsparse`'
    lines = ["```python", "from sentence_transformers import SparseEncoder", "", load,
             'q = model.encode_query(["a dog running on the beach"])   # sparse [1, vocabulary] tensor',
             "print(model.decode(q, top_k=10))                         # (token, weight) pairs"]
    if route == "all":
        lines += ["", "from PIL import Image",
                  'd = model.encode_document([Image.open("dog.jpg")])   # images (or paths)',
                  "print(model.similarity(q, d))                          # dot products"]
    lines += ["```", ""]
    if only_st:
        lines.append("This directory holds the query route only: a `SparseStaticEmbedding` (one weight per token, "
                     "no model), which needs nothing but sentence-transformers. Documents (images) are encoded "
                     "by the full export or by `mmsparse sparsify`.")
    else:
        lines.append("The routes through the dual encoder are mmsparse's module (`mmsparse.methods.st.DualEncoderHead`: "
                     "the dual encoder and the sparse head), loaded from `modules.json` by its class path: install "
                     "mmsparse and pass `trust_remote_code=True`.")
    return lines


def _router():
    """sentence-transformers' Router class."""
    from sentence_transformers.base.modules import Router

    return Router


try:   # the base class of DualEncoderHead; without sentence-transformers (require_st refuses first) a stand-in
    from sentence_transformers.base.modules.input_module import InputModule as _Base
except ImportError:
    _Base = torch.nn.Module


class DualEncoderHead(_Base):
    """sentence-transformers input module: images and/or texts -> an mmsparse dual encoder -> its
    sparse head -> weights [B, n] float32 over the tokenizer's n ids (output_size).

    encoder: an mmsparse Backbone (its towers become this module's `net`); head: a d2s,
    inference-free or joint SparseHead; backbone: the Backbone's registry name (hf-dual, clip, ...);
    modalities: what it encodes ("image", "text"); precision: autocast of the towers (fp32 | bf16 |
    fp16), as the dense files were encoded (bf16 runs as bf16 wherever the model is loaded).
    preprocess: PIL images or image paths -> pixel_values (the backbone's image processor), texts
    -> the backbone's tokenizer batch (padding, truncation at its max_length).
    forward: dense vectors as encode-dense writes them (joint: the head's tuned projection of the
    pre-projection states), then head.encode_csr (top-k gates and posting floor included), each
    head column scattered to its tokenizer id. Inference only (no gradient reaches the towers).
    """

    config_keys = ["backbone", "max_length", "precision", "modalities"]
    save_in_root = False
    forward_kwargs: set = set()

    def __init__(self, encoder, head, *, backbone: str, precision: str = "fp32",
                 modalities: list[str] = ("image", "text")):
        super().__init__()
        if precision not in PRECISION_DTYPES:
            raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISION_DTYPES)}")
        self.encoder, self.head = encoder, head.eval()
        self.net = encoder.net                 # registered, so the model's .to(device) moves the towers
        self.backbone, self.precision, self._modalities = str(backbone), str(precision), sorted(modalities)
        self.max_length = int(encoder.max_length)
        self.tokenizer = head.tokenizer or encoder.tokenizer   # of the output ids (decode); inputs: the encoder's
        self.num_dimensions = output_size(self.tokenizer, head.token_ids.cpu().numpy())
        self.max_seq_length = self.max_length if "text" in self._modalities else None
        encoder.set_memory_format("auto")      # encode-dense's default layout

    @property
    def modalities(self) -> list[str]:
        return list(self._modalities)

    def get_embedding_dimension(self) -> int:
        return self.num_dimensions

    # -- inputs ------------------------------------------------------------------------------
    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict:
        """A batch of PIL images or image paths -> {"pixel_values", "mmsparse_side": "image"};
        of texts -> the tokenizer batch + "mmsparse_side": "text". ValueError for a modality this
        module does not encode (e.g. text documents of an inference-free model)."""
        from sentence_transformers.base.modality import infer_batch_modality

        from ..backbones.encode import load_image

        modality = infer_batch_modality(list(inputs), supported_modalities=self.modalities)
        if modality not in self._modalities:
            raise ValueError(f"this mmsparse {self.head.method} module encodes {' and '.join(self._modalities)}, "
                             f"not {modality} inputs" + (" (queries go through encode_query)"
                                                         if modality == "text" else ""))
        if modality == "image":
            images = [load_image(Path(x)) if isinstance(x, (str, Path)) else x for x in inputs]
            return {"pixel_values": self.encoder.preprocess_images(images), "mmsparse_side": "image"}
        texts = [prompt + t for t in inputs] if prompt else list(inputs)
        return {**self.encoder.tokenize(texts), "mmsparse_side": "text"}

    # -- forward -----------------------------------------------------------------------------
    def forward(self, features: dict, **kwargs) -> dict:
        side = features["mmsparse_side"]
        dev = next(self.net.parameters()).device
        self.encoder.device = str(dev)
        joint = self.head.method == "joint"
        extras = ("pre_projection",) if joint else ()
        dtype = PRECISION_DTYPES[self.precision]
        ctx = torch.autocast(dev.type, dtype=dtype) if dtype is not None else torch.autocast(dev.type, enabled=False)
        with ctx:
            if side == "image":
                res = self.encoder.encode_pixels(features["pixel_values"], extras)
            else:
                res = self.encoder.encode_tokens({k: v for k, v in features.items() if isinstance(v, torch.Tensor)},
                                                 extras)
        with torch.no_grad():
            z = torch.from_numpy(res["pre_projection" if joint else "vectors"]).float().to(dev)
            s = self.head.encode_csr(self.head.project(z, side) if joint else z, side=side).tocoo()
        out = torch.zeros(z.shape[0], self.num_dimensions, dtype=torch.float32)
        tid = self.head.token_ids.cpu()
        out[torch.from_numpy(s.row.astype(np.int64)), tid[torch.from_numpy(s.col.astype(np.int64))]] = \
            torch.from_numpy(s.data.astype(np.float32))
        features["sentence_embedding"] = out.to(dev)
        return features

    # -- files -------------------------------------------------------------------------------
    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """OUTPUT/config.json (config_keys), OUTPUT/dual_encoder/ (the transformers model, its
        tokenizer and image processor, as backbones load them) and OUTPUT/head/ (save_pretrained)."""
        out = Path(output_path)
        self.save_config(str(out))
        enc = out / "dual_encoder"
        self.encoder.net.save_pretrained(str(enc), safe_serialization=safe_serialization)
        self.encoder.tokenizer.save_pretrained(str(enc))
        self.encoder.image_preprocessor.ip.save_pretrained(str(enc))
        self.head.save_pretrained(out / "head")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, **kwargs) -> "DualEncoderHead":
        """The module saved by `save` in `model_name_or_path`/`subfolder` (a local directory or a
        hub repository), on the CPU (the model's device setting moves it)."""
        from ..backbones.base import load_backbone
        from .head import load_head

        hub = dict(token=token, cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        config = cls.load_config(model_name_or_path, subfolder=subfolder, **hub)
        local = Path(cls.load_dir_path(model_name_or_path, subfolder=subfolder, **hub))
        enc = load_backbone(config["backbone"], local / "dual_encoder", "cpu", max_length=int(config["max_length"]))
        return cls(enc, load_head(local / "head"), backbone=config["backbone"], precision=config["precision"],
                   modalities=config["modalities"])
