"""python -m mmsparse.methods.joint grid HEAD_DIR... [-o OUT.md]: the w1 x w2 validation table.
python -m mmsparse.methods.joint se LABEL=EVAL_JSON... [-o OUT.md]: R@1, R@5, R@10 (x100) with their
standard errors and FLOPs of `mmsparse eval` results (docs/joint.md, paper Tables 1-3)."""

import sys

from ...atomic import write_text_atomic
from .method import grid_table, se_table

args = sys.argv[1:]
if not args or args[0] not in ("grid", "se"):
    sys.exit("usage: python -m mmsparse.methods.joint grid HEAD_DIR... | se LABEL=EVAL_JSON... [-o OUT.md]")
out = args[args.index("-o") + 1] if "-o" in args else None
rest = [x for x in args[1:] if x not in ("-o", out)]
table = grid_table(rest) if args[0] == "grid" else se_table(rest)
print(table)
if out:
    write_text_atomic(out, table)
