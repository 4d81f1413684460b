"""`mmsparse inspect`: look inside a sparse file — top terms per id, why a doc matches a query,
term statistics of an index, and an HTML report with images and word clouds.

Word pieces: a WordPiece continuation such as '##oot' is shown as '-oot' (glued to the previous
piece); --json and --html tooltips keep the raw vocabulary term.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

import typer

from ..errors import InputError


def main(
    sparse: Path = typer.Argument(..., help="Sparse HDF5 (captions or images), or a sparse index directory "
                                  "(PISA/Seismic; the sparse file it was built from, per its mmsparse.json, is read)."),
    ids: Optional[List[str]] = typer.Argument(None, help="Row ids to show (caption sentids / image ids)."),
    k: int = typer.Option(20, "--k", min=1, help="Terms shown per row (highest weights first)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON to stdout instead of tables (raw terms)."),
    explain: Optional[Tuple[str, str]] = typer.Option(None, "--explain", metavar="QUERY_ID DOC_ID",
                                                      help="Shared terms of a query (from SPARSE) and a doc "
                                                      "(from --docs), each with q_t*d_t, and the dot-product score."),
    docs: Optional[Path] = typer.Option(None, "--docs", help="Sparse HDF5 of the documents (images), same vocab."),
    stats: bool = typer.Option(False, "--stats", help="Document-frequency table of SPARSE's terms, the "
                               "fitted power law df ~ C*rank^-a (a, C, R² of the log-log fit) and the terms in "
                               "more than half of the rows."),
    stats_top: int = typer.Option(30, "--stats-top", min=1, help="Rows of the --stats table."),
    png: Optional[Path] = typer.Option(None, "--png", help="With --stats: write the log-log rank-frequency plot "
                                       "here (df normalised so rank 1 = 1, as BM25-V Fig. 1, with the fit)."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Write an HTML report of the ids (caption, top "
                                            "terms, top images of --run inlined, with their terms; shared terms "
                                            "highlighted)."),
    wordcloud: bool = typer.Option(False, "--wordcloud", help="With --html: a word cloud PNG per shown image, "
                                   "written to wordclouds/ beside the HTML file and shown under the image."),
    run: Optional[Path] = typer.Option(None, "--run", help="TREC run giving each id's retrieved images (for --html)."),
    qrels: Optional[Path] = typer.Option(None, "--qrels", help="Qrels to frame relevant images (for --html)."),
    image_root: Optional[Path] = typer.Option(None, "--image-root", help="Directory of <image id>.jpg files (--html)."),
    n_images: int = typer.Option(5, "--n-images", min=1, help="Retrieved images per id in --html."),
    provenance: bool = typer.Option(False, "--provenance", help="Print how SPARSE (any mmsparse output: dense "
                                    "or sparse HDF5, head, index, run, qrels, eval JSON) was made, back to the "
                                    "images and captions: each input's command, version, seed, and whether it "
                                    "still matches its recorded sha256 (--json: the tree as JSON)."),
) -> None:
    """Show top-k terms of rows of a sparse file, explain a query-doc score, or summarise terms."""
    from ..formats import read_sparse

    if provenance:  # issue 10: the walking lives in mmsparse/provenance.py
        from ..provenance import chain, format_chain
        if not sparse.exists():
            raise InputError(f"{sparse}: not found")
        tree = chain(sparse)
        typer.echo(json.dumps(tree, indent=2, ensure_ascii=False, default=str) if as_json
                   else "\n".join(format_chain(tree)))
        return
    ids = list(ids or [])
    if not (ids or explain or stats):
        raise InputError("nothing to inspect: give row IDs, --explain QUERY_ID DOC_ID, or --stats")
    if html_out is not None and not ids:
        raise InputError("--html needs row IDs to report on")
    if png is not None and not stats:
        raise InputError("--png goes with --stats")
    if wordcloud and html_out is None:
        raise InputError("--wordcloud goes with --html")
    sparse, index_dir = _sparse_source(sparse)
    col = read_sparse(sparse)
    out: dict = {"file": str(sparse), **({"index": str(index_dir)} if index_dir else {})}
    if ids:
        out["rows"] = [_row(col, _find(col, i, sparse), k) for i in ids]
    dcol = None
    if explain or (html_out is not None and docs is not None):
        if docs is None:
            raise InputError("--explain needs --docs DOCS.h5 (the document side)")
        dcol = read_sparse(docs)
        if dcol.vocab != col.vocab:
            raise InputError(f"{docs}: vocab differs from {sparse}; both must come from the same head")
    if explain:
        out["explain"] = _explain(col, dcol, explain, sparse, docs)
    if stats:
        out["stats"] = _stats(col, stats_top, png)
    if html_out is not None:
        n = _html(col, dcol, ids, html_out, run, qrels, image_root, n_images, k, sparse, wordcloud, docs)
        out["html"] = str(html_out)
    if as_json:
        typer.echo(json.dumps(_finite(out), indent=2, ensure_ascii=False))
    elif html_out is not None:  # the report shows the rows; the terminal gets one line
        typer.echo(f"wrote {html_out}: {len(ids)} queries, {n} retrieved images"
                   + (f", word clouds in {Path(html_out).parent / 'wordclouds'}" if wordcloud else ""))
        _print({k: v for k, v in out.items() if k != "rows"})
    else:
        _print(out)


def _sparse_source(path: Path) -> tuple[Path, Path | None]:
    """(sparse HDF5 to read, index directory or None): an index directory stands for the sparse
    file its mmsparse.json records as `source`."""
    from ..indexes.meta import SPARSE_KINDS, read_meta

    if not Path(path).is_dir():
        return Path(path), None
    meta = read_meta(path)
    if meta["kind"] not in SPARSE_KINDS:
        raise InputError(f"{path}: a {meta['kind']} index holds dense vectors, not terms; "
                         "inspect a sparse index or a sparse HDF5")
    src = meta.get("source")
    if not src or not Path(src).is_file():
        raise InputError(f"{path}/mmsparse.json: source: the sparse file the index was built from ({src}) "
                         "is gone; pass the sparse HDF5 itself")
    return Path(src), Path(path)


def _finite(x):
    """JSON-safe: NaN/Inf (e.g. R² of a flat df curve) -> null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and x != x or x in (float("inf"), float("-inf")) else x


def _index(col) -> dict[str, int]:
    return {r: i for i, r in enumerate(col.ids)}


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


def _stats(col, top: int, png: Path | None) -> dict:
    """Document frequencies of the terms, the power-law fit df ~ C * rank^-a (with R²), and the
    share of active terms in more than half of the rows (BM25-V's "stop words")."""
    from ..metrics import df_table, power_law_fit, term_df

    df = term_df(col.matrix)
    a, c, r2 = power_law_fit(df)
    if png is not None:
        from ..metrics.plots import plot_rank_frequency
        plot_rank_frequency(df, png, a, c)
    active = int((df > 0).sum())
    head = int((df > 0.5 * len(col.ids)).sum())
    return {"rows": len(col.ids), "active_terms": active, "postings": int(df.sum()),
            "power_law_exponent": a, "power_law_scale": c, "power_law_r2": r2,
            "head_terms": head, "head_fraction": head / active if active else 0.0,
            "top_terms": df_table(df, col.vocab, top)}


def _html(col, dcol, ids, out, run, qrels, image_root, n_images, k, path, wordcloud, docs) -> int:
    """Write the HTML report (and word clouds); returns the number of retrieved images shown."""
    import re

    from rich.progress import track

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
    dindex = _index(dcol) if dcol is not None else {}
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
                         "image": find_image(image_root, did), "relevant": rel.get(rid, {}).get(did, 0) > 0})
        e = {"id": rid, "text": col.texts[i] if col.texts is not None else None, "terms": col.terms(i, k),
             "hits": hits}
        if rid in rel and rid in r:
            ranked = top_k(r[rid], len(r[rid]))
            e["gold_rank"] = next((n for n, d in enumerate(ranked, 1) if rel[rid].get(d, 0) > 0), None)
        entries.append(e)
    if wordcloud:
        # one PNG per (query, image): the query decides which of the image's terms are highlighted
        safe = lambda x: re.sub(r"[^A-Za-z0-9_.-]", "_", x)  # noqa: E731
        jobs = [(e, h) for e in entries for h in e["hits"] if h["doc_row"] is not None]
        for e, h in track(jobs, description="word clouds", transient=True, disable=len(jobs) < 20):
            name = f"wordclouds/{safe(e['id'])}__{safe(h['id'])}.png"
            write_wordcloud(dcol.terms(h["doc_row"], max(k, 40)), Path(out).parent / name, h["shared"])
            h["wordcloud"] = name
    sub = f"queries: {path}" + (f"; run: {run}" if run else "") + (f"; documents: {docs}" if docs else "")
    write_text_atomic(out, render_report(entries, f"mmsparse inspect: {Path(path).name}", sub))
    return sum(len(e["hits"]) for e in entries)


def _print(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..metrics import display_term

    con = Console()
    for r in out.get("rows", []):
        t = Table(title=f"{r['id']} ({r['nnz']} terms)" + (f"\n{r['text']}" if r["text"] else ""))
        t.add_column("#", justify="right")
        t.add_column("term")
        t.add_column("weight", justify="right")
        for n, x in enumerate(r["terms"], 1):
            t.add_row(str(n), display_term(x["term"]), f"{x['weight']:.3f}")
        con.print(t)
    if "explain" in out:
        e = out["explain"]
        t = Table(title=f"query {e['query']} x doc {e['doc']}: score {e['score']:.4f} "
                        f"({e['shared_terms']} shared terms)")
        for c in ("term", "query weight", "doc weight", "q*d"):
            t.add_column(c, justify="left" if c == "term" else "right")
        for x in e["terms"]:
            t.add_row(display_term(x["term"]), f"{x['query_weight']:.3f}", f"{x['doc_weight']:.3f}",
                      f"{x['contribution']:.4f}")
        con.print(t)
    if "stats" in out:
        s = out["stats"]
        src = f"{out['index']} (index built from {out['file']})" if "index" in out else out["file"]
        con.print(f"{src}: {s['rows']} rows, {s['active_terms']} active terms, {s['postings']} postings; "
                  f"df ~ {s['power_law_scale']:.3g} * rank^-{s['power_law_exponent']:.3f} "
                  f"(R² {s['power_law_r2']:.3f}); {s['head_terms']} terms ({100 * s['head_fraction']:.2f}% of the "
                  "active ones) occur in more than half of the rows",
                  markup=False, highlight=False, soft_wrap=True)
        t = Table(title=f"top {len(s['top_terms'])} terms by document frequency")
        for c in ("rank", "term", "df"):
            t.add_column(c, justify="left" if c == "term" else "right")
        for x in s["top_terms"]:
            t.add_row(str(x["rank"]), display_term(x["term"]), str(x["df"]))
        con.print(t)
