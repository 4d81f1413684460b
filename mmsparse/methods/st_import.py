"""A sentence-transformers export of an mmsparse head (methods/st.py), fine-tuned or not, read back
as a head directory (`mmsparse import FOLDER -o HEAD`).

The folder is read as files (modules.json, each module's config.json and model.safetensors), never
by running its code: Dense (W1) -> w1, LayerNorm -> norm, Dense (W2 + b) -> w2, SparseGates ->
token_ids, doc_floor, the top-k of each side and the head's own config; an inference-free export's
SparseStaticEmbedding -> query_weight (the table at each term's id; a table with negative weights,
or weight at ids outside the head's terms, is refused: never clamped in silence). A joint export
becomes a D2S head: its tuned projections and final layers now live in the folder's dual encoder,
whose vectors are the joint head's dense vectors.

The dense vectors the head reads come from the folder's own dual encoder (the Transformer module's
directory: the root, or `document_0_Transformer/` of an inference-free export) when a fine-tuning
changed it (its weights' sha256 differs from the one recorded at export) or the head was joint:
the head's training record then names that directory as its model, so `encode-dense --model DIR`
writes vectors `sparsify` accepts. Otherwise the record keeps the model the head was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import InputError
from .st import GATES_TYPE, tower_dir, towers_sha256

DENSE_CHAIN = ("Transformer", "Normalize", "Dense", "LayerNorm", "Dense")   # the export's module stack
JOINT_ONLY = ("image_dim", "text_dim", "proj_bias", "tau_init", "final_layers", "final_layers_source",
              "final_layers_tuned")   # joint config keys a D2S head does not take


def _json(p: Path) -> dict:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{p}: cannot read ({type(e).__name__}: {e}); the export folder is incomplete") from None


def _weights(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not (d / "model.safetensors").is_file():
        raise InputError(f"{d}/model.safetensors: missing; the export folder is incomplete")
    return load_file(str(d / "model.safetensors"))


def export_modules(folder: Path) -> tuple[list[tuple[str, Path]], Path | None, Path]:
    """(the dense chain [(class name, directory)] of DENSE_CHAIN, the SparseStaticEmbedding directory or
    None, the SparseGates directory) of export `folder`. InputError for a folder that is not an
    mmsparse export, or whose module stack was changed."""
    if not (folder / "modules.json").is_file():
        raise InputError(f"{folder}: no modules.json; `mmsparse import` reads a sentence-transformers model folder "
                         "written by `mmsparse export` (or a .jsonl file with --vocab)")
    entries = _json(folder / "modules.json")
    kinds = [(e["type"].rsplit(".", 1)[-1], folder / e["path"]) for e in entries]
    gates = [d for (k, d), e in zip(kinds, entries) if e["type"] == GATES_TYPE]
    if not gates:
        only_table = [k for k, _ in kinds] == ["SparseStaticEmbedding"]
        raise InputError(f"{folder}/modules.json: " + (
            "a query-route export (the term-weight table alone, no image route); import the full export "
            "(`mmsparse export HEAD -o DIR` without --route query)" if only_table else
            f"no {GATES_TYPE} module; not a model `mmsparse export` wrote"))
    static = None
    if kinds[0][0] == "Router":
        cfg = _json(kinds[0][1] / "router_config.json")
        routes = {r: [(cfg["types"][m].rsplit(".", 1)[-1], kinds[0][1] / m) for m in ms]
                  for r, ms in cfg["structure"].items()}
        chain = routes.get("document", [])
        query = routes.get("query", [])
        static = query[0][1] if [k for k, _ in query] == ["SparseStaticEmbedding"] else None
    else:
        chain = kinds[:len(DENSE_CHAIN)]
    if tuple(k for k, _ in chain) != DENSE_CHAIN:
        raise InputError(f"{folder}/modules.json: modules {[k for k, _ in chain]}, not the export's "
                         f"{list(DENSE_CHAIN)}; a model whose module stack was changed is not an mmsparse head")
    return chain, static, gates[0]


def _table(static: Path, token_ids: torch.Tensor) -> torch.Tensor:
    """query_weight [|V|] float32 of an inference-free export's SparseStaticEmbedding (weight [num
    tokens]) at the head's token ids. InputError, in one line with the count and the fix, for a
    table that a head cannot hold as it is: negative weights (sentence-transformers' table has no
    ReLU; a head's queries are max(0, w), so clamping would change every score they touch) or
    weight at ids outside the head's terms (the head has no column for them)."""
    weight = _weights(static)["weight"].float()
    where = f"{static}/model.safetensors"
    neg = int((weight < 0).sum())
    if neg:
        raise InputError(f"{where}: the query table holds {neg} negative weight(s) (fine-tuned without the table "
                         "frozen; sentence-transformers' SparseStaticEmbedding has no ReLU), which a head cannot "
                         "hold without changing scores: fine-tune with the table frozen (the export's default), "
                         "or set them to 0 in the model yourself (weight.data.clamp_(min=0)) and save it again")
    outside = torch.ones_like(weight, dtype=torch.bool)
    outside[token_ids] = False
    stray = int((weight[outside] != 0).sum())
    if stray:
        raise InputError(f"{where}: {stray} weight(s) at token ids outside the head's {token_ids.numel()} terms, "
                         "which a head has no column for: fine-tune with the table frozen (the export's default), "
                         "or set them to 0 in the model and save it again")
    return weight[token_ids]


def read_export(folder: str | Path):
    """(head, changed) of export `folder`: the head (a SparseHead of the exported method, joint read as
    d2s, its tokenizer set) and whether its dense vectors now come from the folder's own dual
    encoder (module docstring). InputError as export_modules, or for weights of other shapes."""
    from transformers import AutoTokenizer

    from ..provenance import model_fingerprint
    from ..vocab import _clean
    from . import get_method

    folder = Path(folder)
    chain, static, gates_dir = export_modules(folder)
    gcfg = _json(gates_dir / "config.json")
    gw = _weights(gates_dir)
    mm = gcfg.get("mmsparse") or {}
    method, config = mm.get("method"), dict(mm.get("config") or {})
    if method not in ("d2s", "inference-free", "joint") or not config:
        raise InputError(f"{gates_dir}/config.json: mmsparse.method / mmsparse.config missing; not a model "
                         "`mmsparse export` wrote")
    joint = method == "joint"
    if joint:
        method, config = "d2s", {k: v for k, v in config.items() if k not in JOINT_ONLY}
    w1, norm, w2 = _weights(chain[2][1]), _weights(chain[3][1]), _weights(chain[4][1])
    token_ids = gw["token_ids"].long()
    config.update(dim=int(w1["linear.weight"].shape[1]), omega=int(w1["linear.weight"].shape[0]),
                  vocab_size=int(token_ids.numel()), doc_top_k=int(gcfg.get("image_top_k", 0)),
                  query_top_k=int(gcfg.get("text_top_k", 0)))
    towers = tower_dir(folder)
    tok = AutoTokenizer.from_pretrained(str(static or towers))
    vocab = [_clean(t or "") for t in tok.convert_ids_to_tokens(token_ids.tolist())]
    state = {"w1.weight": w1["linear.weight"], "norm.weight": norm["norm.weight"], "norm.bias": norm["norm.bias"],
             "w2.weight": w2["linear.weight"], "w2.bias": w2["linear.bias"], "token_ids": token_ids}
    if "doc_floor" in gw:   # a head holds the floor buffer when doc_max_share < 1
        state["doc_floor"] = gw["doc_floor"]
        config["doc_max_share"] = float(config.get("doc_max_share") or 0.5)
    else:
        config.pop("doc_max_share", None)
    if method == "inference-free":
        if static is None:
            raise InputError(f"{folder}: an inference-free export without its query table (SparseStaticEmbedding)")
        state["query_weight"] = _table(static, token_ids)
    changed = joint or towers_sha256(folder) != mm.get("towers_sha256")
    if changed:
        training = dict(config.get("training") or {})
        training.update(backbone=mm.get("backbone") or training.get("backbone"), model=str(towers.resolve()),
                        model_fingerprint=model_fingerprint(towers), imported_from=str(folder.resolve()))
        config["training"] = training
    head = get_method(method, f"{gates_dir}/config.json: mmsparse.method").head_class(config, vocab)
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise InputError(f"{folder}: weights do not fit a {method} head ({str(e).splitlines()[0]})") from None
    head.tokenizer = tok
    return head.eval(), changed
