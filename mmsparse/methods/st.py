"""mmsparse heads as self-contained sentence-transformers `SparseEncoder` models (`mmsparse export
--format sentence-transformers`; needs the `st` extra).

A SparseEncoder is a stack of modules whose output is one weight per token id of a tokenizer
(`decode` and sentence-transformers' search-engine helpers read the token strings). An export keeps
that contract: its output spans the tokenizer's whole id space (30,522 for a BERT vocabulary), each
head term at its tokenizer id (`token_ids`), every other id 0. Every module is sentence-transformers'
own except one, `sparse_gates.SparseGates`, a torch-only file shipped inside the folder
(methods/sparse_gates.py): the folder needs no mmsparse to load, encode or fine-tune.

    d2s / joint head        Transformer (the dual encoder: get_text_features / get_image_features,
                            the modality picks the tower) -> Normalize (encode-dense's L2) -> Dense
                            (W1, no bias) -> LayerNorm (eps 1e-5) -> Dense (W2 + b) -> SparseGates
                            (log(1 + ReLU), each side's top-k gate, the posting floor, caption-term
                            queries, columns -> tokenizer ids). A joint head's tuned projections (and
                            tuned final layers) are written into the Transformer's weights, a copy of
                            the backbone, so its vectors are the joint head's dense vectors.
    inference-free, "all"   Router: task "query" -> SparseStaticEmbedding (the term-weight table);
                            "document" -> Transformer (images only) ... Dense (W2); then SparseGates
                            (text rows, the table's output, pass through)
    inference-free, "query" SparseStaticEmbedding alone: loads with trust_remote_code=False
    route "query" of d2s / joint: the Transformer takes texts only.

q_t of the table = max(0, w_t) at the term's id, 0 for special tokens and ids outside the head's
vocabulary; the tokenizer's model_max_length is 128 and sentence-transformers tokenizes without
special tokens, so q = max(0, w) ⊙ 1[t among the caption's first 128 tokens]: queries.py's encoder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from .inference_free.queries import MAX_TOKENS
from .sparse_gates import FILE_NAME, QUERY_MODES, SparseGates
from .st_require import require_st  # noqa: F401  (re-exported)

ST_METHODS = ("d2s", "inference-free", "joint")   # heads over pooled dense vectors with a text vocabulary
ST_BACKBONES = ("hf-dual", "clip", "siglip")      # transformers dual encoders with get_*_features
GATES_TYPE = f"{FILE_NAME.removesuffix('.py')}.{SparseGates.__name__}"   # its class path in modules.json
LN_EPS = 1e-5   # sentence-transformers' LayerNorm module is nn.LayerNorm(dimension): eps fixed at 1e-5


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


def static_query_module(head, frozen: bool = True):
    """SparseStaticEmbedding of an inference-free head's term-weight table over its tokenizer's ids:
    weight[token_ids[c]] = max(0, query_weight[c]), 0 at special ids and ids the head lacks; a copy
    of the tokenizer with model_max_length MAX_TOKENS (128). frozen (the default): the table is not
    trained by sentence-transformers' trainers (SparseStaticEmbedding applies no ReLU, so a trained
    table goes negative, which `mmsparse import` refuses); docs/export.md says how to unfreeze it.
    InputError without a tokenizer."""
    import copy

    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding

    tok = copy.deepcopy(head_tokenizer(head))
    tok.model_max_length = MAX_TOKENS
    ids = head.token_ids.cpu()
    weight = torch.zeros(output_size(tok, ids.numpy()), dtype=torch.float32)
    weight[ids] = head.query_weight.detach().float().cpu().clamp(min=0)
    weight[special_ids(tok)] = 0.0
    return SparseStaticEmbedding(tokenizer=tok, weight=weight, frozen=frozen)


def check_exportable(head, backbone: str | None, route: str) -> None:
    """InputError, in one line saying why, for a head the export cannot express exactly."""
    src = getattr(head, "source_dir", None) or "head"
    why = {"vdr": "VDR pools vocabulary weights over each tower's per-position states (eq. 2-4: max over tokens "
                  "and patches, elu1p, top-k with the caption's bag of words), not over one pooled vector as "
                  "sentence-transformers' Transformer module gives it",
           "bm25v": "its terms are visual words of a sparse autoencoder, not a tokenizer's ids",
           "dense": "it writes dense vectors, not term weights"}
    if head.method not in ST_METHODS:
        raise InputError(f"{src}: a {head.method} head cannot be exported to sentence-transformers: "
                         f"{why.get(head.method, 'its method is not one of ' + ', '.join(ST_METHODS))}; "
                         "use `mmsparse sparsify` and `--format jsonl` for its vectors")
    if head.config.get("center") == "mean":
        raise InputError(f"{src}: a head trained with --center mean subtracts a per-modality mean the exported "
                         "module stack has no place for; retrain with --center none to export it")
    if abs(float(head.norm.eps) - LN_EPS) > 1e-12:
        raise InputError(f"{src}: LayerNorm eps {head.norm.eps:g}; sentence-transformers' LayerNorm module "
                         f"fixes eps at {LN_EPS:g}, so the export would not give the head's vectors")
    if head.method == "inference-free" and route == "query":
        return
    if backbone not in ST_BACKBONES:
        raise InputError(f"--backbone {backbone}: sentence-transformers' Transformer module runs transformers dual "
                         f"encoders through get_text_features / get_image_features ({', '.join(ST_BACKBONES)}), "
                         f"not {backbone}'s towers; export heads of those backbones")
    if head.method == "joint" and (backbone == "siglip" or head.config.get("proj_bias")):
        raise InputError(f"{src}: a joint head whose tuned projections have a bias or no layer of the model to "
                         "hold them (SigLIP); the export writes them into the model's projection weights")


def tower_module(head, backbone: str, model: str, max_length: int | None, modalities: list[str]):
    """sentence-transformers' Transformer over the dual encoder `model`: texts (truncated at max_length
    tokens, encode-dense's; default the backbone's, hf_dual.caption_tokens) through
    get_text_features, images through get_image_features (the model's own image processor),
    `modalities` only. A joint head's tuned projections and final layers are written into its
    weights. InputError when the model has no such methods or its tokenizer is not the head's."""
    from sentence_transformers.base.modules import Transformer
    from transformers import AutoConfig

    from ..backbones.hf_dual import caption_tokens

    try:
        kw = {"max_seq_length": caption_tokens(AutoConfig.from_pretrained(str(model)), max_length)}
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"--model {model}: not a transformers dual encoder ({str(e).splitlines()[0]})") from None
    if backbone == "siglip":   # SigLIP pools the last position: captions padded to max_length, as encode-dense
        kw["processing_kwargs"] = {"text": {"padding": "max_length"}}
    try:
        t = Transformer(str(model), **kw)
    except (OSError, ValueError) as e:
        raise InputError(f"--model {model}: sentence-transformers cannot load it ({str(e).splitlines()[0]})") from None
    methods = {m: (t.modality_config.get(m) or {}).get("method") for m in modalities}
    want = {"text": "get_text_features", "image": "get_image_features"}
    if any(methods[m] != want[m] for m in modalities):
        raise InputError(f"--model {model}: sentence-transformers runs it as {methods}, not through "
                         "get_text_features / get_image_features; export heads of transformers dual encoders")
    t.modality_config = {m: t.modality_config[m] for m in modalities}
    t.input_formatter.supported_modalities = list(modalities)
    tok = head.tokenizer
    if tok is not None and t.tokenizer is not None and tok.get_vocab() != t.tokenizer.get_vocab():
        raise InputError(f"{getattr(head, 'source_dir', 'head')}: the head's terms are another tokenizer's than "
                         f"{model}'s; an export outputs the model tokenizer's ids")
    if head.method == "joint":
        write_joint_towers(head, t.model)
    return t


def write_joint_towers(head, net) -> None:
    """Write a joint head's tuned projections (and tuned final layers) into transformers dual encoder
    `net` (visual_projection, text_projection, vision_model, text_model), in place."""
    with torch.no_grad():
        net.visual_projection.weight.copy_(head.image_proj.weight)
        net.text_projection.weight.copy_(head.text_proj.weight)
    if head.has_final:
        head.text_final.copy_to(net.text_model)
        head.image_final.copy_to(net.vision_model)


def head_modules(head) -> list:
    """sentence-transformers' Normalize, Dense (W1), LayerNorm, Dense (W2 + b) with the head's weights:
    normalize(z) -> W2 · LN(W1 · z) + b, the pre-activations of the head's columns."""
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.sentence_transformer.modules import LayerNorm

    w1, w2 = head.w1.weight.detach().float().cpu(), head.w2.weight.detach().float().cpu()
    norm = LayerNorm(int(w1.shape[0]))
    norm.norm.load_state_dict({k: v.detach().float().cpu() for k, v in head.norm.state_dict().items()})
    return [Normalize(),
            Dense(int(w1.shape[1]), int(w1.shape[0]), bias=False, activation_function=torch.nn.Identity(),
                  init_weight=w1.clone()),
            norm,
            Dense(int(w2.shape[1]), int(w2.shape[0]), bias=True, activation_function=torch.nn.Identity(),
                  init_weight=w2.clone(), init_bias=head.w2.bias.detach().float().cpu().clone())]


def gates_module(head, tok, *, backbone: str | None, static_text: bool, query_mode: str) -> SparseGates:
    """The SparseGates of `head` (top-k of each side, posting floor, token ids) over tokenizer `tok`."""
    from .st_record import known_hashes, portable

    floor = hasattr(head, "doc_floor")
    config = portable(head.config, known_hashes(getattr(head, "source_dir", None)))
    g = SparseGates(len(head.vocab), output_size(tok, head.token_ids.cpu().numpy()),
                    image_top_k=head.top_k("image"), text_top_k=head.top_k("text"), floor=floor,
                    query_mode=query_mode, static_text=static_text, special_ids=special_ids(tok),
                    mmsparse={"method": head.method, "backbone": backbone, "config": config})
    with torch.no_grad():
        g.token_ids.copy_(head.token_ids.cpu())
        if floor:
            g.doc_floor.copy_(head.doc_floor.detach().float().cpu())
    return g


def build_encoder(head, *, route: str, backbone: str | None, model: str | None, max_length: int | None,
                  query_mode: str = "expand"):
    """The SparseEncoder of `head` (module docstring): route "query" or "all"; backbone, model,
    max_length: the dual encoder the Transformer module runs (not needed for an inference-free
    query route); query_mode: what encode_query gives for texts (expand | caption-terms; the task
    "caption-terms" or "expand" picks either per call). InputError for heads it cannot express."""
    require_st()
    from sentence_transformers import SparseEncoder

    if query_mode not in QUERY_MODES:
        raise InputError(f"--query-mode {query_mode!r}: use one of {', '.join(QUERY_MODES)}")
    check_exportable(head, backbone, route)
    head.tokenizer = tok = head_tokenizer(head)      # saved with the head; outputs are its ids
    if head.method == "inference-free" and route == "query":
        return SparseEncoder(modules=[static_query_module(head)], similarity_fn_name="dot")
    if head.method == "inference-free":
        if query_mode != "expand":
            raise InputError("--query-mode: an inference-free head's queries are its term-weight table")
        from sentence_transformers.base.modules import Router

        docs = [tower_module(head, backbone, model, max_length, ["image"]), *head_modules(head)]
        router = Router.for_query_document([static_query_module(head)], docs)
        return SparseEncoder(modules=[router, gates_module(head, tok, backbone=backbone, static_text=True,
                                                           query_mode=query_mode)], similarity_fn_name="dot")
    sides = ["text"] if route == "query" else ["image", "text"]
    return SparseEncoder(modules=[tower_module(head, backbone, model, max_length, sides), *head_modules(head),
                                  gates_module(head, tok, backbone=backbone, static_text=False,
                                               query_mode=query_mode)], similarity_fn_name="dot")


def save_encoder(encoder, out: Path) -> None:
    """encoder.save(out), with SparseGates named by its file in the folder ("sparse_gates.SparseGates",
    which sentence-transformers loads from `out`/sparse_gates.py with trust_remote_code=True, not
    from mmsparse) and the sha256 of the towers' weights as saved (`mmsparse import` tells from it
    whether a fine-tuning changed them)."""
    encoder.save(str(out), create_model_card=False)
    entries = json.loads((out / "modules.json").read_text(encoding="utf-8"))
    for e in entries:
        if e["type"].endswith(f".{SparseGates.__name__}"):
            e["type"] = GATES_TYPE
            cfg_path = out / e["path"] / "config.json"
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            cfg["mmsparse"]["towers_sha256"] = towers_sha256(out)
            cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    (out / "modules.json").write_text(json.dumps(entries, indent=2), encoding="utf-8")


def record_file(folder: Path) -> str | None:
    """Where an export folder holds the head's record, for its card: "`N_SparseGates/config.json`
    (`mmsparse.config`)"; None for a folder without SparseGates (a query-route export)."""
    entries = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    gates = next((e["path"] for e in entries if e["type"] == GATES_TYPE), None)
    return f"`{gates}/config.json` (`mmsparse.config`: the head's config and its `training` record)" if gates else None


def tower_dir(folder: Path) -> Path | None:
    """The folder of an export's Transformer module (the dual encoder's weights): the root, or an
    inference-free export's document route; None when it has none (a query-route export)."""
    entries = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    first = entries[0]
    if first["type"].endswith(".Transformer"):
        return folder / first["path"]
    if first["type"].endswith(".Router"):
        cfg = json.loads((folder / first["path"] / "router_config.json").read_text(encoding="utf-8"))
        for mid, typ in cfg["types"].items():
            if typ.endswith(".Transformer"):
                return folder / first["path"] / mid
    return None


def towers_sha256(folder: Path) -> str | None:
    """sha256 of the Transformer module's model.safetensors in an export folder (None without one)."""
    d = tower_dir(folder)
    if d is None or not (d / "model.safetensors").is_file():
        return None
    h = hashlib.sha256()
    with open(d / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def card_usage(method: str, route: str) -> list[str]:
    """The "Use" section of an exported model's card: loading and calling it from sentence-transformers."""
    only_st = method == "inference-free" and route == "query"
    load = 'model = SparseEncoder("DIR")' if only_st else \
        'model = SparseEncoder("DIR", trust_remote_code=True)   # runs sparse_gates.py from this folder'
    lines = ["```python", "from sentence_transformers import SparseEncoder", "", load,
             'q = model.encode_query(["a dog running on the beach"])   # sparse [1, vocabulary] tensor',
             "print(model.decode(q, top_k=10))                         # (token, weight) pairs"]
    if route == "all":
        lines += ["", "from PIL import Image   # Pillow: the model's image processor reads PIL images",
                  "",
                  "# PIL images: Image.open refuses a path that is not a file, where a string would be encoded as text",
                  'd = model.encode_document([Image.open(p).convert("RGB") for p in ["dog.jpg"]])',
                  "print(model.similarity(q, d))                          # dot products"]
    lines += ["```", ""]
    if only_st:
        lines.append("This directory holds the query route only: a `SparseStaticEmbedding` (one weight per token, "
                     "no model), which needs nothing but sentence-transformers. Documents (images) are encoded "
                     "by the full export or by `mmsparse sparsify`.")
    else:
        lines.append("Every module is sentence-transformers' own (`Transformer`: the dual encoder; `Normalize`, "
                     "`Dense`, `LayerNorm`: the sparse head's layers) except `sparse_gates.SparseGates`, the torch "
                     "file `sparse_gates.py` in this folder (log(1 + ReLU), the top-k gate of each side, the posting "
                     "floor, caption-term queries with `task=\"caption-terms\"`): loading runs it, hence "
                     "`trust_remote_code=True`; mmsparse is not needed. The model fine-tunes with "
                     "`SparseEncoderTrainer`, and `mmsparse import DIR -o HEAD` reads it back as a head.")
        lines += ["", "Needs `sentence-transformers>=5.4` and Pillow (`pip install sentence-transformers pillow`). After "
                  "fine-tuning, save with `model.save(DIR, create_model_card=False)` and copy this README.md into DIR: "
                  "sentence-transformers' generated card omits `trust_remote_code=True`, without which the model "
                  "does not load."]
    if method == "inference-free":
        lines += ["", "The query table (`SparseStaticEmbedding`) is frozen: fine-tuning trains the document side. "
                  "It has no ReLU, so a table trained unfrozen can go negative, which mmsparse heads and search "
                  "engines' `rank_features` refuse (`mmsparse import` refuses such a table)."]
    return lines
