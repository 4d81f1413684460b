"""The scales of the search benchmark: which documents, queries and qrels each one holds
(scale_spec), and the synthetic stress-test collections it writes for synthetic-N."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ...errors import InputError
from .harness import Scale


REAL_SCALES = ("flickr8k", "123k", "1m")
DENSE = "dense"   # the directory of the dense side under OUT (no head may have this name)


def head_query_modes(work: Path, head: str, split: str) -> list[str]:
    """The query modes of head HEAD, primary first: its method's (WORK/heads/HEAD/config.json, e.g.
    d2s: expand, caption-terms; inference-free: inference-free), else, without a head directory,
    the SPLIT-captions.MODE.h5 files of WORK/sparse/HEAD (expand or inference-free first,
    caption-terms last). InputError when neither names a mode."""
    cfg = work / "heads" / head / "config.json"
    if cfg.is_file():
        from ...methods import get_method   # imports torch in this orchestrating process only

        return list(get_method(json.loads(cfg.read_text())["method"]).query_modes)
    found = [f.name[len(f"{split}-captions."):-len(".h5")]
             for f in (work / "sparse" / head).glob(f"{split}-captions.*.h5")]
    order = {"expand": 0, "inference-free": 1, "caption-terms": 3}
    modes = sorted(found, key=lambda m: (order.get(m, 2), m))
    if not modes:
        raise InputError(f"head {head!r}: no {work / 'heads' / head / 'config.json'} and no "
                         f"{work / 'sparse' / head}/{split}-captions.MODE.h5 query files")
    return modes


def scale_spec(label: str, args, nq: int, head: str | None = None) -> Scale:
    """The Scale of `label` for head `head` (its sparse documents and query files) or, with head
    None, for the dense side. nq: rows of the dense captions file (the sample is drawn from them
    with --seed, so every head and the dense side time the same captions)."""
    dd = args.work / "dense" / args.backbone
    dq, qrels = dd / f"{args.split}-captions.h5", dd / f"{args.split}.qrels"
    n = int(args.queries.get(label, args.queries.get("*", 300)))
    perm = np.random.default_rng(args.seed).permutation(nq)
    # warm-up queries: the permutation's last ones (outside the sample unless it holds them all)
    sample, warm = np.sort(perm[:min(n, nq)]), perm[::-1][:min(args.warmup, nq)]
    settings = {"warmup": len(warm), "build_threads": args.build_threads, "reuse": args.reuse, "tag": args.tag,
                **{k: getattr(args, k) for k in ("pisa_bits", "pisa_block", "pisa_algorithms", "prune_algorithms",
                                                 "query_top_n", "query_min_weight", "query_bits", "qbits_algorithm",
                                                 "candidates",
                                                 "pisa_levers", "lever_algorithms", "seismic_build", "seismic_cuts",
                                                 "seismic_heaps", "seismic_at_k", "seismic_levers",
                                                 "lever_seismic_cuts", "seismic_n_knn", "bmp_bits", "bmp_blocks",
                                                 "bmp_alphas", "bmp_betas", "kannolo_flat", "kannolo_m",
                                                 "kannolo_efc", "kannolo_ef", "e2e_bmp", "e2e_kannolo", "hnsw_m",
                                                 "ef_construction", "ef_search", "hnsw_max_random",
                                                 "e2e_pisa", "e2e_seismic", "e2e_ef_search", "e2e_min_overlap",
                                                 "model")}}
    sd = args.work / "sparse" / head if head else None
    queries = {m: sd / f"{args.split}-captions.{m}.h5" for m in head_query_modes(args.work, head, args.split)} \
        if head else {}
    common = dict(label=label, out=args.out / (head or DENSE) / label, queries=queries, dq=dq, sample=sample,
                  warm=warm, ks=sorted(args.ks), settings=settings, head=head,
                  head_dir=args.work / "heads" / head if head else None, dense_out=args.out / DENSE / label)
    if label == "flickr8k":
        return Scale(sparse_docs=sd / f"{args.split}-images.h5" if head else None,
                     dense_docs=dd / f"{args.split}-images.h5", qrels=qrels, **common)
    if label in ("123k", "1m"):
        colls = Path(str(args.collections).replace("{head}", head)) if head else None
        return Scale(sparse_docs=colls / f"{label}.h5" if head else None,
                     dense_docs=args.dense_collections / f"{label}.dense.h5", qrels=qrels, **common)
    if label.startswith("synthetic-"):
        nd = int(label.split("-", 1)[1])
        if head:
            data = args.out / head / label / "data"
            sfile, _ = write_synthetic(sd / f"{args.split}-images.h5", next(iter(queries.values())), nd, data,
                                       args.seed)
            return Scale(sparse_docs=sfile, dense_docs=None, qrels=None, synthetic=True, **common)
        data = args.out / DENSE / label / "data"
        fit = [dd / f"{args.split}-images.h5"] + [f for f in [dd / "train-images.h5"] if f.is_file()]
        kinds = {k: write_synthetic_dense(fit, nd, data, k, args.seed) for k in args.dense_synthetic}
        return Scale(sparse_docs=None, dense_docs=None, qrels=None, synthetic=True, dense_kinds=kinds, **common)
    raise InputError(f"--scales: {label!r} unknown; use flickr8k, 123k, 1m or synthetic-N")


def write_synthetic(real_docs: Path, qe: Path, n: int, out: Path, seed: int) -> tuple[Path, dict]:
    """The sparse synthetic collection of n documents in out/docs.h5 (kept) + its figures against
    the queries qe (a sparse query file)."""
    from ...formats.sparse import read_sparse, write_sparse
    from ..collection import collection_stats
    from ..synthetic import synthesize

    out.mkdir(parents=True, exist_ok=True)
    sfile, stats_file = out / "docs.h5", out / "stats.json"
    if sfile.is_file() and stats_file.is_file():
        return sfile, json.loads(stats_file.read_text())
    real = read_sparse(real_docs)
    t0 = time.time()
    m = synthesize(real.matrix, n, seed=seed)
    stats = {"generate_s": round(time.time() - t0, 1), "seed": seed,
             "synthetic": collection_stats(m, read_sparse(qe).matrix, real.vocab)}
    write_sparse(sfile, [f"syn{i:07d}" for i in range(n)], m, real.vocab,
                 {"modality": "image", "head": real.attrs.get("head", ""), "query_mode": "doc",
                  "dataset": f"synthetic-{n}", "split": "synthetic", "method": "mmsparse.bench.synthetic",
                  "seed": seed})
    stats_file.write_text(json.dumps(stats, indent=2))
    return sfile, stats


def write_synthetic_dense(fit_files: list[Path], n: int, out: Path, kind: str, seed: int) -> Path:
    """n synthetic dense documents in out/dense-KIND.h5 (kept): `random` uniform unit vectors, or
    `gaussian` x ~ N(mu, Sigma) fitted to the real image vectors, L2-normalised."""
    from ...formats.dense import DenseWriter, read_dense
    from ..collection import sqrt_psd, unit
    from ..synthetic import random_unit

    out.mkdir(parents=True, exist_ok=True)
    dfile = out / f"dense-{kind}.h5"
    if dfile.is_file():
        return dfile
    first = read_dense(fit_files[0])
    x = np.concatenate([first.vectors] + [read_dense(f).vectors for f in fit_files[1:]]).astype(np.float64)
    dim = x.shape[1]
    if kind == "random":
        chunks = random_unit(n, dim, seed=seed + 1)
    else:
        mu, root = x.mean(axis=0).astype(np.float32), sqrt_psd(np.cov(x, rowvar=False))
        rng = np.random.default_rng(seed + 2)

        def gen(chunk=65536):
            for s in range(0, n, chunk):
                yield unit(rng.standard_normal((min(chunk, n - s), dim), dtype=np.float32) @ root.T + mu)
        chunks = gen()
    with DenseWriter(dfile, dim, {"modality": "image", "backbone": first.attrs["backbone"],
                                  "model": f"synthetic-{kind}", "dataset": f"synthetic-{n}", "split": "synthetic",
                                  "normalized": True}) as w:
        s = 0
        for z in chunks:
            w.append([f"syn{i:07d}" for i in range(s, s + len(z))], z)
            s += len(z)
    return dfile
