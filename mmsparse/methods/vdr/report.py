"""VDR's figures (docs/vdr.md): the validation curve of VDR and dense heads (R@10 per epoch) and
the word clouds of mean term values over a set of images (VDR paper Fig. 7).

    python -m mmsparse.methods.vdr curve HEAD_DIR... -o OUT.png
    python -m mmsparse.methods.vdr clouds LABEL=SPARSE_IMAGES.h5... -o OUT.png [--top 100]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..headdir import validated_epochs


def curve_figure(heads: Sequence[str | Path], out: str | Path, metric: str = "R@10") -> None:
    """Write a PNG of validation `metric` (×100) per epoch of VDR heads (parametric queries solid,
    bag-of-words queries VDR^α dashed) and dense heads (dotted), the saved epoch circled, the
    backbone's own figure before training (dense heads' `val_before`) as a grey line, and the
    training loss per epoch below. Raises InputError for a directory without a train-head record
    or a head with no validated epochs."""
    import matplotlib

    from ...metrics.plots import save_png
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axl) = plt.subplots(2, 1, figsize=(6.0, 6.0), sharex=True, height_ratios=(3, 1.3))
    before = None
    for i, h in enumerate(heads):
        t, rows = validated_epochs(h)
        ep = [e["epoch"] for e in rows]
        color, name = f"C{i}", Path(h).name
        dense = t.get("method") == "dense"
        ax.plot(ep, [100 * e["val"][metric] for e in rows], ":" if dense else "-", color=color,
                label=f"{name}" + ("" if dense else ": VDR"))
        if not dense and all("bow" in e["val"] for e in rows):
            ax.plot(ep, [100 * e["val"]["bow"][metric] for e in rows], "--", color=color, label=f"{name}: VDR^α")
        hit = [e for e in rows if e["epoch"] == t.get("best_epoch")]
        if hit:
            ax.plot([hit[0]["epoch"]], [100 * hit[0]["val"][metric]], "o", mfc="none", ms=9, color=color)
        axl.plot(ep, [e["loss"] for e in rows], ":" if dense else "-", color=color)
        before = before or t.get("val_before", {}).get(metric)
    if before is not None:
        ax.axhline(100 * before, color="0.4", ls="-.", lw=1.0, label="shipped dense (before training)")
    ax.set_ylabel(f"validation {metric} (×100)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("VDR and the dense model trained alike: validation per epoch", fontsize=10)
    axl.set_ylabel("training loss")
    axl.set_yscale("log")
    axl.xaxis.get_major_locator().set_params(integer=True)
    axl.set_xlabel("epoch")
    axl.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, Path(out))


def mean_terms(path: str | Path, top: int = 100) -> list[tuple[str, float]]:
    """The `top` terms of largest mean weight over the rows of a sparse HDF5 file (zeros counted),
    as (term, mean weight), largest first (VDR paper Fig. 7: "average values for each token")."""
    from ...formats.sparse import read_sparse
    col = read_sparse(path)
    mean = np.asarray(col.matrix.mean(axis=0)).ravel()
    order = np.argsort(-mean, kind="stable")[:top]
    return [(col.vocab[i], float(mean[i])) for i in order if mean[i] > 0]


def clouds_figure(items: Sequence[str], out: str | Path, top: int = 100) -> list[list[tuple[str, float]]]:
    """Write one PNG of word clouds side by side, one per "LABEL=SPARSE.h5" item: the `top` terms of
    largest mean weight over its rows (mean_terms), word size ~ mean weight. Returns each panel's
    terms."""
    import matplotlib
    from PIL import Image

    from ...metrics.html_report import write_wordcloud
    from ...metrics.plots import save_png
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import tempfile

    panels = []
    fig, axes = plt.subplots(1, len(items), figsize=(5.2 * len(items), 3.6), squeeze=False)
    with tempfile.TemporaryDirectory() as tmp:
        for ax, item in zip(axes[0], items):
            label, _, path = item.rpartition("=")
            terms = mean_terms(path, top)
            panels.append(terms)
            png = Path(tmp) / f"{len(panels)}.png"
            write_wordcloud(terms, png, width=840, height=540, max_words=top, min_font_size=10)
            ax.imshow(Image.open(png))
            ax.set_axis_off()
            head = ", ".join(t for t, _ in terms[:5])
            ax.set_title(f"{label or Path(path).name}\n(top 5: {head})", fontsize=9)
    fig.suptitle("Mean term weight over the test images (top terms)", fontsize=10)
    fig.tight_layout()
    save_png(fig, Path(out))
    return panels
