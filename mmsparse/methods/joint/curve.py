"""Validation curves of joint heads (docs/joint.md "Convergence"): per epoch, the sparse and the
dense validation R@1 and the sparse FLOPs that train-head recorded in each head's config.json
(`training.history`), against the backbone's dense R@1 before training and, optionally, a
reference head's validation R@1 (the main job's D2S head)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..headdir import read_training, validated_epochs


def curve_figure(heads: Sequence[str | Path], out: str | Path, reference: str | Path | None = None) -> None:
    """Write a PNG (two panels: validation R@1 x100 per epoch, sparse solid and dense dashed, the
    saved epoch circled; validation FLOPs per epoch) of joint heads' `history`. reference: a head
    whose saved validation R@1 is drawn as a dotted line. Raises InputError for a directory without
    a train-head record or a head with no validated epochs."""
    import matplotlib

    from ...metrics.plots import save_png
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axf) = plt.subplots(2, 1, figsize=(5.6, 5.6), sharex=True, height_ratios=(3, 1.3))
    before = None
    for i, h in enumerate(heads):
        t, rows = validated_epochs(h)
        ep = [e["epoch"] for e in rows]
        color = f"C{i}"
        name = Path(h).name
        ax.plot(ep, [100 * e["val"]["R@1"] for e in rows], "-", color=color, label=f"{name}: sparse")
        if all("dense" in e["val"] for e in rows):
            ax.plot(ep, [100 * e["val"]["dense"]["R@1"] for e in rows], "--", color=color, label=f"{name}: dense")
        best = t.get("best_epoch")
        hit = [e for e in rows if e["epoch"] == best]
        if hit:
            ax.plot([best], [100 * hit[0]["val"]["R@1"]], "o", mfc="none", ms=9, color=color)
        axf.plot(ep, [e["val"]["FLOPs"] for e in rows], "-", color=color)
        before = before or t.get("val_before", {}).get("dense", {}).get("R@1")
    if before is not None:
        ax.axhline(100 * before, color="0.4", ls=":", lw=1.2, label="backbone dense (before training)")
    if reference is not None:
        r = read_training(reference)
        ax.axhline(100 * r["val"]["R@1"], color="C3", ls=":", lw=1.5, label=f"{Path(reference).name} sparse (saved)")
    ax.set_ylabel("validation R@1 (×100)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Joint head: validation per epoch", fontsize=10)
    axf.set_ylabel("val FLOPs")
    axf.set_xlabel("epoch")
    axf.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, Path(out))
