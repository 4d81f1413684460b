"""`make vdr`'s table over seeds (docs/vdr.md): each row the mean ± standard deviation over its seeds
of the `mmsparse eval` figures, the share of a reference row's R@10, and two tests against rows
named by --versus:

    python -m mmsparse.methods.vdr seeds "LABEL=EVAL_S1,EVAL_S2,EVAL_S3" ... \
        --versus "VDR=dense trained alike" -o vdr-table.md

- over seeds: Welch's two-sided t-test of the rows' per-seed R@1 and R@10 (scipy.stats.ttest_ind,
  unequal variances): each seed is one head, so it compares methods, not two heads;
- per query, per seed: the paired two-sided t-test each seed's evaluation recorded against a run
  of the other row (`eval --dense-run` or `--compare` of the same seed's run, Bonferroni as that
  evaluation recorded), all seeds' p listed.

A row of one evaluation (the shipped dense model) has standard deviation 0 and no Welch test.
"""

from __future__ import annotations

import json
from pathlib import Path


from ...errors import InputError
from ...metrics.compare import mean_sd, welch

FIGS = ("R@1", "R@5", "R@10", "FLOPs", "query_terms", "doc_terms")


def read_row(item: str) -> dict:
    """"LABEL=A.json,B.json" -> {label, evals: [the eval dicts], paths}. InputError on a missing file."""
    label, sep, files = item.rpartition("=")
    if not sep or not label:
        raise InputError(f"{item!r}: expected LABEL=EVAL_JSON[,EVAL_JSON...]")
    paths = [Path(p) for p in files.split(",") if p]
    evals = []
    for p in paths:
        try:
            evals.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            raise InputError(f"{p}: cannot read the evaluation ({e}); run its make target first") from None
    return {"label": label, "evals": evals, "paths": [str(p.resolve()) for p in paths]}


def _stats(row: dict, key: str) -> tuple[float | None, float | None, list[float]]:
    vals = [float(e[key]) for e in row["evals"] if e.get(key) is not None]
    if not vals:
        return None, None, []
    return (*mean_sd(vals), vals)


def paired(row: dict, other: dict, key: str) -> list[float]:
    """The per-query paired p (corrected) each of `row`'s evaluations recorded against one of `other`'s
    runs (as --dense-run or --compare); [] when none did."""
    runs = {str(Path(e.get("run", "")).resolve()) for e in other["evals"]}
    out = []
    for e in row["evals"]:
        if e.get("dense_run") in runs and f"p_vs_dense_corrected_{key}" in e:
            out.append(float(e[f"p_vs_dense_corrected_{key}"]))
        for run, blk in (e.get("compare") or {}).items():
            if str(Path(run).resolve()) in runs and f"p_{key}" in blk:
                out.append(float(blk[f"p_{key}"]))
    return out


def split_pair(item: str, rows: dict) -> tuple[dict, dict]:
    """"A=B" -> (row A, row B), at the "=" where both sides name rows (labels may hold "=").
    InputError when none does."""
    for i, ch in enumerate(item):
        if ch == "=" and item[:i] in rows and item[i + 1:] in rows:
            return rows[item[:i]], rows[item[i + 1:]]
    raise InputError(f"--versus {item!r}: no such pair of rows A=B; rows: {', '.join(rows)}")


def seeds_table(items: list[str], versus: list[str] = (), reference: str | None = None) -> tuple[str, dict]:
    """(markdown, json) of the rows `items` ("LABEL=EVAL,..."), R@k ×100 mean ± sd over seeds, the
    share of `reference`'s mean R@10 (default: the first row), and the tests of each "A=B" of `versus`.
    InputError when a label of `versus` or `reference` names no row."""
    rows = [read_row(i) for i in items]
    by = {r["label"]: r for r in rows}
    if reference is not None and reference not in by:
        raise InputError(f"{reference!r}: no such row; rows: {', '.join(by)}")
    pairs = [split_pair(v, by) for v in versus]
    ref = by[reference] if reference else rows[0]
    ref10 = _stats(ref, "R@10")[0]
    out = {"rows": [], "versus": []}
    lines = [f"| run | seeds | R@1 | R@5 | R@10 | R@10 ÷ {ref['label']} | FLOPs | terms / query | terms / image |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        st = {k: _stats(r, k) for k in FIGS}
        out["rows"].append({"label": r["label"], "evals": r["paths"],
                            **{k: {"mean": m, "sd": s, "seeds": v} for k, (m, s, v) in st.items()}})

        def cell(k, scale=1.0, fmt=".1f"):
            m, s, v = st[k]
            if m is None:
                return "–"
            return f"{scale * m:{fmt}}" + (f" ± {scale * s:{fmt}}" if len(v) > 1 else "")
        share = f"{st['R@10'][0] / ref10:.3f}" if ref10 and st["R@10"][0] is not None else "–"
        lines.append(f"| {r['label']} | {len(r['evals'])} | {cell('R@1', 100)} | {cell('R@5', 100)} | "
                     f"{cell('R@10', 100)} | {share} | {cell('FLOPs', 1, '.2f')} | {cell('query_terms')} | "
                     f"{cell('doc_terms')} |")
    md = "\n".join(lines) + ("\n\nR@k ×100 and FLOPs (eq. 1): mean ± standard deviation over the seeds (ddof 1), "
                             "test split\n")
    if versus:
        md += ("\n| A vs B | R@1 A − B | p over seeds | p per query, per seed | R@10 A − B | p over seeds "
               "| p per query, per seed |\n|---|---:|---:|---|---:|---:|---|\n")
    for a, b in pairs:
        rec = {"a": a["label"], "b": b["label"]}
        cells = []
        for k in ("R@1", "R@10"):
            (ma, _, va), (mb, _, vb) = _stats(a, k), _stats(b, k)
            p, pq = welch(va, vb), paired(a, b, k)
            rec[k] = {"diff": ma - mb, "p_seeds": p, "p_per_query": pq}
            cells += [f"{100 * (ma - mb):+.1f}", "–" if p is None else f"{p:.2g}",
                      ", ".join(f"{x:.2g}" for x in pq) or "–"]
        out["versus"].append(rec)
        md += f"| {a['label']} vs {b['label']} | " + " | ".join(cells) + " |\n"
    if versus:
        md += ("\np over seeds: Welch's two-sided t-test of the per-seed figures (each seed one head); p per query: "
               "each seed's paired two-sided t-test against the other row's run of its seed, as its evaluation "
               "recorded it (Bonferroni)\n")
    return md, out
