"""The report of the search benchmark: the machine, search.md's tables (the search-only rows, the
summary a reader needs per scale and k, the end-to-end rows), and issues 17's and 25's goals. The
frontier plot is in frontier.py."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


SPARSE_ENGINES = ("pisa", "two-stage", "seismic", "bmp", "kannolo", "milvus-sparse")


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":")[1].strip()
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "memory": mem, "arch": platform.machine(),
            "python": platform.python_version(), "load_avg": os.getloadavg()}


ENGINE_PACKAGES = ("pyterrier-pisa", "pyseismic-lsr", "bmp", "kannolo", "faiss-cpu", "faiss-gpu", "pymilvus",
                   "milvus-lite", "numpy", "scipy")


def engine_versions() -> dict:
    """{package: installed version} of every search engine the benchmark times (absent ones left
    out), for search.meta.json: a measurement names the engine builds it measured."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ENGINE_PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


COLUMNS = ("head", "engine", "mode", "k", "queries", "p50_ms", "p99_ms", "qps_1t", "qps_2t", "R@10", "S@10",
           "overlap@10", "overlap@k", "postings_per_query", "build_s", "bytes_per_doc", "rss_mb", "build_rss_mb")


def search_only(rows: list[dict]) -> list[dict]:
    """The search-only rows (queries read from the sparse / dense files), without the end-to-end ones."""
    return [r for r in rows if not r.get("endtoend")]


def markdown(rows: list[dict], columns=COLUMNS) -> str:
    """One markdown table per scale."""
    out = []
    for scale in dict.fromkeys(r["scale"] for r in rows):
        sub = [r for r in rows if r["scale"] == scale]
        out.append(f"\n### {scale} ({sub[0]['docs']} documents)\n\n| " + " | ".join(columns) + " |\n|"
                   + "---|" * len(columns))
        for r in sub:
            out.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in columns) + " |")
    return "\n".join(out) + "\n"


SUMMARY_COLUMNS = ("head", "engine", "mode", "p50_ms", "p99_ms", "qps_1t", "qps_2t", "R@10", "S@10", "overlap@10",
                   "postings_per_query", "build_s", "bytes_per_doc", "rss_mb")


def _fastest(rows: list[dict], min_overlap: float | None = None) -> dict | None:
    ok = [r for r in rows if min_overlap is None or (r.get("overlap@10") or 0) >= min_overlap]
    return min(ok, key=lambda r: r["p50_ms"], default=None)


def _heads(rows: list[dict]) -> list[str]:
    return [h for h in dict.fromkeys(r.get("head") for r in rows) if h is not None]


def summary(rows: list[dict], scale: str, k: int = 10, min_overlap: float = 0.95) -> list[dict]:
    """The search-only rows a reader needs at one scale and k: Faiss Flat, then per head its
    exhaustive reference, every PISA algorithm on its primary queries, the fastest PISA row of
    each other query mode, and per engine family the fastest row with overlap@10 >= min_overlap
    plus the fastest row overall (pruned PISA queries, two-stage, Seismic, Milvus); then HNSW's."""
    sub = [r for r in search_only(rows) if r["scale"] == scale and r["k"] == k]
    out = [r for r in sub if r["engine"] == "faiss-flat"]

    def add_families(fams, pool):
        for f in fams:
            fam = [r for r in pool if f(r)]
            for r in (_fastest(fam, min_overlap), _fastest(fam)):
                if r is not None and r not in out:
                    out.append(r)
    for h in _heads(sub):
        hs = [r for r in sub if r.get("head") == h]
        ex = [r for r in hs if r["engine"] == "exhaustive"]
        primary = ex[0].get("query_mode") if ex else None
        out += ex
        full = [r for r in hs if r["engine"] == "pisa" and r["mode"].count(" ") == 1]
        out += [r for r in full if r.get("query_mode", primary) == primary]
        for m in dict.fromkeys(r.get("query_mode") for r in full if r.get("query_mode", primary) != primary):
            out.append(_fastest([r for r in full if r.get("query_mode") == m]))
        add_families([lambda r: r["engine"] == "pisa" and r["mode"].count(" ") > 1,
                      lambda r: r["engine"] == "two-stage", lambda r: r["engine"] == "seismic",
                      lambda r: r["engine"] == "bmp", lambda r: r["engine"] == "kannolo",
                      lambda r: r["engine"] == "milvus-sparse"], hs)
    add_families([lambda r: r["engine"] == "faiss-hnsw", lambda r: r["engine"] == "milvus-dense"],
                 [r for r in sub if r.get("head") is None or r["engine"] == "milvus-dense"])
    return out


QUERY_NAMES = {"dense": "dense (text tower)", "expand": "D2S expanded", "caption-terms": "D2S caption terms",
               "inference-free": "inference-free"}
ENDTOEND_COLUMNS = ("query", "head", "engine", "mode", "encode_p50_ms", "search_p50_ms", "p50_ms", "p90_ms", "p99_ms",
                    "qps_1t", "overlap@10", "R@10", "file_match", "torch_loaded", "choice")


def endtoend_md(rows: list[dict]) -> str:
    """The end-to-end rows (text in, top-10 ids out, encoder included), one table per scale."""
    e2e = [{**r, "query": QUERY_NAMES.get(r["query_mode"], r["query_mode"])} for r in rows if r.get("endtoend")]
    order = list(QUERY_NAMES)
    e2e.sort(key=lambda r: (order.index(r["query_mode"]) if r["query_mode"] in order else len(order), r["engine"]))
    return markdown(e2e, ENDTOEND_COLUMNS) if e2e else "\n(no end-to-end rows)\n"


EDGE_ENGINES = ("exhaustive", "pisa", "seismic", "bmp", "kannolo", "two-stage", "milvus-sparse", "faiss-flat",
                "faiss-hnsw", "milvus-dense")
EDGE_COLUMNS = ("head", "query_mode", "engine", "mode", "p50_ms", "p99_ms", "x_hnsw", "overlap@10",
                "R@10", "postings_per_query", "build_s", "bytes_per_doc", "rss_mb", "edge")


def edges(rows: list[dict], scale: str, k: int = 10, min_overlap: float = 0.95) -> list[dict]:
    """Per head, query mode and engine at `scale`: its fastest search-only row with overlap@10 >=
    min_overlap, with `x_hnsw` (its p50 over the fastest Faiss HNSW row's at that overlap) and
    `edge`: whether a faster setting of the same engine was measured below the overlap (the
    setting is then a measured edge) or not (the grid's corner: a faster one may still hold it)."""
    sub = [r for r in search_only(rows) if r["scale"] == scale and r["k"] == k and "[" not in r["mode"]]
    hn = _fastest([r for r in sub if r["engine"] == "faiss-hnsw"], min_overlap)
    out = []
    groups = dict.fromkeys((r.get("head"), r.get("query_mode"), r["engine"]) for r in sub
                           if r["engine"] in EDGE_ENGINES)
    for h, qm, eng in sorted(groups, key=lambda g: (g[0] or "~", EDGE_ENGINES.index(g[2]), g[1] or "")):
        fam = [r for r in sub if (r.get("head"), r.get("query_mode"), r["engine"]) == (h, qm, eng)]
        best = _fastest(fam, min_overlap)
        if best is None:
            continue
        faster = [r for r in fam if r["p50_ms"] < best["p50_ms"]]
        edge = "exact" if eng in ("exhaustive", "faiss-flat") else (
            f"measured: {min(faster, key=lambda r: -r['overlap@10'])['mode']} is faster at overlap "
            f"{max(r['overlap@10'] for r in faster)}" if faster else "grid corner: nothing faster measured")
        out.append({**best, "x_hnsw": round(best["p50_ms"] / hn["p50_ms"], 2) if hn else None, "edge": edge})
    return out


def search_md(rows: list[dict], scales: list[str], ks: list[int], goal: dict) -> str:
    """search.md: per scale every engine's fastest setting at overlap@10 >= 0.95 (and whether that
    is a measured edge), the search-only summary of every scale at every k, the end-to-end table,
    all search-only rows, and the goals (JSON)."""
    so = search_only(rows)
    short = [r for s in scales for kk in sorted(ks) for r in summary(so, s, kk)]
    edge = [r for s in scales for r in edges(so, s)]
    by_scale = sorted([r for r in rows if r.get("endtoend")], key=lambda r: scales.index(r["scale"])
                      if r["scale"] in scales else len(scales))
    return ("## every engine at its fastest setting with overlap@10 >= 0.95 (k = 10, 1 thread)\n"
            + (markdown(edge, EDGE_COLUMNS) if edge else "\n(no rows)\n")
            + "\n## search only: summary (k = " + ", ".join(map(str, sorted(ks))) + ")\n"
            + markdown(short, SUMMARY_COLUMNS + ("k",))
            + "\n## end to end: caption text in, top-10 image ids out (1 thread, encoder included)\n"
            + endtoend_md(by_scale) + "\n## search only: all rows\n" + markdown(so)
            + "\n### goals\n\n```\n" + json.dumps(goal, indent=1) + "\n```\n")


PRIMARY_MODES = ("expand", "inference-free")   # the query types the search-only goal is about
GOAL_KEYS = ("head", "query_mode", "engine", "mode", "p50_ms", "overlap@10", "R@10")


def _brief(r: dict | None, keys=GOAL_KEYS) -> dict | None:
    return None if r is None else {kk: r.get(kk) for kk in keys}


def search_goal(rows: list[dict], scale: str, k: int = 10, bound: float = 3.0, min_overlap: float = 0.95) -> dict:
    """Search only, at `scale`, k, 1 thread: the fastest sparse row with overlap@10 >= min_overlap
    on expanded or inference-free queries (which one: its head and query_mode) against the fastest
    Faiss HNSW row at that overlap: met when its p50 <= bound x HNSW's. Also each head's fastest,
    and the sparse row's R@10 minus its head's exhaustive R@10."""
    sub = [r for r in search_only(rows) if r["scale"] == scale and r["k"] == k]
    sparse = [r for r in sub if r["engine"] in SPARSE_ENGINES and r.get("query_mode", "expand") in PRIMARY_MODES]
    best = _fastest(sparse, min_overlap)
    hn = _fastest([r for r in sub if r["engine"] == "faiss-hnsw" and "[" not in r["mode"]], min_overlap)
    out: dict = {"scale": scale, "k": k, "bound": f"sparse p50 <= {bound:g} x HNSW p50, both at overlap@10 >= "
                 f"{min_overlap}", "sparse": _brief(best), "hnsw": _brief(hn)}
    if best and hn:
        out["ratio_p50"] = round(best["p50_ms"] / hn["p50_ms"], 2)
        out["met"] = out["ratio_p50"] <= bound
    out["by_head"] = {h: _brief(_fastest([r for r in sparse if r.get("head") == h], min_overlap))
                      for h in _heads(sparse)}
    ex = next((r for r in sub if r["engine"] == "exhaustive" and best and r.get("head") == best.get("head")), None)
    if best and ex and ex.get("R@10") is not None and best.get("R@10") is not None:
        out["R@10_delta_vs_exhaustive"] = round(best["R@10"] - ex["R@10"], 2)
    return out


def endtoend_goal(rows: list[dict], scale: str, p50_ms: float, speedup: float | None = None,
                  min_overlap: float = 0.95) -> dict:
    """End to end at `scale`: the fastest inference-free row with overlap@10 >= min_overlap; met
    when its p50 <= p50_ms and (speedup given) the dense row's p50 >= speedup x its p50."""
    sub = [r for r in rows if r.get("endtoend") and r["scale"] == scale]
    free = [r for r in sub if r["query_mode"] == "inference-free"]
    best = _fastest(free, min_overlap)
    dense = _fastest([r for r in sub if r["query_mode"] == "dense"])
    bound = f"inference-free p50 <= {p50_ms:g} ms at overlap@10 >= {min_overlap}" + (
        f" and >= {speedup:g}x faster than dense" if speedup else "")
    out: dict = {"scale": scale, "bound": bound, "inference_free": _brief(best), "dense": _brief(dense)}
    if free and not best:   # measured, but no configuration reaches the overlap
        out["met"] = False
    elif best:
        met = best["p50_ms"] <= p50_ms
        if speedup and dense:
            out["speedup_vs_dense"] = round(dense["p50_ms"] / best["p50_ms"], 1)
            met = met and out["speedup_vs_dense"] >= speedup
        out["met"] = met if (dense or not speedup) else None
    return out


def ratio_goals(rows: list[dict], scale: str, min_overlap: float = 0.95) -> dict:
    """Issue 50's ratios at `scale` (k = 10, overlap@10 >= min_overlap each): the D2S head's
    expanded queries' fastest sparse search over the fastest HNSW (bound 1.5), the inference-free
    head's (bound 1), and the inference-free end-to-end p50 over dense end to end (bound 0.2)."""
    sub = [r for r in search_only(rows) if r["scale"] == scale and r["k"] == 10]
    hn = _fastest([r for r in sub if r["engine"] == "faiss-hnsw" and "[" not in r["mode"]], min_overlap)
    out: dict = {"scale": scale, "hnsw": _brief(hn)}
    for key, mode, bound in (("expand_vs_hnsw", "expand", 1.5), ("inference_free_vs_hnsw", "inference-free", 1.0)):
        best = _fastest([r for r in sub if r["engine"] in SPARSE_ENGINES and r.get("query_mode") == mode],
                        min_overlap)
        out[key] = {"sparse": _brief(best), "bound": bound}
        if best and hn:
            out[key].update(ratio=round(best["p50_ms"] / hn["p50_ms"], 2),
                            met=best["p50_ms"] <= bound * hn["p50_ms"])
    e2e = [r for r in rows if r.get("endtoend") and r["scale"] == scale]
    free = _fastest([r for r in e2e if r["query_mode"] == "inference-free"], min_overlap)
    dense = _fastest([r for r in e2e if r["query_mode"] == "dense"])
    out["endtoend_inference_free_vs_dense"] = {"inference_free": _brief(free), "dense": _brief(dense), "bound": 0.2}
    if free and dense:
        out["endtoend_inference_free_vs_dense"].update(ratio=round(free["p50_ms"] / dense["p50_ms"], 3),
                                                       met=free["p50_ms"] <= 0.2 * dense["p50_ms"])
    return out


def goals(rows: list[dict]) -> dict:
    """Issue 17's and 25's goals (None where the rows are not there yet):
    search_123k / search_1m: the fastest sparse configuration at overlap@10 >= 0.95 (expanded or
    inference-free queries) within 3x Faiss HNSW's p50; endtoend_123k: inference-free end to end
    p50 <= 1 ms at overlap@10 >= 0.95 and >= 10x faster than dense end to end; endtoend_1m: p50
    <= 3 ms; two_stage_R@10_delta: two-stage R@10 minus exhaustive R@10 per scale; ratios_SCALE:
    issue 50's ratios to HNSW and to dense end to end (ratio_goals)."""
    out = {"search_123k": search_goal(rows, "123k"), "search_1m": search_goal(rows, "1m"),
           "endtoend_123k": endtoend_goal(rows, "123k", 1.0, speedup=10.0),
           "endtoend_1m": endtoend_goal(rows, "1m", 3.0), "two_stage_R@10_delta": {},
           **{f"ratios_{s}": ratio_goals(rows, s) for s in ("flickr8k", "123k", "1m")}}
    so = search_only(rows)
    for s in dict.fromkeys(r["scale"] for r in so):
        e = next((r for r in so if r["scale"] == s and r["engine"] == "exhaustive" and r["k"] == 10
                  and r.get("query_mode", "expand") == "expand"), None)
        if e and e.get("R@10") is not None:
            out["two_stage_R@10_delta"][s] = {r["mode"]: round(r["R@10"] - e["R@10"], 2) for r in so
                                              if r["scale"] == s and r["engine"] == "two-stage" and r["k"] == 10}
    return out


