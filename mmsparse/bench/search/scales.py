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


def scale_spec(label: str, args, nq_ids: int) -> Scale:
    sd = args.work / "sparse" / args.head
    dd = args.work / "dense" / args.backbone
    qe, qc = sd / f"{args.split}-captions.expand.h5", sd / f"{args.split}-captions.caption-terms.h5"
    dq, qrels = dd / f"{args.split}-captions.h5", dd / f"{args.split}.qrels"
    n = int(args.queries.get(label, args.queries.get("*", 300)))
    perm = np.random.default_rng(args.seed).permutation(nq_ids)
    # warm-up queries: the permutation's last ones (outside the sample unless it holds them all)
    sample, warm = np.sort(perm[:min(n, nq_ids)]), perm[::-1][:min(args.warmup, nq_ids)]
    settings = {"warmup": len(warm), "build_threads": args.build_threads, "reuse": args.reuse, "tag": args.tag,
                **{k: getattr(args, k) for k in ("pisa_bits", "pisa_block", "pisa_algorithms", "prune_algorithms",
                                                 "query_top_n", "query_min_weight", "query_bits", "qbits_algorithm",
                                                 "candidates",
                                                 "pisa_levers", "lever_algorithms", "seismic_build", "seismic_cuts",
                                                 "seismic_heaps", "seismic_at_k", "seismic_levers",
                                                 "lever_seismic_cuts", "seismic_n_knn", "hnsw_m",
                                                 "ef_construction", "ef_search", "hnsw_max_random")}}
    common = dict(label=label, out=args.out / label, qe=qe, qc=qc, dq=dq, sample=sample, warm=warm, ks=sorted(args.ks),
                  settings=settings)
    if label == "flickr8k":
        return Scale(sparse_docs=sd / f"{args.split}-images.h5", dense_docs=dd / f"{args.split}-images.h5",
                     qrels=qrels, **common)
    if label in ("123k", "1m"):
        return Scale(sparse_docs=args.collections / f"{label}.h5",
                     dense_docs=args.dense_collections / f"{label}.dense.h5", qrels=qrels, **common)
    if label.startswith("synthetic-"):
        nd = int(label.split("-", 1)[1])
        data = args.out / label / "data"
        sfile, _ = write_synthetic(sd / f"{args.split}-images.h5", qe, qc, nd, data, args.seed)
        fit = [dd / f"{args.split}-images.h5"] + ([dd / "train-images.h5"] if (dd / "train-images.h5").is_file() else [])
        kinds = {k: write_synthetic_dense(fit, nd, data, k, args.seed) for k in args.dense_synthetic}
        return Scale(sparse_docs=sfile, dense_docs=None, qrels=None, synthetic=True, dense_kinds=kinds, **common)
    raise InputError(f"--scales: {label!r} unknown; use flickr8k, 123k, 1m or synthetic-N")


def write_synthetic(real_docs: Path, qe: Path, qc: Path, n: int, out: Path, seed: int) -> tuple[Path, dict]:
    """The sparse synthetic collection of n documents in out/docs.h5 (kept) + its figures."""
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
