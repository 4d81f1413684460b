"""One comparison table from several eval results (`mmsparse eval --table`): the dense run and the
sparse runs side by side, as D2S Tables 1 (effectiveness, FLOPs, † vs dense), 3 (Exact@k,
Semantic@k) and 5 (Pearson r of per-query values with the dense run) combined.

Significance: an eval run with --dense-run stores the raw two-tailed p-value of a paired t-test
vs the dense run per measure (`p_vs_dense_<measure>`). The table applies Bonferroni over the
runs it compares with dense (the rows carrying such p-values), or over `n_comparisons` when given,
and marks a measure † when the corrected p < alpha.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

from .compare import bonferroni
from .effectiveness import DEFAULT_MEASURES

def measures_of(result: dict) -> list[str]:
    """The ir-measures names an eval result holds: its `measures` list, else the default measures present."""
    ms = result.get("measures")
    if isinstance(ms, list):
        return [str(m) for m in ms]
    return [m for m in DEFAULT_MEASURES if m in result]


def default_columns(results: Sequence[dict]) -> list[str]:
    """Measures, FLOPs, query_terms, doc_terms, pearson_<measure>, overlap@10, Exact@k, Semantic@k,
    doc_Exact@k (larger k first), doc_max_df (in that order), keeping only the columns at least
    one result has a value for."""
    ms: list[str] = []
    for r in results:
        ms += [m for m in measures_of(r) if m not in ms]
    dev, doc = [], []
    for r in results:
        dev += [k for k in r if re.match(r"^(Exact|Semantic)@\d+$", k) and k not in dev]
        doc += [k for k in r if re.match(r"^doc_Exact@\d+$", k) and k not in doc]
    dev.sort(key=lambda k: (int(k.split("@")[1]), not k.startswith("Exact")))
    doc.sort(key=lambda k: -int(k.split("@")[1]))
    cols = [*ms, "FLOPs", "query_terms", "doc_terms", *(f"pearson_{m}" for m in ms), "overlap@10", *dev,
            *doc, "doc_max_df"]
    return [c for c in cols if any(_num(r.get(c)) is not None for r in results)]


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def format_cell(column: str, value) -> str:
    """Display text of one value: FLOPs with two decimals, the sparsity figures (query_* / doc_*)
    as they are, every other column (measures, pearson_*, overlap@k, Exact@k, Semantic@k,
    doc_Exact@k, doc_max_df: fractions in [0, 1] or r in [-1, 1]) x100 with one decimal; '–' when
    missing."""
    v = _num(value)
    if v is None:
        return "–"
    if column == "FLOPs":
        return f"{v:.2f}"
    if column in ("query_terms", "doc_terms"):
        return f"{v:.1f}"
    if column.startswith(("query_", "doc_", "queries")) and not column.startswith(("doc_Exact@", "doc_max_df")):
        return f"{v:.4g}"
    return f"{100 * v:.1f}"


def build_table(results: Sequence[dict], labels: Sequence[str], columns: Sequence[str] | None = None,
                alpha: float = 0.05, n_comparisons: int | None = None) -> dict:
    """The table as data.

    results: eval JSON dicts, one row each; labels: their row labels. Returns {columns, rows:
    [{label, values: {column: value|None}, significant: [measure columns marked †]}], alpha,
    bonferroni_n, bonferroni_basis (why that factor, in words), reference (label of the row whose
    `run` is the rows' dense_run, or None), warnings: [text]}. bonferroni_n = n_comparisons when
    given, else the number of rows holding raw p-values vs dense (`p_vs_dense_<measure>`): the
    runs this table actually tests against the dense run. The rows' own `p_vs_dense_corrected_*`
    (corrected when each was evaluated) are not used.
    """
    cols = list(columns) if columns else default_columns(results)
    tested = [r for r in results if any(k.startswith("p_vs_dense_") and not k.startswith("p_vs_dense_corrected_")
                                        for k in r)]
    n = n_comparisons or max(1, len(tested))
    basis = ("set by --n-comparisons" if n_comparisons else
             f"over the {len(tested)} row{'s' if len(tested) != 1 else ''} tested against the dense run")
    warnings = []
    qrels = {str(r.get("qrels")) for r in results if r.get("qrels")}
    if len(qrels) > 1:
        warnings.append(f"the results were evaluated against different qrels: {sorted(qrels)}")
    nq = {r.get("queries") for r in results if r.get("queries") is not None}
    if len(nq) > 1:
        warnings.append(f"the results cover different numbers of queries: {sorted(nq)}")
    runs = {_resolved(r.get("run")): lab for r, lab in zip(results, labels) if r.get("run")}
    names = {Path(str(r.get("run"))).name: lab for r, lab in zip(results, labels) if r.get("run")}
    dense_runs = {_resolved(r["dense_run"]) for r in tested if r.get("dense_run")}
    reference = None
    if len(dense_runs) == 1:  # the same path, else (evaluated from another directory) the same file name
        d = next(iter(dense_runs))
        reference = runs.get(d) or names.get(Path(d).name)
    if len(dense_runs) > 1:
        warnings.append(f"the sparse rows were tested against different dense runs: {sorted(dense_runs)}")
    elif dense_runs and reference is None:
        warnings.append(f"the dense run the † marks refer to ({next(iter(dense_runs))}) is not a row of the table")
    rows = []
    for r, lab in zip(results, labels):
        sig = []
        for c in cols:
            p = _num(r.get(f"p_vs_dense_{c}"))
            if p is not None and bonferroni(p, n) < alpha:
                sig.append(c)
        rows.append({"label": lab, "values": {c: _num(r.get(c)) for c in cols}, "significant": sig})
    return {"columns": cols, "rows": rows, "alpha": alpha, "bonferroni_n": n, "bonferroni_basis": basis,
            "reference": reference, "warnings": warnings}


def _resolved(p) -> str:
    return str(Path(str(p)).resolve())


def caption(table: dict, queries: int | None = None) -> str:
    """One-line legend of the table: units, and what † means."""
    ref = table["reference"] or "the dense run"
    q = f"{queries} queries; " if queries else ""
    return (f"{q}values x100 except FLOPs (mean shared terms per query-image pair) and *_terms (non-zeros "
            f"per vector); † p < {table['alpha']:g} vs {ref} (paired two-tailed t-test, Bonferroni "
            f"x{table['bonferroni_n']}" + (f", {table['bonferroni_basis']}" if table.get("bonferroni_basis") else "")
            + ")")


def cells(table: dict, row: dict) -> list[str]:
    """Display texts of one row, † appended to significant measures."""
    return [format_cell(c, row["values"][c]) + ("†" if c in row["significant"] else "") for c in table["columns"]]


def to_markdown(table: dict, queries: int | None = None) -> str:
    """The table as GitHub markdown, legend below."""
    lines = ["| run | " + " | ".join(table["columns"]) + " |",
             "|---|" + "---:|" * len(table["columns"])]
    for row in table["rows"]:
        lines.append(f"| {row['label']} | " + " | ".join(cells(table, row)) + " |")
    return "\n".join(lines) + f"\n\n{caption(table, queries)}\n"
