"""The efficiency frontier: R@k against FLOPs of heads trained at FLOPs budgets (`--target-flops`).

    python -m mmsparse.metrics.frontier --dense eval/dense.json \
        --row d2s=heads/front-d2s-6=eval/front-d2s-6.expand.json ... \
        --point VDR=eval/vdr.json -o frontier/table.md --plot frontier/frontier.png

A row is METHOD=HEAD_DIR=EVAL_JSON: a head (its config.json gives the budget F of --target-flops,
the saved epoch's validation FLOPs and the precision it trained in) and the `mmsparse eval` JSON of
its test run (R@1, R@10, FLOPs, doc_Exact@10, the number of queries). A point is LABEL=EVAL_JSON:
another run shown as one marker (e.g. VDR). A paired comparison is LABEL=EVAL_JSON of an
`mmsparse eval RUN_A QRELS --compare RUN_B` on the same queries: its paired two-tailed t-tests of
R@1 and R@10 per query (Bonferroni-corrected as that eval recorded) are tabled. The table gives each row's R@1 and R@10 ± their
standard error sqrt(p(1-p)/n) over the n queries (binomial; the five captions of an image are
counted as independent, so a lower bound), as a share of dense too, and where validation FLOPs
landed against the budget. The picture: R@1 against test FLOPs (log x), a line per method through
its budgets with ± one standard error, dense as a horizontal line, the points as markers.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..atomic import atomic_path
from ..errors import InputError


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the {what} ({e}); run its make target first") from None


def se(p: float, n: int) -> float:
    """Standard error sqrt(p(1 - p)/n) of a share p over n queries (0 when n is 0)."""
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def load_row(method: str, head_dir: Path, eval_json: Path) -> dict:
    """One frontier row: method, budget (training.flops_budget.target, None without), val_FLOPs of the
    saved epoch, precision, best_epoch, and the eval JSON's R@1, R@10, FLOPs, doc_Exact@10, queries."""
    cfg = _read_json(Path(head_dir) / "config.json", "head config")
    tr = cfg.get("training", {})
    r = _read_json(eval_json, "evaluation")
    return {"method": method, "head": Path(head_dir).name, "budget": (tr.get("flops_budget") or {}).get("target"),
            "val_FLOPs": (tr.get("val") or {}).get("FLOPs"), "precision": tr.get("precision"),
            "best_epoch": tr.get("best_epoch"), "eta": tr.get("config", {}).get("eta"),
            **{k: r.get(k) for k in ("R@1", "R@10", "FLOPs", "doc_Exact@10", "queries")}}


def load_point(label: str, eval_json: Path) -> dict:
    r = _read_json(eval_json, "evaluation")
    return {"label": label, **{k: r.get(k) for k in ("R@1", "R@10", "FLOPs", "queries")}}


def load_paired(label: str, eval_json: Path) -> dict:
    """A paired comparison: label, A's and B's R@1 / R@10 and the corrected p-values of B vs A per query.
    InputError when the JSON holds no --compare run, or several."""
    r = _read_json(eval_json, "evaluation")
    cmp = r.get("compare") or {}
    if len(cmp) != 1:
        raise InputError(f"{eval_json}: expected an evaluation with exactly one --compare run, found {len(cmp)}")
    blk = next(iter(cmp.values()))
    return {"label": label, "a": {k: r[k] for k in ("R@1", "R@10")}, "b": {k: blk[k] for k in ("R@1", "R@10")},
            "p": {k: blk[f"p_{k}"] for k in ("R@1", "R@10")}, "n_comparisons": r.get("n_comparisons"),
            "queries": r.get("queries")}


def paired_markdown(pairs: list[dict]) -> str:
    """The paired comparisons: A and B's R@1 and R@10 ×100, A − B, and p (paired t-test, corrected)."""
    lines = ["| comparison (A vs B) | R@1 A | R@1 B | A − B | p | R@10 A | R@10 B | A − B | p |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in pairs:
        cells = []
        for k in ("R@1", "R@10"):
            a, b = 100 * c["a"][k], 100 * c["b"][k]
            cells += [f"{a:.1f}", f"{b:.1f}", f"{a - b:+.1f}", f"{c['p'][k]:.2g}"]
        lines.append(f"| {c['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\np: paired two-tailed t-test over the same queries, Bonferroni-corrected over the " \
        "comparisons of its evaluation\n"


def markdown(rows: list[dict], dense: dict, points: list[dict] = ()) -> str:
    """The table: a line per row (method, budget order), then the points and dense."""
    n = int(dense.get("queries") or 0)

    def pm(r, k):
        q = int(r.get("queries") or n)
        return f"{100 * r[k]:.1f} ± {100 * se(r[k], q):.1f}"

    def opt(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| method | budget F | val FLOPs (÷ F) | test FLOPs | R@1 | R@10 | R@1 ÷ dense | R@10 ÷ dense "
             "| doc_Exact@10 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        landed = f"{r['val_FLOPs']:.2f} ({r['val_FLOPs'] / r['budget']:.2f})" if r["budget"] and r["val_FLOPs"] else \
            opt(r["val_FLOPs"], ".2f")
        lines.append(f"| {r['method']} | {opt(r['budget'], 'g')} | {landed} | {r['FLOPs']:.2f} | {pm(r, 'R@1')} "
                     f"| {pm(r, 'R@10')} | {r['R@1'] / dense['R@1']:.3f} | {r['R@10'] / dense['R@10']:.3f} "
                     f"| {opt(r.get('doc_Exact@10') and 100 * r['doc_Exact@10'], '.1f')} |")
    for p in points:
        lines.append(f"| {p['label']} | – | – | {opt(p['FLOPs'], '.2f')} | {pm(p, 'R@1')} | {pm(p, 'R@10')} "
                     f"| {p['R@1'] / dense['R@1']:.3f} | {p['R@10'] / dense['R@10']:.3f} | – |")
    lines.append(f"| dense | – | – | – | {pm(dense, 'R@1')} | {pm(dense, 'R@10')} | 1 | 1 | – |")
    return "\n".join(lines) + f"\n\nR@k ×100 ± standard error over {n:,} queries; FLOPs: eq. 1 on the test vectors\n"


def plot(rows: list[dict], dense: dict, points: list[dict], path: Path, measure: str = "R@1") -> None:
    """R@1 (%) against test FLOPs (log x): a line per method through its rows with ± one standard
    error, each row's point labelled with its budget, dense as a dashed horizontal line, each point
    a marker in the legend."""
    from .plots import _figure, format_log_axis, save_png

    n = int(dense.get("queries") or 0)
    fig, ax = _figure()
    methods = list(dict.fromkeys(r["method"] for r in rows))
    xs = [r["FLOPs"] for r in rows if r["FLOPs"]] + [p["FLOPs"] for p in points if p.get("FLOPs")]
    for i, m in enumerate(methods):
        pts = sorted((r["FLOPs"], r[measure], int(r.get("queries") or n), r["budget"]) for r in rows
                     if r["method"] == m)
        ax.errorbar([p[0] for p in pts], [100 * p[1] for p in pts], yerr=[100 * se(p[1], p[2]) for p in pts],
                    marker="o", ms=4, capsize=2, lw=1.2, color=f"C{i}", label=m)
        for x, y, _, budget in pts:   # the budget each point was trained at
            if budget:
                # below right for the first method, above left for the next: labels of equal budgets do not collide
                ax.annotate(f"F={budget:g}", (x, 100 * y), textcoords="offset points", fontsize=6, color=f"C{i}",
                            xytext=(4, -9) if i % 2 == 0 else (-4, 5), ha="left" if i % 2 == 0 else "right")
    for j, p in enumerate(points):
        if p.get("FLOPs"):
            ax.errorbar([p["FLOPs"]], [100 * p[measure]], yerr=[100 * se(p[measure], int(p.get("queries") or n))],
                        marker="sDP^v"[j % 5], ms=6, capsize=2, ls="none", color=f"C{len(methods) + j}",
                        label=p["label"])
    ax.axhline(100 * dense[measure], color="0.4", ls="--", lw=1, label=f"dense ({100 * dense[measure]:.1f})")
    ax.set_xscale("log")
    if xs:
        lo, hi = min(xs) / 1.3, max(xs) * 1.3
        ax.set_xlim(lo, hi)
        format_log_axis(ax.xaxis, lo, hi)
    ax.set_xlabel("FLOPs: mean shared terms per query-image pair (log scale)")
    ax.set_ylabel(f"{measure} (%), ± one standard error")
    ax.set_title(f"Efficiency frontier on Flickr8k test ({measure} vs FLOPs)", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=7, loc="lower right")
    save_png(fig, Path(path))


def _split(item: str, names: tuple[str, ...], flag: str) -> list[str]:
    out = item.rsplit("=", len(names) - 1)    # from the right: a label may hold "=" ("VDR (k=48)"), paths do not
    if len(out) != len(names) or not all(out):
        raise InputError(f"{flag} {item!r}: expected {'='.join(names)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense", type=Path, required=True, help="eval JSON of the dense run (the horizontal line)")
    ap.add_argument("--row", action="append", default=[], help="METHOD=HEAD_DIR=EVAL_JSON, repeatable")
    ap.add_argument("--point", action="append", default=[], help="LABEL=EVAL_JSON, repeatable (e.g. VDR)")
    ap.add_argument("--paired", action="append", default=[],
                    help="LABEL=EVAL_JSON of `mmsparse eval RUN_A QRELS --compare RUN_B`, repeatable")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the table (.md); its rows go beside it as .json")
    ap.add_argument("--plot", type=Path, help="the picture (PNG)")
    a = ap.parse_args(argv)
    dense = _read_json(a.dense, "dense evaluation")
    rows = [load_row(*_split(x, ("METHOD", "HEAD_DIR", "EVAL_JSON"), "--row")) for x in a.row]
    points = [load_point(*_split(x, ("LABEL", "EVAL_JSON"), "--point")) for x in a.point]
    order = list(dict.fromkeys(r["method"] for r in rows))
    rows.sort(key=lambda r: (order.index(r["method"]), r["budget"] or 0))
    pairs = [load_paired(*_split(x, ("LABEL", "EVAL_JSON"), "--paired")) for x in a.paired]
    md = markdown(rows, dense, points) + ("\n" + paired_markdown(pairs) if pairs else "")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(a.out) as tmp:
        Path(tmp).write_text(md, encoding="utf-8")
    with atomic_path(a.out.with_suffix(".json")) as tmp:
        Path(tmp).write_text(json.dumps({"rows": rows, "points": points, "paired": pairs, "dense": {k: dense.get(k) for k in
                                         ("R@1", "R@10", "queries")}}, indent=1), encoding="utf-8")
    if a.plot:
        plot(rows, dense, points, a.plot)
    print(md)
    return 0


if __name__ == "__main__":
    import sys

    try:
        raise SystemExit(main())
    except InputError as e:   # one line, exit 2, as the commands
        print(f"mmsparse: error: {e}", file=sys.stderr)
        raise SystemExit(2)
