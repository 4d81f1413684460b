"""The PISA jobs of the search benchmark: `pisa` (every algorithm on every query mode of the head,
pruned and quantised primary queries, two-stage re-scoring for a head with caption-term and
expanded queries) and `pisa-levers` (more builds: quantisation bits, block size, posting codec)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ...errors import InputError
from .harness import (Rows, Scale, _cached_index, _row_fn, _save, _sparse_job_inputs, _warm_fn, index_bytes,
                      mode_label, pool_batch, postings_per_query)


def prune_relative(q: sp.csr_matrix, frac: float) -> sp.csr_matrix:
    """Keep each row's weights >= frac x the row's largest weight. CSR in, CSR out."""
    q = sp.csr_matrix(q, copy=True)
    if q.nnz:
        mx = np.maximum.reduceat(q.data, q.indptr[:-1][np.diff(q.indptr) > 0])
        rowmax = np.zeros(q.shape[0], dtype=q.data.dtype)
        rowmax[np.diff(q.indptr) > 0] = mx
        q.data[q.data < frac * np.repeat(rowmax, np.diff(q.indptr))] = 0
        q.eliminate_zeros()
    return q


def _pisa_build(sc: Scale, name: str, bits: int, block: int, encoding: str) -> tuple[Path, dict, float | None]:
    """Build (or reuse) a PISA index in a child process; returns (dir, meta, build peak RSS MB)."""
    from ...indexes.pisa import build_pisa_index

    return _cached_index(sc, name, build_pisa_index, [sc.sparse_docs],
                         dict(quant_bits=bits, block_size=block, index_encoding=encoding,
                              threads=sc.settings["build_threads"]))


def pisa_default_build(sc: Scale) -> tuple[Path, dict, float | None]:
    """The pisa job's index (--pisa-bits, --pisa-block, block_simdbp), built or reused."""
    st = sc.settings
    return _pisa_build(sc, f"pisa-b{st['pisa_bits']}-k{st['pisa_block']}-block_simdbp", st["pisa_bits"],
                       st["pisa_block"], "block_simdbp")


def job_pisa(sc: Scale) -> dict:
    """PISA algorithms on every query mode, query pruning and query bits on the primary mode, and
    two-stage (caption terms first, expanded re-score) when the head has both."""
    from ...indexes.pisa import PisaSearcher
    from ...indexes.rescore import prune_rows, rescore_one

    st = sc.settings
    q, D, doc_ids, exact, df = _sparse_job_inputs(sc)
    d, meta, brss = pisa_default_build(sc)
    ps = PisaSearcher(d, threads=1)
    ps._forward = D
    rows = Rows(sc, q, doc_ids, D.shape[0], exact)
    n, nw = len(sc.sample), len(sc.warm)
    common = {"build_s": meta["build_seconds"], "build_rss_mb": brss, "bytes_per_doc": round(index_bytes(d, "pisa") / D.shape[0], 1),
              "index": d.name}
    qe, lab = q["main"], mode_label(sc.primary)

    def batch_of(qm, algo):
        def b(k):
            ps.threads, ps.query_algorithm = 2, algo
            try:
                ps.search(qm, k)
            finally:
                ps.threads, ps.query_algorithm = 1, algo
        return b

    def one(mode, qm, qwarm, algo, ks, query_mode=None, **extra):
        ps.query_algorithm = algo
        for k in ks:
            ps.query_algorithm = algo
            rows.run("pisa", mode, k, _row_fn(ps, qm), _warm_fn(lambda x: _row_fn(ps, x), qwarm, nw),
                     batch_of(qm, algo), query_mode=query_mode, postings_per_query=postings_per_query(df, qm),
                     algorithm=algo, **common, **extra)

    for m in q["modes"]:  # every algorithm on every query mode (overlap: against the primary mode's ranking)
        for algo in st["pisa_algorithms"]:
            one(f"{mode_label(m)} {algo}", q["q"][m], q["q_warm"][m], algo, sc.ks, query_mode=m)
    k0, qw = min(sc.ks), q["main_warm"]
    for algo in st["prune_algorithms"]:
        for top in st["query_top_n"]:
            one(f"{lab} top={top} {algo}", prune_rows(qe, top_n=top), prune_rows(qw, top_n=top), algo, [k0])
        for frac in st["query_min_weight"]:
            one(f"{lab} w>={frac}max {algo}", prune_relative(qe, frac), prune_relative(qw, frac), algo, [k0])
    for bits in st["query_bits"]:
        ps.query_bits = bits
        qa = st["qbits_algorithm"]
        one(f"{lab} qbits={bits} {qa}", qe, qw, qa, [k0], query_bits=bits)
    ps.query_bits = 8
    if not (sc.primary == "expand" and "caption-terms" in q["q"]):
        return _save(sc, "pisa", rows.rows, {"index": meta})
    qc = q["q"]["caption-terms"]
    # two-stage: caption terms (PISA block-max WAND) for c candidates, exact re-score with the expanded query
    fbytes = round(index_bytes(d, "pisa", with_forward=True) / D.shape[0], 1)

    def two(qcm, qem, c):
        def f(j, k):
            s, e = qcm.indptr[j], qcm.indptr[j + 1]
            cand = ps.search_one(qcm.indices[s:e], qcm.data[s:e], c)[0]
            s, e = qem.indptr[j], qem.indptr[j + 1]
            return rescore_one(qem.indices[s:e], qem.data[s:e], D, cand, k)[0]
        return f

    ps.query_algorithm = "block_max_wand"
    for c in st["candidates"]:
        fn = two(qc, qe, c)
        for k in [k for k in sc.ks if k <= c]:
            warm = two(q["q_warm"]["caption-terms"], qw, c)
            # the final ranking is the expanded query's (re-scored exactly): query_mode expand
            rows.run("two-stage", f"c={c}", k, fn, lambda k, warm=warm: [warm(j, k) for j in range(nw)],
                     pool_batch(fn, n), postings_per_query=postings_per_query(df, qc), algorithm="block_max_wand",
                     **{**common, "bytes_per_doc": fbytes})
    return _save(sc, "pisa", rows.rows, {"index": meta})


def job_pisa_levers(sc: Scale) -> dict:
    """Extra PISA builds (quantisation bits, block size, codec) x --lever-algorithms at the smallest k."""
    from ...indexes.pisa import PisaSearcher

    st = sc.settings
    q, D, doc_ids, exact, df = _sparse_job_inputs(sc)
    rows = Rows(sc, q, doc_ids, D.shape[0], exact)
    nw, k0 = len(sc.warm), min(sc.ks)
    metas = {}
    for lever in st["pisa_levers"]:
        bits, block, enc = st["pisa_bits"], st["pisa_block"], "block_simdbp"
        key, val = lever.split("=")
        if key == "bits":
            bits = int(val)
        elif key == "block":
            block = int(val)
        elif key == "encoding":
            enc = val
        else:
            raise InputError(f"--pisa-levers: {lever!r}: use bits=N, block=N or encoding=NAME")
        d, meta, brss = _pisa_build(sc, f"pisa-b{bits}-k{block}-{enc}", bits, block, enc)
        metas[lever] = meta
        ps = PisaSearcher(d, threads=1)
        for algo in st["lever_algorithms"]:
            ps.query_algorithm = algo

            def batch(k, ps=ps, algo=algo):
                ps.threads = 2
                ps.search(q["main"], k)
                ps.threads = 1
            rows.run("pisa", f"{mode_label(sc.primary)} {algo} {lever}", k0, _row_fn(ps, q["main"]),
                     _warm_fn(lambda x, ps=ps: _row_fn(ps, x), q["main_warm"], nw), batch,
                     postings_per_query=postings_per_query(df, q["main"]), algorithm=algo, lever=lever,
                     build_s=meta["build_seconds"], build_rss_mb=brss, index=d.name,
                     bytes_per_doc=round(index_bytes(d, "pisa") / D.shape[0], 1),
                     dropped_postings=meta.get("dropped_postings"))
        del ps
        gc.collect()
    return _save(sc, "pisa-levers", rows.rows, {"indexes": metas})
