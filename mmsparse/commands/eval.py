"""`mmsparse eval`: effectiveness (ir-measures), FLOPs and sparsity, semantic deviation and
image-side faithfulness, faithfulness to and significance against a dense run, as one flat JSON;
and `--table`, which prints the results of several evaluations as one table (D2S Tables 1, 3 and
5 combined). The work is done by mmsparse.api.evaluation; this module parses and prints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import InputError

_SPARSE = "Sparse files: FLOPs, sparsity, Exact@K, doc_Exact@k"
_DENSE = "Comparisons and significance"
_TABLE = "--table"
_OUT = "Outputs"


def main(
    files: Optional[List[Path]] = typer.Argument(None, metavar="RUN QRELS | EVAL_JSON...", help="RUN (TREC run: "
                                                 "qid Q0 docid rank score tag) and QRELS (TREC qrels: qid 0 docid "
                                                 "relevance); with --table: eval JSONs, one table row each."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", rich_help_panel=_OUT, help="Write the flat JSON of all "
                                       "figures here (atomically). --table: the table as markdown (.md) or JSON "
                                       "(other suffix). Without it only the table is printed."),
    measure: Optional[List[str]] = typer.Option(None, "--measure", "-m", help="ir-measures name, repeatable "
                                                "(default: R@1, R@5, R@10, RR@10). Values are fractions in [0, 1]."),
    strict: bool = typer.Option(False, "--strict", help="Fail when run queries are missing from the qrels "
                                "(default: skip them with a warning). Qrels queries missing from the run always score 0."),
    force: bool = typer.Option(False, "--force", help="Evaluate even when the run's queries and the qrels "
                               "record different datasets or splits (their .meta.json sidecars)."),
    queries: Optional[Path] = typer.Option(None, "--queries", rich_help_panel=_SPARSE, help="Sparse HDF5 of the "
                                           "queries (captions): enables FLOPs (eq. 1), query_terms and sparsity "
                                           "figures; needs --docs."),
    docs: Optional[Path] = typer.Option(None, "--docs", rich_help_panel=_SPARSE, help="Sparse HDF5 of the "
                                        "documents (images), same vocab: doc_terms, doc_max_df (share of images "
                                        "holding the most common term) and doc_max_df_term."),
    doc_k: List[int] = typer.Option([10, 3], "--doc-k", rich_help_panel=_SPARSE, help="Image-side faithfulness "
                                    "doc_Exact@k, repeatable (default 10 and 3): the share of each image's top-k terms "
                                    "that occur in the captions the qrels call relevant to it (word pieces of the "
                                    "--queries texts, as for Exact@K; '##' continuation pieces never count), mean "
                                    "over the images that have one. "
                                    "--doc-k 0 turns it off."),
    deviation_k: Optional[int] = typer.Option(None, "--deviation-k", min=1, rich_help_panel=_SPARSE,
                                              help="Compute caption-side Exact@K and Semantic@K (eq. 2-3) of the "
                                              "--queries captions (the paper uses 20)."),
    static_embeddings: Optional[Path] = typer.Option(None, "--static-embeddings", rich_help_panel=_SPARSE,
                                                     help="Static term embeddings for Semantic@K: .npy [|V|, e], "
                                                     ".safetensors, or a model/head dir (default: --head's W2 "
                                                     "output-layer rows)."),
    head: Optional[Path] = typer.Option(None, "--head", rich_help_panel=_SPARSE, help="Head directory whose "
                                        "model.safetensors W2 rows are the default static embeddings."),
    embedding_key: Optional[str] = typer.Option(None, "--embedding-key", rich_help_panel=_SPARSE,
                                                help="Tensor name to use as embeddings."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", rich_help_panel=_SPARSE, help="Directory with "
                                             "tokenizer.json that splits captions into word pieces (default: the "
                                             "--queries file's model, else the shared dual encoder)."),
    dense_run: Optional[Path] = typer.Option(None, "--dense-run", rich_help_panel=_DENSE, help="Dense run of the "
                                             "same queries: adds pearson_<measure> over per-query values, overlap@10 "
                                             "(mean top-10 fraction shared, and its histogram), p_vs_dense_<measure> "
                                             "(paired two-tailed t-test, raw) and p_vs_dense_corrected_<measure> "
                                             "(x the Bonferroni factor, see --n-comparisons)."),
    compare: Optional[List[str]] = typer.Option(None, "--compare", rich_help_panel=_DENSE, help="Other run(s), "
                                                "repeatable: paired two-tailed t-test per measure vs RUN (p_<measure> "
                                                "corrected, p_raw_<measure> raw)."),
    n_comparisons: Optional[int] = typer.Option(None, "--n-comparisons", min=1, rich_help_panel=_DENSE,
                                                help="Bonferroni factor. Default: the runs RUN is tested against in "
                                                "this call (1 for --dense-run + one per --compare), so an eval with "
                                                "only --dense-run corrects x1 and records that (n_comparisons, "
                                                "bonferroni); pass the size of the family you compare (e.g. every "
                                                "sparse run tested against the same dense run). --table: default "
                                                "the number of rows tested against dense."),
    alpha: float = typer.Option(0.05, "--alpha", rich_help_panel=_DENSE, help="Significance level for the † "
                                "marks (after Bonferroni)."),
    per_query: Optional[Path] = typer.Option(None, "--per-query", rich_help_panel=_OUT, help="Write per-query "
                                             "values as TSV here."),
    plot: Optional[Path] = typer.Option(None, "--plot", rich_help_panel=_OUT, help="Write PNGs here: "
                                        "flops_vs_R@1.png (Fig. 2a, needs FLOPs) and overlap_top10.png (Fig. 2b, "
                                        "needs --dense-run). --table: over the table's rows."),
    plot_with: Optional[List[Path]] = typer.Option(None, "--plot-with", rich_help_panel=_OUT, help="Earlier eval "
                                                   "JSON(s) to add as points to the FLOPs plot, repeatable."),
    table: bool = typer.Option(False, "--table", rich_help_panel=_TABLE, help="Print one table from the eval "
                               "JSONs given as arguments (e.g. dense.json sparse.json): measures, FLOPs, query/doc "
                               "terms, pearson_*, overlap@10, Exact@k, Semantic@k, doc_Exact@k, doc_max_df, with † "
                               "marks vs the dense run."),
    label: Optional[List[str]] = typer.Option(None, "--label", rich_help_panel=_TABLE, help="--table: row label, "
                                              "repeatable, one per JSON in order (default: the file name without "
                                              ".json)."),
    column: Optional[List[str]] = typer.Option(None, "--column", rich_help_panel=_TABLE, help="--table: show only "
                                               "these JSON keys as columns, repeatable, in order (default: every "
                                               "figure of the list above that some row has)."),
) -> None:
    """Evaluate a run: R@k / RR@10 (ir-measures), FLOPs (mean shared terms per query-image pair),
    Exact@K / doc_Exact@k; or, with --table, print several evaluations as one table.

    Every qrels query is evaluated; one the run lacks scores 0. Measure values are fractions in
    [0, 1] (the table shows them x100). JSON keys: see mmsparse.api.evaluation.evaluate and
    docs/formats.md. P-values are stored raw and Bonferroni-corrected; the factor used and why
    are recorded (n_comparisons, bonferroni).

    --table marks a measure † when the paired two-tailed t-test vs the dense run (stored by the
    evaluation with --dense-run) gives p < --alpha after Bonferroni over the rows tested against
    dense (or --n-comparisons), as in D2S Table 1.
    """
    from ..api.evaluation import evaluate, evaluate_table
    from ..cli_ui import RichReporter

    files = list(files or [])
    if table:
        single = {"--queries": queries, "--docs": docs, "--dense-run": dense_run, "--compare": compare,
                  "--deviation-k": deviation_k, "--per-query": per_query, "--measure": measure,
                  "--plot-with": plot_with}
        given = [k for k, v in single.items() if v]
        if given:
            raise InputError(f"{', '.join(given)}: not used with --table (which reads finished eval JSONs)")
        tab = evaluate_table(files, out=out, label=label, column=column, n_comparisons=n_comparisons,
                             alpha=alpha, plot=plot, progress=RichReporter())
        _print_eval_table(tab)
        return
    if label or column:
        raise InputError("--label/--column go with --table")
    if len(files) != 2:
        raise InputError(f"eval takes RUN QRELS ({len(files)} path(s) given), or --table EVAL_JSON...")
    run, qrels = files
    result = evaluate(run, qrels, out=out, measure=measure, strict=strict, force=force, queries=queries, docs=docs,
                      per_query=per_query, deviation_k=deviation_k, doc_k=doc_k,
                      static_embeddings=static_embeddings, head=head, embedding_key=embedding_key,
                      tokenizer=tokenizer, dense_run=dense_run, compare=compare, n_comparisons=n_comparisons,
                      alpha=alpha, plot=plot, plot_with=plot_with, progress=RichReporter())
    _print_result(result)


def _sig(p, alpha: float) -> bool:
    return isinstance(p, (int, float)) and not math.isnan(p) and p < alpha


def _print_result(result: dict) -> None:
    """The measures of RUN, the dense run and the compared runs as one table (x100, † marks),
    then every other scalar figure."""
    from rich.console import Console
    from rich.table import Table

    names = list(result["measures"])
    alpha = result.get("alpha", 0.05)
    rows = [(Path(result["run"]).name, result,
             {n: _sig(result.get(f"p_vs_dense_corrected_{n}"), alpha) for n in names})]
    if "dense_run" in result:
        rows.append((f"dense: {Path(result['dense_run']).name}", result.get("dense_measures", {}), {}))
    for c, block in (result.get("compare") or {}).items():
        rows.append((Path(c).name, block, {n: _sig(block.get(f"p_{n}"), alpha) for n in names}))
    notes = []
    if "n_comparisons" in result:
        notes = (["† on the first row: vs the dense run"] if "dense_run" in result else []) + \
                (["† on a compared run: vs the first row"] if "compare" in result else [])
        notes.append(f"paired two-tailed t-test, p < {alpha:g} after Bonferroni x{result['n_comparisons']}")
    t = Table(caption="; ".join([f"{result['queries']} queries, values x100", *notes]), caption_justify="left")
    t.add_column("run")
    for n in names:
        t.add_column(n, justify="right")
    for label, agg, sig in rows:
        t.add_row(label, *(_pct(agg.get(n)) + ("†" if sig.get(n) else "") for n in names))
    console = Console()
    console.print(t)
    if result.get("bonferroni"):
        console.print(f"Bonferroni {result['bonferroni']}", markup=False, highlight=False, soft_wrap=True)
    skip = {*names, "run", "qrels", "compare", "mmsparse_version", "command", "dense_run", "bonferroni"}
    rest = Table(show_header=False, box=None)
    for k, v in result.items():
        if k not in skip and not isinstance(v, (list, dict)):
            rest.add_row(k, "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else
                         (f"{v:.4g}" if isinstance(v, float) else str(v)))
    console.print(rest)


def _pct(v) -> str:
    return "n/a" if not isinstance(v, (int, float)) or math.isnan(v) else f"{100 * v:.1f}"


def _print_eval_table(tab: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..metrics import table as T

    console = Console()
    if not console.is_terminal:  # make logs and pipes get every column on one line
        console.width = max(console.width, 220)
    t = Table(caption=T.caption(tab, tab.get("queries")), caption_justify="left")
    t.add_column("run")
    for c in tab["columns"]:
        t.add_column(c, justify="right")
    for row in tab["rows"]:
        t.add_row(row["label"], *T.cells(tab, row))
    console.print(t)
