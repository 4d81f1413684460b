"""`query`: free-text (or image) queries against an index, encoded on the fly with the backbone
and head the index was built from; `QueryEngine`: the same with the model loaded once.

    import mmsparse
    hits = mmsparse.query("work/index/d2s", ["a dog running on the beach"], k=10)
    top = hits[0]["results"][0]      # {"rank": 1, "id": "...", "score": 7.91, "shared": [...]}
    top["shared"][0]                 # {"term": "dog", "query_weight", "doc_weight", "contribution"}

    from mmsparse.api.querying import QueryEngine
    with QueryEngine("work/index/d2s") as engine:        # loads backbone, head and index once
        engine.run(["a dog", "two cats"], k=5)
        engine.run(["a dog"], k=5, exclude=["dog"], add=["grass"])   # edit the expanded terms

Where the model comes from (the index's provenance). An index's `mmsparse.json` records the
file it was built from (`source`) and that file's attributes: a sparse file records its `head`
and the `dense` file it was made from; the dense file records the `backbone` and `model` (and
`max_length`, `patch_layer`). `head=`, `backbone=`, `model=` override what is recorded.

How a query is encoded (the same for every method of the registry). The query texts (or
images) go through the backbone exactly as `encode-dense` encodes a captions (images) file —
`backbones.encode.encode_captions_file` / `encode_images_file` into a temporary dense HDF5 with
every extra the modality has (pre_projection and token_states for texts, pre_projection and
patch_states for images), with the document files' max_length, patch layer and states dtype —
and that file goes through the head's method exactly as `mmsparse.sparsify` sends a file
through it: the registry's `Method.sparsify` hook (mmsparse/methods/base.py) with the mode
`Method.query_mode` picks (the head's default query mode, or `query_mode`), the method's
default sparsify options, its batch size and the same backbone/model check. Whatever a method
reads (vectors for d2s, pre_projection for joint, token or patch states for vdr and bm25v), it
finds it there, so a query is sparsified exactly as the same text in a captions file would be:
`query` gives the rankings `encode-dense` + `sparsify` + `search` give (for the same batch of
texts and thread count; see QueryEncoder). The hook is called directly rather than through
`mmsparse.sparsify` so a query writes no sparse file and registers no provenance input (a
server answers many). A head that does not take the query's modality (a bm25v head and a text)
raises the method's own InputError. Dense (Faiss) indexes take the backbone's vectors directly.

An inference-free head (methods/inference_free) needs no model for text: a query is its
tokens weighted by the head's term-weight table. For such an index the encoder is a
TableQueryEncoder (`encoder_for` picks it from the head's config.json, read without torch): no
torch, transformers or backbone is imported, so `mmsparse query` answers in well under a second
from a cold start, and its rows are those `sparsify` writes for the same texts in a .tsv/.txt
file (`search` over them ranks the same). Such an index takes no image queries.

Scores are those of `mmsparse search`: the engine's (PISA: quantised, ~ <q, d>), or <q, d>
for dense indexes. `shared` lists the terms query and document share, with q_t, d_t (the
document's weight as indexed) and the contribution q_t * d_t, largest first; their sum is the
exact float inner product <q, d> (D2S eq. 1's per-term products).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter
from ..runtime import torch_threads

MAX_QUERY_CHARS = 1000          # longer texts are refused (the backbone truncates at max_length tokens)
TABLE_METHOD = "inference-free"  # the method whose text queries are a table lookup (TableQueryEncoder)
NO_IMAGES = ("an inference-free head encodes text queries only (images are its documents); query with text, or "
             "search these images through an index of a head with an image encoder")
TEXT_EXTRAS = ("pre_projection", "token_states")
IMAGE_EXTRAS = ("pre_projection", "patch_states")


@dataclass
class Origin:
    """Where an index's queries are encoded from: `route` sparse | dense, the `head` (directory
    or hub id; None for dense indexes), `backbone` name and `model`, and `encode` (max_length,
    layer, states_dtype: the document files' encode-dense settings), `index_meta` the index's
    mmsparse.json, `sparse_source` / `dense_source` the files it was built from (None when
    unknown or gone), `image_root` the image folder encode-dense read (its image folder input,
    or the folder of its annotations' images; None when unknown or gone), `method` the head's
    method (read from its config.json without torch; None for dense indexes). An inference-free
    head's index may record no backbone or model ("" then): its queries need neither."""

    route: str
    head: str | None
    backbone: str
    model: str
    encode: dict = field(default_factory=dict)
    index_meta: dict = field(default_factory=dict)
    sparse_source: Path | None = None
    dense_source: Path | None = None
    image_root: Path | None = None
    method: str | None = None


def _attrs(path: Path | None) -> dict:
    if path is None or not Path(path).is_file():
        return {}
    import h5py

    from ..formats._h5 import attrs_dict

    try:
        with h5py.File(path, "r") as f:
            return attrs_dict(f)
    except OSError:
        return {}


def index_route(meta: dict) -> str:
    """sparse | dense: what an index (its mmsparse.json dict) is searched with (PISA, Seismic and
    a Milvus collection with a sparse field: sparse; Faiss and a dense-only Milvus: dense)."""
    from ..indexes.meta import SPARSE_KINDS

    if meta["kind"] in SPARSE_KINDS:
        return "sparse"
    if meta["kind"] == "milvus":
        return "sparse" if "sparse" in meta.get("fields", ["sparse"]) else "dense"
    return "dense"


def resolve_origin(index_dir: str | Path, head: str | Path | None = None, backbone: str | None = None,
                   model: str | Path | None = None) -> Origin:
    """Read the head, backbone and model of INDEX_DIR from its provenance (module docstring);
    `head` / `backbone` / `model` override. Raises InputError naming what is missing and the
    option that supplies it."""
    from ..indexes.meta import read_meta

    meta = read_meta(index_dir)
    src_attrs = dict(meta.get("source_attrs") or {})
    source = Path(meta["source"]) if meta.get("source") else None
    route = index_route(meta)
    sparse_source = dense_source = None
    if route == "sparse":
        sparse_source = source if source is not None and source.is_file() else None
        s_attrs = {**src_attrs, **_attrs(sparse_source)}
        d = s_attrs.get("dense")
        dense_source = Path(d) if d and Path(d).is_file() else None
    else:
        dense_source = source if source is not None and source.is_file() else None
        s_attrs = src_attrs
    d_attrs = {**s_attrs, **_attrs(dense_source)}
    h = method = None
    if route == "sparse":
        h = str(head) if head is not None else (s_attrs.get("head") or None)
        if not h:
            raise InputError(f"{index_dir}: the index's source ({source}) records no head; pass --head HEAD_DIR")
        if head is None and not Path(h).exists():
            raise InputError(f"{index_dir}: the head it was built with ({h}) is not there any more; pass --head "
                             "HEAD_DIR (or a Hugging Face hub id)")
        from ..methods.headdir import head_method

        method = head_method(h)
    bb = backbone or d_attrs.get("backbone")
    mdl = str(model) if model is not None else d_attrs.get("model")
    if (not bb or not mdl) and h is not None:
        try:
            from ..methods.headdir import read_head_config, resolve_head_path

            cfg, _ = read_head_config(resolve_head_path(h))
            tr = cfg.get("training") or {}
            bb, mdl = bb or tr.get("backbone"), mdl or tr.get("model")
        except InputError:
            pass
    if (not bb or not mdl) and method != TABLE_METHOD:
        raise InputError(f"{index_dir}: cannot tell which backbone/model encoded its documents (no 'backbone'/'model' "
                         "in its provenance); pass --backbone NAME --model PATH")
    enc = {}
    if "max_length" in d_attrs:
        enc["max_length"] = int(d_attrs["max_length"])
    if "patch_layer" in d_attrs:
        enc["layer"] = int(d_attrs["patch_layer"])
    if d_attrs.get("states_dtype") in ("float16", "float32"):
        enc["states_dtype"] = str(d_attrs["states_dtype"])
    return Origin(route, h, str(bb or ""), str(mdl or ""), enc, meta, sparse_source, dense_source,
                  _image_root(d_attrs), method)


def _image_root(dense_attrs: dict) -> Path | None:
    """The image folder a dense file was encoded from: its `source` when that is a folder, else
    the input its provenance records as kind "images"."""
    src = dense_attrs.get("source")
    if src and Path(str(src)).is_dir():
        return Path(str(src))
    ins = dense_attrs.get("inputs")
    try:
        ins = json.loads(ins) if isinstance(ins, str) else ins or []
    except ValueError:
        ins = []
    for i in ins if isinstance(ins, list) else []:
        if isinstance(i, dict) and i.get("kind") == "images" and Path(str(i.get("path"))).is_dir():
            return Path(str(i["path"]))
    return None


@dataclass
class Encoded:
    """Encoded queries: `ids` (q0, q1, ...), `vectors` [n, d] float32 (the backbone's; None
    from a TableQueryEncoder, which has none), `matrix` CSR [n, |V|] float32 (the head's; None
    without a head), `modality` text | image."""

    ids: list[str]
    vectors: np.ndarray
    matrix: object
    modality: str


class QueryEncoder:
    """The backbone (and head) that turn query texts or images into what an index is searched
    with, loaded once. Thread-safe (a lock serialises the model).

    head: a head directory, hub id or loaded SparseHead (None: dense vectors only). backbone /
    model: the backbone name and model path or hub id. device: cpu | cuda | auto. query_mode: the
    head's caption query mode (default: the method's first, e.g. expand for d2s). force: use a
    head with vectors of another model than it was trained on (warning instead of InputError).
    encode: encode-dense settings of the documents (max_length, layer, states_dtype).
    backbones: a dict shared between encoders so the same backbone and model load once; lock: a
    threading.RLock to share with them. threads: torch CPU threads while encoding (None: torch's
    setting; 1 keeps a busy machine responsive). Vectors are reproducible for the same texts,
    batch_size and threads; the last float bits change with the batch (its padding) and the
    thread count, which can move a quantised query weight by one step. runtime: what runs the towers,
    torch | onnx | auto (Backbone.set_runtime: ONNX Runtime on the CPU where it exports, as
    encode-dense --runtime; vectors within cosine 0.9999 of PyTorch's); log: str -> None, told about
    an ONNX export and about auto falling back to torch.
    `QueryEncoder.for_index(INDEX)` reads all of this from an index's provenance (resolve_origin),
    and gives a TableQueryEncoder (no model) for an inference-free head's index.
    Attributes: head (SparseHead or None), vocab (list or None), backbone (a Backbone),
    method (the head's, or None), description (what encodes the queries, in words),
    load_seconds (wall time of loading, s).
    """

    def __init__(self, head=None, backbone: str = "hf-dual", model: str | Path | None = None, *,
                 device: str = "cpu", query_mode: str | None = None, force: bool = False,
                 encode: dict | None = None, backbones: dict | None = None, lock=None,
                 threads: int | None = None, runtime: str = "auto", log=None):
        from .. import settings
        from ..backbones import load_backbone
        from ..methods.head import SparseHead, load_head

        t0 = time.perf_counter()
        self.query_mode, self.force, self.threads = query_mode, force, threads
        self.settings = dict(encode or {})
        self.lock = lock if lock is not None else threading.RLock()
        self.head_path = None if head is None or isinstance(head, SparseHead) else str(head)
        self.head = head if isinstance(head, SparseHead) or head is None else load_head(head)
        self.vocab = list(self.head.vocab) if self.head is not None else None
        self._col = {t: i for i, t in enumerate(self.vocab or [])}
        model = str(model) if model is not None else str(settings.dual_encoder_dir())
        key = (backbone, model, device, self.settings.get("max_length"), runtime)
        cache = backbones if backbones is not None else {}
        if key not in cache:
            kw = {"max_length": self.settings["max_length"]} if "max_length" in self.settings else {}
            with torch_threads(threads):
                cache[key] = load_backbone(backbone, model, device, **kw)
                cache[key].set_runtime(runtime, threads, log)
        self.backbone = cache[key]
        self.backbone_name, self.model = backbone, model
        self.load_seconds = time.perf_counter() - t0

    @property
    def method(self) -> str | None:
        """The head's method (None without a head)."""
        return self.head.method if self.head is not None else None

    @property
    def description(self) -> str:
        """What encodes the queries, as the search page says it: "backbone NAME (MODEL) + METHOD head",
        MODEL the model directory's name (or hub id's)."""
        return f"backbone {self.backbone_name} ({Path(str(self.model)).name})" + \
            (f" + {self.method} head" if self.head is not None else "")

    @classmethod
    def for_index(cls, index: str | Path, *, head=None, backbone: str | None = None, model=None,
                  sparse: bool = True, **kwargs) -> "QueryEncoder":
        """The encoder of INDEX's queries (its provenance, `head` / `backbone` / `model` overriding;
        encoder_for: a TableQueryEncoder for an inference-free head); sparse=False: the backbone
        only (dense vectors), whatever the index."""
        return encoder_for(resolve_origin(index, head, backbone, model), sparse, **kwargs)

    def encode(self, texts: Sequence[str] | None = None, images: Sequence[str | Path] | None = None,
               batch_size: int = 64) -> Encoded:
        """Encode query `texts` (or image files `images`) as the module docstring says: the
        backbone vectors [n, d] and, with a head, its CSR [n, |V|]. `batch_size` texts per forward
        pass (64, encode-dense's default, gives byte-identical vectors to encode-dense). Raises
        InputError for no queries, an empty or over-long text, an unreadable image, or a head
        that does not take this modality."""
        from ..backbones.encode import encode_captions_file, encode_images_file
        from ..data.records import CaptionRecord, ImageRecord
        from ..formats.dense import read_dense

        texts, images = _check_queries(texts, images)
        enc = self.settings
        modality = "text" if texts else "image"
        extras = list(TEXT_EXTRAS if texts else IMAGE_EXTRAS) if self.head is not None else []
        if getattr(self.head, "config", {}).get("final_layers"):  # joint heads over the towers' final layers
            extras.append("final_layer_inputs")
        attrs = {"modality": modality, "dataset": "query", "split": "query"}
        ids = [f"q{i}" for i in range(len(texts or images))]
        with self.lock, torch_threads(self.threads), \
                tempfile.TemporaryDirectory(prefix="mmsparse-query-", dir=_scratch()) as tmp:
            dense = Path(tmp) / "queries.h5"
            if texts:
                recs = [CaptionRecord(i, str(t).strip(), "") for i, t in zip(ids, texts)]
                encode_captions_file(self.backbone, recs, dense, attrs, batch_size=batch_size,
                                     states_dtype=enc.get("states_dtype", "float16"), **{e: True for e in extras})
            else:
                recs = [ImageRecord(i, p.resolve()) for i, p in zip(ids, images)]
                encode_images_file(self.backbone, recs, dense, attrs, batch_size=batch_size, workers=0,
                                   layer=enc.get("layer", -1), states_dtype=enc.get("states_dtype", "float16"),
                                   strict=True, **{e: True for e in extras})
            dc = read_dense(dense)
            matrix = None
            if self.head is not None:
                ms, mids = self._sparsify(dense, Path(tmp) / "queries.sparse.h5", modality)
                pos = {q: r for r, q in enumerate(mids)}
                matrix = ms[[pos[q] for q in ids]]
        pos = {q: r for r, q in enumerate(dc.ids)}
        return Encoded(ids, dc.vectors[[pos[q] for q in ids]], matrix, modality)

    def _sparsify(self, dense: Path, out: Path, modality: str):
        """(CSR [n, |V|] float32, ids) of dense file `dense` through the head's Method.sparsify,
        as mmsparse.sparsify runs it (mode, default options, batch size, compatibility check)."""
        from ..checks import check_compatible
        from ..formats.dense import read_dense_attrs
        from ..formats.sparse import to_csr
        from ..methods import get_method

        m = get_method(self.head.method)
        attrs = read_dense_attrs(dense)
        mode = m.query_mode(modality, self.query_mode if modality == "text" else None, dense)
        check_compatible(attrs, self.head.config.get("training", {}), m.compat_keys, "the query vectors",
                         f"head {self.head_path or self.head.method} (its training vectors)",
                         "query with the backbone and model the head was trained on", self.force)
        opts = {k: spec[0] for k, spec in m.config_class.sparsify_options.items()}
        head_dir = getattr(self.head, "source_dir", None)
        res = m.sparsify(self.head, head_dir, dense, out, mode, opts, m.batch_size, reporter(None))
        mat = to_csr(res.matrix, len(self.vocab))
        if mat.nnz and not np.isfinite(mat.data).all():
            raise InputError("the head gives NaN/Inf weights for this query; check the backbone and head")
        return mat, list(res.ids)

    # -- terms --------------------------------------------------------------------------------
    def term_ids(self, word: str) -> list[int]:
        """Vocabulary columns of `word`: itself when it is a term, else its tokenizer pieces (word
        pieces) when every one of them is a term. InputError when it is not a term and some piece
        is not (or is a special token such as [UNK]): a nonsense word ("qqqxz") would otherwise add
        whichever of its pieces happen to be terms ("##x", "##z")."""
        if self.vocab is None:
            raise InputError("a dense index has no terms to add")
        w = str(word).strip()
        if w in self._col:
            return [self._col[w]]
        pieces, special = self._pieces(w)
        missing = [p for p in pieces if p not in self._col or p in special]
        if not pieces or missing:
            why = f" (its pieces {', '.join(missing)} are not terms)" if pieces and len(pieces) > 1 else ""
            raise InputError(f"term {w!r}: not in the head's vocabulary ({len(self.vocab)} terms){why}")
        return list(dict.fromkeys(self._col[p] for p in pieces))

    def _pieces(self, word: str) -> tuple[list[str], set[str]]:
        """(the tokenizer's pieces of `word`, the tokenizer's special tokens); ([], set()) without one."""
        tok = self.head.tokenizer
        if tok is None and self.head.config.get("vocab_source"):
            from ..methods.head import require_tokenizer

            with contextlib.suppress(InputError):
                tok = require_tokenizer(self.head, self.head_path or "head")
        if tok is None:
            return [], set()
        return tok.tokenize(word), set(getattr(tok, "all_special_tokens", []) or [])

    def edit(self, row, exclude: Sequence[str] = (), add: Sequence[str] = ()):
        """One query row (CSR [1, |V|]) with the terms `exclude` removed and the words `add` added
        (each of their terms at the row's largest weight, or 1.0 for an empty row). Unknown
        excluded terms are ignored; unknown added words raise InputError."""
        import scipy.sparse as sp

        r = sp.csr_matrix(row, dtype=np.float32)
        vals = dict(zip(r.indices.tolist(), r.data.tolist()))
        top = max(vals.values()) if vals else 1.0
        for t in exclude:
            c = self._col.get(str(t))
            if c is not None:
                vals.pop(c, None)
        for w in add:
            for c in self.term_ids(w):
                vals[c] = max(vals.get(c, 0.0), top)
        cols = sorted(vals)
        return sp.csr_matrix((np.array([vals[c] for c in cols], dtype=np.float32), np.array(cols, dtype=np.int32),
                              np.array([0, len(cols)])), shape=(1, len(self.vocab)))

    def terms(self, row, k: int | None = None) -> list[dict]:
        """The {"term", "weight"} entries of one query row, largest weight first (at most k)."""
        import scipy.sparse as sp

        r = sp.csr_matrix(row)
        order = np.argsort(-r.data, kind="stable")[:k]
        return [{"term": self.vocab[r.indices[j]], "weight": float(r.data[j])} for j in order]


class TableQueryEncoder(QueryEncoder):
    """The queries of an inference-free head, with no model: each text's tokens weighted by the
    head's term-weight table (methods/inference_free/queries.py, TermWeightQueryEncoder), read
    from the head directory with the `tokenizers` and safetensors' numpy loaders: no torch,
    transformers or backbone (module docstring). QueryEncoder's interface: encode (texts only),
    edit, terms, term_ids; rows equal what `sparsify` writes for the same texts.

    head: a head directory, hub id, or loaded InferenceFreeHead. query_mode: None or
    "inference-free". lock: a threading.RLock to share (as QueryEncoder).
    Attributes: table (the TermWeightQueryEncoder), vocab, head (None: no model is loaded;
    head_path names the head), backbone (None), method, description, load_seconds.
    """

    method = TABLE_METHOD

    def __init__(self, head, *, query_mode: str | None = None, lock=None):
        from ..methods.headdir import resolve_head_path
        from ..methods.inference_free.queries import DESCRIPTION, QUERY_MODE, TermWeightQueryEncoder

        t0 = time.perf_counter()
        if query_mode not in (None, QUERY_MODE):
            raise InputError(f"--query-mode {query_mode}: an inference-free head takes {QUERY_MODE} queries only")
        self.query_mode, self.force, self.threads, self.settings = QUERY_MODE, False, None, {}
        self.lock = lock if lock is not None else threading.RLock()
        if isinstance(head, (str, Path)):
            self.head_path = str(head)
            self.table = TermWeightQueryEncoder.load(resolve_head_path(head))
        else:
            self.head_path = str(getattr(head, "source_dir", "") or "") or None
            self.table = TermWeightQueryEncoder.from_head(head)
        self.head, self.backbone, self.backbone_name, self.model = None, None, None, None
        self.vocab = list(self.table.vocab)
        self._col = {t: i for i, t in enumerate(self.vocab)}
        self._description = DESCRIPTION
        self.load_seconds = time.perf_counter() - t0

    @property
    def description(self) -> str:
        return self._description

    def encode(self, texts: Sequence[str] | None = None, images: Sequence[str | Path] | None = None,
               batch_size: int = 64) -> Encoded:
        """Query `texts` -> Encoded: ids q0.., vectors None, matrix CSR [n, |V|] float32 (max(0, w_t)
        on each text's terms), modality text. batch_size is unused (there is no forward pass).
        InputError for no queries, an empty or over-long text, or images (an inference-free
        head's images are its documents)."""
        texts, images = _check_queries(texts, images)
        if images:
            raise InputError(NO_IMAGES)
        with self.lock:
            matrix = self.table.encode([str(t).strip() for t in texts])
        return Encoded([f"q{i}" for i in range(len(texts))], None, matrix, "text")

    def _pieces(self, word: str) -> tuple[list[str], set[str]]:
        tok = self.table.tokenizer
        special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        return tok.encode(word, add_special_tokens=False).tokens, special


def encoder_for(origin: Origin, sparse: bool = True, **kwargs) -> QueryEncoder:
    """The encoder of the queries of the index `origin` describes (resolve_origin): the term-weight
    table of an inference-free head (TableQueryEncoder: no model), else QueryEncoder with the
    backbone and head (sparse=False: the backbone only, for dense vectors). kwargs: QueryEncoder's
    keywords (device, query_mode, force, backbones, lock, threads); the table takes query_mode and
    lock, and needs none of the others."""
    if sparse and origin.route == "sparse" and origin.method == TABLE_METHOD:
        return TableQueryEncoder(origin.head, query_mode=kwargs.get("query_mode"), lock=kwargs.get("lock"))
    return QueryEncoder(origin.head if sparse and origin.route == "sparse" else None, origin.backbone, origin.model,
                        encode=origin.encode, **kwargs)


def _check_queries(texts, images) -> tuple[list[str], list[Path]]:
    """(texts, image paths) after the checks every encoder makes: one kind, at least one, no
    empty or over-long text (MAX_QUERY_CHARS), every image a file. InputError otherwise."""
    texts, images = list(texts or []), [Path(p) for p in images or []]
    if bool(texts) == bool(images):
        raise InputError("give query texts or query images (one kind per call)")
    for t in texts:
        if not str(t).strip():
            raise InputError("an empty query; type some words")
        if len(str(t)) > MAX_QUERY_CHARS:
            raise InputError(f"a query of {len(t)} characters; at most {MAX_QUERY_CHARS}")
    for p in images:
        if not p.is_file():
            raise InputError(f"{p}: query image not found")
    return texts, images


def _scratch() -> str | None:
    """Where a query's temporary dense file goes: memory-backed /dev/shm when writable (a query's
    file is a few KB to MB), else the system temporary directory."""
    import os

    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class QueryEngine:
    """An index with the encoder of its queries, loaded once (a context manager; `close()`
    releases the index). Thread-safe: calls are serialised by one lock (one model, one index).

    index: an index directory (PISA, Seismic, Faiss or Milvus). head / backbone / model override
    the provenance (resolve_origin); device, query_mode, force, backbones, lock: QueryEncoder;
    encode_threads: its `threads`; runtime: its runtime (torch | onnx | auto). threads: search
    threads. An inference-free head's index loads no model: its encoder is a TableQueryEncoder
    (encoder_for).
    Attributes: origin (Origin), kind, route (sparse | dense), encoder (QueryEncoder or
    TableQueryEncoder), head and vocab (the encoder's; None for a dense index; head also None
    for a table), backbone (None for a table), method (the head's), load_seconds (loading
    backbone, head and index, s).
    """

    def __init__(self, index: str | Path, *, head: str | Path | None = None, backbone: str | None = None,
                 model: str | Path | None = None, device: str = "cpu", query_mode: str | None = None,
                 force: bool = False, threads: int = 1, encode_threads: int | None = None,
                 backbones: dict | None = None, lock=None, progress: Reporter | None = None, runtime: str = "auto"):
        from ..indexes import open_index

        t0 = time.perf_counter()
        rep = reporter(progress)
        self.index_dir = Path(index)
        self.origin = o = resolve_origin(index, head, backbone, model)
        self.kind, self.route = o.index_meta["kind"], o.route
        kw = {} if o.route == "sparse" and o.method == TABLE_METHOD else {"runtime": runtime, "log": rep.log}
        self.encoder = encoder_for(o, device=device, query_mode=query_mode, force=force, backbones=backbones,
                                   lock=lock, threads=encode_threads, **kw)
        self._lock = self.encoder.lock
        self.head, self.vocab, self.backbone = self.encoder.head, self.encoder.vocab, self.encoder.backbone
        self.method = self.encoder.method
        self.searcher = open_index(index, threads=threads)
        self._docs = None
        if self.route == "sparse":
            from ..indexes.pisa import read_ids_vocab

            idx_vocab = getattr(self.searcher, "vocab", None)
            if idx_vocab is None and o.sparse_source is not None:
                idx_vocab = read_ids_vocab(o.sparse_source)[1]
            if idx_vocab is not None and list(idx_vocab) != self.vocab:
                raise InputError(f"{index}: its vocabulary ({len(idx_vocab)} terms) is not the head's ({len(self.vocab)} "
                                 f"terms, {o.head}); pass the --head the index was built with")
        self.load_seconds = time.perf_counter() - t0
        what = (f"the term-weight table of head {o.head} (inference-free: no model)" if self.backbone is None else
                f"{o.backbone} {o.model}" + (f", head {o.head}" if self.head is not None else ""))
        rep.log(f"query: loaded {what} and {self.kind} index {index} in {self.load_seconds:.1f} s")

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the index (a Milvus connection); the engine is unusable afterwards."""
        if hasattr(self.searcher, "close"):
            self.searcher.close()

    def __enter__(self) -> "QueryEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- documents ----------------------------------------------------------------------------
    @property
    def ids(self) -> list[str] | None:
        """Document ids in index row order (None for a Milvus index, which returns ids)."""
        return getattr(self.searcher, "ids", None)

    def doc_matrix(self):
        """The documents' sparse vectors as indexed, CSR [N, |V|] float32 (row order of `ids`), or
        None for a dense index. Loaded on first use."""
        if self.route != "sparse":
            return None
        if self._docs is None:
            if hasattr(self.searcher, "forward"):
                self._docs = (self.searcher.ids, self.searcher.forward)
            elif self.origin.sparse_source is not None:
                from ..formats.sparse import read_sparse

                col = read_sparse(self.origin.sparse_source)
                self._docs = (col.ids, col.matrix)
            else:
                return None
            self._row = {d: i for i, d in enumerate(self._docs[0])}
        return self._docs[1]

    # -- encoding, editing, searching ---------------------------------------------------------
    def encode(self, texts: Sequence[str] | None = None, images: Sequence[str | Path] | None = None,
               batch_size: int = 64) -> Encoded:
        """QueryEncoder.encode of this index's encoder (a dense index: vectors only)."""
        return self.encoder.encode(texts, images, batch_size)

    def search(self, enc: Encoded | None = None, k: int = 10, matrix=None) -> list[list[tuple[str, float]]]:
        """Top-k (document id, score) per query: the sparse rows (`matrix`, default enc.matrix)
        for a sparse index, enc.vectors for a dense one."""
        from ..indexes import bm25

        with self._lock:
            if self.route == "sparse":
                q = bm25.query_matrix(self.origin.index_meta, matrix if matrix is not None else enc.matrix)
                res = self.searcher.search_sparse(q, k) if self.kind == "milvus" else self.searcher.search(q, k)
            else:
                v = np.ascontiguousarray(enc.vectors, dtype=np.float32)
                res = self.searcher.search_dense(v, k) if self.kind == "milvus" else self.searcher.search(v, k)
            ids = self.ids
            return [[(d if ids is None else ids[d], float(s)) for d, s in r] for r in res]

    def shared(self, row, doc_id: str) -> list[dict]:
        """Terms query row `row` shares with document `doc_id`: term, query_weight (as searched:
        binary on a BM25-weighted index), doc_weight (as indexed) and contribution q_t * d_t,
        largest contribution first."""
        import scipy.sparse as sp

        from ..indexes import bm25

        docs = self.doc_matrix()
        if docs is None or doc_id not in self._row:
            return []
        q = sp.csr_matrix(bm25.query_matrix(self.origin.index_meta, sp.csr_matrix(row)))
        d = docs[self._row[doc_id]]
        qw = dict(zip(q.indices.tolist(), q.data.tolist()))
        out = [{"term": self.vocab[c], "query_weight": qw[c], "doc_weight": float(w), "contribution": qw[c] * float(w)}
               for c, w in zip(d.indices.tolist(), d.data.tolist()) if c in qw]
        return sorted(out, key=lambda x: -x["contribution"])

    def run(self, texts: Sequence[str] | None = None, images: Sequence[str | Path] | None = None, k: int = 10,
            exclude: Sequence[str] = (), add: Sequence[str] = (), batch_size: int = 64) -> list[dict]:
        """Encode `texts` (or `images`; `batch_size` per forward pass), then `results`: one dict
        per query (see results)."""
        with self._lock:
            enc = self.encode(texts, images, batch_size)
            return self.results(enc, list(texts) if texts else [str(p) for p in images], k, exclude, add)

    def results(self, enc: Encoded, queries: Sequence[str], k: int = 10, exclude: Sequence[str] = (),
                add: Sequence[str] = ()) -> list[dict]:
        """Edit (sparse: `exclude` terms, `add` words; QueryEncoder.edit) and search encoded
        queries; one dict per query: {"query", "modality", "terms": [{"term", "weight"}] (the
        searched sparse query, largest first; [] for a dense index), "excluded", "added",
        "results": [{"rank", "id", "score", "shared": [...] (see shared)}]}. InputError for k
        outside 1..10000 or an added word outside the vocabulary."""
        import scipy.sparse as sp

        if not 1 <= int(k) <= 10_000:
            raise InputError(f"--k {k}: must be in 1..10000")
        with self._lock:
            rows = None
            if self.route == "sparse":
                if enc.matrix is None:
                    raise InputError("these queries were encoded without a head; encode them with this engine")
                rows = [self.encoder.edit(enc.matrix[i], exclude, add) if (exclude or add) else enc.matrix[i]
                        for i in range(len(enc.ids))]
                hits = self.search(enc, k, sp.vstack(rows, format="csr"))
            else:
                hits = self.search(enc, k)
            out = []
            for i, (q, h) in enumerate(zip(queries, hits)):
                res = [{"rank": r + 1, "id": d, "score": s, "shared": self.shared(rows[i], d) if rows else []}
                       for r, (d, s) in enumerate(h)]
                out.append({"query": q, "modality": enc.modality,
                            "terms": self.encoder.terms(rows[i]) if rows else [],
                            "excluded": list(exclude), "added": list(add), "results": res})
            return out


@provenance.recorded("index", "image", "head")
def query(index: str | Path, queries: Sequence[str] = (), *, out: str | Path | None = None, k: int = 10,
          image: Sequence[str | Path] = (), head: str | Path | None = None, backbone: str | None = None,
          model: str | Path | None = None, query_mode: str | None = None, device: str = "cpu",
          force: bool = False, exclude: Sequence[str] = (), add: Sequence[str] = (), batch_size: int = 64,
          threads: int | None = None, runtime: str = "auto", progress: Reporter | None = None) -> list[dict]:
    """Search INDEX with free-text `queries` (or the image files `image`), encoded with the
    backbone and head the index was built from (module docstring; `head`, `backbone`, `model`
    override); returns one dict per query (QueryEngine.run): the top `k` results with rank, id,
    score and the shared terms with their contributions, and the query's own terms.
    `exclude` / `add` edit every sparse query's terms before searching. `out`: also write the
    list as JSON (atomically). batch_size: texts per forward pass (64, as encode-dense: a file of
    captions ranks exactly as encode-dense + sparsify + search of the same file); threads: torch
    CPU threads while encoding (None: torch's); runtime: what runs the towers (torch | onnx | auto,
    as encode-dense --runtime). Loads the model once per call
    (QueryEngine.load_seconds).
    Raises InputError for bad input (no queries, both texts and images, an empty text, a head
    or index that cannot be found, a head that does not take the query's modality)."""
    from ..atomic import write_text_atomic

    texts, images = [str(q) for q in queries], list(image or [])
    if not texts and not images:
        raise InputError("no queries: give query texts, --file FILE (one query per line, - for stdin) or --image PATH")
    if texts and images:
        raise InputError("give query texts or --image files, not both")
    for t in texts:   # before the model loads
        if not t.strip():
            raise InputError("an empty query; type some words")
    for p in images:
        if not Path(p).is_file():
            raise InputError(f"{p}: query image not found")
    if batch_size < 1:
        raise InputError(f"--batch-size {batch_size}: must be >= 1")
    if images:
        o = resolve_origin(index, head, backbone, model)
        if o.route == "sparse" and o.method == TABLE_METHOD:
            raise InputError(NO_IMAGES)
    with QueryEngine(index, head=head, backbone=backbone, model=model, device=device, query_mode=query_mode,
                     force=force, encode_threads=threads, progress=progress, runtime=runtime) as engine:
        rep = reporter(progress)
        t0 = time.perf_counter()
        res = engine.run(texts or None, images or None, k=k, exclude=exclude, add=add, batch_size=batch_size)
        rep.log(f"query: {len(res)} quer{'y' if len(res) == 1 else 'ies'} in {time.perf_counter() - t0:.2f} s "
                f"({'model' if engine.backbone is not None else 'table'} loaded in {engine.load_seconds:.1f} s)")
    if out is not None:
        write_text_atomic(out, json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    return res
