"""The sparse head's term vocabulary and caption bag-of-words helpers.

A vocabulary is (terms, embeddings, tokenizer): `terms[i]` names output dimension i of the
head, `embeddings` [|V|, ω] float32 initialises W2 (D2S §4.1: "W2 is initialized with
vocabulary embeddings"), `tokenizer` maps a caption to term ids (used for expansion control
and for `--query-mode caption-terms`).

Default source: the text tower of the backbone that made the dense files (their `model`
attribute), via `mmsparse.backbones.backbone_from_attrs` when that backbone is registered, else
a local loader (AutoTokenizer + AutoModel, taking the text model's input embeddings).
`--vocab-model PATH` takes a masked-LM path (e.g. distilbert-base-uncased) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError


@dataclass
class Vocab:
    """terms: |V| strings; embeddings: [|V|, ω] float32 torch tensor; tokenizer: HF tokenizer;
    source: where it came from (model path, for provenance); token_ids: [|V|] int64 tokenizer id
    of each term (None = 0..|V|-1, the whole tokenizer vocabulary)."""

    terms: list[str]
    embeddings: "object"
    tokenizer: "object"
    source: str
    token_ids: np.ndarray | None = None

    def __post_init__(self):
        if self.token_ids is None:
            self.token_ids = np.arange(len(self.terms), dtype=np.int64)

    def restrict(self, keep: np.ndarray) -> "Vocab":
        """The sub-vocabulary of the terms where boolean mask `keep` [|V|] is True."""
        idx = np.flatnonzero(keep)
        return Vocab([self.terms[i] for i in idx], self.embeddings[idx], self.tokenizer, self.source,
                     self.token_ids[idx])


def _clean(term: str) -> str:
    # vocab.txt holds one term per line and index files split on whitespace
    return "".join("_" if ch.isspace() else ch for ch in term) or "[empty]"


def _vocab_list(tokenizer, n: int) -> list[str]:
    inv = {i: t for t, i in tokenizer.get_vocab().items()}
    return [_clean(inv.get(i, f"[unused_{i}]")) for i in range(n)]


def load_vocab_model(path: str | Path) -> Vocab:
    """Vocabulary of a local transformers model: its tokenizer and text input embeddings.

    Works for a masked LM (BERT, DistilBERT), a text encoder, or a VisionTextDualEncoderModel /
    CLIP-like model (uses its `text_model`). Raises InputError if `path` does not hold one.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"{p}: vocabulary model not found; pass a local transformers model directory "
                         "(e.g. --vocab-model /path/to/distilbert-base-uncased)")
    try:
        from transformers import logging as hf_logging
        hf_logging.set_verbosity_error()
        tok = AutoTokenizer.from_pretrained(str(p))
        model = AutoModel.from_pretrained(str(p))
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{p}: cannot load a tokenizer + model from it ({type(e).__name__}: {e})") from None
    text = getattr(model, "text_model", model)
    emb = text.get_input_embeddings().weight.detach().to(torch.float32).clone()
    return Vocab(_vocab_list(tok, emb.shape[0]), emb, tok, str(p.resolve()))


def vocab_from_dense_attrs(attrs: dict) -> Vocab:
    """Vocabulary of the backbone named by a dense file's `backbone` and `model` attributes."""
    import torch

    try:
        from .backbones.base import backbone_from_attrs
    except ImportError:
        backbone_from_attrs = None
    if backbone_from_attrs is not None:
        try:
            bb = backbone_from_attrs(attrs, device="cpu")
        except InputError:
            bb = None
        except ImportError:  # backbone module not importable yet -> local loader
            bb = None
        if bb is not None:
            emb = bb.word_embeddings().detach().to(torch.float32).clone()
            return Vocab([_clean(t) for t in bb.vocab()], emb, bb.tokenizer, str(attrs.get("model", "")))
    model = attrs.get("model")
    if not model:
        raise InputError("dense file has no `model` attribute to take the vocabulary from; pass --vocab-model")
    if not Path(str(model)).exists():
        raise InputError(f"dense file attribute model={model!r} is not a local path; pass --vocab-model PATH")
    return load_vocab_model(model)


def caption_token_ids(tokenizer, texts: list[str], max_length: int = 128) -> list[np.ndarray]:
    """Term ids of each caption (no special tokens, truncated to `max_length`), int64 arrays."""
    enc = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = []
    for ids in enc["input_ids"]:
        a = np.unique(np.asarray(ids, dtype=np.int64))
        out.append(a[~np.isin(a, list(special))] if special else a)
    return out


def to_columns(ids: list[np.ndarray], token_ids: np.ndarray, n_tokens: int | None = None) -> list[np.ndarray]:
    """Map tokenizer ids to head columns (the position of each id in `token_ids`); ids the head's
    vocabulary lacks are dropped."""
    token_ids = np.asarray(token_ids, dtype=np.int64)
    n = max(int(token_ids.max(initial=-1)) + 1, n_tokens or 0,
            max((int(a.max(initial=-1)) + 1 for a in ids), default=0))
    col = np.full(n, -1, dtype=np.int64)
    col[token_ids] = np.arange(len(token_ids))
    out = []
    for a in ids:
        c = col[a]
        out.append(np.sort(c[c >= 0]))
    return out


def pad_ids(ids: list[np.ndarray], fill: int) -> np.ndarray:
    """Stack ragged id arrays into [N, Lmax] int64, padded with `fill` (use |V| = a dummy column)."""
    n = max((len(a) for a in ids), default=0)
    out = np.full((len(ids), max(n, 1)), fill, dtype=np.int64)
    for i, a in enumerate(ids):
        out[i, :len(a)] = a
    return out


def indicator(padded, vocab_size: int):
    """[B, L] padded term ids (pad = vocab_size) -> [B, |V|] float32 torch 0/1 matrix, vectorised."""
    import torch

    padded = torch.as_tensor(padded, dtype=torch.int64)
    m = torch.zeros(padded.shape[0], vocab_size + 1, dtype=torch.float32, device=padded.device)
    m.scatter_(1, padded, 1.0)
    return m[:, :vocab_size]


def indicator_cols(padded, cols, vocab_size: int, values=None):
    """indicator(padded, vocab_size)[:, cols] without building the [B, |V|] matrix:
    padded [B, L] term ids (pad = vocab_size), cols [K] int64 distinct columns -> [B, K] float32 0/1.
    values: optional [B, L] float32 written instead of 1 at each listed term (ids distinct per row;
    a term outside `cols` and the pad are dropped)."""
    import torch

    cols = torch.as_tensor(cols)
    dev = cols.device
    padded = torch.as_tensor(padded, dtype=torch.int64).to(dev)
    pos = torch.full((vocab_size + 1,), len(cols), dtype=torch.int64, device=dev)  # others -> spare column
    pos[cols] = torch.arange(len(cols), device=dev)
    m = torch.zeros(padded.shape[0], len(cols) + 1, dtype=torch.float32, device=dev)
    m.scatter_(1, pos[padded], 1.0 if values is None else values.to(device=dev, dtype=torch.float32))
    return m[:, :len(cols)]


def document_frequency(ids: list[np.ndarray], vocab_size: int) -> np.ndarray:
    """df_v = fraction of captions containing term v, float64 [|V|] in [0, 1] (D2S Alg. 1)."""
    if not ids:
        return np.zeros(vocab_size)
    counts = np.bincount(np.concatenate(ids).astype(np.int64), minlength=vocab_size)[:vocab_size]
    return counts / len(ids)


def load_vocab(vocab_model: str | Path | None, dense_attrs: dict) -> Vocab:
    """The vocabulary of `vocab_model` (a local model directory) if given, else of the text tower
    that made the dense files (`dense_attrs`' backbone and model)."""
    return load_vocab_model(vocab_model) if vocab_model else vocab_from_dense_attrs(dense_attrs)


def restrict_to_frequent(voc: Vocab, raw_ids: list[np.ndarray], min_df: int) -> Vocab:
    """The terms of `voc` occurring in >= `min_df` of the captions whose tokenizer ids are
    `raw_ids` (min_df 0: `voc` unchanged). InputError when no term is left."""
    if min_df <= 0:
        return voc
    tid = np.asarray(voc.token_ids, dtype=np.int64)
    n = max(int(tid.max(initial=-1)) + 1, max((int(a.max(initial=-1)) + 1 for a in raw_ids), default=0))
    counts = np.bincount(np.concatenate(raw_ids).astype(np.int64), minlength=n) if raw_ids else np.zeros(n)
    out = voc.restrict(counts[tid] >= min_df)
    if not out.terms:
        raise InputError(f"--vocab-min-df {min_df}: no term occurs that often in the training captions")
    return out
