"""Look inside sparse files: `inspect_terms` (top terms of rows, why a document matches a query,
term statistics, image-side faithfulness, the HTML report) and `inspect_provenance` (how any
mmsparse output was made). `mmsparse inspect` prints what these return.

    import mmsparse
    r = mmsparse.inspect_terms("sparse/test-images.h5", ["1084040636_97d9633581"], k=10,
                               captions="sparse/test-captions.h5", qrels="test.qrels", stats=True)
    r["rows"][0]["terms"]          # [{"term", "weight", "in_captions"}, ...], highest weight first
    r["faithfulness"]["doc_Exact@10"], r["stats"]["max_df"]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .. import provenance as _prov
from ..errors import InputError
from ..progress import Reporter, reporter

DEFAULT_DOC_K = (10, 3)


@_prov.recorded("sparse", "docs", "run", "qrels", "captions", "tokenizer")
def inspect_terms(sparse: str | Path, ids: Sequence[str] = (), *, k: int = 20,
                  explain: tuple[str, str] | None = None, docs: str | Path | None = None,
                  stats: bool = False, stats_top: int = 30, png: str | Path | None = None,
                  html: str | Path | None = None, wordcloud: bool = False, run: str | Path | None = None,
                  qrels: str | Path | None = None, image_root: str | Path | None = None, n_images: int = 5,
                  captions: str | Path | None = None, tokenizer: str | Path | None = None,
                  doc_k: Sequence[int] = DEFAULT_DOC_K, progress: Reporter | None = None) -> dict:
    """What the sparse vectors of `sparse` hold. `sparse`: a sparse HDF5 (captions or images) or a
    sparse index directory (PISA/Seismic; the sparse file its mmsparse.json records is read).

    Returns {"file": the sparse HDF5 read, "index": the index directory (when one was given), and
    as asked:
    - "rows" (`ids`): per id {"id", "text" (caption or None), "nnz" (non-zero terms), "terms":
      [{"term" (raw vocabulary term), "weight" (float)}] (the k highest, decreasing)}; with
      `captions` and `qrels` (image rows) also "captions" (texts of the captions the qrels call
      relevant to the image), per term "in_captions" (the term is one of their word pieces) and
      "doc_Exact@<k>" (share of the k shown terms that are; None without relevant captions);
    - "explain" (`explain` = (query id in `sparse`, doc id in `docs`)): {"query", "doc", "score"
      (dot product), "shared_terms", "terms": [{"term", "query_weight", "doc_weight",
      "contribution" = q_t * d_t}] by decreasing contribution};
    - "stats" (`stats`): {"rows", "active_terms", "postings", "power_law_exponent" a,
      "power_law_scale" C, "power_law_r2" (df ~ C * rank^-a fitted in log-log space),
      "head_terms" / "head_fraction" (terms in more than half of the rows), "max_df" (share of rows
      holding the most common term), "max_df_term", "top_terms": [{"rank", "term", "df"}]};
      `png`: the log-log rank-frequency plot (BM25-V Fig. 1);
    - "faithfulness" (`captions` and `qrels`, `sparse` holding the images, with `stats` or without
      `ids`): {"doc_Exact@k" for k
      in `doc_k` (metrics.doc_exact_at_k: share of an image's top-k terms found in its relevant
      captions' word pieces, mean over the "doc_faithfulness_docs" images that have one),
      "doc_max_df", "doc_max_df_term", and when `captions` is a sparse file of the same vocab
      its caption-side "Exact@20" and, when its head's weights are found, "Semantic@20" (D2S eq. 2-3)};
    - "html" (`html`: path of the report written: each id's caption and terms, the top
      `n_images` images of `run` with their terms from `docs`, relevant ones (`qrels`) framed,
      images from `image_root`, a word-cloud PNG per image with `wordcloud`) and "html_images"
      (retrieved images shown)}.
    `captions`: sparse or dense HDF5 holding caption texts; their word pieces come from
    `tokenizer` (directory with tokenizer.json; default the captions' model, else the shared
    dual encoder), as for Exact@k. Raises InputError for unknown ids, missing or mismatched
    files, or options that need another option.
    """
    from ..formats import read_sparse

    ids = [str(i) for i in (ids or [])]
    rep = reporter(progress)
    faith = captions is not None
    if not (ids or explain or stats or faith):
        raise InputError("nothing to inspect: give row IDs, --explain QUERY_ID DOC_ID, --stats, "
                         "or --captions with --qrels")
    if html is not None and not ids:
        raise InputError("--html needs row IDs to report on")
    if png is not None and not stats:
        raise InputError("--png goes with --stats")
    if wordcloud and html is None:
        raise InputError("--wordcloud goes with --html")
    if faith and qrels is None:
        raise InputError("--captions needs --qrels (which captions describe which image)")
    if k < 1 or stats_top < 1 or n_images < 1:
        raise InputError("--k, --stats-top and --n-images must be >= 1")
    src, index_dir = _sparse_source(Path(sparse))
    col = read_sparse(src)
    out: dict = {"file": str(src), **({"index": str(index_dir)} if index_dir else {})}
    if ids:
        out["rows"] = [_row(col, _find(col, i, src), k) for i in ids]
    dcol = None
    if explain or (html is not None and docs is not None):
        if docs is None:
            raise InputError("--explain needs --docs DOCS.h5 (the document side)")
        dcol = read_sparse(docs)
        if dcol.vocab != col.vocab:
            raise InputError(f"{docs}: vocab differs from {src}; both must come from the same head")
    if explain:
        out["explain"] = _explain(col, dcol, explain, src, docs)
    if stats:
        out["stats"] = _stats(col, stats_top, png)
    if faith:
        block = _faithfulness(col, src, out.get("rows", []), captions, qrels, tokenizer, doc_k, k)
        if stats or not ids:  # the collection's figures go with --stats (or stand alone), not with every row listing
            out["faithfulness"] = block
    if html is not None:
        out["html"] = str(html)
        out["html_images"] = _html(col, dcol, ids, Path(html), run, qrels, image_root, n_images, k, src, wordcloud,
                                   docs, rep)
    return _finite(out)


def inspect_provenance(path: str | Path) -> dict:
    """How `path` (any mmsparse output: dense or sparse HDF5, head, index, run, qrels, eval JSON)
    was made, back to the images and captions: the tree of mmsparse.provenance.chain (per node
    path, kind, command, mmsparse_version, seed, inputs, "parents" and, for inputs, "status":
    ok | changed | missing | unhashed against the recorded sha256). InputError when `path` is missing."""
    if not Path(path).exists():
        raise InputError(f"{path}: not found")
    return _prov.chain(path)


def _sparse_source(path: Path) -> tuple[Path, Path | None]:
    """(sparse HDF5 to read, index directory or None): an index directory stands for the sparse
    file its mmsparse.json records as `source`."""
    from ..indexes.meta import SPARSE_KINDS, read_meta

    if not path.is_dir():
        return path, None
    meta = read_meta(path)
    if meta["kind"] not in SPARSE_KINDS:
        raise InputError(f"{path}: a {meta['kind']} index holds dense vectors, not terms; "
                         "inspect a sparse index or a sparse HDF5")
    src = meta.get("source")
    if not src or not Path(src).is_file():
        raise InputError(f"{path}/mmsparse.json: source: the sparse file the index was built from ({src}) "
                         "is gone; pass the sparse HDF5 itself")
    return Path(src), path


def _finite(x):
    """JSON-safe: NaN/Inf (e.g. R² of a flat df curve) -> None."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))) else x


def _find(col, rid: str, path: Path) -> int:
    try:
        return col.ids.index(rid)
    except ValueError:
        raise InputError(f"{path}: id {rid!r} not found among its {len(col.ids)} ids (e.g. {col.ids[:3]})") from None


def _row(col, i: int, k: int) -> dict:
    return {"id": col.ids[i], "text": col.texts[i] if col.texts is not None else None,
            "nnz": int(col.nnz_per_row[i]),
            "terms": [{"term": t, "weight": w} for t, w in col.terms(i, k)]}


def _explain(qcol, dcol, pair, qpath, dpath) -> dict:
    from ..metrics import explain_pair

    qi, di = _find(qcol, pair[0], qpath), _find(dcol, pair[1], dpath)
    score, rows = explain_pair(*qcol.row(qi), *dcol.row(di), qcol.vocab)
    return {"query": pair[0], "doc": pair[1], "score": score, "shared_terms": len(rows), "terms": rows}


def _stats(col, top: int, png) -> dict:
    """Document frequencies of the terms, the power-law fit df ~ C * rank^-a (with R²), the share
    of active terms in more than half of the rows (BM25-V's "stop words"), and the most common term."""
    from ..metrics import df_table, max_df, power_law_fit, term_df

    df = term_df(col.matrix)
    a, c, r2 = power_law_fit(df)
    if png is not None:
        from ..metrics.plots import plot_rank_frequency
        plot_rank_frequency(df, Path(png), a, c, n_rows=len(col.ids), vocab=col.vocab, r2=r2)
    active = int((df > 0).sum())
    head = int((df > 0.5 * len(col.ids)).sum())
    share, term, _ = max_df(col.matrix, col.vocab)
    return {"rows": len(col.ids), "active_terms": active, "postings": int(df.sum()),
            "power_law_exponent": a, "power_law_scale": c, "power_law_r2": r2,
            "head_terms": head, "head_fraction": head / active if active else 0.0,
            "max_df": share, "max_df_term": term, "top_terms": df_table(df, col.vocab, top)}


def _caption_file(path):
    """(ids, texts, sparse collection or None) of a sparse or dense HDF5 holding caption texts."""
    from ..formats import read_dense, read_sparse

    kind = _prov.detect_kind(path)
    if kind == "missing":
        raise InputError(f"{path}: --captions file not found")
    if kind == "sparse":
        c = read_sparse(path)
        coll = c
    elif kind == "dense":
        c, coll = read_dense(path), None
    else:
        raise InputError(f"{path}: --captions must be a sparse or dense HDF5 of captions (found: {kind})")
    if c.texts is None:
        raise InputError(f"{path}: texts: this file stores no caption texts; pass the captions' "
                         "sparse or dense HDF5")
    return c.ids, c.texts, coll, c.attrs


def _faithfulness(col, path, rows: list, captions, qrels, tokenizer, doc_k, k) -> dict:
    """Image-side faithfulness of the documents in `col` (and caption-side Exact@20 / Semantic@20
    when `captions` is a sparse file of the same vocab); annotates `rows` in place."""
    from .. import metrics as M
    from ..formats import read_qrels

    cids, texts, ccol, cattrs = _caption_file(captions)
    qr = read_qrels(qrels)
    if not set(col.ids) & {d for docs in qr.values() for d in docs}:
        raise InputError(f"{path}: no id of it is a document of {qrels}; --captions/--qrels describe images: "
                         "inspect the images' sparse file")
    tok = M.resolve_tokenizer(tokenizer, cattrs, col.attrs)
    pieces = M.tokenize_captions(texts, tok)
    cap = M.caption_term_ids(pieces, col.vocab)
    terms = dict(zip(cids, cap))
    ks = [int(x) for x in (doc_k or []) if int(x) > 0]
    summary, _ = M.doc_faithfulness(col.matrix, col.ids, col.vocab, qr, terms, ks)
    out = dict(summary)
    if ccol is not None and ccol.vocab == col.vocab:
        src = M.embeddings_source(None, None, ccol.attrs)
        emb = M.load_static_embeddings(src, len(col.vocab)) if src is not None else None
        ccap = M.caption_term_ids(pieces, ccol.vocab)
        exact, sem = M.exact_semantic_at_k(ccol.matrix, ccap, 20, emb)
        out["Exact@20"] = float(exact.mean()) if len(exact) else 0.0
        if sem is not None:
            out["Semantic@20"] = float(sem.mean()) if len(sem) else 0.0
    # per shown row: which of its terms its relevant captions hold
    text_of = dict(zip(cids, texts))
    vocab_index = {t: i for i, t in enumerate(col.vocab)}
    words = M.doc_caption_terms([r["id"] for r in rows], qr, terms, col.vocab)
    for r, w in zip(rows, words):
        r["captions"] = [text_of[q] for q, docs in qr.items() if docs.get(r["id"], 0) > 0 and q in text_of]
        hit = set(w.tolist()) if w is not None else set()
        for t in r["terms"]:
            t["in_captions"] = vocab_index[t["term"]] in hit
        r[f"doc_Exact@{k}"] = (sum(t["in_captions"] for t in r["terms"]) / k) if w is not None else None
    return out


def _html(col, dcol, ids, out: Path, run, qrels, image_root, n_images, k, path, wordcloud, docs, rep) -> int:
    """Write the HTML report (and word clouds); returns the number of retrieved images shown."""
    from ..atomic import write_text_atomic
    from ..formats import read_qrels, read_run
    from ..metrics.compare import top_k
    from ..metrics.html_report import find_image, render_report, write_wordcloud

    if image_root is not None and not Path(image_root).is_dir():
        raise InputError(f"{image_root}: --image-root directory not found")
    if run is not None and dcol is None:
        raise InputError("--html with --run needs --docs DOCS.h5 to show the images' terms")
    r = read_run(run) if run is not None else {}
    rel = read_qrels(qrels) if qrels is not None else {}
    dindex = {d: i for i, d in enumerate(dcol.ids)} if dcol is not None else {}
    root = Path(image_root) if image_root is not None else None
    entries = []
    for rid in ids:
        i = _find(col, rid, path)
        qset = {col.vocab[t] for t in col.row(i)[0]}
        hits = []
        for did in top_k(r.get(rid, {}), n_images):
            j = dindex.get(did)  # a retrieved id absent from --docs is shown without terms
            terms = dcol.terms(j, k) if j is not None else []
            shared = qset & {dcol.vocab[t] for t in dcol.row(j)[0]} if j is not None else set()
            hits.append({"id": did, "score": r[rid][did], "terms": terms, "shared": shared, "doc_row": j,
                         "image": find_image(root, did), "relevant": rel.get(rid, {}).get(did, 0) > 0})
        e = {"id": rid, "text": col.texts[i] if col.texts is not None else None, "terms": col.terms(i, k),
             "hits": hits}
        if rid in rel and rid in r:
            ranked = top_k(r[rid], len(r[rid]))
            e["gold_rank"] = next((n for n, d in enumerate(ranked, 1) if rel[rid].get(d, 0) > 0), None)
        entries.append(e)
    if wordcloud:
        # one PNG per (query, image): the query decides which of the image's terms are highlighted
        def safe(x: str) -> str:
            return re.sub(r"[^A-Za-z0-9_.-]", "_", x)

        jobs = [(e, h) for e in entries for h in e["hits"] if h["doc_row"] is not None]
        with rep.task("word clouds", total=len(jobs)) as task:
            for e, h in jobs:
                name = f"wordclouds/{safe(e['id'])}__{safe(h['id'])}.png"
                write_wordcloud(dcol.terms(h["doc_row"], max(k, 40)), out.parent / name, h["shared"])
                h["wordcloud"] = name
                task.advance()
    sub = f"queries: {path}" + (f"; run: {run}" if run else "") + (f"; documents: {docs}" if docs else "")
    write_text_atomic(out, render_report(entries, f"mmsparse inspect: {Path(path).name}", sub))
    return sum(len(e["hits"]) for e in entries)
