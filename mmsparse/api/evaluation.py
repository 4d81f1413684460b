"""Evaluate runs: `evaluate` (one run -> the flat figures `mmsparse eval` writes as JSON) and
`evaluate_table` (several of those -> one comparison table, `mmsparse eval --table`).

    import mmsparse
    scores = mmsparse.evaluate("runs/d2s.trec", "test.qrels", queries="sparse/test-captions.h5",
                               docs="sparse/test-images.h5", dense_run="runs/dense.trec",
                               deviation_k=20, out="eval/d2s.json")
    scores["R@10"], scores["FLOPs"], scores["doc_Exact@10"], scores["p_vs_dense_R@10"]
    table = mmsparse.evaluate_table(["eval/dense.json", "eval/d2s.json"], out="table.md")

Significance and Bonferroni. Every p-value is a paired two-tailed t-test over per-query values
(scipy.stats.ttest_rel). The raw p-value is always stored; the corrected one multiplies it by
the number of comparisons m (Bonferroni, capped at 1):
- `evaluate`: m = `n_comparisons` when given, else the runs RUN is actually tested against in
  this call: 1 for `dense_run` plus one per `compare` run. A single evaluation with only
  `dense_run` therefore uses m = 1, and says so (`n_comparisons`, `bonferroni`); pass the size
  of the wider family (e.g. the number of sparse runs you will compare with dense) as
  `n_comparisons`, or let `evaluate_table` correct over its rows.
- `evaluate_table`: m = `n_comparisons` when given, else the number of rows holding p-values vs
  the dense run (recomputed from the raw p-values; the rows' own corrected values are not used).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from .. import provenance
from ..errors import InputError
from ..progress import Reporter, reporter

DEFAULT_DOC_K = (10, 3)


@provenance.recorded("run", "qrels", "queries", "docs", "dense_run", "compare", "static_embeddings", "head",
                     "tokenizer", "plot_with")
def evaluate(run: str | Path, qrels: str | Path, *, out: str | Path | None = None,
             measure: Sequence[str] | None = None, strict: bool = False, force: bool = False,
             queries: str | Path | None = None, docs: str | Path | None = None,
             per_query: str | Path | None = None, deviation_k: int | None = None,
             doc_k: Sequence[int] = DEFAULT_DOC_K, static_embeddings: str | Path | None = None,
             head: str | Path | None = None, embedding_key: str | None = None,
             tokenizer: str | Path | None = None, dense_run: str | Path | None = None,
             compare: Sequence[str | Path] | None = None, n_comparisons: int | None = None,
             alpha: float = 0.05, plot: str | Path | None = None,
             plot_with: Sequence[str | Path] | None = None, progress: Reporter | None = None) -> dict:
    """Evaluate the TREC run `run` against the TREC qrels `qrels`; returns the flat dict that
    `out` (JSON, written atomically) holds, NaN written as None.

    Keys (values are fractions in [0, 1] unless said otherwise):
    - measures (ir-measures names, default R@1, R@5, R@10, RR@10: `measure`), `measures` (their
      list), `queries` (every qrels query; one the run lacks scores 0), `queries_not_in_run`,
      `queries_not_in_qrels` (skipped with a warning, or InputError with `strict`).
    - with `queries` and `docs` (sparse HDF5 of the captions and images, same vocab): `FLOPs`
      (D2S eq. 1: mean shared terms per query-document pair, a count), `query_terms` /
      `doc_terms` and the other sparsity figures (metrics.sparsity_stats, counts), `doc_max_df`
      (share of documents holding the most common term) and `doc_max_df_term`;
      when the captions file stores texts and `doc_k` is not empty, the image-side faithfulness
      `doc_Exact@k` for each k of `doc_k` (default 10 and 3; metrics.doc_exact_at_k: share of an
      image's top-k terms that occur in the captions the qrels call relevant to it, '##'
      continuation pieces never counting, mean over the `doc_faithfulness_docs` images that
      have one);
      with `deviation_k` = K: caption-side `Exact@K` and `Semantic@K` (D2S eq. 2-3; Semantic@K
      needs static embeddings: `static_embeddings`, else `head`'s W2 rows, else the head the
      captions file records). Captions are split with `tokenizer` (a directory with
      tokenizer.json; default: the captions file's model, else the shared dual encoder).
    - with `dense_run`: `dense_run` (absolute path), `dense_measures` ({measure: value} of the dense
      run), `pearson_<m>` (Pearson r of per-query values), `overlap@10` (mean share of the
      top-10 shared with the dense run) and `overlap@10_histogram` (queries with 0..10 shared),
      `p_vs_dense_<m>` (raw p) and `p_vs_dense_corrected_<m>` (x the Bonferroni factor).
    - with `compare` (other runs): `compare` = {run path: {<m>: value, p_<m>: corrected p,
      p_raw_<m>: raw p}}, RUN vs that run.
    - with `dense_run` or `compare`: `n_comparisons` (the Bonferroni factor used), `bonferroni`
      (why, in words) and `alpha` (the significance level of the † marks).
    - `run`, `qrels` and the provenance keys (`mmsparse_version`, `command`, `inputs`).

    Side outputs: `per_query` (TSV: qid, the measures, query_terms, Exact@K, Semantic@K,
    overlap@10), `plot` (directory: flops_vs_R@1.png with FLOPs, D2S Fig. 2a, plus the points of
    the eval JSONs `plot_with`; overlap_top10.png with `dense_run`, Fig. 2b).
    Raises InputError for missing or mismatched inputs (run/qrels of different splits unless
    `force`, vocabularies that differ, options that need another option).
    """
    from .. import metrics as M
    from ..checks import check_run_qrels, warn
    from ..formats import read_qrels, read_run

    reporter(progress)  # evaluation takes seconds: no progress to report
    ms = M.parse_measures(measure)
    compare = [str(c) for c in (compare or [])]
    doc_k = [int(k) for k in (doc_k or []) if int(k) > 0]
    if (queries is None) != (docs is None):
        raise InputError("--queries and --docs go together: FLOPs needs both sparse files")
    if deviation_k is not None and deviation_k < 1:
        raise InputError(f"--deviation-k {deviation_k}: must be >= 1")
    if deviation_k and queries is None:
        raise InputError("--deviation-k needs --queries (the sparse captions with their texts)")
    if n_comparisons is not None and n_comparisons < 1:
        raise InputError(f"--n-comparisons {n_comparisons}: must be >= 1")
    for p in plot_with or []:
        if not Path(p).is_file():
            raise InputError(f"{p}: eval JSON for --plot-with not found")
    warnings: list[str] = []
    extra_cols: dict[str, dict[str, float]] = {}
    qr = read_qrels(qrels)
    base_run = read_run(run)
    check_run_qrels(run, qrels, force)
    res = M.evaluate_run(base_run, qr, ms, strict, str(run), str(qrels))
    result: dict = {**res.aggregate, "measures": list(res.aggregate), "queries": res.queries,
                    "queries_not_in_run": len(res.not_in_run), "queries_not_in_qrels": len(res.not_in_qrels)}

    if queries is not None:
        extra_cols.update(_sparse_figures(queries, docs, qr, result, warnings, deviation_k, doc_k,
                                          static_embeddings, head, embedding_key, tokenizer))

    raw_dense: dict[str, float] | None = None  # measure -> raw p vs the dense run
    raw_cmp: dict[str, dict[str, float]] = {}  # compare path -> measure -> raw p
    if dense_run is not None:
        drun = read_run(dense_run)
        dres = M.evaluate_run(drun, qr, ms, False, str(dense_run), str(qrels))
        result["dense_run"] = str(Path(dense_run).resolve())  # absolute: `--table` matches it to a row's run
        result["dense_measures"] = dict(dres.aggregate)
        for n in res.per_query:
            result[f"pearson_{n}"] = M.pearson_per_query(res.per_query[n], dres.per_query[n])
        raw_dense = {n: M.paired_ttest(res.per_query[n], dres.per_query[n])[1] for n in res.per_query}
        ov = M.overlap_at_k(base_run, drun, 10, list(qr))
        result["overlap@10"] = sum(ov.values()) / len(ov)
        result["overlap@10_histogram"] = M.overlap_histogram(ov, 10)
        extra_cols["overlap@10"] = ov

    cres = {}
    for c in compare:
        cres[c] = M.evaluate_run(read_run(c), qr, ms, False, c, str(qrels))
        raw_cmp[c] = {n: M.paired_ttest(res.per_query[n], cres[c].per_query[n])[1] for n in res.per_query}

    if raw_dense is not None or raw_cmp:
        m = n_comparisons or (raw_dense is not None) + len(raw_cmp)
        result["n_comparisons"] = m
        result["bonferroni"] = _bonferroni_basis(n_comparisons, dense_run is not None, len(compare))
        result["alpha"] = alpha
        if raw_dense is not None:
            for n, p in raw_dense.items():
                result[f"p_vs_dense_{n}"] = p
                result[f"p_vs_dense_corrected_{n}"] = M.bonferroni(p, m)
        if compare:
            result["compare"] = {}
            for c in compare:
                block = dict(cres[c].aggregate)
                for n, p in raw_cmp[c].items():
                    block[f"p_{n}"] = M.bonferroni(p, m)
                    block[f"p_raw_{n}"] = p
                result["compare"][c] = block

    result.update({"run": str(run), "qrels": str(qrels), **provenance.record()})
    result = _clean(result)
    if plot is not None:
        _plots(Path(plot), result, list(plot_with or []), Path(run).name)
    if per_query is not None:
        _write_per_query(Path(per_query), res.per_query, extra_cols)
    if out is not None:
        from ..atomic import write_text_atomic

        write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    # warnings only once every input has been read, so a bad input stays one line on stderr
    if res.not_in_qrels:
        warnings.insert(0, f"{len(res.not_in_qrels)} run queries are not in the qrels and were skipped "
                           f"(e.g. {res.not_in_qrels[:3]}); use --strict to fail instead")
    if res.not_in_run:
        warnings.insert(0, f"{len(res.not_in_run)} qrels queries are missing from the run and count as 0")
    for w in warnings:
        warn(w)
    return result


def _bonferroni_basis(n_comparisons: int | None, dense: bool, n_compare: int) -> str:
    """Why the Bonferroni factor is what it is, in words (stored in the eval JSON)."""
    if n_comparisons:
        return f"x{n_comparisons}, set by --n-comparisons"
    parts = (["the dense run"] if dense else []) + ([f"{n_compare} --compare run(s)"] if n_compare else [])
    return (f"x{int(dense) + n_compare}, the runs RUN is tested against in this call ({' + '.join(parts)}); "
            "--n-comparisons sets a wider family" + ("; eval --table corrects over its rows" if dense else ""))


def _sparse_figures(queries, docs, qrels, result: dict, warnings: list, deviation_k, doc_k, static_embeddings,
                    head, embedding_key, tokenizer) -> dict:
    """FLOPs, sparsity, doc_max_df, doc_Exact@k and Exact@K / Semantic@K into `result`;
    returns per-query columns for the TSV."""
    from .. import metrics as M

    qs, ds = _read_pair(queries, docs)
    result["FLOPs"] = M.flops(qs.matrix, ds.matrix)
    result.update(M.sparsity_stats(qs.matrix, "query"))
    result.update(M.sparsity_stats(ds.matrix, "doc"))
    share, term, _ = M.max_df(ds.matrix, ds.vocab)
    result.update({"doc_max_df": share, "doc_max_df_term": term})
    cols = {"query_terms": {q: float(n) for q, n in zip(qs.ids, M.row_nnz(qs.matrix))}}
    if not (deviation_k or doc_k):
        return cols
    if qs.texts is None:
        if deviation_k:
            raise InputError(f"{queries}: texts: the --queries file stores no caption texts; "
                             "Exact@k needs them (sparsify a text dense file)")
        warnings.append(f"{queries} stores no caption texts: doc_Exact@k skipped")
        return cols
    tok = M.resolve_tokenizer(tokenizer, qs.attrs)
    if tokenizer is None and not deviation_k and not (tok / "tokenizer.json" if tok.is_dir() else tok).is_file():
        # doc_Exact@k is on by default: without a tokenizer it is skipped, not an error (Exact@K asked for is)
        warnings.append(f"no tokenizer.json at {tok} (the captions' model or the shared dual encoder): "
                        "doc_Exact@k skipped; pass --tokenizer MODEL_DIR")
        return cols
    cap = M.caption_term_ids(M.tokenize_captions(qs.texts, tok), qs.vocab)
    if doc_k:
        summary, _ = M.doc_faithfulness(ds.matrix, ds.ids, ds.vocab, qrels, dict(zip(qs.ids, cap)), doc_k)
        result.update({k: v for k, v in summary.items() if k.startswith("doc_Exact@") or k == "doc_faithfulness_docs"})
        if not summary["doc_faithfulness_docs"]:
            warnings.append("no document of --docs has a relevant caption (qrels) in --queries: doc_Exact@k is 0")
    if deviation_k:
        src = M.embeddings_source(static_embeddings, head, qs.attrs)
        emb = M.load_static_embeddings(src, len(qs.vocab), embedding_key) if src is not None else None
        if emb is None:
            warnings.append("no --static-embeddings/--head: Semantic@k skipped")
        exact, sem = M.exact_semantic_at_k(qs.matrix, cap, deviation_k, emb)
        k = deviation_k
        result[f"Exact@{k}"] = float(exact.mean()) if len(exact) else 0.0
        cols[f"Exact@{k}"] = dict(zip(qs.ids, map(float, exact)))
        if sem is not None:
            result[f"Semantic@{k}"] = float(sem.mean()) if len(sem) else 0.0
            cols[f"Semantic@{k}"] = dict(zip(qs.ids, map(float, sem)))
    return cols


def _read_pair(queries, docs):
    from ..formats import read_sparse

    qs, ds = read_sparse(queries), read_sparse(docs)
    if qs.vocab != ds.vocab:
        i = next((i for i, (a, b) in enumerate(zip(qs.vocab, ds.vocab)) if a != b), min(len(qs.vocab), len(ds.vocab)))
        raise InputError(f"{docs}: vocab differs from {queries} ({len(ds.vocab)} vs {len(qs.vocab)} terms, first "
                         f"difference at term {i}); sparsify queries and docs with the same head")
    return qs, ds


def load_eval_json(path: str | Path) -> dict:
    """An eval JSON (as `evaluate` writes it) as a dict; InputError when missing or not one."""
    from ..errors import require_file

    require_file(path, "eval JSON")
    try:
        o = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not an eval JSON ({e})") from None
    if not isinstance(o, dict) or not any(isinstance(o.get(k), (int, float)) for k in ("queries", "R@1", "FLOPs")):
        raise InputError(f"{path}: not an eval JSON (no queries/measures); write one with `mmsparse eval RUN QRELS -o`")
    return o


def _plots(d: Path, result: dict, others: list, label: str) -> None:
    from ..metrics.plots import plot_flops_vs_effectiveness, plot_overlap_histogram

    pts = []
    for p in others:
        o = load_eval_json(p)
        if o.get("FLOPs") is None or o.get("R@1") is None:
            raise InputError(f"{p}: FLOPs/R@1: missing; rerun eval with --queries/--docs and the default measures")
        pts.append((Path(o.get("run", p)).name, float(o["FLOPs"]), float(o["R@1"])))
    if _finite(result.get("FLOPs")) and _finite(result.get("R@1")):
        pts.append((label, result["FLOPs"], result["R@1"]))
    refs = []
    if isinstance(result.get("dense_measures"), dict) and _finite(result["dense_measures"].get("R@1")):
        refs.append((f"dense ({Path(result['dense_run']).name})", float(result["dense_measures"]["R@1"])))
    if pts:
        plot_flops_vs_effectiveness(pts, d / "flops_vs_R@1.png", references=refs)
    if "overlap@10_histogram" in result:
        plot_overlap_histogram([(label, result["overlap@10_histogram"])], d / "overlap_top10.png")


@provenance.recorded("eval_jsons")
def evaluate_table(eval_jsons: Sequence[str | Path], *, out: str | Path | None = None,
                   label: Sequence[str] | None = None, column: Sequence[str] | None = None,
                   n_comparisons: int | None = None, alpha: float = 0.05, plot: str | Path | None = None,
                   progress: Reporter | None = None) -> dict:
    """Several eval JSONs as one table (D2S Tables 1, 3 and 5 combined): one row per file.

    label: row labels, one per file (default: the file name without .json); column: the JSON
    keys to show, in order (default metrics.table.default_columns). Returns (and writes to
    `out`: markdown when it ends in .md, else JSON) {columns, rows: [{label, values: {column:
    value|None}, significant: [columns marked †]}], alpha, bonferroni_n, bonferroni_basis,
    reference, warnings, queries, files}. A measure is marked † when its raw p-value vs the dense
    run (stored by `evaluate(..., dense_run=...)`), x bonferroni_n, is below `alpha`;
    bonferroni_n = `n_comparisons` or the number of rows tested against dense. `plot`: a
    directory for flops_vs_R@1.png (rows with FLOPs as points, rows without as dashed lines) and
    overlap_top10.png (one bar series per row with an overlap histogram).
    Warnings (different qrels, query counts or dense runs across rows) go to checks.warn too.
    Raises InputError for no files, a file that is not an eval JSON, a label count that does not
    match, or a column no file has.
    """
    from ..checks import warn
    from ..metrics import table as T

    files = [Path(p) for p in eval_jsons]
    if not files:
        raise InputError("--table needs eval JSON files, e.g. `mmsparse eval --table dense.json sparse.json`")
    labels = list(label or [])
    if labels and len(labels) != len(files):
        raise InputError(f"--label given {len(labels)} time(s) for {len(files)} eval JSONs; give one per file")
    if n_comparisons is not None and n_comparisons < 1:
        raise InputError(f"--n-comparisons {n_comparisons}: must be >= 1")
    results = [load_eval_json(p) for p in files]
    labels = labels or [p.name.removesuffix(".json") for p in files]
    for c in column or []:
        if not any(c in r for r in results):
            raise InputError(f"--column {c!r}: no eval JSON has this key (e.g. {sorted(results[0])[:8]})")
    tab = T.build_table(results, labels, list(column) if column else None, alpha, n_comparisons)
    nq = next((r.get("queries") for r in results if r.get("queries")), None)
    tab = _clean({**tab, "queries": nq, "files": [str(p) for p in files]})
    if plot is not None:
        _table_plots(Path(plot), results, labels)
    if out is not None:
        from ..atomic import write_text_atomic

        write_text_atomic(out, T.to_markdown(tab, nq) if Path(out).suffix == ".md" else json.dumps(tab, indent=2) + "\n")
    for w in tab["warnings"]:
        warn(w)
    return tab


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
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _write_per_query(path: Path, per: dict, extra: dict) -> None:
    from ..atomic import write_text_atomic

    cols = [*per, *extra]
    qids = list(next(iter(per.values())))
    lines = ["\t".join(["qid", *cols])]
    for q in qids:
        vals = [per[c][q] if c in per else extra[c].get(q) for c in cols]
        lines.append("\t".join([q, *("" if v is None else f"{v:.6g}" for v in vals)]))
    write_text_atomic(path, "\n".join(lines) + "\n")


def _clean(x):
    """JSON-safe: NaN/Inf -> None, recursively."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
