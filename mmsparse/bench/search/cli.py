"""The command line of the search benchmark (`python -m mmsparse.bench.search`, see the package
docstring): parse the options, run every job of every scale in its own process (the sparse jobs
once per head, the dense ones once, the end-to-end job for both), collect the saved rows of every
job and write search.json, search.meta.json, search.md and the frontier plots."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ...errors import require_file
from .exhaustive import job_exhaustive
from .faiss import job_faiss_flat, job_faiss_hnsw
from .endtoend import K as ENDTOEND_K, job_endtoend
from .harness import Scale, collection_stamp, in_child
from .milvus import job_milvus
from .pisa import job_pisa, job_pisa_levers
from .frontier import frontier_plot
from .report import engine_versions, goals, machine, search_md
from .scales import DENSE, REAL_SCALES, scale_spec
from .seismic import job_seismic, job_seismic_levers
from .bmp import job_bmp
from .kannolo import job_kannolo


JOBS = {"exhaustive": job_exhaustive, "pisa": job_pisa, "pisa-levers": job_pisa_levers, "seismic": job_seismic,
        "seismic-levers": job_seismic_levers, "bmp": job_bmp, "kannolo": job_kannolo, "faiss-flat": job_faiss_flat, "faiss-hnsw": job_faiss_hnsw,
        "milvus": job_milvus, "endtoend": job_endtoend}
# where a job runs: once per head (its sparse documents), once on the dense side, or both
# (end to end: the dense rows once, each head's query modes per head)
SIDES = {"faiss-flat": ("dense",), "faiss-hnsw": ("dense",), "endtoend": ("dense", "heads")}
DEFAULT_JOBS = [j for j in JOBS if j != "milvus"]
LEVER_JOBS = ("pisa-levers", "seismic-levers")


def _one_thread_job(name: str, sc: Scale) -> dict:
    import faiss

    faiss.omp_set_num_threads(1)
    return JOBS[name](sc)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


def _strs(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def _pairs(s: str) -> list[tuple[int, float]]:
    return [(int(a), float(b)) for a, b in (x.split(":") for x in s.split(",") if x)]


def _per_scale(s: str) -> dict:
    """'flickr8k:5000,123k:1000,*:300' -> {scale: value-string}."""
    out = {}
    for part in (p for p in s.split(";" if ";" in s else ",") if p):
        k, v = part.split(":", 1)
        out[k] = v
    return out


def parse_args(argv=None):
    from . import __doc__ as about  # the package docstring: its first paragraph is --help's description

    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.search", description=about.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="workspace (the Flickr8k example's WORK)")
    p.add_argument("--heads", "--head", dest="heads", type=_strs, default=["d2s"],
                   help="sparse heads, comma-separated (WORK/sparse/HEAD, WORK/heads/HEAD); the sparse jobs run for "
                   "each, on its own sparse collections, with the query modes of its method")
    p.add_argument("--backbone", default="hf-dual", help="dense backbone name under WORK/dense/")
    p.add_argument("--split", default="test", help="split whose captions are the queries")
    p.add_argument("--out", type=Path, default=None, help="output directory (default WORK/bench): OUT/HEAD/SCALE "
                   "(each head's jobs), OUT/dense/SCALE (the dense jobs), OUT/search.md (all)")
    p.add_argument("--collections", default=None,
                   help="directory of each head's sparse 123k.h5 / 1m.h5, {head} standing for the head "
                   "(default OUT/{head}/collections)")
    p.add_argument("--dense-collections", type=Path, default=None,
                   help="dense 123k.dense.h5 / 1m.dense.h5 (default WORK/bench/collections)")
    p.add_argument("--scales", type=_strs, default=["flickr8k", "123k", "1m"],
                   help="flickr8k, 123k, 1m and/or synthetic-N (the stress test)")
    p.add_argument("--jobs", type=_strs, default=DEFAULT_JOBS, help="jobs to run (others' rows are kept from "
                   "earlier runs): " + ", ".join(JOBS) + " (milvus: Milvus Lite, needs mmsparse[scale])")
    p.add_argument("--ks", type=_ints, default=[10, 100], help="cut-offs k")
    p.add_argument("--queries", type=_per_scale, default=_per_scale("flickr8k:5000,123k:500,1m:200,*:200"),
                   help="query sample size per scale (SCALE:N, * = the others); one seeded sample for every "
                   "configuration of a scale")
    p.add_argument("--warmup", type=int, default=50, help="untimed warm-up queries before every configuration")
    p.add_argument("--build-threads", type=int, default=2, help="threads of index builds")
    p.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse indexes already built under OUT/index with the same settings from the same collection file (path, size, modification time)")
    p.add_argument("--pisa-bits", type=int, default=8, help="PISA document quantisation bits (as `mmsparse index`)")
    p.add_argument("--pisa-block", type=int, default=64, help="PISA block-max block size (as `mmsparse index`)")
    p.add_argument("--pisa-algorithms", type=_strs, default=["block_max_wand", "block_max_maxscore", "maxscore",
                   "wand", "ranked_or", "ranked_or_taat"], help="PISA algorithms run at every k (the conjunctive "
                   "ranked_and ones need every query term in a document: not top-k of <q, d>)")
    p.add_argument("--prune-algorithms", type=_strs, default=["maxscore", "ranked_or_taat"],
                   help="PISA algorithms run with pruned queries")
    p.add_argument("--query-top-n", type=_ints, default=[3, 5, 8, 10, 20, 40],
                   help="primary queries pruned to their top-N terms (PISA, the engine without a query cut of its own)")
    p.add_argument("--query-min-weight", type=_floats, default=[0.05, 0.1, 0.2, 0.3],
                   help="expanded queries pruned to weights >= f x their largest weight")
    p.add_argument("--query-bits", type=_ints, default=[6, 4], help="PISA query quantisation bits (8 = default)")
    p.add_argument("--qbits-algorithm", default="maxscore", help="PISA algorithm of the --query-bits rows")
    p.add_argument("--candidates", type=_ints, default=[100, 1000], help="two-stage first-stage candidates")
    p.add_argument("--lever-scales", type=_strs, default=["123k"], help="scales of the *-levers jobs")
    p.add_argument("--pisa-levers", type=_strs, default=["bits=6", "bits=10", "block=32", "block=128",
                   "encoding=block_optpfor", "encoding=ef"], help="extra PISA builds")
    p.add_argument("--lever-algorithms", type=_strs, default=["block_max_maxscore", "maxscore"],
                   help="PISA algorithms of the lever builds")
    p.add_argument("--seismic-build", type=lambda s: dict(x.split(":", 1) for x in s.split(";") if x),
                   default=_per_scale("1m:n_postings=20000;*:n_postings=4000"),
                   help="Seismic build parameters per scale (SCALE:k=v,...; separated by ';')")
    p.add_argument("--seismic-cuts", type=_ints, default=[1, 2, 3, 4, 5, 10, 20], help="Seismic query_cut values")
    p.add_argument("--seismic-heaps", type=_floats, default=[0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 2.0],
                   help="Seismic heap_factor values: a block is skipped below heap_factor x the k-th score, so "
                   "values above 1 are the faster side")
    p.add_argument("--seismic-at-k", type=_pairs, default=[(10, 0.8), (20, 0.8), (40, 0.9)],
                   help="query_cut:heap_factor pairs also run at the larger k")
    p.add_argument("--seismic-levers", type=lambda s: [x for x in s.split(";") if x],
                   default=["n_postings=2000", "knn=10", "knn=20", "variant=dotvbyte"],
                   help="extra Seismic builds, ';'-separated k=v,... overriding --seismic-build")
    p.add_argument("--lever-seismic-cuts", type=_ints, default=[5, 8, 10, 15, 20], help="query_cut values of lever builds")
    p.add_argument("--seismic-n-knn", type=_ints, default=[5, 10, 20],
                   help="n_knn values on a k-NN graph build (those <= the graph's knn)")
    p.add_argument("--bmp-bits", type=int, default=8, help="BMP document quantisation bits (as `mmsparse index`)")
    p.add_argument("--bmp-blocks", type=_ints, default=[8, 16, 32, 64], help="BMP block sizes (one build each)")
    p.add_argument("--bmp-alphas", type=_floats, default=[1.0, 0.9, 0.8, 0.7, 0.6, 0.5],
                   help="BMP alpha values (blocks scored while alpha x bound > k-th score)")
    p.add_argument("--bmp-betas", type=_floats, default=[1.0, 0.8, 0.6, 0.4, 0.3],
                   help="BMP beta values (share of query terms kept)")
    p.add_argument("--kannolo-flat", action=argparse.BooleanOptionalAction, default=True,
                   help="kANNolo's exhaustive SparseFlatIndex rows (the exact check)")
    p.add_argument("--kannolo-m", type=_ints, default=[16, 32], help="kANNolo HNSW M values (one build each)")
    p.add_argument("--kannolo-efc", type=int, default=200, help="kANNolo HNSW efConstruction")
    p.add_argument("--kannolo-ef", type=_ints, default=[10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512],
                   help="kANNolo HNSW efSearch values")
    p.add_argument("--hnsw-m", type=int, default=32, help="Faiss HNSW M (as `mmsparse index`)")
    p.add_argument("--ef-construction", type=int, default=200, help="Faiss HNSW efConstruction (as `mmsparse index`)")
    p.add_argument("--ef-search", type=_ints, default=[10, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 256, 384,
                                                        512], help="Faiss HNSW efSearch values (the same granularity "
                   "as --kannolo-ef)")
    p.add_argument("--hnsw-max-random", type=int, default=200_000,
                   help="synthetic: skip HNSW over random unit vectors above this many documents (0 = never)")
    p.add_argument("--dense-synthetic", type=_strs, default=["random", "gaussian"], help="synthetic dense kinds")
    p.add_argument("--e2e-pisa", default="auto", help="endtoend: PISA algorithm (auto: the pisa job's fastest on "
                   "the query mode at this scale, else maxscore)")
    p.add_argument("--e2e-seismic", default="auto", help="endtoend: Seismic query_cut:heap_factor[:n_knn] on the "
                   "scale's --seismic-build (auto: the seismic jobs' fastest configuration with overlap@10 >= "
                   "--e2e-min-overlap on the head's primary queries, its build included, else 10:0.8; none: PISA only, "
                   "no Seismic build)")
    p.add_argument("--e2e-bmp", default="auto", help="endtoend: BMP BLOCK:ALPHA:BETA (auto: the bmp job's fastest "
                   "row with overlap@10 >= --e2e-min-overlap on the head's primary queries; none: no BMP rows)")
    p.add_argument("--e2e-kannolo", default="auto", help="endtoend: kANNolo M:EF (auto: the kannolo job's fastest "
                   "HNSW row with overlap@10 >= --e2e-min-overlap on the head's primary queries; none: no rows)")
    p.add_argument("--e2e-ef-search", default="auto", help="endtoend: HNSW efSearch (auto: the faiss-hnsw job's "
                   "fastest with overlap@10 >= --e2e-min-overlap at this scale, else 64)")
    p.add_argument("--e2e-min-overlap", type=float, default=0.95, help="endtoend: overlap@10 the auto choices need")
    p.add_argument("--model", default=None, help="endtoend: the text tower's model (default: the `model` of the "
                   "dense captions file)")
    p.add_argument("--seed", type=int, default=0, help="seed of the query sample and synthetic collections")
    p.add_argument("--tag", default="", help="write the jobs' rows to JOB-TAG.json beside JOB.json (an extra run, "
                   "e.g. one more lever build, that keeps the earlier rows)")
    return p.parse_args(argv)


def _stale(d: dict, current: tuple[list, int | None]) -> bool:
    """Whether a saved job (its rows and info) was measured on other documents than the scale's
    current collection: another file stamp, or (jobs saved before stamps) another document count."""
    stamp, ndocs = current
    if "collection" in d["info"]:
        return d["info"]["collection"] != stamp
    return ndocs is not None and any(r.get("docs") not in (None, ndocs) for r in d["rows"])


def collect(out: Path, groups: list[str], scales: list[str], current: dict | None = None,
            log=print) -> tuple[list[dict], dict]:
    """Rows and job infos of every group (a head's directory, or "dense") and scale (job order
    fixed); rows get the group's head (None for dense). current: {(group, scale): (collection
    stamp, document count)} of what this run measured; jobs saved from an earlier version of the
    collection are left out (with a line saying so), since their rows would mix two document sets
    in one table."""
    rows, infos = [], {}
    for g in groups:
        for s in scales:
            d0 = out / g / s
            for job in JOBS:
                longer = [j for j in JOBS if j.startswith(job + "-")]  # pisa -> pisa-levers: not a tag of pisa
                for f in [d0 / f"{job}.json"] + sorted(d0.glob(f"{job}-*.json")):
                    if not f.is_file() or any(f.stem == j or f.stem.startswith(j + "-") for j in longer):
                        continue
                    d = json.loads(f.read_text())
                    if current and (g, s) in current and _stale(d, current[(g, s)]):
                        tag = f" --tag {f.stem[len(job) + 1:]}" if f.stem != job else ""
                        log(f"[{s}] {g} {f.stem}: measured on an earlier version of the collection; left out "
                            f"(re-run it with --jobs {job}{tag})")
                        continue
                    for r in d["rows"]:
                        r.setdefault("head", None if g == DENSE else g)
                    rows += d["rows"]
                    infos.setdefault(s, {})[f"{g}/{f.stem}"] = d["info"]
    return rows, infos


def _ndocs(sc: Scale) -> int | None:
    """Documents of the scale's collection (its sparse file, else its dense one)."""
    import h5py

    f = sc.sparse_docs if sc.sparse_docs is not None else sc.dense_docs
    if f is None or not Path(f).is_file():
        return None
    with h5py.File(f, "r") as h:
        return int(h["ids"].shape[0])


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out = args.out or args.work / "bench"
    args.collections = args.collections or str(args.out / "{head}" / "collections")
    args.dense_collections = args.dense_collections or args.work / "bench" / "collections"
    if DENSE in args.heads:
        raise SystemExit(f"--heads: {DENSE!r} names the dense side's directory; rename that head")
    from ...formats.sparse import read_sparse_attrs  # noqa: F401  (fail early on a broken install)
    import h5py

    with h5py.File(require_file(args.work / "dense" / args.backbone / f"{args.split}-captions.h5",
                                "dense captions (the queries)"), "r") as f:
        nq = int(f["ids"].shape[0])
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    current = {}
    for label in args.scales:
        sides = {DENSE: scale_spec(label, args, nq), **{h: scale_spec(label, args, nq, h) for h in args.heads}}
        for job in args.jobs:
            if job in LEVER_JOBS and label not in args.lever_scales:
                continue
            if job == "endtoend" and label.startswith("synthetic-"):
                print(f"[{label}] {job}: skipped (synthetic documents have no images to find)", flush=True)
                continue
            where = SIDES.get(job, ("heads",))
            for g in ([DENSE] if "dense" in where else []) + (list(args.heads) if "heads" in where else []):
                sc = sides[g]
                ks = [ENDTOEND_K] if job == "endtoend" else sc.ks
                print(f"[{label}] {g} {job}: {len(sc.sample)} queries, k = {ks}", flush=True)
                t0 = time.time()
                in_child(_one_thread_job, job, sc)
                print(f"[{label}] {g} {job}: {time.time() - t0:.0f} s", flush=True)
        for g, sc in sides.items():
            n = _ndocs(sc)
            if n is not None:
                current[(g, label)] = (collection_stamp(sc), n)
    args.out.mkdir(parents=True, exist_ok=True)
    # every head measured here or before (a directory holding job results), then the dense side
    earlier = sorted(d.name for d in args.out.iterdir() if d.is_dir() and d.name not in (*args.heads, DENSE)
                     and any(d.glob("*/exhaustive*.json")))
    groups = [*args.heads, *earlier, DENSE]
    seen = {p.name for g in groups if (args.out / g).is_dir() for p in (args.out / g).iterdir() if p.is_dir()}
    others = sorted(x for x in seen if x.startswith("synthetic-"))
    all_scales = [s for s in dict.fromkeys(list(REAL_SCALES) + args.scales + others) if s in seen]
    rows, infos = collect(args.out, groups, all_scales, current)
    meta = {"machine": machine(), "engine_versions": engine_versions(), "last_run_started": started,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "jobs": infos, "goals": goals(rows)}
    (args.out / "search.json").write_text(json.dumps(rows, indent=1))
    (args.out / "search.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    md = search_md(rows, all_scales, args.ks, meta["goals"])
    (args.out / "search.md").write_text(md)
    real = [r for r in rows if r["scale"] in REAL_SCALES and not r.get("endtoend")]
    if real:
        frontier_plot(real, args.out / "frontier.png")
    syn = [r for r in rows if r["scale"].startswith("synthetic-")]
    if syn:
        frontier_plot(syn, args.out / "frontier-synthetic.png")
    print(md)
