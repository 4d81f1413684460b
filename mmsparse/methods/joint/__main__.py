"""python -m mmsparse.methods.joint grid HEAD_DIR... [-o OUT.md]: the w1 x w2 validation table.
python -m mmsparse.methods.joint se LABEL=EVAL_JSON... [-o OUT.md]: R@1, R@5, R@10 (x100) with their
standard errors and FLOPs of `mmsparse eval` results (docs/joint.md, paper Tables 1-3).
python -m mmsparse.methods.joint curve HEAD_DIR... [--reference HEAD_DIR] -o OUT.png: validation R@1
(sparse, dense) and FLOPs per epoch of joint heads (docs/joint.md "Convergence")."""

import sys

from ...atomic import write_text_atomic
from ...options import split_argv
from .method import grid_table, se_table

args = sys.argv[1:]
USAGE = ("usage: python -m mmsparse.methods.joint grid HEAD_DIR... | se LABEL=EVAL_JSON... [-o OUT.md] | "
         "curve HEAD_DIR... [--reference HEAD_DIR] -o OUT.png")
if not args or args[0] not in ("grid", "se", "curve"):
    sys.exit(USAGE)
opts, rest = split_argv(args[1:], ("-o", "--reference"))   # each of those flags takes the next argument
out, ref = opts.get("-o"), opts.get("--reference")
if args[0] == "curve":
    from ...errors import InputError
    from .curve import curve_figure
    if not out or not rest:
        sys.exit(USAGE)
    try:
        curve_figure(rest, out, ref)
    except InputError as e:
        sys.exit(f"mmsparse: {e}")
    print(f"wrote {out}")
    sys.exit(0)
table = grid_table(rest) if args[0] == "grid" else se_table(rest)
print(table)
if out:
    write_text_atomic(out, table)
