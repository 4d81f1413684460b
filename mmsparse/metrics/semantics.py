"""Semantic deviation proxies of D2S (eq. 2-3): Exact@k and Semantic@k of caption vectors, and
their image-side counterpart doc_Exact@k (do an image's top terms occur in its own captions?)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import InputError


def tokenize_captions(texts: Sequence[str], tokenizer: str | Path) -> list[list[str]]:
    """Word pieces of each caption (no special tokens) with the tokenizer.json in `tokenizer`
    (a model directory or the file itself). Raises InputError if there is none."""
    from tokenizers import Tokenizer

    p = Path(tokenizer)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise InputError(f"{p}: no tokenizer.json; pass --tokenizer MODEL_DIR (the model whose vocab the head uses)")
    tok = Tokenizer.from_file(str(f))
    # a model's tokenizer.json may pad batches (to the longest caption) and truncate: neither belongs
    # to a caption's own pieces ([PAD] would count as a caption term in Exact@k / Semantic@k)
    tok.no_padding()
    tok.no_truncation()
    return [e.tokens for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def resolve_tokenizer(tokenizer: str | Path | None, *attrs: Mapping) -> Path:
    """The directory (or tokenizer.json) that splits captions into the vocabulary's word pieces:
    `tokenizer` when given, else the `model` attribute of the first sparse file in `attrs` whose
    model directory holds a tokenizer.json, else the shared dual encoder
    (mmsparse.settings.dual_encoder_dir). Existence is checked by `tokenize_captions`."""
    from ..settings import dual_encoder_dir

    if tokenizer is not None:
        return Path(tokenizer)
    for a in attrs:
        m = str((a or {}).get("model", ""))
        if m and (Path(m) / "tokenizer.json").is_file():
            return Path(m)
    return dual_encoder_dir()


def caption_term_ids(pieces: Sequence[Sequence[str]], vocab: Sequence[str]) -> list[np.ndarray]:
    """Unique vocab ids (int64, sorted) of each caption's word pieces; pieces not in `vocab` are dropped."""
    index = {t: i for i, t in enumerate(vocab)}
    return [np.unique(np.array([index[t] for t in ps if t in index], dtype=np.int64)) for ps in pieces]


def top_k_ids(matrix: sp.csr_matrix, i: int, k: int) -> np.ndarray:
    """Term ids of row i's k largest non-zero weights (ties broken by lower term id)."""
    s, e = matrix.indptr[i], matrix.indptr[i + 1]
    idx, w = matrix.indices[s:e], matrix.data[s:e]
    keep = w != 0
    idx, w = idx[keep], w[keep]
    return idx[np.argsort(-w, kind="stable")[:k]].astype(np.int64)


def exact_semantic_at_k(matrix: sp.csr_matrix, caption_ids: Sequence[np.ndarray], k: int,
                        embeddings: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-caption Exact@k (eq. 2) and Semantic@k (eq. 3), float64 [N] each.

    matrix: CSR [N, |V|] caption term weights s_C; caption_ids[i]: vocab ids of caption i's
    word pieces x_C; embeddings: static term embeddings f_enc [|V|, e] (rows aligned with the
    vocab) or None to skip Semantic@k.
    Exact@k = |top_k(s_C) ∩ x_C| / k.  Semantic@k = (1/k) sum_{t in top_k(s_C)} max_{c in x_C} cos(f(t), f(c)).
    Both divide by k even when a row has fewer than k non-zeros (as the equations do); a
    caption with no in-vocab piece scores 0.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    n = matrix.shape[0]
    if len(caption_ids) != n:
        raise ValueError(f"{len(caption_ids)} captions for {n} rows")
    exact = np.zeros(n)
    sem = np.zeros(n) if embeddings is not None else None
    if embeddings is not None:
        if embeddings.shape[0] != matrix.shape[1]:
            raise InputError(f"static embeddings have {embeddings.shape[0]} rows, the vocab has {matrix.shape[1]} terms")
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        unit = embeddings / np.where(norms == 0, 1, norms)
    for i in range(n):
        top, cap = top_k_ids(matrix, i, k), caption_ids[i]
        if not len(top) or not len(cap):
            continue
        exact[i] = np.isin(top, cap).sum() / k
        if sem is not None:
            sem[i] = (unit[top] @ unit[cap].T).max(axis=1).sum() / k
    return exact, sem


def doc_caption_terms(doc_ids: Sequence[str], qrels: Mapping[str, Mapping[str, int]],
                      caption_terms: Mapping[str, np.ndarray],
                      vocab: Sequence[str] | None = None) -> list[np.ndarray | None]:
    """The caption words of each document: for doc_ids[j], the union (sorted unique int64 vocab
    ids) of `caption_terms[q]` over the captions q that the qrels call relevant to it
    (qrels[q][doc] > 0) and that `caption_terms` holds; None for a document with no such caption.
    With `vocab`, WordPiece continuations ('##ed', '##s') are dropped: they are fragments of a
    caption word, not words (a hub piece such as '##ed' would otherwise match most captions)."""
    keep = None if vocab is None else np.array([not str(t).startswith("##") for t in vocab], dtype=bool)
    rel: dict[str, list[str]] = {}
    for q, docs in qrels.items():
        if q in caption_terms:
            for d, r in docs.items():
                if r > 0:
                    rel.setdefault(d, []).append(q)
    out: list[np.ndarray | None] = []
    for d in doc_ids:
        qs = rel.get(d)
        if not qs:
            out.append(None)
            continue
        w = np.unique(np.concatenate([caption_terms[q] for q in qs])).astype(np.int64)
        out.append(w[keep[w]] if keep is not None else w)
    return out


def doc_exact_at_k(docs: sp.csr_matrix, doc_terms: Sequence[np.ndarray | None], k: int) -> np.ndarray:
    """Image-side faithfulness doc_Exact@k, per document: float64 [D].

    docs: CSR [D, |V|] document (image) term weights s_I; doc_terms[j]: vocab ids of the words of
    document j's relevant captions (`doc_caption_terms`), or None when it has none.

        doc_Exact@k(d) = |top_k(s_d) ∩ W(d)| / k,   W(d) = ∪_{q : qrels(q, d) > 0} x_q

    where x_q are caption q's word pieces (tokenised as for Exact@k, eq. 2 of D2S; doc_faithfulness
    leaves out '##' continuation pieces, see doc_caption_terms) and top_k the k largest non-zero
    weights (ties by lower term id). Like eq. 2 it divides by k even when a row
    has fewer than k non-zeros; documents without relevant captions are NaN (leave them out of
    the mean: np.nanmean). Function words count when the captions hold them, so read it beside
    doc_max_df (a hub term in every image also scores here).
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    if len(doc_terms) != docs.shape[0]:
        raise ValueError(f"{len(doc_terms)} caption-word sets for {docs.shape[0]} documents")
    out = np.full(docs.shape[0], np.nan)
    for j, words in enumerate(doc_terms):
        if words is not None:
            out[j] = np.isin(top_k_ids(docs, j, k), words).sum() / k
    return out


def doc_faithfulness(docs: sp.csr_matrix, doc_ids: Sequence[str], vocab: Sequence[str],
                     qrels: Mapping[str, Mapping[str, int]], caption_terms: Mapping[str, np.ndarray],
                     ks: Sequence[int] = (10, 3)) -> tuple[dict, dict[int, np.ndarray]]:
    """Image-side faithfulness of a document collection, as eval's JSON keys, and per-document values.

    docs: CSR [D, |V|]; caption_terms: {caption id: vocab ids of its word pieces} (caption_term_ids
    of the captions that have texts); qrels: {caption id: {doc id: relevance}}. Returns
    ({"doc_Exact@k": mean over the scored documents for each k in `ks` (a term counts when it is
      a word-start piece of a relevant caption: '##' continuations never count),
      "doc_faithfulness_docs": documents with at least one relevant caption (the ones scored),
      "doc_max_df": share of all D documents holding the most common term, "doc_max_df_term": it},
     {k: float64 [D] per-document doc_Exact@k, NaN where unscored}).
    Means are 0.0 when no document has a relevant caption. See doc_exact_at_k and efficiency.max_df.
    """
    from .efficiency import max_df

    words = doc_caption_terms(doc_ids, qrels, caption_terms, vocab)  # whole-word pieces only
    n = sum(w is not None for w in words)
    per = {k: doc_exact_at_k(docs, words, k) for k in ks}
    out: dict = {f"doc_Exact@{k}": float(np.nanmean(v)) if n else 0.0 for k, v in per.items()}
    share, term, _ = max_df(docs, vocab)
    out.update({"doc_faithfulness_docs": n, "doc_max_df": share, "doc_max_df_term": term})
    return out, per


def embeddings_source(static_embeddings: str | Path | None, head: str | Path | None,
                      attrs: Mapping) -> Path | None:
    """Where Semantic@k's static term embeddings come from: `static_embeddings`, else `head`, else
    the head directory a sparse file records in its `head` attribute (when it still exists), else None."""
    src = static_embeddings or head
    if src is None and str(attrs.get("head", "")) and Path(str(attrs["head"])).is_dir():
        src = attrs["head"]
    return Path(src) if src is not None else None


def load_static_embeddings(path: str | Path, vocab_size: int, key: str | None = None) -> np.ndarray:
    """Static term embeddings [vocab_size, e] float32 from `path`:

    - a .npy file [vocab_size, e];
    - a .safetensors file or a directory holding model.safetensors (a head directory or a
      Hugging Face model): tensor `key` if given, else `...word_embeddings.weight`, else a
      2-D tensor named like W2 / w2 (the head's output layer), else the only 2-D tensor with
      a dimension of size vocab_size. A [e, vocab_size] tensor is transposed.
    Raises InputError when nothing fits.
    """
    from safetensors import safe_open

    p = Path(path)
    if p.suffix == ".npy" and p.is_file():
        emb = np.load(p)
        return _orient(emb, vocab_size, str(p))
    f = p / "model.safetensors" if p.is_dir() else p
    if not f.is_file():
        raise InputError(f"{p}: static embeddings not found (expected .npy, .safetensors, or a directory "
                         "with model.safetensors)")
    with safe_open(str(f), framework="numpy") as st:
        shapes = {k: st.get_slice(k).get_shape() for k in st.keys()}
        fits = [k for k, s in shapes.items() if len(s) == 2 and vocab_size in s]
        if key is not None:
            if key not in shapes:
                raise InputError(f"{f}: no tensor {key!r}; 2-D tensors with a {vocab_size} dimension: {fits}")
            pick = key
        else:
            pick = (next((k for k in fits if k.endswith("word_embeddings.weight")), None)
                    or next((k for k in fits if "w2" in k.lower()), None)
                    or (fits[0] if len(fits) == 1 else None))
            if pick is None:
                raise InputError(f"{f}: cannot tell which tensor holds the {vocab_size} term embeddings "
                                 f"(candidates: {fits}); pass --embedding-key")
        emb = st.get_tensor(pick)
    return _orient(emb, vocab_size, f"{f}[{pick}]")


def _orient(emb: np.ndarray, vocab_size: int, where: str) -> np.ndarray:
    emb = np.asarray(emb, dtype=np.float32)
    if emb.ndim == 2 and emb.shape[0] != vocab_size and emb.shape[1] == vocab_size:
        emb = emb.T
    if emb.ndim != 2 or emb.shape[0] != vocab_size:
        raise InputError(f"{where}: embeddings of shape {emb.shape} do not match the {vocab_size}-term vocab")
    return np.ascontiguousarray(emb)
