"""The Seismic jobs of the search benchmark: `seismic` (query_cut x heap_factor on one build) and
`seismic-levers` (more builds: n_postings, max_fraction, centroid_fraction, summary_energy, a k-NN
graph with n_knn, DotVByte)."""

from __future__ import annotations

import gc
from pathlib import Path

from .harness import Scale, _cached_index, _row_fn, _save, _warm_fn, index_bytes, lean_job_inputs, \
    postings_per_query


def _seismic_build(sc: Scale, params: dict) -> tuple[Path, dict, float | None]:
    from ...indexes.seismic import build_seismic_index

    name = "seismic-" + "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    return _cached_index(sc, name, build_seismic_index, [sc.sparse_docs],
                         dict(threads=sc.settings["build_threads"], **params))


def _seismic_rows(sc, rows, q, df, d, meta, brss, grid, at_k, label="", build=None):
    """Rows of one Seismic build (its parameters `build`, kept in each row so the end-to-end job can
    reopen the same index) at every (query_cut, heap_factor, n_knn) of grid (smallest k) and at_k."""
    from ...indexes.seismic import SeismicSearcher

    ss = SeismicSearcher(d, threads=1)
    nw = len(sc.warm)
    common = {"build_s": meta["build_seconds"], "build_rss_mb": brss, "index": d.name,
              "bytes_per_doc": round(index_bytes(d, "seismic") / rows.ndocs, 1),
              "postings_per_query": postings_per_query(df, q["main"]), "build": build}
    for (qcut, hf, nknn), ks in [(g, [min(sc.ks)]) for g in grid] + [(g, [k for k in sc.ks if k > min(sc.ks)])
                                                                     for g in at_k]:
        ss.query_cut, ss.heap_factor, ss.n_knn = qcut, hf, nknn

        def batch(k, ss=ss):
            ss.threads = 2
            ss.search(q["main"], k)
            ss.threads = 1
        for k in ks:
            rows.run("seismic", f"qc={qcut} hf={hf}" + (f" knn={nknn}" if nknn else "") + label, k,
                     _row_fn(ss, q["main"]), _warm_fn(lambda x: _row_fn(ss, x), q["main_warm"], nw), batch,
                     query_cut=qcut, heap_factor=hf, n_knn=nknn, **common)
    del ss
    gc.collect()


def _parse_kv(s: str) -> dict:
    """'n_postings=4000,max_fraction=1.5' -> dict with int/float/str values."""
    out = {}
    for part in (p for p in s.split(",") if p):
        k, v = part.split("=")
        for t in (int, float):
            try:
                out[k] = t(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out


def seismic_build_params(sc: Scale) -> dict:
    """The scale's Seismic build parameters (--seismic-build SCALE:..., else *:...)."""
    build = sc.settings["seismic_build"]
    return _parse_kv(build.get(sc.label, build["*"]))


def _seismic_job_inputs(sc: Scale):
    """(queries, document frequencies, an empty Rows, the scale's Seismic build parameters); the
    CSR documents are dropped before Seismic builds its own copy, to keep the peak RSS low."""
    return (*lean_job_inputs(sc), seismic_build_params(sc))


def job_seismic(sc: Scale) -> dict:
    st = sc.settings
    q, df, rows, params = _seismic_job_inputs(sc)
    d, meta, brss = _seismic_build(sc, params)
    grid = [(c, h, 0) for c in st["seismic_cuts"] for h in st["seismic_heaps"]]
    _seismic_rows(sc, rows, q, df, d, meta, brss, grid, [(c, h, 0) for c, h in st["seismic_at_k"]], build=params)
    return _save(sc, "seismic", rows.rows, {"index": meta})


def job_seismic_levers(sc: Scale) -> dict:
    st = sc.settings
    q, df, rows, base = _seismic_job_inputs(sc)
    metas = {}
    for lever in st["seismic_levers"]:
        params = {**base, **_parse_kv(lever)}
        d, meta, brss = _seismic_build(sc, params)
        metas[lever] = meta
        knn = int(params.get("knn", 0))
        grid = [(c, h, nk) for c in st["lever_seismic_cuts"] for h in st["seismic_heaps"]
                for nk in [0] + [n for n in st["seismic_n_knn"] if n <= knn]]
        _seismic_rows(sc, rows, q, df, d, meta, brss, grid, [], label=f" [{lever}]", build=params)
    return _save(sc, "seismic-levers", rows.rows, {"indexes": metas})
