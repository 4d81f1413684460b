"""PNG figures (matplotlib, Agg backend), written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..atomic import atomic_path


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=(5, 3.6))


def plot_flops_vs_effectiveness(points: Sequence[tuple[str, float, float]], path: str | Path,
                                measure: str = "R@1",
                                references: Sequence[tuple[str, float]] = ()) -> None:
    """D2S Fig. 2a: one labelled point (FLOPs on a log x-axis, `measure` in %) per (label, flops,
    value); each (label, value) of `references` (runs without FLOPs, e.g. the dense model) is a
    dashed horizontal line."""
    fig, ax = _figure()
    for n, (label, x, y) in enumerate(points):
        ax.scatter([x], [100 * y])
        # alternate above/below so labels of nearby points do not print over each other
        ax.annotate(label, (x, 100 * y), textcoords="offset points", xytext=(4, 4 if n % 2 == 0 else -10),
                    fontsize=7)
    for label, y in references:
        ax.axhline(100 * y, color="grey", ls="--", lw=1)
        ax.annotate(label, (0.01, 100 * y), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(0, 3), fontsize=7, color="grey")
    if points and all(x > 0 for _, x, _ in points):
        ax.set_xscale("log")
    ax.set_xlabel("FLOPs (mean shared terms per query-image pair)")
    ax.set_ylabel(f"{measure} (%)")
    ax.grid(alpha=0.3)
    _save(fig, Path(path))


def plot_overlap_histogram(series: Sequence[tuple[str, Sequence[int]]], path: str | Path, k: int = 10) -> None:
    """D2S Fig. 2b: per run (label, counts [k + 1]: queries with j of the top-k shared with the
    dense run), the % of queries per j/k as side-by-side bars, and each run's mean as a dashed line."""
    fig, ax = _figure()
    x = np.arange(k + 1) / k
    width = 0.8 / k / max(1, len(series))
    for n, (label, counts) in enumerate(series):
        c = np.asarray(counts, dtype=np.float64)
        total = c.sum() or 1.0
        mean = float((c * x).sum() / total)
        bars = ax.bar(x + (n - (len(series) - 1) / 2) * width, 100 * c / total, width=width,
                      label=f"{label} (mean {mean:.2f})")
        ax.axvline(mean, color=bars.patches[0].get_facecolor(), ls="--", lw=1)
    ax.set_xlabel(f"fraction of the top-{k} images shared with the dense run")
    ax.set_ylabel("queries (%)")
    ax.legend(fontsize=7)
    _save(fig, Path(path))


def plot_rank_frequency(freqs: np.ndarray, path: str | Path, exponent: float, scale: float) -> None:
    """Log-log rank vs document frequency of the terms, normalised so rank 1 = 1 (BM25-V Fig. 1),
    with the fitted power law C * r^-a (same normalisation) and Zipf's a = 1 for reference."""
    fig, ax = _figure()
    f = np.sort(np.asarray(freqs)[np.asarray(freqs) > 0])[::-1].astype(np.float64)
    if f.size:
        r = np.arange(1, len(f) + 1)
        ax.loglog(r, f / f[0], ".", ms=2, label=f"terms ({len(f)} active)")
        if np.isfinite(exponent):
            ax.loglog(r, scale * r ** (-exponent) / f[0], "r-", lw=1, label=f"fit: a = {exponent:.2f}")
        ax.loglog(r, 1.0 / r, "k:", lw=1, label="Zipf (a = 1)")
        ax.legend(fontsize=8)
    ax.set_xlabel("term rank")
    ax.set_ylabel("document frequency / rank-1 frequency")
    ax.grid(alpha=0.3, which="both", lw=0.3)
    _save(fig, Path(path))
