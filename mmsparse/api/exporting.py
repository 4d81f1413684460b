"""`export` and `import_terms`: mmsparse's heads and vectors in the formats other tools read.

    export(HEAD, out=DIR, format="sentence-transformers")   a sentence-transformers SparseEncoder
                                                             directory (methods/st.py)
    export(SPARSE.h5, out=FILE.jsonl, format="jsonl")        one term map per line, what search
                                                             engines ingest (formats/termmap.py)
    import_terms(FILE.jsonl, out=SPARSE.h5, vocab=...)       such a file back to sparse HDF5
    import_head(DIR, out=HEAD)                               a sentence-transformers export (fine-tuned
                                                             or not) back to a head (methods/st_import.py)

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
           max_length: int | None = None, query_mode: str = "expand", seismic: bool = False,
           escape_dots: bool = False, batch_size: int = 2048, progress=None) -> Path:
    """Write `source` in another tool's format to `out` (atomically: a killed or failed export
    leaves the previous output or none). Returns `out`.

    format "sentence-transformers" (default unless `out` ends in .jsonl): `source` is a head
    directory or hub id (d2s, inference-free or joint), `out` a directory that
    `sentence_transformers.SparseEncoder(out, trust_remote_code=True)` loads without mmsparse
    (sentence-transformers' own modules plus the torch file sparse_gates.py inside `out`), output
    [n] float32 over the tokenizer's ids (methods/st.py); it fine-tunes with sentence-transformers'
    trainers, and import_head reads it back. route "all": queries and documents (inference-free: the
    query table and the image route; d2s/joint: texts and images); "query": the text route alone
    (inference-free: a plain SparseStaticEmbedding that loads with trust_remote_code=False). model,
    backbone: the dual encoder the image and text routes run (default: the head's training record;
    hf-dual, clip or siglip); max_length (caption tokens): default the head's training captions
    file's, as encode-dense wrote them, else the backbone's; precision: fp32 only (the export runs
    in float32); query_mode (expand | caption-terms): what encode_query gives for texts of a d2s or
    joint head (the task "expand" or "caption-terms" picks either per call). The card README.md is
    the head's model card (methods/head.model_card) with its use from sentence-transformers.

    format "jsonl": `source` is a sparse HDF5 file (or sharded directory); `out` gets one line
    {"id": ..., "terms": {term: weight}} per row, `batch_size` rows read at a time (memory O(batch));
    seismic: Seismic's form {"id": row number, "vector": {...}} and the ids in OUT.ids.txt
    (formats/termmap.py); escape_dots writes "." as "%2E" and "%" as "%25" in terms
    (Elasticsearch's rank_features and sparse_vector refuse "." in a feature name).

    InputError: an unknown format or route, a source of the wrong kind (a dense file, a head for
    jsonl, a file for sentence-transformers), a head the export cannot express (vdr, bm25v, dense,
    --center mean, another backbone: one line saying why) or without a tokenizer,
    sentence-transformers not installed.
    """
    fmt = format or ("jsonl" if str(out).endswith(".jsonl") else "sentence-transformers")
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if route not in ROUTES:
        raise InputError(f"--route {route!r}: choose one of {', '.join(ROUTES)}")
    if fmt == "jsonl":
        return _export_jsonl(Path(source), Path(out), escape_dots, seismic, batch_size, progress)
    if escape_dots or seismic:
        raise InputError(f"--{'escape-dots' if escape_dots else 'seismic'} applies to --format jsonl (term maps for "
                         "engines); a sentence-transformers model outputs token ids")
    return _export_st(source, Path(out), route, model, backbone, precision, max_length, query_mode, progress)


def _export_jsonl(source: Path, out: Path, escape_dots: bool, seismic: bool, batch_size: int, progress) -> Path:
    from ..formats.termmap import write_jsonl

    kind = provenance.detect_kind(source)
    if kind == "dense":
        raise InputError(f"{source}: a dense HDF5 file (vectors, not terms); --format jsonl exports sparse vectors: "
                         f"run `mmsparse sparsify HEAD {source} -o SPARSE.h5` and export SPARSE.h5")
    if kind == "head":
        raise InputError(f"{source}: a head directory; --format jsonl exports a sparse HDF5 file (sparsify's "
                         "output), --format sentence-transformers exports a head")
    write_jsonl(source, out, escape_dots=escape_dots, seismic=seismic, batch_rows=batch_size, progress=progress)
    return out


def _export_st(source, out: Path, route: str, model, backbone, precision, max_length, query_mode,
               progress) -> Path:
    from ..methods.st_require import require_st

    require_st()     # before methods.st, whose imports need sentence-transformers
    from ..atomic import atomic_path
    from ..methods.head import load_head, model_card
    from ..methods.headdir import resolve_head_path
    from ..methods.st import build_encoder, card_usage, record_file, save_encoder
    from ..methods.st_record import known_hashes, portable
    from ..progress import reporter

    if precision not in (None, "fp32"):
        raise InputError(f"--precision {precision}: an export is sentence-transformers' own modules in float32 "
                         "(pass model_kwargs={'torch_dtype': ...} when loading it for another dtype); drop the option")
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
    max_length = max_length or dense.get("max_length")
    with reporter(progress).task(f"export {out.name}", total=1) as bar:
        enc = build_encoder(head, route=route, backbone=backbone, model=model, max_length=max_length,
                            query_mode=query_mode)
        with atomic_path(out, directory=True) as tmp:
            save_encoder(enc, tmp)
            cfg = {"method": head.method, **portable(head.config, known_hashes(p))}   # no machine paths
            (tmp / "README.md").write_text(model_card(cfg, use=card_usage(head.method, route), record=record_file(tmp)),
                                           encoding="utf-8")
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


@provenance.recorded("folder")
def import_head(folder: str | Path, *, out: str | Path, progress=None) -> Path:
    """Read a sentence-transformers model folder written by `export` (d2s, joint or inference-free,
    route "all"), fine-tuned by sentence-transformers or not, back into a head directory `out`
    (written atomically). A joint export becomes a d2s head over the folder's dual encoder (its
    tuned projections and final layers live there). When a fine-tuning changed the dual encoder's
    weights (or the head was joint), the head's training record names the folder's Transformer
    directory as its model: encode images and captions with `encode-dense --model` that directory
    before `sparsify` (a log line says which). InputError for a folder that is not such an export
    (a query-route export included: it has no image route) or whose module stack was changed.
    Returns `out`."""
    from ..methods.st_require import require_st

    require_st()     # before methods.st, whose imports need sentence-transformers
    from ..methods.st import tower_dir
    from ..methods.st_import import read_export
    from ..progress import reporter

    folder = Path(folder)
    rep = reporter(progress)
    head, changed = read_export(folder)
    head.save_pretrained(out)
    if changed:
        rep.log(f"import: the dual encoder of {folder} is not the one the head was trained on (fine-tuned, or a joint "
                f"head's tuned towers): encode with `mmsparse encode-dense ... --backbone "
                f"{head.config['training'].get('backbone')} --model {tower_dir(folder)}` before sparsify")
    return Path(out)


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
