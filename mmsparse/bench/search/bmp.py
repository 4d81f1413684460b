"""The BMP job of the search benchmark: `bmp` (one build per --bmp-blocks block size, each searched
at every --bmp-alphas x --bmp-betas, smallest k). Rows time `BmpSearcher.search_one` per query like
every engine's: BMP's call (which allocates its 65,537 score buckets each time) with mmsparse's block
bounds, last-block completion and fill (indexes/bmp_exact.py); `fallbacks` counts the queries BMP
would have panicked on, `completions` those the completion steps ran for."""

from __future__ import annotations

import gc
from pathlib import Path

from .harness import Scale, _cached_index, _row_fn, _save, _warm_fn, index_bytes, lean_job_inputs, \
    postings_per_query


def bmp_build(sc: Scale, block: int) -> tuple[Path, dict, float | None]:
    """The BMP index of the scale's documents with `block` documents per block (--bmp-bits)."""
    from ...indexes.bmp import build_bmp_index

    bits = sc.settings["bmp_bits"]
    return _cached_index(sc, f"bmp-b{bits}-block{block}", build_bmp_index, [sc.sparse_docs],
                         dict(quant_bits=bits, block_size=block))


def job_bmp(sc: Scale) -> dict:
    """Every block size x alpha x beta on the primary queries at the smallest k; each row keeps its
    build (`build`: block size) and search settings (`search`: alpha, beta) for the end-to-end job."""
    from ...indexes.bmp import BmpSearcher

    st = sc.settings
    q, df, rows = lean_job_inputs(sc)
    ndocs = rows.ndocs
    k0, nw, metas = min(sc.ks), len(sc.warm), {}
    for block in st["bmp_blocks"]:
        d, meta, brss = bmp_build(sc, block)
        metas[f"block={block}"] = meta
        bs = BmpSearcher(d)
        common = {"build_s": meta["build_seconds"], "build_rss_mb": brss, "index": d.name,
                  "bytes_per_doc": round(index_bytes(d, "bmp") / ndocs, 1),
                  "postings_per_query": postings_per_query(df, q["main"]), "build": {"block_size": block},
                  "quant_bound": meta["quantization"]["bound"]}
        for alpha in st["bmp_alphas"]:
            for beta in st["bmp_betas"]:
                bs.alpha, bs.beta, bs.fallbacks, bs.completions = alpha, beta, 0, 0
                rows.run("bmp", f"block={block} a={alpha} b={beta}", k0, _row_fn(bs, q["main"]),
                         _warm_fn(lambda x: _row_fn(bs, x), q["main_warm"], nw), None,
                         search={"alpha": alpha, "beta": beta}, **common)
                rows.rows[-1].update(fallbacks=bs.fallbacks, completions=bs.completions)
        del bs
        gc.collect()
    return _save(sc, "bmp", rows.rows, {"indexes": metas})
