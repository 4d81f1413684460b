"""python -m mmsparse.methods.vdr curve HEAD_DIR... -o OUT.png: validation R@10 per epoch of VDR
(parametric and bag-of-words queries) and dense heads (docs/vdr.md "Convergence").
python -m mmsparse.methods.vdr clouds LABEL=SPARSE_IMAGES.h5... -o OUT.png [--top N]: word clouds of
the mean term weights over the images of each file (VDR paper Fig. 7)."""

import sys

from ...errors import InputError
from ...options import split_argv

USAGE = ("usage: python -m mmsparse.methods.vdr curve HEAD_DIR... -o OUT.png | "
         "clouds LABEL=SPARSE_IMAGES.h5... -o OUT.png [--top N]")
args = sys.argv[1:]
if not args or args[0] not in ("curve", "clouds"):
    sys.exit(USAGE)
opts, rest = split_argv(args[1:], ("-o", "--top"))   # each of those flags takes the next argument
out = opts.get("-o")
if not out or not rest:
    sys.exit(USAGE)
try:
    if args[0] == "curve":
        from .report import curve_figure
        curve_figure(rest, out)
    else:
        from .report import clouds_figure
        for item, terms in zip(rest, clouds_figure(rest, out, int(opts.get("--top") or 100))):
            print(f"{item}: " + ", ".join(f"{t} {w:.3f}" for t, w in terms[:15]))
except InputError as e:
    sys.exit(f"mmsparse: {e}")
print(f"wrote {out}")
