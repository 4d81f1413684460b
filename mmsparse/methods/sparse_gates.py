"""The one module an mmsparse export adds to sentence-transformers' own: log(1 + ReLU), the top-k gate
of each route, the posting floor, caption-term queries, and the head's vocabulary columns placed at
their tokenizer ids.

`mmsparse export` copies this file into the model folder as `sparse_gates.py`; sentence-transformers
loads it from there with `SparseEncoder(folder, trust_remote_code=True)`. It imports torch and
sentence-transformers only, never mmsparse, so the model runs where mmsparse is not installed, and
every operation is a differentiable torch operation, so the model fine-tunes with
sentence-transformers' trainers and losses.

    input   features["sentence_embedding"] [B, |V|]: pre-activations x = W2 · LN(W1 · z) + b of the
            head's |V| vocabulary columns (the modules before this one: Transformer, Normalize, Dense,
            LayerNorm, Dense); features["modality"] ("image" | "text"), and for caption-term queries
            the Transformer's features["input_ids"] / ["attention_mask"]
    output  features["sentence_embedding"] [B, num_tokens] float32 >= 0, column token_ids[c] holding
            head column c, every other id 0:
              image rows   s = log(1 + ReLU(x)) at each row's image_top_k largest x (every x when 0),
                           then 0 where s <= doc_floor (the posting floor, when the head has one)
              text rows    s at each row's text_top_k largest x ("expand", the default), or, with task
                           "caption-terms" (or query_mode "caption-terms"), s ungated at the caption's
                           own tokens only (special tokens and tokens outside the head's columns left out)
              static_text  text rows come from a SparseStaticEmbedding (an inference-free head's query
                           table, already over the tokenizer ids): passed through unchanged
"""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import torch

try:
    from typing import Self
except ImportError:   # Python < 3.11
    from typing_extensions import Self

from sentence_transformers.base.modules.module import Module

FILE_NAME = "sparse_gates.py"          # this file's name inside an exported model folder
QUERY_MODES = ("expand", "caption-terms")


class SparseGates(Module):
    """Term weights over the tokenizer's ids from the head's pre-activations (module docstring).

    num_terms: |V|, the head's columns; num_tokens: the tokenizer's ids (the output width);
    image_top_k / text_top_k: k of each side's gate (0 = none); floor: the head has a posting floor
    (buffer doc_floor [|V|]); query_mode: "expand" or "caption-terms", what text rows are unless the
    task says otherwise; static_text: text rows are an inference-free query table's output, passed
    through; special_ids: tokenizer ids never taken as caption terms; mmsparse: the exported head's
    own description (method, config), read back by `mmsparse import`, unused here.
    Buffers: token_ids [|V|] int64 (tokenizer id of each column), doc_floor [|V|] float32.
    """

    config_keys = ["num_terms", "num_tokens", "image_top_k", "text_top_k", "floor", "query_mode", "static_text",
                   "special_ids", "mmsparse"]
    forward_kwargs = {"task"}

    def __init__(self, num_terms: int, num_tokens: int, image_top_k: int = 0, text_top_k: int = 0,
                 floor: bool = False, query_mode: str = "expand", static_text: bool = False,
                 special_ids: list[int] | None = None, mmsparse: dict | None = None):
        super().__init__()
        if query_mode not in QUERY_MODES:
            raise ValueError(f"query_mode {query_mode!r}: use one of {', '.join(QUERY_MODES)}")
        self.num_terms, self.num_tokens = int(num_terms), int(num_tokens)
        self.image_top_k, self.text_top_k = int(image_top_k), int(text_top_k)
        self.floor, self.query_mode, self.static_text = bool(floor), str(query_mode), bool(static_text)
        self.special_ids = sorted(int(i) for i in (special_ids or []))
        self.mmsparse = dict(mmsparse or {})
        self.register_buffer("token_ids", torch.arange(self.num_terms, dtype=torch.int64))
        if self.floor:
            self.register_buffer("doc_floor", torch.zeros(self.num_terms))

    def get_embedding_dimension(self) -> int:
        return self.num_tokens

    def forward(self, features: dict, task: str | None = None, **kwargs) -> dict:
        side = "image" if features.get("modality") == "image" else "text"
        if side == "text" and self.static_text:
            return features
        x = features["sentence_embedding"].float()
        mode = task if task in QUERY_MODES else self.query_mode     # encode_query's task "query": the default
        if side == "text" and mode == "caption-terms":
            s = torch.log1p(torch.relu(x)) * self._own_terms(features, x.shape[0], x.device)
            out = x.new_zeros(x.shape[0], self.num_tokens).index_copy(1, self.token_ids, s)
        else:
            k = self.image_top_k if side == "image" else self.text_top_k
            # the gate picks the k largest pre-activations: log(1 + ReLU) keeps their order
            cols = x.topk(k, dim=1).indices if 0 < k < self.num_terms else None
            s = torch.log1p(torch.relu(x if cols is None else x.gather(1, cols)))
            if side == "image" and self.floor:
                s = s * (s > (self.doc_floor if cols is None else self.doc_floor[cols]))
            tokens = self.token_ids.expand(x.shape[0], -1) if cols is None else self.token_ids[cols]
            out = x.new_zeros(x.shape[0], self.num_tokens).scatter(1, tokens, s)
        features["sentence_embedding"] = out
        return features

    def _own_terms(self, features: dict, rows: int, device) -> torch.Tensor:
        """[B, |V|] float 0/1: the head columns of each caption's tokens (its input_ids where the
        attention mask is 1), special tokens and tokens outside the head's columns left out."""
        ids = features["input_ids"].to(device)
        mask = features.get("attention_mask")
        width = max(self.num_tokens, int(ids.max()) + 1 if ids.numel() else 0)
        col = torch.full((width,), self.num_terms, dtype=torch.int64, device=device)
        col[self.token_ids] = torch.arange(self.num_terms, device=device)
        if self.special_ids:
            col[torch.tensor(self.special_ids, device=device)] = self.num_terms
        c = col[ids]
        if mask is not None:
            c = c.masked_fill(mask.to(device) == 0, self.num_terms)
        keep = torch.zeros(rows, self.num_terms + 1, device=device).scatter_(1, c, 1.0)
        return keep[:, :self.num_terms]

    # -- files ---------------------------------------------------------------------------------
    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """config.json and model.safetensors (token_ids, doc_floor) in `output_path`, and this file
        beside the module folder, in the model's root, where sentence-transformers looks for the
        class named in modules.json ("sparse_gates.SparseGates") when it loads the model again."""
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)
        src = Path(inspect.getsourcefile(type(self)))
        for dest in (Path(output_path) / FILE_NAME, Path(output_path).resolve().parent / FILE_NAME):
            if src.resolve() != dest.resolve():
                shutil.copyfile(src, dest)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token=None, cache_folder=None, revision=None,
             local_files_only: bool = False, **kwargs) -> Self:
        hub = dict(subfolder=subfolder, token=token, cache_folder=cache_folder, revision=revision,
                   local_files_only=local_files_only)
        config = cls.load_config(model_name_or_path, **hub)
        model = cls(**{k: v for k, v in config.items() if k in cls.config_keys})
        return cls.load_torch_weights(model_name_or_path, model=model, **hub)
