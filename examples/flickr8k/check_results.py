"""Check that the main job's results still support what README.md claims about them.

    python examples/flickr8k/check_results.py [WORK]      (WORK default: examples/flickr8k/work)

Reads WORK/eval/dense.json, sparse.json (expanded queries) and sparse-caption-terms.json, written
by `make -C examples/flickr8k`, and exits 1 naming every claim that no longer holds. CI runs it
after the main job, so the README's results table cannot drift from the code. The bounds below
are the README's ("Results of the main job"); change both together.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# claim -> (eval file, key, comparison, bound); "x dense" bounds are fractions of the dense run's value
CLAIMS = [
    ("expanded-query R@10 >= 0.95 x dense R@10", "sparse", "R@10", ">=", ("dense", "R@10", 0.95)),
    ("FLOPs of expanded queries <= 20", "sparse", "FLOPs", "<=", 20.0),
    ("terms per image <= 50", "sparse", "doc_terms", "<=", 50.0),
    ("caption-side Exact@20 >= 0.13 (0.1 head: 0.104)", "sparse", "Exact@20", ">=", 0.13),
    ("image-side doc_Exact@10 >= 0.25 (0.1 head: 0.147)", "sparse", "doc_Exact@10", ">=", 0.25),
    ("no term in more than 95 % of the test images (0.1 head: 99.8 %)", "sparse", "doc_max_df", "<=", 0.95),
    ("caption-term queries keep FLOPs <= 5", "sparse-caption-terms", "FLOPs", "<=", 5.0),
]


def check(work: Path) -> list[str]:
    """The claims that fail, as lines "claim: key = value (bound)"; [] when all hold."""
    evals = {}
    for name in ("dense", "sparse", "sparse-caption-terms"):
        p = work / "eval" / f"{name}.json"
        if not p.is_file():
            return [f"{p}: missing; run `make -C examples/flickr8k` first"]
        evals[name] = json.loads(p.read_text(encoding="utf-8"))
    failed = []
    for claim, name, key, op, bound in CLAIMS:
        value = evals[name].get(key)
        if isinstance(bound, tuple):
            other, okey, frac = bound
            bound = frac * evals[other][okey]
        ok = value is not None and (value >= bound if op == ">=" else value <= bound)
        print(f"{'ok  ' if ok else 'FAIL'} {claim}: {key} = {value if value is None else round(value, 4)} "
              f"({op} {bound:.4g})")
        if not ok:
            failed.append(f"{claim}: {key} = {value} ({op} {bound:.4g})")
    return failed


if __name__ == "__main__":
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "work"
    failed = check(work)
    if failed:
        print(f"{len(failed)} README claim(s) no longer hold:", *failed, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("every README claim about the main job holds")
