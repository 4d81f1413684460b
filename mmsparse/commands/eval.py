"""`mmsparse eval`: effectiveness (ir-measures), FLOPs and sparsity, semantic deviation,
faithfulness to and significance against a dense run, as one flat JSON; and `--table`, which
prints the results of several evaluations as one table (D2S Tables 1, 3 and 5 combined)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

from ..atomic import write_text_atomic
from ..errors import InputError


def main(
    files: Optional[List[Path]] = typer.Argument(None, metavar="RUN QRELS | EVAL_JSON...", help="RUN (TREC run: "
                                                 "qid Q0 docid rank score tag) and QRELS (TREC qrels: qid 0 docid "
                                                 "relevance); with --table: eval JSONs, one table row each."),
    table: bool = typer.Option(False, "--table", help="Print one table from the eval JSONs given as arguments "
                               "(e.g. dense.json sparse.json): measures, FLOPs, query/doc terms, pearson_*, "
                               "overlap@10, Exact@k, Semantic@k, with † marks vs the dense run."),
    label: Optional[List[str]] = typer.Option(None, "--label", help="--table: row label, repeatable, one per "
                                              "JSON in order (default: the file name without .json)."),
    column: Optional[List[str]] = typer.Option(None, "--column", help="--table: show only these JSON keys as "
                                               "columns, repeatable, in order (default: every figure of the "
                                               "list above that some row has)."),
    n_comparisons: Optional[int] = typer.Option(None, "--n-comparisons", min=1, help="Bonferroni factor for the "
                                                "p-values vs --dense-run (default 1). --table: default the number of "
                                                "rows tested against dense."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write the flat JSON of all figures here "
                                       "(atomically). --table: the table as markdown (.md) or JSON (other suffix). "
                                       "Without it only the table is printed."),
    measure: Optional[List[str]] = typer.Option(None, "--measure", "-m", help="ir-measures name, repeatable "
                                                "(default: R@1, R@5, R@10, RR@10). Values are fractions in [0, 1]."),
    strict: bool = typer.Option(False, "--strict", help="Fail when run queries are missing from the qrels "
                                "(default: skip them with a warning). Qrels queries missing from the run always score 0."),
    force: bool = typer.Option(False, "--force", help="Evaluate even when the run's queries and the qrels "
                               "record different datasets or splits (their .meta.json sidecars)."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="Sparse HDF5 of the queries (captions): "
                                           "enables FLOPs (eq. 1), query_terms and sparsity figures; needs --docs."),
    docs: Optional[Path] = typer.Option(None, "--docs", help="Sparse HDF5 of the documents (images), same vocab."),
    per_query: Optional[Path] = typer.Option(None, "--per-query", help="Write per-query values as TSV here."),
    deviation_k: Optional[int] = typer.Option(None, "--deviation-k", min=1, help="Compute Exact@K and "
                                              "Semantic@K (eq. 2-3) of the --queries captions (the paper uses 20)."),
    static_embeddings: Optional[Path] = typer.Option(None, "--static-embeddings", help="Static term embeddings "
                                                     "for Semantic@K: .npy [|V|, e], .safetensors, or a model/head dir "
                                                     "(default: --head's W2 output-layer rows)."),
    head: Optional[Path] = typer.Option(None, "--head", help="Head directory whose model.safetensors W2 rows "
                                        "are the default static embeddings."),
    embedding_key: Optional[str] = typer.Option(None, "--embedding-key", help="Tensor name to use as embeddings."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Directory with tokenizer.json that "
                                             "splits captions into word pieces (default: the dual-encoder model)."),
    dense_run: Optional[Path] = typer.Option(None, "--dense-run", help="Dense run of the same queries: adds "
                                             "pearson_<measure> over per-query values, overlap@10 (mean top-10 "
                                             "fraction shared, and its histogram), and p_vs_dense_<measure> (paired "
                                             "two-tailed t-test, raw; p_vs_dense_corrected_<measure>: x --n-comparisons)."),
    compare: Optional[List[str]] = typer.Option(None, "--compare", help="Other run(s), repeatable: paired "
                                                "two-tailed t-test per measure vs RUN, Bonferroni over the compared runs."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level for the † marks (after Bonferroni)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write PNGs here: flops_vs_R@1.png (Fig. 2a, needs "
                                        "FLOPs) and overlap_top10.png (Fig. 2b, needs --dense-run). --table: "
                                        "over the table's rows."),
    plot_with: Optional[List[Path]] = typer.Option(None, "--plot-with", help="Earlier eval JSON(s) to add as "
                                                   "points to the FLOPs plot, repeatable."),
) -> None:
    """Evaluate a run: R@k / RR@10 (ir-measures), FLOPs (mean shared terms per query-image pair);
    or, with --table, print several evaluations as one table.

    Every qrels query is evaluated; one the run lacks scores 0. Measure values are fractions in
    [0, 1] (the table shows them x100). JSON keys: the measure names (and `measures`, their list),
    queries, FLOPs, query_terms / doc_terms (mean non-zeros per row) and the other sparsity figures,
    Exact@K / Semantic@K, pearson_<measure>, overlap@10, overlap@10_histogram (queries with 0..10
    shared), p_vs_dense_<measure>, and a nested "compare" block with Bonferroni-corrected p_<measure>.

    --table marks a measure † when the paired two-tailed t-test vs the dense run (stored by the
    evaluation with --dense-run) gives p < --alpha after Bonferroni over the rows tested against
    dense (or --n-comparisons), as in D2S Table 1.
    """
    from rich.console import Console

    from .. import metrics as M
    from ..formats import read_qrels, read_run
    from ..provenance import record

    files = list(files or [])
    if table:
        single = {"--queries": queries, "--docs": docs, "--dense-run": dense_run, "--compare": compare,
                  "--deviation-k": deviation_k, "--per-query": per_query, "--measure": measure,
                  "--plot-with": plot_with}
        given = [k for k, v in single.items() if v]
        if given:
            raise InputError(f"{', '.join(given)}: not used with --table (which reads finished eval JSONs)")
        return _table(files, label, column, n_comparisons, alpha, out, plot)
    if label or column:
        raise InputError("--label/--column go with --table")
    if len(files) != 2:
        raise InputError(f"eval takes RUN QRELS ({len(files)} path(s) given), or --table EVAL_JSON...")
    run, qrels = files
    err = Console(stderr=True)
    ms = M.parse_measures(measure)
    if (queries is None) != (docs is None):
        raise InputError("--queries and --docs go together: FLOPs needs both sparse files")
    if deviation_k and queries is None:
        raise InputError("--deviation-k needs --queries (the sparse captions with their texts)")
    for p in [*(plot_with or [])]:
        if not Path(p).is_file():
            raise InputError(f"{p}: eval JSON for --plot-with not found")
    q_path = str(qrels)
    qr = read_qrels(qrels)
    base_run = read_run(run)
    from ..checks import check_run_qrels
    check_run_qrels(run, qrels, force)
    res = M.evaluate_run(base_run, qr, ms, strict, str(run), q_path)
    result: dict = {**res.aggregate, "measures": list(res.aggregate), "queries": res.queries,
                    "queries_not_in_run": len(res.not_in_run), "queries_not_in_qrels": len(res.not_in_qrels)}
    extra_cols: dict[str, dict[str, float]] = {}
    warnings: list[str] = []

    if queries is not None:
        qs, ds = _read_pair(queries, docs)
        result["FLOPs"] = M.flops(qs.matrix, ds.matrix)
        result.update(M.sparsity_stats(qs.matrix, "query"))
        result.update(M.sparsity_stats(ds.matrix, "doc"))
        nnz = M.row_nnz(qs.matrix)
        extra_cols["query_terms"] = {q: float(n) for q, n in zip(qs.ids, nnz)}
        if deviation_k:
            extra_cols.update(_deviation(qs, queries, deviation_k, static_embeddings, head, embedding_key, tokenizer,
                                         result, warnings))

    rows = [(_label(run), res.aggregate, {})]
    if dense_run is not None:
        drun = read_run(dense_run)
        dres = M.evaluate_run(drun, qr, ms, False, str(dense_run), q_path)
        result["dense_run"] = str(Path(dense_run).resolve())  # absolute: `--table` matches it to a row's run
        result["n_comparisons"] = n_comparisons or 1
        for n in res.per_query:
            result[f"pearson_{n}"] = M.pearson_per_query(res.per_query[n], dres.per_query[n])
        for n in res.per_query:
            _, p = M.paired_ttest(res.per_query[n], dres.per_query[n])
            result[f"p_vs_dense_{n}"] = p
            result[f"p_vs_dense_corrected_{n}"] = M.bonferroni(p, n_comparisons or 1)
            rows[0][2][n] = (not math.isnan(p)) and M.bonferroni(p, n_comparisons or 1) < alpha
        ov = M.overlap_at_k(base_run, drun, 10, list(qr))
        result["overlap@10"] = sum(ov.values()) / len(ov)
        result["overlap@10_histogram"] = M.overlap_histogram(ov, 10)
        extra_cols["overlap@10"] = ov
        rows.append((f"dense: {_label(dense_run)}", dres.aggregate, {}))

    if compare:
        result["compare"] = {}
        for c in compare:
            cres = M.evaluate_run(read_run(c), qr, ms, False, c, q_path)
            block, sig = dict(cres.aggregate), {}
            for n in res.per_query:
                _, p = M.paired_ttest(res.per_query[n], cres.per_query[n])
                p = M.bonferroni(p, len(compare))
                block[f"p_{n}"] = p
                sig[n] = (not math.isnan(p)) and p < alpha
            result["compare"][c] = block
            rows.append((_label(Path(c)), cres.aggregate, sig))

    result.update({"run": str(run), "qrels": q_path, **record()})
    if plot is not None:
        _plots(plot, result, plot_with or [], _label(run))
    if per_query is not None:
        _write_per_query(per_query, res.per_query, extra_cols)
    if out is not None:
        write_text_atomic(out, json.dumps(_clean(result), indent=2) + "\n")
    # warnings only once every input has been read, so a bad input stays one line on stderr
    if res.not_in_qrels:
        warnings.insert(0, f"{len(res.not_in_qrels)} run queries are not in the qrels and were skipped "
                           f"(e.g. {res.not_in_qrels[:3]}); use --strict to fail instead")
    if res.not_in_run:
        warnings.insert(0, f"{len(res.not_in_run)} qrels queries are missing from the run and count as 0")
    for w in warnings:
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    _print_table(rows, result, [str(m) for m in ms])


def _label(p: Path) -> str:
    return Path(p).name


def _read_pair(queries: Path, docs: Path):
    from ..formats import read_sparse

    qs, ds = read_sparse(queries), read_sparse(docs)
    if qs.vocab != ds.vocab:
        i = next((i for i, (a, b) in enumerate(zip(qs.vocab, ds.vocab)) if a != b), min(len(qs.vocab), len(ds.vocab)))
        raise InputError(f"{docs}: vocab differs from {queries} ({len(ds.vocab)} vs {len(qs.vocab)} terms, first "
                         f"difference at term {i}); sparsify queries and docs with the same head")
    return qs, ds


def _deviation(qs, path, k, static_embeddings, head, key, tokenizer, result, warnings) -> dict:
    """Exact@k / Semantic@k into `result`; returns per-query columns."""
    from .. import metrics as M
    from ..settings import dual_encoder_dir

    if qs.texts is None:
        raise InputError(f"{path}: texts: the --queries file stores no caption texts; "
                         "Exact@k needs them (sparsify a text dense file)")
    tok = tokenizer or _default_tokenizer(qs.attrs) or dual_encoder_dir()
    cap = M.caption_term_ids(M.semantics.tokenize_captions(qs.texts, tok), qs.vocab)
    src = static_embeddings or head
    if src is None and Path(str(qs.attrs.get("head", ""))).is_dir():
        src = Path(qs.attrs["head"])
    emb = M.load_static_embeddings(src, len(qs.vocab), key) if src is not None else None
    if emb is None:
        warnings.append("no --static-embeddings/--head: Semantic@k skipped")
    exact, sem = M.exact_semantic_at_k(qs.matrix, cap, k, emb)
    result[f"Exact@{k}"] = float(exact.mean()) if len(exact) else 0.0
    cols = {f"Exact@{k}": dict(zip(qs.ids, map(float, exact)))}
    if sem is not None:
        result[f"Semantic@{k}"] = float(sem.mean()) if len(sem) else 0.0
        cols[f"Semantic@{k}"] = dict(zip(qs.ids, map(float, sem)))
    return cols


def _default_tokenizer(attrs: dict) -> Path | None:
    m = Path(str(attrs.get("model", "")))
    return m if str(m) and (m / "tokenizer.json").is_file() else None


def _load_result(p: Path) -> dict:
    """An eval JSON as a dict; InputError when missing or not one."""
    from ..errors import require_file

    require_file(p, "eval JSON")
    try:
        o = json.loads(Path(p).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: not an eval JSON ({e})") from None
    if not isinstance(o, dict) or not any(isinstance(o.get(k), (int, float)) for k in ("queries", "R@1", "FLOPs")):
        raise InputError(f"{p}: not an eval JSON (no queries/measures); write one with `mmsparse eval RUN QRELS -o`")
    return o


def _plots(d: Path, result: dict, others: list[Path], label: str) -> None:
    from ..metrics.plots import plot_flops_vs_effectiveness, plot_overlap_histogram

    pts = []
    for p in others:
        o = _load_result(p)
        if o.get("FLOPs") is None or o.get("R@1") is None:
            raise InputError(f"{p}: FLOPs/R@1: missing; rerun eval with --queries/--docs and the default measures")
        pts.append((Path(o.get("run", p)).name, float(o["FLOPs"]), float(o["R@1"])))
    if "FLOPs" in result and "R@1" in result:
        pts.append((label, result["FLOPs"], result["R@1"]))
    if pts:
        plot_flops_vs_effectiveness(pts, d / "flops_vs_R@1.png")
    if "overlap@10_histogram" in result:
        plot_overlap_histogram([(label, result["overlap@10_histogram"])], d / "overlap_top10.png")


def _table(files: list[Path], labels, columns, n_comparisons, alpha, out, plot) -> None:
    """--table: one row per eval JSON, printed, optionally written (-o) and plotted (--plot)."""
    from rich.console import Console
    from rich.table import Table

    from ..metrics import table as T

    if not files:
        raise InputError("--table needs eval JSON files, e.g. `mmsparse eval --table dense.json sparse.json`")
    labels = list(labels or [])
    if labels and len(labels) != len(files):
        raise InputError(f"--label given {len(labels)} time(s) for {len(files)} eval JSONs; give one per file")
    results = [_load_result(p) for p in files]
    labels = labels or [Path(p).name.removesuffix(".json") for p in files]
    for c in columns or []:
        if not any(c in r for r in results):
            raise InputError(f"--column {c!r}: no eval JSON has this key (e.g. {sorted(results[0])[:8]})")
    tab = T.build_table(results, labels, columns, alpha, n_comparisons)
    nq = next((r.get("queries") for r in results if r.get("queries")), None)
    if plot is not None:
        _table_plots(plot, results, labels)
    if out is not None:
        text = (T.to_markdown(tab, nq) if Path(out).suffix == ".md"
                else json.dumps(_clean({**tab, "queries": nq, "files": [str(p) for p in files]}), indent=2) + "\n")
        write_text_atomic(out, text)
    err = Console(stderr=True)
    for w in tab["warnings"]:
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    console = Console()
    if not console.is_terminal:  # make logs and pipes get every column on one line
        console.width = max(console.width, 220)
    t = Table(caption=T.caption(tab, nq), caption_justify="left")
    t.add_column("run")
    for c in tab["columns"]:
        t.add_column(c, justify="right")
    for row in tab["rows"]:
        t.add_row(row["label"], *T.cells(tab, row))
    console.print(t)


def _table_plots(d: Path, results: list[dict], labels: list[str]) -> None:
    """Fig. 2a over the rows with FLOPs (rows with R@1 but no FLOPs, e.g. dense, as lines) and
    Fig. 2b with one bar series per row that has an overlap histogram."""
    from ..metrics.plots import plot_flops_vs_effectiveness, plot_overlap_histogram

    pts = [(lab, float(r["FLOPs"]), float(r["R@1"])) for r, lab in zip(results, labels)
           if _finite(r.get("FLOPs")) and _finite(r.get("R@1"))]
    refs = [(lab, float(r["R@1"])) for r, lab in zip(results, labels)
            if not _finite(r.get("FLOPs")) and _finite(r.get("R@1"))]
    if pts:
        plot_flops_vs_effectiveness(pts, d / "flops_vs_R@1.png", references=refs)
    hist = [(lab, r["overlap@10_histogram"]) for r, lab in zip(results, labels)
            if isinstance(r.get("overlap@10_histogram"), list)]
    if hist:
        plot_overlap_histogram(hist, d / "overlap_top10.png")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _write_per_query(path: Path, per: dict, extra: dict) -> None:
    cols = [*per, *extra]
    qids = list(next(iter(per.values())))
    lines = ["\t".join(["qid", *cols])]
    for q in qids:
        vals = [per[c][q] if c in per else extra[c].get(q) for c in cols]
        lines.append("\t".join([q, *("" if v is None else f"{v:.6g}" for v in vals)]))
    write_text_atomic(path, "\n".join(lines) + "\n")


def _clean(x):
    """JSON-safe: NaN/Inf -> null."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _print_table(rows, result: dict, names: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    notes = []
    if "dense_run" in result:
        notes.append(f"† on the first row: vs the dense run, Bonferroni x{result['n_comparisons']}")
    if "compare" in result:
        notes.append(f"† on a compared run: vs the first row, Bonferroni x{len(result['compare'])}")
    t = Table(caption=f"{result['queries']} queries, values x100"
              + (f"; paired two-tailed t-test, p < alpha; {'; '.join(notes)}" if notes else ""),
              caption_justify="left")
    t.add_column("run")
    for n in names:
        t.add_column(n, justify="right")
    for label, agg, sig in rows:
        t.add_row(label, *(f"{100 * agg[n]:.1f}" + ("†" if sig.get(n) else "") for n in names))
    console = Console()
    console.print(t)
    skip = {*names, "run", "qrels", "compare", "mmsparse_version", "command", "dense_run"}
    rest = Table(show_header=False, box=None)
    for k, v in result.items():
        if k not in skip and not isinstance(v, (list, dict)):
            rest.add_row(k, "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else
                         (f"{v:.4g}" if isinstance(v, float) else str(v)))
    console.print(rest)
