"""The kANNolo job of the search benchmark: `kannolo` (the exhaustive SparseFlatIndex as the exact
check, then one HNSW build per --kannolo-m, each searched at every --kannolo-ef, smallest k; the
largest k too at the efs >= it)."""

from __future__ import annotations

import gc
from pathlib import Path

from .harness import Scale, _cached_index, _row_fn, _save, _warm_fn, index_bytes, lean_job_inputs, \
    postings_per_query


def kannolo_build(sc: Scale, index_type: str, m: int = 32) -> tuple[Path, dict, float | None]:
    """The kANNolo index (flat, or hnsw with M `m` and --kannolo-efc) of the scale's documents."""
    from ...indexes.kannolo import build_kannolo_index

    st = sc.settings
    name = "kannolo-flat" if index_type == "flat" else f"kannolo-hnsw{m}-efc{st['kannolo_efc']}"
    return _cached_index(sc, name, build_kannolo_index, [sc.sparse_docs],
                         dict(index_type=index_type, m=m, ef_construction=st["kannolo_efc"],
                              threads=st["build_threads"]))


def job_kannolo(sc: Scale) -> dict:
    """Flat (exact) and every M x efSearch on the primary queries; rows keep `build` (index type,
    M) and `search` (ef_search) for the end-to-end job."""
    from ...indexes.kannolo import KannoloSearcher

    st = sc.settings
    q, df, rows = lean_job_inputs(sc)
    ndocs = rows.ndocs
    k0, nw, metas = min(sc.ks), len(sc.warm), {}
    builds = ([("flat", 0)] if st["kannolo_flat"] else []) + [("hnsw", m) for m in st["kannolo_m"]]
    for kind, m in builds:
        d, meta, brss = kannolo_build(sc, kind, m or 32)
        metas[kind if kind == "flat" else f"M={m}"] = meta
        ks = KannoloSearcher(d)
        common = {"build_s": meta["build_seconds"], "build_rss_mb": brss, "index": d.name,
                  "bytes_per_doc": round(index_bytes(d, "kannolo") / ndocs, 1),
                  "postings_per_query": postings_per_query(df, q["main"]),
                  "build": {"index_type": kind, "m": m or None}}

        def batch(k, ks=ks):
            ks.threads = 2
            ks.search(q["main"], k)
            ks.threads = 1
        for ef in ([None] if kind == "flat" else st["kannolo_ef"]):
            ks.ef_search = ef or 1
            for k in [k for k in sc.ks if k == k0 or (ef or k) >= k]:
                rows.run("kannolo", "flat" if kind == "flat" else f"M={m} ef={ef}", k, _row_fn(ks, q["main"]),
                         _warm_fn(lambda x: _row_fn(ks, x), q["main_warm"], nw), batch,
                         search={"ef_search": ef}, **common)
        del ks
        gc.collect()
    return _save(sc, "kannolo", rows.rows, {"indexes": metas})
