"""The efficiency frontier: R@k against FLOPs of heads trained at FLOPs budgets (`--target-flops`),
over seeds, decided on validation.

    python -m mmsparse.metrics.frontier --dense eval/dense.json \
        --val-images dense/val-images.h5 --val-captions dense/val-captions.h5 \
        --row D2S=heads/front-d2s-6-s1=eval/front-d2s-6-s1.expand.json ... \
        --versus joint=D2S --point VDR=eval/vdr.json -o frontier/table.md --plot frontier/frontier.png

A row is METHOD=HEAD_DIR=EVAL_JSON: a head (its config.json gives the budget F of --target-flops,
the seed, and the saved epoch's validation figures: R@1, R@10 and FLOPs of the validation split,
scored exhaustively as an index would) and the `mmsparse eval` JSON of its test run (R@1, R@10,
FLOPs, doc_Exact@10, the number of queries). Rows of one method and budget are the seeds of one
point: the table gives the mean ± the standard deviation over seeds of every figure, and beside
R@k the binomial standard error sqrt(p(1-p)/n) over the n test queries (a lower bound: an image's
five captions are not independent). Dense's validation R@k come from the validation dense files
(exhaustive inner products), its test R@k from --dense.

**Validation decides**: `choose` names, per method, the smallest budget whose validation R@1 and
R@10 (means over seeds) keep KEEP_R1 and KEEP_R10 of dense's validation R@1 and R@10; test
figures are reported, never read by the rule. **Methods are compared over seeds**: --versus A=B
tests, at every budget both trained, A's per-seed test R@1 and R@10 against B's (Welch's two-sample
t-test over seeds, scipy.stats.ttest_ind): heads, not one head each. A point is LABEL=EVAL_JSON:
another run shown as one marker (e.g. VDR). The picture: R@1 against test FLOPs (log x), a line
per method through its budgets' means with ± one standard deviation over seeds, dense as a
horizontal line, the points as markers.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import InputError
from .compare import mean_sd, welch

KEEP_R1, KEEP_R10 = 0.95, 0.97   # the rule: the smallest budget keeping these shares of dense's validation R@1, R@10


def _read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the {what} ({e}); run its make target first") from None


def se(p: float, n: int) -> float:
    """Standard error sqrt(p(1 - p)/n) of a share p over n queries (0 when n is 0)."""
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def load_row(method: str, head_dir: Path, eval_json: Path) -> dict:
    """One head: method, budget (training.flops_budget.target, None without), seed, the saved epoch's
    validation R@1 / R@10 / FLOPs (val_*), precision, best_epoch, and the eval JSON's R@1, R@10,
    FLOPs, doc_Exact@10, queries. InputError when the head has no validation figures."""
    cfg = _read_json(Path(head_dir) / "config.json", "head config")
    tr = cfg.get("training", {})
    val = tr.get("val") or {}
    if "R@1" not in val:
        raise InputError(f"{head_dir}/config.json: training.val holds no validation figures; train the head with "
                         "--val-images/--val-captions (or --target-flops, which holds images out)")
    r = _read_json(eval_json, "evaluation")
    return {"method": method, "head": Path(head_dir).name, "budget": (tr.get("flops_budget") or {}).get("target"),
            "seed": tr.get("config", {}).get("seed"), "val_R@1": val["R@1"], "val_R@10": val.get("R@10"),
            "val_FLOPs": val.get("FLOPs"), "precision": tr.get("precision"), "best_epoch": tr.get("best_epoch"),
            **{k: r.get(k) for k in ("R@1", "R@10", "FLOPs", "doc_Exact@10", "queries")}}


def load_point(label: str, eval_json: Path) -> dict:
    r = _read_json(eval_json, "evaluation")
    return {"label": label, **{k: r.get(k) for k in ("R@1", "R@10", "FLOPs", "queries")}}


def dense_val(images: Path, captions: Path) -> dict:
    """Dense caption->image R@1, R@10 (and R@5, MRR@10) of the validation dense files (exhaustive).
    The captions file must carry `image_ids` (encode-dense writes it). Raises InputError otherwise."""
    from ..formats.dense import read_dense
    from .exhaustive import dense_retrieval_metrics

    im, ca = read_dense(images), read_dense(captions)
    if not ca.image_ids:
        raise InputError(f"{captions}: no 'image_ids' dataset; re-run encode-dense on the validation captions")
    row = {i: k for k, i in enumerate(im.ids)}
    missing = [i for i in ca.image_ids if i not in row]
    if missing:
        raise InputError(f"{captions}: image_ids: {len(missing)} caption(s) name images not in {images}, "
                         f"e.g. {missing[:3]}; pass the images file of the same split")
    gold = np.array([row[i] for i in ca.image_ids], dtype=np.int64)
    return dense_retrieval_metrics(ca.vectors, im.vectors, gold)


FIGURES = ("val_R@1", "val_R@10", "val_FLOPs", "FLOPs", "R@1", "R@10", "doc_Exact@10")


def aggregate(rows: list[dict]) -> list[dict]:
    """One point per (method, budget): n seeds, and for each of FIGURES its mean and standard
    deviation over seeds (ddof 1; 0 for one seed) as FIG and FIG_sd, plus the per-seed values
    (FIG_seeds) and the queries. Order: methods as first seen, budgets ascending."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["method"], r["budget"]), []).append(r)
    order = list(dict.fromkeys(r["method"] for r in rows))
    out = []
    for (m, b), rs in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1] or 0)):
        pt = {"method": m, "budget": b, "seeds": [r["seed"] for r in rs], "heads": [r["head"] for r in rs],
              "queries": int(rs[0].get("queries") or 0)}
        for k in FIGURES:
            xs = [r[k] for r in rs if r.get(k) is not None]
            pt[k], pt[k + "_sd"] = mean_sd(xs)
            pt[k + "_seeds"] = xs
        out.append(pt)
    return out


def choose(points: list[dict], dense_v: dict, keep_r1: float = KEEP_R1, keep_r10: float = KEEP_R10) -> dict:
    """{method: the smallest budget whose mean validation R@1 >= keep_r1 × dense's validation R@1 and
    R@10 >= keep_r10 × dense's (None when no budget keeps both)}: validation decides."""
    out: dict = {}
    for p in points:
        ok = p["val_R@1"] >= keep_r1 * dense_v["R@1"] and p["val_R@10"] >= keep_r10 * dense_v["R@10"]
        if p["budget"] is not None:
            out.setdefault(p["method"], None)
            if ok and (out[p["method"]] is None or p["budget"] < out[p["method"]]):
                out[p["method"]] = p["budget"]
    return out


def versus(points: list[dict], a: str, b: str) -> list[dict]:
    """Method `a` against method `b` at every budget both trained: per-seed test R@1 and R@10 means,
    their difference and Welch's two-sided t-test over seeds (p None with fewer than two seeds a side)."""
    by = {(p["method"], p["budget"]): p for p in points}
    out = []
    for (m, budget), pa in by.items():
        pb = by.get((b, budget))
        if m != a or pb is None:
            continue
        row = {"label": f"{a} vs {b}", "budget": budget, "FLOPs_a": pa["FLOPs"], "FLOPs_b": pb["FLOPs"]}
        for k in ("R@1", "R@10"):
            xa, xb = pa[k + "_seeds"], pb[k + "_seeds"]
            row.update({f"{k}_a": pa[k], f"{k}_b": pb[k], f"{k}_sd_a": pa[k + "_sd"], f"{k}_sd_b": pb[k + "_sd"],
                        f"p_{k}": welch(xa, xb)})
        out.append(row)
    return out


def _pm(mean: float | None, sd: float, scale: float = 100, digits: int = 1) -> str:
    return "–" if mean is None else f"{scale * mean:.{digits}f} ± {scale * sd:.{digits}f}"


def markdown(points: list[dict], dense: dict, dense_v: dict, chosen: dict, extra: list[dict] = (),
             tests: list[dict] = ()) -> str:
    """The table (a line per method and budget: seeds, validation figures, test figures as mean ±
    standard deviation over seeds with the binomial standard error in brackets), the points, dense,
    the rule's choice, and the over-seed tests."""
    n = int(dense.get("queries") or 0)
    lines = ["| method | budget F | seeds | val FLOPs (÷ F) | val R@1 | val R@10 | test FLOPs | R@1 (SE) | R@10 (SE) "
             "| R@1 ÷ dense | R@10 ÷ dense | doc_Exact@10 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        q = p["queries"] or n
        vf = p["val_FLOPs"]
        landed = "–" if vf is None else f"{vf:.2f} ± {p['val_FLOPs_sd']:.2f}" + (f" ({vf / p['budget']:.2f})"
                                                                                  if p["budget"] else "")
        de = p.get("doc_Exact@10")
        lines.append(f"| {p['method']} | {'–' if p['budget'] is None else format(p['budget'], 'g')} | {len(p['seeds'])} "
                     f"| {landed} | {_pm(p['val_R@1'], p['val_R@1_sd'])} | {_pm(p['val_R@10'], p['val_R@10_sd'])} "
                     f"| {_pm(p['FLOPs'], p['FLOPs_sd'], 1, 2)} | {_pm(p['R@1'], p['R@1_sd'])} ({100 * se(p['R@1'], q):.1f}) "
                     f"| {_pm(p['R@10'], p['R@10_sd'])} ({100 * se(p['R@10'], q):.1f}) | {p['R@1'] / dense['R@1']:.3f} "
                     f"| {p['R@10'] / dense['R@10']:.3f} | {'–' if de is None else f'{100 * de:.1f}'} |")
    for x in extra:
        q = int(x.get("queries") or n)
        lines.append(f"| {x['label']} | – | – | – | – | – | {'–' if x['FLOPs'] is None else format(x['FLOPs'], '.2f')} "
                     f"| {100 * x['R@1']:.1f} ({100 * se(x['R@1'], q):.1f}) | {100 * x['R@10']:.1f} "
                     f"({100 * se(x['R@10'], q):.1f}) | {x['R@1'] / dense['R@1']:.3f} | {x['R@10'] / dense['R@10']:.3f} | – |")
    lines.append(f"| dense | – | – | – | {100 * dense_v['R@1']:.1f} | {100 * dense_v['R@10']:.1f} | – "
                 f"| {100 * dense['R@1']:.1f} ({100 * se(dense['R@1'], n):.1f}) "
                 f"| {100 * dense['R@10']:.1f} ({100 * se(dense['R@10'], n):.1f}) | 1 | 1 | – |")
    md = "\n".join(lines) + (f"\n\nR@k ×100, mean ± standard deviation over seeds, (binomial standard error over "
                             f"{n:,} test queries); val: the saved epoch's validation figures; FLOPs: D2S eq. 1\n")
    md += (f"\nChosen on validation (the smallest budget whose mean validation R@1 keeps {KEEP_R1} × and R@10 "
           f"{KEEP_R10} × dense's, {100 * dense_v['R@1']:.1f} / {100 * dense_v['R@10']:.1f}): "
           + "; ".join(f"{m} {'none' if b is None else format(b, 'g')}" for m, b in chosen.items()) + "\n")
    if tests:
        md += ("\n| comparison (A vs B) | budget | FLOPs A / B | R@1 A | R@1 B | p | R@10 A | R@10 B | p |\n"
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
        for t in tests:
            cells = []
            for k in ("R@1", "R@10"):
                p = t[f"p_{k}"]
                cells += [_pm(t[f"{k}_a"], t[f"{k}_sd_a"]), _pm(t[f"{k}_b"], t[f"{k}_sd_b"]),
                          "–" if p is None else f"{p:.2g}"]
            fl = " / ".join("–" if x is None else f"{x:.2f}" for x in (t["FLOPs_a"], t["FLOPs_b"]))
            md += (f"| {t['label']} | {t['budget']:g} | {fl} | "
                   + " | ".join(cells) + " |\n")
        md += "\np: Welch's two-sided t-test over seeds (each seed one head), test split\n"
    return md


def plot(points: list[dict], dense: dict, extra: list[dict], path: Path, measure: str = "R@1") -> None:
    """`measure` (%) against test FLOPs (log x): a line per method through its budgets' means with
    ± one standard deviation over seeds (both axes), each labelled with its budget, dense as a
    dashed line, each extra point a marker with its binomial standard error."""
    from .plots import _figure, format_log_axis, save_png

    n = int(dense.get("queries") or 0)
    fig, ax = _figure()
    methods = list(dict.fromkeys(p["method"] for p in points))
    xs = [p["FLOPs"] for p in points if p["FLOPs"]] + [x["FLOPs"] for x in extra if x.get("FLOPs")]
    for i, m in enumerate(methods):
        pts = sorted((p for p in points if p["method"] == m and p["FLOPs"]), key=lambda p: p["FLOPs"])
        if not pts:
            continue
        n = sorted({len(p["seeds"]) for p in pts})
        seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"   # points trained with unequal seed counts say so
        ax.errorbar([p["FLOPs"] for p in pts], [100 * p[measure] for p in pts],
                    xerr=[p["FLOPs_sd"] for p in pts], yerr=[100 * p[measure + "_sd"] for p in pts],
                    marker="o", ms=4, capsize=2, lw=1.2, color=f"C{i}", label=f"{m} ({seeds} seed{'' if seeds == '1' else 's'})")
        for p in pts:
            if p["budget"]:
                ax.annotate(f"F={p['budget']:g}", (p["FLOPs"], 100 * p[measure]), textcoords="offset points",
                            fontsize=6, color=f"C{i}", xytext=(4, -9) if i % 2 == 0 else (-4, 5),
                            ha="left" if i % 2 == 0 else "right")
    for j, x in enumerate(extra):
        if x.get("FLOPs"):
            ax.errorbar([x["FLOPs"]], [100 * x[measure]], yerr=[100 * se(x[measure], int(x.get("queries") or n))],
                        marker="sDP^v"[j % 5], ms=6, capsize=2, ls="none", color=f"C{len(methods) + j}",
                        label=x["label"])
    ax.axhline(100 * dense[measure], color="0.4", ls="--", lw=1, label=f"dense ({100 * dense[measure]:.1f})")
    ax.set_xscale("log")
    if xs:
        lo, hi = min(xs) / 1.3, max(xs) * 1.3
        ax.set_xlim(lo, hi)
        format_log_axis(ax.xaxis, lo, hi)
    ax.set_xlabel("FLOPs: mean shared terms per query-image pair (log scale)")
    ax.set_ylabel(f"{measure} (%), mean ± sd over seeds")
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
    ap.add_argument("--dense", type=Path, required=True, help="eval JSON of the dense test run (the horizontal line)")
    ap.add_argument("--val-images", type=Path, required=True, help="dense HDF5 of the validation images")
    ap.add_argument("--val-captions", type=Path, required=True, help="dense HDF5 of the validation captions")
    ap.add_argument("--row", action="append", default=[], help="METHOD=HEAD_DIR=EVAL_JSON, repeatable (a seed each)")
    ap.add_argument("--point", action="append", default=[], help="LABEL=EVAL_JSON, repeatable (e.g. VDR)")
    ap.add_argument("--versus", action="append", default=[], help="A=B: method A against method B at every "
                    "budget both trained, over seeds (Welch's t-test), repeatable")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the table (.md); its figures go beside it as .json")
    ap.add_argument("--plot", type=Path, help="the picture (PNG)")
    a = ap.parse_args(argv)
    dense = _read_json(a.dense, "dense evaluation")
    dense_v = dense_val(a.val_images, a.val_captions)
    rows = [load_row(*_split(x, ("METHOD", "HEAD_DIR", "EVAL_JSON"), "--row")) for x in a.row]
    points = aggregate(rows)
    extra = [load_point(*_split(x, ("LABEL", "EVAL_JSON"), "--point")) for x in a.point]
    tests = [t for x in a.versus for t in versus(points, *_split(x, ("A", "B"), "--versus"))]
    chosen = choose(points, dense_v)
    md = markdown(points, dense, dense_v, chosen, extra, tests)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(a.out) as tmp:
        Path(tmp).write_text(md, encoding="utf-8")
    with atomic_path(a.out.with_suffix(".json")) as tmp:
        Path(tmp).write_text(json.dumps({"rows": rows, "points": points, "extra": extra, "versus": tests,
                                         "chosen": chosen, "dense": {k: dense.get(k) for k in ("R@1", "R@10", "queries")},
                                         "dense_val": dense_v}, indent=1), encoding="utf-8")
    if a.plot:
        plot(points, dense, extra, a.plot)
    print(md)
    return 0


if __name__ == "__main__":
    import sys

    try:
        raise SystemExit(main())
    except InputError as e:   # one line, exit 2, as the commands
        print(f"mmsparse: error: {e}", file=sys.stderr)
        raise SystemExit(2)
