"""A budget path's heads against independent heads, on validation, over seeds (issue 55).

    python -m mmsparse.metrics.paths --pair PATH_HEAD=INDEPENDENT_HEAD [--pair ...] [-o table.md]

Each pair: a head written by a budget path (`train-head --target-flops 12,9.4,6`, OUT/flops-F) and
the head trained alone at the same budget and seed (`--target-flops F --seed S`). Pairs are grouped
by budget (the heads' training.config.target_flops); per seed the path head's validation R@1 and
R@10 minus the independent head's (points ×100), then per budget the mean difference with its 95 %
Student interval (scipy.stats.t, n − 1 degrees of freedom). The rule: paths replace independent
heads where the interval's lower end is above −0.5 point for R@1 and for R@10 at every budget.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

RULE = -0.5   # points: the lowest the 95 % interval's lower end may reach


def head_figures(head: str | Path) -> dict:
    """{"budget", "seed", "R@1", "R@10", "FLOPs", "epoch"} of a head's saved epoch on validation
    (its config.json's training record; R@k ×100). Raises ValueError naming the file when it has no
    validation figures or no budget."""
    p = Path(head) / "config.json"
    tr = json.loads(p.read_text(encoding="utf-8")).get("training", {})
    v, conf = tr.get("val") or {}, tr.get("config") or {}
    if "R@1" not in v or conf.get("target_flops") is None:
        raise ValueError(f"{p}: no validation figures or no --target-flops in training")
    return {"budget": float(conf["target_flops"]), "seed": conf.get("seed"), "R@1": 100 * v["R@1"],
            "R@10": 100 * v["R@10"], "FLOPs": v.get("FLOPs"), "epoch": tr.get("best_epoch")}


def interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper) of the Student t interval of the mean of `diffs` at `level`; with one
    value the interval is (-inf, inf)."""
    from scipy.stats import t

    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return mean, -math.inf, math.inf
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def compare(pairs: Sequence[tuple[str, str]]) -> tuple[list[dict], bool]:
    """Rows per budget ({"budget", "seeds", "path", "independent", "diffs": {metric: [...]},
    metric: (mean, lower, upper)}) and whether the rule holds at every budget. Raises ValueError
    when a pair's heads differ in budget or seed."""
    groups: dict = {}
    for a, b in pairs:
        pa, pb = head_figures(a), head_figures(b)
        if (pa["budget"], pa["seed"]) != (pb["budget"], pb["seed"]):
            raise ValueError(f"{a} and {b}: not the same budget and seed")
        groups.setdefault(pa["budget"], []).append((pa, pb))
    rows, ok = [], True
    for budget in sorted(groups, reverse=True):
        g = sorted(groups[budget], key=lambda x: x[0]["seed"] or 0)
        row = {"budget": budget, "seeds": [x[0]["seed"] for x in g], "path": [x[0] for x in g],
               "independent": [x[1] for x in g], "diffs": {}}
        for m in ("R@1", "R@10"):
            d = [x[0][m] - x[1][m] for x in g]
            row["diffs"][m] = d
            row[m] = interval(d)
            ok = ok and row[m][1] > RULE
        rows.append(row)
    return rows, ok


def markdown(rows: list[dict], ok: bool) -> str:
    """The comparison as a markdown table and the rule's verdict."""
    out = ["| budget | seeds | path val R@1 / R@10 (FLOPs) per seed | independent, same | Δ R@1 per seed | "
           "Δ R@1 mean [95 % CI] | Δ R@10 per seed | Δ R@10 mean [95 % CI] |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fig = lambda hs: "; ".join(f"{h['R@1']:.2f} / {h['R@10']:.2f} ({h['FLOPs']:.2f})" for h in hs)
        ci = lambda m: f"{r[m][0]:+.2f} [{r[m][1]:+.2f}, {r[m][2]:+.2f}]"
        out.append(f"| {r['budget']:g} | {', '.join(map(str, r['seeds']))} | {fig(r['path'])} | {fig(r['independent'])} | "
                   f"{', '.join(f'{d:+.2f}' for d in r['diffs']['R@1'])} | {ci('R@1')} | "
                   f"{', '.join(f'{d:+.2f}' for d in r['diffs']['R@10'])} | {ci('R@10')} |")
    out.append("")
    out.append(f"Rule (the 95 % interval's lower end above {RULE} point for R@1 and R@10 at every budget): "
               + ("holds: train from paths." if ok else "fails: keep independent heads."))
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mmsparse.metrics.paths", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", required=True, metavar="PATH_HEAD=INDEPENDENT_HEAD",
                    help="a path's head and the independent head of the same budget and seed")
    ap.add_argument("-o", "--out", help="write the markdown table here too")
    a = ap.parse_args(argv)
    try:
        pairs = [tuple(p.split("=", 1)) for p in a.pair]
        if any(len(p) != 2 for p in pairs):
            raise ValueError("--pair takes PATH_HEAD=INDEPENDENT_HEAD")
        rows, ok = compare(pairs)
    except (ValueError, OSError) as e:
        print(f"mmsparse.metrics.paths: error: {e}", file=sys.stderr)
        return 2
    text = markdown(rows, ok)
    print(text, end="")
    if a.out:
        from ..atomic import atomic_path

        with atomic_path(Path(a.out)) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
