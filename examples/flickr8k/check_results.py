"""Check that the main job's results still support what README.md claims about them.

    python examples/flickr8k/check_results.py [WORK]      (WORK default: examples/flickr8k/work)

Reads WORK/eval/dense.json, sparse.json (expanded queries), sparse-caption-terms.json and
sparse-inference-free.json (the inference-free head's queries), written by
`make -C examples/flickr8k`, and exits 1 naming every claim that no longer holds. CI runs it
after the main job, so the README's results table cannot drift from the code. The bounds below
are the README's ("Results of the main job") and docs/results.md's; change both together. It also runs check_export.py
(the exported heads reproduce their vectors in sentence-transformers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Where the main job's figure sits close to a target, the bound keeps a margin for what varies between
# machines and thread counts (docs/results.md "What varies between machines" says by how much); the targets the job
# does not reach (issue 25) are named beside the bound it does hold.
DOC_EXACT = 0.40      # image-side doc_Exact@10, the target (measured 0.417 at budget 9.4, fp32 seed 1; 0.327 before the word loss)
BUDGET = 9.4          # train-head --target-flops of the D2S head (examples/flickr8k/Makefile D2S_BUDGET)
BUDGET_LIMIT = BUDGET * 1.15
CAPTION_TERMS = 0.85  # caption-term R@10 / dense R@10, the target (measured 0.898; 0.907 the previous head)
MAX_DF = 0.50         # doc_max_df, the target: no term in more than half the test images (measured 0.435)
IF_R1 = 0.80          # inference-free R@1 / dense R@1 (measured 0.866 fp32; 0.900 the previous bf16 head)
IF_R10 = 0.90         # inference-free R@10 / dense R@10 (measured 0.914 fp32, 0.916 bf16; aim 0.95 not reached)
IF_FLOPS = 2.0        # FLOPs of inference-free queries (measured 1.11; 2.53 before --eta-query-flops)

# claim -> (eval file, key, comparison, bound); "x dense" bounds are fractions of the dense run's value,
# "~" bounds are (centre, tolerance)
CLAIMS = [
    # the backbone: ../shared's dual encoder as issue 24 measured it (R@1 20.4, R@10 61.5), +- 1 point
    ("dense R@1 = 0.204 +- 0.01", "dense", "R@1", "~", (0.204, 0.01)),
    ("dense R@10 = 0.615 +- 0.01", "dense", "R@10", "~", (0.615, 0.01)),
    # D2S, expanded queries: the D2S paper keeps 0.90 x dense R@1 at FLOPs 11.5
    ("expanded-query R@1 >= 0.90 x dense R@1", "sparse", "R@1", ">=", ("dense", "R@1", 0.90)),
    ("expanded-query R@10 >= 0.95 x dense R@10", "sparse", "R@10", ">=", ("dense", "R@10", 0.95)),
    # the main job's FLOPs budget (Makefile D2S_BUDGET 9.4, the frontier's smallest budget at 0.95 x dense
    # R@1, docs/d2s.md), the saved epoch's validation FLOPs <= 1.15 x it; measured on test 9.35
    (f"FLOPs of expanded queries <= {BUDGET_LIMIT:.2f} (budget {BUDGET} + 15 %)", "sparse", "FLOPs", "<=", BUDGET_LIMIT),
    # the terms a person reads: caption side, image side, no hub term
    ("caption-side Exact@20 >= 0.20", "sparse", "Exact@20", ">=", 0.20),
    (f"image-side doc_Exact@10 >= {DOC_EXACT}", "sparse", "doc_Exact@10", ">=", DOC_EXACT),
    (f"no term in more than {MAX_DF:.0%} of the test images", "sparse", "doc_max_df", "<=", MAX_DF),
    # D2S, caption-term queries (no expansion)
    (f"caption-term R@10 >= {CAPTION_TERMS} x dense R@10", "sparse-caption-terms", "R@10", ">=",
     ("dense", "R@10", CAPTION_TERMS)),
    ("caption-term queries keep FLOPs <= 5", "sparse-caption-terms", "FLOPs", "<=", 5.0),
    # inference-free head: no model at query time
    (f"inference-free R@1 >= {IF_R1} x dense R@1", "sparse-inference-free", "R@1", ">=", ("dense", "R@1", IF_R1)),
    (f"inference-free R@10 >= {IF_R10} x dense R@10", "sparse-inference-free", "R@10", ">=",
     ("dense", "R@10", IF_R10)),
    (f"inference-free queries keep FLOPs <= {IF_FLOPS}", "sparse-inference-free", "FLOPs", "<=", IF_FLOPS),
]


def check(work: Path) -> list[str]:
    """The claims that fail, as lines "claim: key = value (bound)"; [] when all hold."""
    evals = {}
    for name in ("dense", "sparse", "sparse-caption-terms", "sparse-inference-free"):
        p = work / "eval" / f"{name}.json"
        if not p.is_file():
            return [f"{p}: missing; run `make -C examples/flickr8k` first"]
        evals[name] = json.loads(p.read_text(encoding="utf-8"))
    failed = []
    for claim, name, key, op, bound in CLAIMS:
        value = evals[name].get(key)
        if op == "~":
            centre, tol = bound
            ok, shown = value is not None and abs(value - centre) <= tol, f"{centre:.4g} +- {tol:.4g}"
        else:
            if isinstance(bound, tuple):
                other, okey, frac = bound
                bound = frac * evals[other][okey]
            ok = value is not None and (value >= bound if op == ">=" else value <= bound)
            shown = f"{op} {bound:.4g}"
        print(f"{'ok  ' if ok else 'FAIL'} {claim}: {key} = {value if value is None else round(value, 4)} "
              f"({shown})")
        if not ok:
            failed.append(f"{claim}: {key} = {value} ({shown})")
    return failed


if __name__ == "__main__":
    from check_export import check as check_export   # README "Use with other tools" (sentence-transformers)

    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "work"
    failed = check(work) + check_export(work)
    if failed:
        print(f"{len(failed)} README claim(s) no longer hold:", *failed, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("every README claim about the main job holds")
