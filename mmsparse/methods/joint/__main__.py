"""python -m mmsparse.methods.joint grid HEAD_DIR... [-o OUT.md]: the w1 x w2 validation table."""

import sys

from ...atomic import write_text_atomic
from .method import grid_table

args = sys.argv[1:]
if not args or args[0] != "grid":
    sys.exit("usage: python -m mmsparse.methods.joint grid HEAD_DIR... [-o OUT.md]")
out = args[args.index("-o") + 1] if "-o" in args else None
table = grid_table([x for x in args[1:] if x not in ("-o", out)])
print(table)
if out:
    write_text_atomic(out, table)
