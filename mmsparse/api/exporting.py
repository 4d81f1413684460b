"""`export` and `import_terms`: mmsparse's heads and vectors in the formats other tools read.

    export(HEAD, out=DIR, format="sentence-transformers")   a sentence-transformers SparseEncoder
                                                             directory (methods/st.py)
    export(SPARSE.h5, out=FILE.jsonl, format="jsonl")        one term map per line, what search
                                                             engines ingest (formats/termmap.py)
    import_terms(FILE.jsonl, out=SPARSE.h5, vocab=...)       such a file back to sparse HDF5

docs/export.md says how each engine ingests the lines and how the exported models are called.
"""

from __future__ import annotations

from pathlib import Path

from .. import provenance
from ..errors import InputError

FORMATS = ("sentence-transformers", "jsonl")
ROUTES = ("all", "query")


@provenance.recorded("source")
def export(source: str | Path, *, out: str | Path, format: str | None = None, route: str = "all",
           model: str | Path | None = None, backbone: str | None = None, precision: str | None = None,
           max_length: int | None = None, escape_dots: bool = False, batch_size: int = 2048,
           progress=None) -> Path:
    """Write `source` in another tool's format to `out` (atomically: a killed or failed export
    leaves the previous output or none). Returns `out`.

    format "sentence-transformers" (default unless `out` ends in .jsonl): `source` is a head
    directory or hub id (d2s, inference-free or joint), `out` a directory that
    `sentence_transformers.SparseEncoder(out)` loads, output [n] over the tokenizer's ids (methods/st.py).
    route "all": queries and documents (inference-free: the query table and the image route;
    d2s/joint: texts and images; loading needs mmsparse and trust_remote_code=True); "query": the
    text route alone (inference-free: a plain SparseStaticEmbedding, loaded by sentence-transformers
    alone). model, backbone: the dual encoder the image and text routes run (default: the head's
    training record); precision (fp32 | bf16 | fp16) and max_length (caption tokens): default the
    head's training captions file's, as encode-dense wrote them (else fp32, the backbone's length).
    The card README.md is the head's model card (methods/head.model_card) with its use from
    sentence-transformers.

    format "jsonl": `source` is a sparse HDF5 file (or sharded directory); `out` gets one line
    {"id": ..., "terms": {term: weight}} per row, `batch_size` rows read at a time (memory O(batch));
    escape_dots writes "." as "%2E" and "%" as "%25" in terms (Elasticsearch's rank_features and
    sparse_vector refuse "." in a feature name).

    InputError: an unknown format or route, a source of the wrong kind (a dense file, a head for
    jsonl, a file for sentence-transformers), a head sentence-transformers cannot express (vdr,
    bm25v) or without a tokenizer, sentence-transformers not installed.
    """
    fmt = format or ("jsonl" if str(out).endswith(".jsonl") else "sentence-transformers")
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if route not in ROUTES:
        raise InputError(f"--route {route!r}: choose one of {', '.join(ROUTES)}")
    if fmt == "jsonl":
        return _export_jsonl(Path(source), Path(out), escape_dots, batch_size, progress)
    if escape_dots:
        raise InputError("--escape-dots applies to --format jsonl (term names in engines); a sentence-transformers "
                         "model outputs token ids")
    return _export_st(source, Path(out), route, model, backbone, precision, max_length, progress)


def _export_jsonl(source: Path, out: Path, escape_dots: bool, batch_size: int, progress) -> Path:
    from ..formats.termmap import write_jsonl

    kind = provenance.detect_kind(source)
    if kind == "dense":
        raise InputError(f"{source}: a dense HDF5 file (vectors, not terms); --format jsonl exports sparse vectors: "
                         f"run `mmsparse sparsify HEAD {source} -o SPARSE.h5` and export SPARSE.h5")
    if kind == "head":
        raise InputError(f"{source}: a head directory; --format jsonl exports a sparse HDF5 file (sparsify's "
                         "output), --format sentence-transformers exports a head")
    write_jsonl(source, out, escape_dots=escape_dots, batch_rows=batch_size, progress=progress)
    return out


def _export_st(source, out: Path, route: str, model, backbone, precision, max_length, progress) -> Path:
    from ..atomic import atomic_path
    from ..methods.head import load_head, model_card
    from ..methods.headdir import resolve_head_path
    from ..methods.st import build_encoder, card_usage, require_st
    from ..progress import reporter

    require_st()
    p = resolve_head_path(source)
    if p.is_file():
        raise InputError(f"{p}: a file; --format sentence-transformers exports a head directory (train-head's "
                         "output), --format jsonl a sparse HDF5 file")
    head = load_head(p)
    tr = head.config.get("training") or {}
    dense = _dense_attrs(tr)
    backbone = backbone or tr.get("backbone") or dense.get("backbone")
    model = str(model or tr.get("model") or "")
    needs_model = not (head.method == "inference-free" and route == "query")
    if needs_model and (not backbone or not model):
        raise InputError(f"{p}/config.json: training.backbone / training.model missing; pass --backbone and --model "
                         "(the dual encoder whose vectors the head was trained on)")
    precision = precision or dense.get("precision") or "fp32"
    max_length = max_length or dense.get("max_length")
    with reporter(progress).task(f"export {out.name}", total=1) as bar:
        enc = build_encoder(head, route=route, backbone=backbone, model=model, max_length=max_length,
                            precision=precision)
        with atomic_path(out, directory=True) as tmp:
            enc.save(str(tmp), create_model_card=False)
            cfg = {"method": head.method, **head.config}
            (tmp / "README.md").write_text(model_card(cfg, use=card_usage(head.method, route)), encoding="utf-8")
        bar.advance(1)
    return out


def _dense_attrs(training: dict) -> dict:
    """Attributes of the head's training captions file (else images file) when it still exists:
    how its vectors were encoded (precision, max_length, backbone); {} otherwise."""
    from ..formats.dense import read_dense_attrs

    for key in ("train_captions", "train_images"):
        f = training.get(key)
        if f and Path(f).exists():
            try:
                return read_dense_attrs(f)
            except InputError:
                continue
    return {}


@provenance.recorded("jsonl", "vocab")
def import_terms(jsonl: str | Path, *, out: str | Path, vocab: str | Path, escape_dots: bool = False,
                 modality: str | None = None, batch_size: int = 8192, progress=None) -> Path:
    """Read JSON lines of term maps (export's --format jsonl) back into a sparse HDF5 file `out`
    (written atomically, `batch_size` lines at a time). vocab: where the term names come from, in
    column order: a head directory (its vocab.txt), a sparse HDF5 file (its vocab; its attributes
    are kept, so export -> import gives the file it came from) or a text file (one term per
    line). escape_dots: the lines were written with --escape-dots. modality (image | text): of the
    rows (default: the vocab file's, else image). Export of the result gives the same bytes as
    the lines it was read from. InputError naming FILE:LINE and the field of the first line that
    is not a term map, a term outside vocab, or a repeated id. Returns `out`."""
    from ..formats.sparse import SparseWriter
    from ..formats.termmap import read_jsonl
    from ..progress import reporter

    terms, attrs = _vocab(Path(vocab))
    modality = modality or attrs.get("modality") or "image"
    if modality not in ("image", "text"):
        raise InputError(f"--modality {modality!r}: choose image or text")
    attrs = {**attrs, "modality": modality, "imported_from": str(Path(jsonl).resolve())}
    attrs.setdefault("query_mode", "doc" if modality == "image" else "imported")
    with reporter(progress).task(f"import {Path(jsonl).name}", total=None) as bar, \
            SparseWriter(out, terms, attrs) as w:
        for ids, m in read_jsonl(jsonl, terms, escape_dots=escape_dots, batch_lines=batch_size):
            w.append(ids, m)
            bar.advance(len(ids))
    return Path(out)


def _vocab(path: Path) -> tuple[list[str], dict]:
    """(terms, attributes for the imported file) of a --vocab source (see import_terms)."""
    from ..formats.sparse import read_sparse_attrs
    from ..methods.headdir import read_head_config

    kind = provenance.detect_kind(path)
    if kind == "missing":
        raise InputError(f"{path}: --vocab not found; give the head directory, sparse HDF5 or vocab.txt the lines' "
                         "terms come from")
    if kind == "head":
        cfg, terms = read_head_config(path)
        return terms, {"head": str(path.resolve()), "method": cfg.get("method", "")}
    if kind == "sparse":
        import h5py

        from ..formats._h5 import read_strings

        keep = {k: v for k, v in read_sparse_attrs(path).items()
                if k not in ("format", "mmsparse_version", "command", "inputs", "seed")}
        with h5py.File(path, "r") as f:
            return read_strings(f["vocab"]), keep
    if kind in ("dense", "hdf5", "index", "model", "images", "dir"):
        raise InputError(f"{path}: a {kind} {'directory' if path.is_dir() else 'file'}; --vocab takes a head "
                         "directory, a sparse HDF5 file or a text file of terms (one per line)")
    terms = path.read_text(encoding="utf-8").split("\n")
    if terms and terms[-1] == "":
        terms.pop()
    if not terms or len(set(terms)) != len(terms):
        raise InputError(f"{path}: --vocab text file must list distinct terms, one per line")
    return terms, {"head": ""}
