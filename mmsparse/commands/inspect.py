"""`mmsparse inspect`: look inside a sparse file — top terms per id, why a doc matches a query,
term statistics of an index, image-side faithfulness, an HTML report with images and word
clouds, and the provenance of any output. The work is done by mmsparse.api.inspection; this module
parses and prints.

Word pieces: a WordPiece continuation such as '##oot' is shown as '-oot' (glued to the previous
piece); --json and --html tooltips keep the raw vocabulary term.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

import typer

_HTML = "HTML report"
_FAITH = "Image-side faithfulness"


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
                               "fitted power law df ~ C*rank^-a (a, C, R² of the log-log fit), the terms in "
                               "more than half of the rows, and max_df (share of rows holding the most common term)."),
    stats_top: int = typer.Option(30, "--stats-top", min=1, help="Rows of the --stats table."),
    png: Optional[Path] = typer.Option(None, "--png", help="With --stats: write the log-log rank-frequency plot "
                                       "here (df normalised so rank 1 = 1, as BM25-V Fig. 1, with the fit)."),
    captions: Optional[Path] = typer.Option(None, "--captions", rich_help_panel=_FAITH, help="Sparse or dense HDF5 "
                                            "holding the caption texts, with --qrels, SPARSE = the images: ✓ on each shown "
                                            "term found in the row's relevant captions, and its doc_Exact@K; with "
                                            "--stats (or without IDs) over all images: doc_Exact@10 / doc_Exact@3 "
                                            "(share of an image's top-k terms that occur in its relevant captions), "
                                            "doc_max_df, and caption-side Exact@20 / Semantic@20 (sparse captions)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", rich_help_panel=_FAITH, help="Directory with "
                                             "tokenizer.json for --captions (default: the captions' model, else "
                                             "the shared dual encoder)."),
    html_out: Optional[Path] = typer.Option(None, "--html", rich_help_panel=_HTML, help="Write an HTML report of "
                                            "the ids (caption, top terms, top images of --run inlined, with their "
                                            "terms; shared terms highlighted)."),
    wordcloud: bool = typer.Option(False, "--wordcloud", rich_help_panel=_HTML, help="With --html: a word cloud "
                                   "PNG per shown image, written to wordclouds/ beside the HTML file and shown under "
                                   "the image."),
    run: Optional[Path] = typer.Option(None, "--run", rich_help_panel=_HTML, help="TREC run giving each id's "
                                       "retrieved images (for --html)."),
    qrels: Optional[Path] = typer.Option(None, "--qrels", help="Qrels: frame relevant images (--html); which "
                                         "captions describe which image (--captions)."),
    image_root: Optional[Path] = typer.Option(None, "--image-root", rich_help_panel=_HTML, help="Directory of "
                                              "<image id>.jpg files (--html)."),
    n_images: int = typer.Option(5, "--n-images", min=1, rich_help_panel=_HTML, help="Retrieved images per id "
                                 "in --html."),
    provenance: bool = typer.Option(False, "--provenance", help="Print how SPARSE (any mmsparse output: dense "
                                    "or sparse HDF5, head, index, run, qrels, eval JSON) was made, back to the "
                                    "images and captions: each input's command, version, seed, and whether it "
                                    "still matches its recorded sha256 (--json: the tree as JSON)."),
) -> None:
    """Show top-k terms of rows of a sparse file, explain a query-doc score, summarise terms, or
    measure how well image terms match their captions."""
    from ..api.inspection import inspect_provenance, inspect_terms
    from ..cli_ui import RichReporter

    if provenance:
        from ..provenance import format_chain

        tree = inspect_provenance(sparse)
        typer.echo(json.dumps(tree, indent=2, ensure_ascii=False, default=str) if as_json
                   else "\n".join(format_chain(tree)))
        return
    out = inspect_terms(sparse, list(ids or []), k=k, explain=explain, docs=docs, stats=stats, stats_top=stats_top,
                        png=png, html=html_out, wordcloud=wordcloud, run=run, qrels=qrels, image_root=image_root,
                        n_images=n_images, captions=captions, tokenizer=tokenizer, progress=RichReporter())
    if as_json:
        typer.echo(json.dumps(out, indent=2, ensure_ascii=False))
    elif html_out is not None:  # the report shows the rows; the terminal gets one line
        typer.echo(f"wrote {html_out}: {len(ids or [])} queries, {out['html_images']} retrieved images"
                   + (f", word clouds in {Path(html_out).parent / 'wordclouds'}" if wordcloud else ""))
        _print({k: v for k, v in out.items() if k != "rows"}, k)
    else:
        _print(out, k)


def _print(out: dict, k: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..metrics import display_term

    con = Console()
    for r in out.get("rows", []):
        title = f"{r['id']} ({r['nnz']} terms)" + (f"\n{r['text']}" if r["text"] else "")
        marks = "captions" in r
        if marks:
            de = r.get(f"doc_Exact@{k}")
            title += (f"\ndoc_Exact@{k} {de:.2f}: ✓ = in its {len(r['captions'])} relevant caption(s)"
                      if de is not None else "\nno relevant caption in the qrels")
        t = Table(title=title)
        t.add_column("#", justify="right")
        t.add_column("term")
        t.add_column("weight", justify="right")
        if marks:
            t.add_column("in captions", justify="center")
        for n, x in enumerate(r["terms"], 1):
            t.add_row(str(n), display_term(x["term"]), f"{x['weight']:.3f}",
                      *(["✓" if x.get("in_captions") else ""] if marks else []))
        con.print(t)
        for c in r.get("captions", []):
            con.print(f"  · {c}", markup=False, highlight=False)
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
        fit = (f"df ~ {s['power_law_scale']:.3g} * rank^-{s['power_law_exponent']:.3f} "
               f"(R² {_num(s['power_law_r2'], '.3f')})" if s["power_law_exponent"] is not None else "no power-law fit")
        top = (f"; the most common term, {display_term(s['max_df_term'])!r}, is in {100 * s['max_df']:.1f}% of "
               "the rows" if s.get("max_df_term") else "")
        con.print(f"{src}: {s['rows']} rows, {s['active_terms']} active terms, {s['postings']} postings; {fit}; "
                  f"{s['head_terms']} terms ({100 * s['head_fraction']:.2f}% of the active ones) occur in more than "
                  f"half of the rows{top}", markup=False, highlight=False, soft_wrap=True)
        t = Table(title=f"top {len(s['top_terms'])} terms by document frequency")
        for c in ("rank", "term", "df"):
            t.add_column(c, justify="left" if c == "term" else "right")
        for x in s["top_terms"]:
            t.add_row(str(x["rank"]), display_term(x["term"]), str(x["df"]))
        con.print(t)
    if "faithfulness" in out:
        f = out["faithfulness"]
        con.print(f"image-side faithfulness over the {f['doc_faithfulness_docs']} images with a relevant caption "
                  "(values x100):", markup=False, highlight=False, soft_wrap=True)
        t = Table(show_header=False)
        t.add_column("figure")
        t.add_column("value", justify="right")
        for key, v in f.items():
            if key in ("doc_max_df_term", "doc_faithfulness_docs") or v is None:
                continue
            if key == "doc_max_df":
                t.add_row(f"doc_max_df ({display_term(f['doc_max_df_term'] or '–')})", f"{100 * v:.1f}")
            else:
                t.add_row(key, f"{100 * v:.1f}")
        con.print(t)


def _num(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)
