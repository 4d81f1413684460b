"""The inference-free query encoder: a caption's WordPiece tokens, each weighted by the head's table.

Needs only the head directory's `tokenizer/tokenizer.json` (the `tokenizers` library) and two
tensors of its `model.safetensors` (read with safetensors' numpy loader): no torch, no
transformers, no backbone. That is what lets `mmsparse query`, `serve` and `search` answer text
queries of an inference-free head without loading a model (cold start well under a second).

    q_t(c) = max(0, w_t) · 1[t ∈ tokens(c)]          (t: a term of the head's vocabulary)

w is the head's `query_weight` [|V|] (initialised from IDF over the training captions, then
learned); a term with w_t <= 0 never appears in a query (the table learned it carries no
ranking value, e.g. "a", "."). Tokens are the caption's unique WordPiece ids without special
tokens, truncated to 128 as in training (mmsparse.vocab.caption_token_ids).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import scipy.sparse as sp

from ...errors import InputError

if TYPE_CHECKING:
    from ..base import Sparsified

MAX_TOKENS = 128   # caption_token_ids' truncation, so queries match what training saw
QUERY_MODE = "inference-free"   # the query_mode of the sparse files these queries make
DESCRIPTION = "term-weight table (inference-free, no model)"   # how the queries were encoded, as shown


class TermWeightQueryEncoder:
    """Text -> sparse query vectors with a head's term-weight table.

    tokenizer: a `tokenizers.Tokenizer`; weights [|V|] float (the raw table w; max(0, w) is used);
    token_ids [|V|] int64 (tokenizer id of each head column); vocab: the |V| terms. Build one from a
    head directory with `load` (no torch) or from a loaded head with `from_head`.
    """

    def __init__(self, tokenizer, weights, token_ids, vocab):
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.weights = np.maximum(np.asarray(weights, dtype=np.float32), 0.0)
        self.vocab_size = len(self.weights)
        self.vocab = list(vocab)
        token_ids = np.asarray(token_ids, dtype=np.int64)
        # tokenizer id -> head column (-1: not in the head's vocabulary, or a special token)
        self.column = np.full(max(int(token_ids.max(initial=-1)) + 1, tokenizer.get_vocab_size()), -1, dtype=np.int64)
        self.column[token_ids] = np.arange(len(token_ids))
        special = [i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special and i < len(self.column)]
        self.column[special] = -1   # as caption_token_ids drops the tokenizer's special ids

    @classmethod
    def load(cls, head_dir: str | Path) -> "TermWeightQueryEncoder":
        """From an inference-free head directory: tokenizer/tokenizer.json, and `query_weight` and
        `token_ids` of model.safetensors (numpy). InputError when a file or tensor is missing."""
        from safetensors import safe_open
        from tokenizers import Tokenizer

        p = Path(head_dir)
        tok = p / "tokenizer" / "tokenizer.json"
        if not tok.is_file():
            raise InputError(f"{p}: no tokenizer/tokenizer.json; an inference-free head needs its fast tokenizer "
                             "(retrain it with `mmsparse train-head --method inference-free`)")
        try:
            with safe_open(str(p / "model.safetensors"), framework="numpy") as f:
                weights, token_ids = f.get_tensor("query_weight"), f.get_tensor("token_ids")
        except (OSError, KeyError) as e:
            raise InputError(f"{p}/model.safetensors: no term-weight table ({e}); not an inference-free head") from None
        vocab = (p / "vocab.txt").read_text(encoding="utf-8").split("\n")[: len(weights)]
        return cls(Tokenizer.from_file(str(tok)), weights, token_ids, vocab)

    @classmethod
    def from_head(cls, head) -> "TermWeightQueryEncoder":
        """From a loaded InferenceFreeHead (its fast tokenizer's backend, its table and columns)."""
        import copy

        from ..head import require_tokenizer

        tok = copy.deepcopy(require_tokenizer(head, getattr(head, "source_dir", None)).backend_tokenizer)
        return cls(tok, head.query_weight.detach().cpu().numpy(), head.token_ids.cpu().numpy(), head.vocab)

    def columns(self, text: str) -> np.ndarray:
        """Sorted unique head columns of the terms of `text` (int64), special tokens left out."""
        col, n = self.column, len(self.column)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids[:MAX_TOKENS]
        # a set over a caption's ~12 ids: no numpy array round trips for so few
        return np.fromiter(sorted({int(col[i]) for i in ids if i < n} - {-1}), dtype=np.int64)

    def encode_one(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """One query: (term ids int32 [n] increasing, weights float32 [n] > 0), q_t(c) as in `encode`.

        No sparse matrix is built (scipy's CSR constructor costs more than the tokenizer on one
        caption): the path the end-to-end benchmark times; `encode` stacks its rows."""
        c = self.columns(text)
        w = self.weights[c]
        keep = w > 0
        return c[keep].astype(np.int32), w[keep]

    def encode(self, texts: Sequence[str]) -> sp.csr_matrix:
        """CSR [len(texts), |V|] float32 of q_t(c) = max(0, w_t)·1[t ∈ c]; terms whose weight is 0 are
        not stored (a query of only such terms is an empty row)."""
        parts = [self.encode_one(t) for t in texts]
        indptr = np.cumsum([0] + [len(c) for c, _ in parts], dtype=np.int64)
        ind = np.concatenate([c for c, _ in parts]) if parts else np.zeros(0, dtype=np.int32)
        dat = np.concatenate([w for _, w in parts]) if parts else np.zeros(0, dtype=np.float32)
        return sp.csr_matrix((dat, ind, indptr), shape=(len(texts), self.vocab_size))   # float32, int32

    def terms(self, text: str) -> list[tuple[str, float]]:
        """(term, weight) pairs of `text`'s query, heaviest first: what the search page shows."""
        c = self.columns(text)
        w = self.weights[c]
        order = np.argsort(-w, kind="stable")
        return [(self.vocab[c[i]], float(w[i])) for i in order if w[i] > 0]


def sparsify_texts(head, head_dir, ids: list[str], texts: list[str], batch_size: int = 4096,
                   progress=None) -> Sparsified:
    """Query texts -> Sparsified (CSR [N, |V|] float32) through the head's table: the directory's
    files when `head_dir` is given (no torch needed), else the loaded head. batch_size: texts per
    progress step (a kill point between steps)."""
    from ...atomic import kill_point
    from ...progress import reporter
    from ..base import Sparsified

    enc = TermWeightQueryEncoder.load(head_dir) if head_dir is not None else TermWeightQueryEncoder.from_head(head)
    parts = []
    with reporter(progress).task("sparsify inference-free", total=len(texts)) as bar:
        for s in range(0, len(texts), batch_size):
            parts.append(enc.encode(texts[s:s + batch_size]))
            bar.advance(len(parts[-1].indptr) - 1)
            kill_point()
    m = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, enc.vocab_size), dtype=np.float32)
    return Sparsified(list(ids), m, list(texts), {"query_encoder": DESCRIPTION})

