"""python -m mmsparse.methods.vdr curve HEAD_DIR... -o OUT.png: validation R@10 per epoch of VDR
(parametric and bag-of-words queries) and dense heads (docs/vdr.md "Convergence").
python -m mmsparse.methods.vdr clouds LABEL=SPARSE_IMAGES.h5... -o OUT.png [--top N]: word clouds of
the mean term weights over the images of each file (VDR paper Fig. 7).
python -m mmsparse.methods.vdr seeds LABEL=EVAL_JSON[,EVAL_JSON...]... [--reference LABEL] [--versus A=B]...
-o OUT.md: mean ± standard deviation over seeds, tests over seeds and per query (make vdr's table; also
OUT.json).
python -m mmsparse.methods.vdr ksweep HEAD_DIR IMAGES.h5 CAPTIONS.h5 -o OUT.json [--ks K,K,...] [--max-flops F]
[--min-alpha A]: VDR and VDR^α over a grid of inference k per side on one split (ksweep.py; also OUT.md)."""

import sys

from ...errors import InputError
from ...options import split_argv

USAGE = ("usage: python -m mmsparse.methods.vdr curve HEAD_DIR... -o OUT.png | "
         "clouds LABEL=SPARSE_IMAGES.h5... -o OUT.png [--top N] | "
         "seeds LABEL=EVAL_JSON[,EVAL_JSON...]... [--reference LABEL] [--versus A=B]... -o OUT.md | "
         "ksweep HEAD_DIR IMAGES.h5 CAPTIONS.h5 -o OUT.json [--ks K,K,...] [--max-flops F] [--min-alpha A]")
args = sys.argv[1:]
if not args or args[0] not in ("curve", "clouds", "seeds", "ksweep"):
    sys.exit(USAGE)
if args[0] == "ksweep":
    import argparse
    import json
    from pathlib import Path

    from ...atomic import write_text_atomic
    from .ksweep import KS, MIN_ALPHA, run, summary
    ap = argparse.ArgumentParser(prog="python -m mmsparse.methods.vdr ksweep")
    ap.add_argument("head", help="a VDR head directory (train-head --method vdr)")
    ap.add_argument("images", help="the split's image states (encode-dense, the head's inputs)")
    ap.add_argument("captions", help="the split's caption states; choose k on validation, never on test")
    ap.add_argument("-o", required=True, help="every grid point as JSON (R@k fractions, FLOPs); a summary in OUT.md")
    ap.add_argument("--ks", default=",".join(map(str, KS)), help="k values, both sides (default %(default)s)")
    ap.add_argument("--max-flops", type=float, default=10.0, help="FLOPs limit of the chosen point (default 10)")
    ap.add_argument("--min-alpha", type=float, default=MIN_ALPHA,
                    help="the chosen point's VDR^α R@10 keeps at least this share of its VDR R@10 (default 0.75)")
    a = ap.parse_args(args[1:])
    try:
        ks = sorted({int(k) for k in a.ks.split(",") if k.strip()})
        if not ks or ks[0] < 1:
            raise ValueError
    except ValueError:
        print(f"mmsparse: --ks {a.ks!r}: expected positive integers separated by commas, e.g. 32,64,128", file=sys.stderr)
        sys.exit(2)
    try:
        res = run(a.head, a.images, a.captions, ks, a.max_flops, a.min_alpha)
    except InputError as e:
        print(f"mmsparse: {e}", file=sys.stderr)
        sys.exit(2)
    write_text_atomic(a.o, json.dumps(res, indent=1) + "\n")
    write_text_atomic(Path(a.o).with_suffix(".md"), summary(res))
    print(summary(res))
    sys.exit(0)
if args[0] == "seeds":
    import argparse
    import json
    from pathlib import Path

    from ...atomic import write_text_atomic
    from .seeds import seeds_table
    ap = argparse.ArgumentParser(prog="python -m mmsparse.methods.vdr seeds")
    ap.add_argument("rows", nargs="+", help="LABEL=EVAL_JSON[,EVAL_JSON...]: one row, an evaluation per seed")
    ap.add_argument("--reference", help="row whose mean R@10 the shares divide by (default: the first)")
    ap.add_argument("--versus", action="append", default=[], help="A=B: test row A against row B")
    ap.add_argument("-o", required=True, help="the markdown table (the figures also in OUT.json)")
    a = ap.parse_args(args[1:])
    try:
        md, data = seeds_table(a.rows, a.versus, a.reference)
    except InputError as e:
        print(f"mmsparse: {e}", file=sys.stderr)
        sys.exit(2)
    write_text_atomic(a.o, md)
    write_text_atomic(Path(a.o).with_suffix(".json"), json.dumps(data, indent=1) + "\n")
    print(md)
    sys.exit(0)
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
