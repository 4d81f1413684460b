"""The search benchmark's frontier plot: p50 latency against overlap@10 with the exact top-10,
every engine of every head, one panel per scale (search-only rows, k = 10, 1 thread)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .report import SPARSE_ENGINES, search_only

ENGINE_STYLE = {"exhaustive": ("black", "s"), "pisa": ("tab:blue", "o"), "two-stage": ("tab:cyan", "D"),
                "seismic": ("tab:orange", "^"), "milvus-sparse": ("tab:purple", "X"), "faiss-flat": ("tab:gray", "P"),
                "bmp": ("tab:red", "*"), "kannolo": ("tab:olive", "p"),
                "faiss-hnsw": ("tab:green", "v"), "milvus-dense": ("tab:brown", "h")}
HEAD_LINES = ("-", "--", ":", "-.")   # one line style per head, in the order heads appear; markers of
                                      # the second and later heads are hollow

MISS_FLOOR = 1e-3  # overlap@10 >= 0.999 is drawn at this miss rate (the "exact" edge of the plot)
MISS_CEIL = 0.6    # overlap@10 < 0.4 is drawn at this miss rate (the left edge)


def _miss(ov: float) -> float:
    """The x coordinate of the frontier plot: 1 - overlap@10 clipped to [MISS_FLOOR, MISS_CEIL] (log axis)."""
    return min(max(1.0 - ov, MISS_FLOOR), MISS_CEIL)


def _staircase(pts: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The frontier through (overlap, p50) points: the fastest configuration at each overlap or
    better (the best p50 holds until a faster configuration's overlap is reached), over the
    overlaps the axis shows (rows clipped to the left edge keep their markers)."""
    fx, fy, best = [], [], float("inf")
    for ov, ms in sorted(pts, key=lambda p: -p[0]):
        if ms < best and ov >= 1 - MISS_CEIL:
            best = ms
            fx.append(_miss(ov))
            fy.append(ms)
    return fx, fy


def _head_name(rows: list[dict], head: str) -> str:
    """'d2s: expand queries' — a head and the query mode of its exhaustive reference."""
    ex = next((r for r in rows if r.get("head") == head and r["engine"] == "exhaustive"), None)
    return f"{head}: {ex['query_mode']} queries" if ex and ex.get("query_mode") else head


def frontier_plot(rows: list[dict], path: Path, k: int = 10) -> None:
    """p50 latency (log) vs overlap@10 per engine and head, one panel per scale (k = 10, 1 thread).

    The x axis is the miss rate 1 - overlap@10 on a log scale, reversed (right = closer to the
    exact top-10; ticks labelled with overlap@10), so the region the goals are about (overlap 0.9
    to 1) is wide. A sparse engine's overlap is against its own head's exhaustive ranking, a dense
    engine's against Faiss Flat. Each (engine, head) line is its frontier, a staircase; colour =
    engine, line style = head (hollow markers: the second head by name). The fastest sparse row of
    each head and the fastest HNSW row at overlap >= 0.95 are named in boxes; the dashed line is 3 x
    that HNSW p50. End-to-end rows are left out (they have their own table).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = search_only(rows)
    scales = list(dict.fromkeys(r["scale"] for r in rows))
    heads = sorted({r["head"] for r in rows if r.get("head") is not None})   # by name, not by run order
    line = {h: HEAD_LINES[i % len(HEAD_LINES)] for i, h in enumerate(heads)}
    width, height = max(9.0, 6.8 * len(scales)), 6.4
    fig, axes = plt.subplots(1, len(scales), figsize=(width, height), squeeze=False)
    ticks = [0.4, 0.8, 0.9, 0.95, 0.98, 0.99, 0.999]
    engines_seen = []
    for ax, s in zip(axes[0], scales):
        sub = [r for r in rows if r["scale"] == s and r["k"] == k and r.get("overlap@10") is not None]
        for eng, (color, marker) in ENGINE_STYLE.items():
            for h in [None, *heads]:
                pts = [(r["overlap@10"], r["p50_ms"]) for r in sub if r["engine"] == eng and r.get("head") == h]
                if not pts:
                    continue
                engines_seen.append(eng)
                ref = eng in ("exhaustive", "faiss-flat")
                hollow = h is not None and heads.index(h) > 0
                ax.scatter([_miss(o) for o, _ in pts], [ms for _, ms in pts], marker=marker, s=80 if ref else 30,
                           facecolors="none" if hollow else color, edgecolors=color if hollow or not ref else "black",
                           linewidths=1.0 if hollow else 0.6, alpha=0.85, zorder=5 if ref else 3)
                fx, fy = _staircase(pts)
                ax.plot(fx, fy, color=color, lw=1.4, alpha=0.8, zorder=2, drawstyle="steps-post",
                        ls=line.get(h, "-"))
        hn = [r for r in sub if r["engine"] == "faiss-hnsw" and r["overlap@10"] >= 0.95 and "[" not in r["mode"]]
        if hn:
            ax.axhline(1.5 * min(r["p50_ms"] for r in hn), color="tab:green", ls="--", lw=1)
            ax.axhline(min(r["p50_ms"] for r in hn), color="tab:green", ls=":", lw=1)
        # name the rows the goals compare: each head's fastest sparse row and the fastest HNSW row at >= 0.95
        boxes = [(f"fastest sparse, head {h},",
                  [r for r in sub if r["engine"] in SPARSE_ENGINES and r.get("head") == h], "tab:orange")
                 for h in heads] + [("fastest HNSW", hn, "tab:green")]
        y = 0.97
        for what, cand, color in boxes:
            ok = [r for r in cand if r["overlap@10"] >= 0.95]
            if not ok:
                continue
            r = min(ok, key=lambda r: r["p50_ms"])
            ax.annotate(f"{what} at overlap ≥ 0.95: {r['engine']} {r['mode']}\n"
                        f"p50 {r['p50_ms']:.3g} ms, overlap {r['overlap@10']:.3f}",
                        (_miss(r["overlap@10"]), r["p50_ms"]), xytext=(0.02, y), textcoords="axes fraction",
                        ha="left", va="top", fontsize=7.5,
                        bbox=dict(boxstyle="round,pad=0.25", fc="white", ec=color, alpha=0.95),
                        arrowprops=dict(arrowstyle="-", color=color, lw=0.8, ls=":"), zorder=6)
            y -= 0.095
        ax.axvline(_miss(0.95), color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(MISS_CEIL * 1.2, MISS_FLOOR * 0.7)  # reversed: right = better
        ax.set_xticks([_miss(t) for t in ticks])
        ax.set_xticklabels([f"{t:g}" if t < 0.999 else "≥0.999" for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("overlap@10 with the exact top-10 (axis: log of 1 − overlap)")
        ax.set_ylabel("p50 latency per query, ms (1 thread, log)")
        nd = max((r["docs"] for r in sub), default="?")
        low = sum(1 for r in sub if r["overlap@10"] < 1 - MISS_CEIL)
        edge = f"\n({low} row{'s' if low > 1 else ''} with overlap < {1 - MISS_CEIL:.1f} drawn at the left edge)"
        ax.set_title((f"{s}: {nd:,} documents, k = {k}, 1 thread" if isinstance(nd, int) else s)
                     + (edge if low else ""), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], color=ENGINE_STYLE[e][0], marker=ENGINE_STYLE[e][1], ls="-", label=e)
               for e in ENGINE_STYLE if e in engines_seen]
    handles += [Line2D([], [], color="gray", ls=line[h], marker="o", markerfacecolor="none" if i else "gray",
                       label=_head_name(rows, h)) for i, h in enumerate(heads)]
    handles.append(Line2D([], [], color="tab:green", ls="--", label="1.5 × fastest HNSW at overlap ≥ 0.95"))
    handles.append(Line2D([], [], color="tab:green", ls=":", label="1 × fastest HNSW at overlap ≥ 0.95"))
    ncol = max(1, min(len(handles), int(width // 2.6)))
    title = textwrap.fill("overlap against the exact top-10: each head's exhaustive sparse ranking for sparse "
                          "engines, Faiss Flat for dense ones; lines: the fastest configuration at that overlap "
                          "or better", width=int(width * 15))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=9, frameon=False, title=title,
               title_fontsize=8)
    lines = -(-len(handles) // ncol) + title.count("\n") + 1   # legend rows + title lines, ~0.2 in each
    fig.tight_layout(rect=(0, min(0.4, (0.15 + 0.2 * lines) / height), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
