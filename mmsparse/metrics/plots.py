"""PNG figures (matplotlib, Agg backend), written atomically.

Every figure is 5.6 x 4 inches at 120 dpi, with units on both axes; log axes print plain
numbers (1, 2, 5, 10, 20, ...) instead of matplotlib's default "2×10⁰ 3×10⁰" minor labels,
which overlap when the data span less than a couple of decades. `format_log_axis` is the helper
other plots (e.g. the D2S ablation) use for the same axes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ..atomic import atomic_path

FIGSIZE = (5.6, 4.0)


def save_png(fig, path: Path) -> None:
    """Write matplotlib figure `fig` to `path` as a PNG (120 dpi, tight bounding box) through a
    temporary file and a rename (no partial file on failure), then close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _figure(figsize=FIGSIZE):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=figsize)


def _plain(v: float) -> str:
    """1, 2, 5, 10, 0.5, 2e+04 -> '1', '2', '5', '10', '0.5', '20000' (no exponent below 1e6)."""
    if v == 0:
        return "0"
    return f"{v:.0f}" if abs(v) >= 1 and abs(v) < 1e6 else f"{v:g}"


def format_log_axis(axis, lo: float, hi: float) -> None:
    """Readable ticks for a log-scale matplotlib `axis` (ax.xaxis / ax.yaxis) showing [lo, hi]:
    labelled ticks at 1..9 x 10^n when the range spans up to ~0.6 decade, at 1-2-3-5-7 x 10^n up
    to ~1.2 decades (1..9 there crowds "8 9 10" together at the top of the decade), 1-2-5 x 10^n
    up to ~2.5, 1-3 x 10^n up to 4, 10^n beyond; plain numbers; unlabelled minor ticks. lo, hi > 0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(max(hi, lo * 1.0001) / lo)
    subs = (tuple(np.arange(1, 10) * 1.0) if decades <= 0.6 else (1.0, 2.0, 3.0, 5.0, 7.0) if decades <= 1.2
            else (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0, 3.0) if decades <= 4 else (1.0,))
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
    axis.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10) * 1.0))
    axis.set_minor_formatter(NullFormatter())


def plot_flops_vs_effectiveness(points: Sequence[tuple[str, float, float]], path: str | Path,
                                measure: str = "R@1",
                                references: Sequence[tuple[str, float]] = ()) -> None:
    """D2S Fig. 2a: one labelled point (FLOPs on a log x-axis, `measure` in %) per (label, flops,
    value); each (label, value) of `references` (runs without FLOPs, e.g. the dense model) is a
    dashed horizontal line labelled with its value. Labels sit beside their point, on the side
    away from the nearer vertical edge, so they stay inside the axes. See flops_figure."""
    fig, _ = flops_figure(points, measure, references)
    save_png(fig, Path(path))


def flops_figure(points: Sequence[tuple[str, float, float]], measure: str = "R@1",
                 references: Sequence[tuple[str, float]] = ()):
    """(matplotlib Figure, Axes) of plot_flops_vs_effectiveness, not saved."""
    fig, ax = _figure()
    xs = [x for _, x, _ in points]
    log = bool(points) and all(x > 0 for x in xs)
    if log:
        ax.set_xscale("log")
    colors = [f"C{n % 10}" for n in range(len(points))]
    for (label, x, y), c in zip(points, colors):
        ax.scatter([x], [100 * y], color=c, s=36, zorder=3)
    ys = [100 * y for _, _, y in points] + [100 * y for _, y in references]
    if ys:
        lo, hi = min(ys), max(ys)
        pad = max(0.08 * (hi - lo), 0.03 * max(abs(hi), 1.0), 0.1)
        ax.set_ylim(lo - pad, hi + 1.6 * pad)  # room above the top point / line for its label
    if log:
        lo, hi = min(xs), max(xs)
        span = max(hi / lo, 1.0)
        f = max(span ** 0.12, 1.35)  # x margin in log space, at least 35 %
        ax.set_xlim(lo / f, hi * f)
        format_log_axis(ax.xaxis, lo / f, hi * f)
    elif points:
        ax.margins(x=0.15)
    x0, x1 = ax.get_xlim()
    for n, (label, x, y) in enumerate(points):
        if log:
            frac = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
        else:
            frac = (x - x0) / ((x1 - x0) or 1)
        right = frac < 0.6
        ax.annotate(f"{label}\n{x:.3g} FLOPs, {100 * y:.1f}%", (x, 100 * y), textcoords="offset points",
                    xytext=(7 if right else -7, 6 if n % 2 == 0 else -6), ha="left" if right else "right",
                    va="bottom" if n % 2 == 0 else "top", fontsize=8, color=colors[n])
    for label, y in references:
        ax.axhline(100 * y, color="0.45", ls="--", lw=1, zorder=1)
        ax.annotate(f"{label}: {100 * y:.1f}%", (0.01, 100 * y), xycoords=("axes fraction", "data"),
                    textcoords="offset points", xytext=(2, 3), fontsize=8, color="0.3")
    ax.set_xlabel("FLOPs: mean shared terms per query-image pair" + (" (log scale)" if log else ""))
    ax.set_ylabel(f"{measure} (%)")
    ax.set_title(f"Efficiency vs effectiveness ({measure})", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    return fig, ax


def plot_overlap_histogram(series: Sequence[tuple[str, Sequence[int]]], path: str | Path, k: int = 10) -> None:
    """D2S Fig. 2b: per run (label, counts [k + 1]: queries with j of the top-k shared with the
    dense run), the % of queries per j as side-by-side bars, and each run's mean as a dashed
    line of the run's colour. The x axis counts shared images 0..k."""
    from matplotlib import patheffects

    fig, ax = _figure()
    x = np.arange(k + 1)
    width = 0.8 / max(1, len(series))
    for n, (label, counts) in enumerate(series):
        c = np.asarray(counts, dtype=np.float64)
        total = c.sum() or 1.0
        mean = float((c * x).sum() / total)
        color = f"C{n % 10}"
        ax.bar(x + (n - (len(series) - 1) / 2) * width, 100 * c / total, width=width, color=color,
               label=f"{label} (mean {mean:.1f} of {k})", zorder=2)
        # white-edged so the line stays visible where it crosses a bar of its own colour
        ax.axvline(mean, color=color, ls="--", lw=1.4, zorder=3,
                   path_effects=[patheffects.withStroke(linewidth=3.5, foreground="white")])
    ax.set_xticks(x)
    ax.set_xlim(-0.6, k + 0.6)
    ax.set_xlabel(f"images of the top {k} shared with the dense run's top {k}")
    ax.set_ylabel("queries (%)")
    ax.set_title(f"Overlap with the dense run (top {k}); dashed: means", fontsize=10)
    ax.grid(alpha=0.3, axis="y", zorder=0)
    if series:
        ax.legend(fontsize=8, loc="upper left")
    save_png(fig, Path(path))


def plot_rank_frequency(freqs: np.ndarray, path: str | Path, exponent: float, scale: float,
                        n_rows: int | None = None, vocab: Sequence[str] | None = None, r2: float | None = None,
                        label_top: int = 3) -> None:
    """Log-log rank vs document frequency of the terms (BM25-V Fig. 1), with the fitted power law
    C * r^-a (metrics.power_law_fit: a = `exponent`, C = `scale`, R² = `r2` in the legend) and
    Zipf's a = 1 through the rank-1 term for reference.

    freqs: df per term [|V|]. y is the share of the `n_rows` rows that hold the term (df / N, so
    1 = in every row; a hub term shows up at the top left); without `n_rows` df is normalised by
    the rank-1 df instead. With `vocab` the `label_top` most frequent terms are named."""
    from .terms import display_term

    fig, ax = _figure()
    df = np.asarray(freqs)
    order = np.lexsort((np.arange(len(df)), -df))
    order = order[df[order] > 0]
    f = df[order].astype(np.float64)
    norm = float(n_rows) if n_rows else (f[0] if f.size else 1.0)
    if f.size:
        r = np.arange(1, len(f) + 1)
        ax.loglog(r, f / norm, ".", ms=3, color="C0", label=f"terms ({len(f)} with df > 0)", zorder=3)
        if np.isfinite(exponent) and np.isfinite(scale):
            fit = f"fit: a = {exponent:.2f}" + (f", R² = {r2:.2f}" if r2 is not None and np.isfinite(r2) else "")
            ax.loglog(r, scale * r ** (-exponent) / norm, "-", color="C3", lw=1.2, label=fit)
        ax.loglog(r, (f[0] / norm) / r, "k:", lw=1, label="Zipf (a = 1)")
        top = max(f[0] / norm, float((scale / norm) if np.isfinite(scale) else 0), 1e-12)
        ax.set_ylim(min(f[-1] / norm, (f[0] / norm) / len(f)) / 2, min(top * 2, 1.5) if n_rows else top * 2)
        ax.set_xlim(0.8, len(f) * 1.25)
        format_log_axis(ax.xaxis, 0.8, len(f) * 1.25)
        if n_rows:
            from matplotlib.ticker import FuncFormatter

            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.10g}%"))
        ax.legend(fontsize=8, loc="lower left")
    ax.set_xlabel("term rank (by document frequency)")
    ax.set_ylabel(f"share of the {n_rows} rows holding the term" if n_rows else "document frequency / rank-1 df")
    title = "Term document frequencies"
    if vocab is not None and f.size:  # the most common terms in the title: labels on the points would cover them
        title += "\nmost common: " + ", ".join(
            f"{display_term(vocab[order[j]])}" + (f" ({100 * f[j] / norm:.1f}%)" if n_rows else "")
            for j in range(min(label_top, len(f))))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="major", lw=0.5)
    save_png(fig, Path(path))
