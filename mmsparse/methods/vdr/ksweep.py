"""VDR's inference k per side chosen on validation (docs/vdr.md "`--target-flops` for VDR"):

    python -m mmsparse.methods.vdr ksweep HEAD_DIR IMAGES.h5 CAPTIONS.h5 -o OUT.json \
        [--ks 16,24,32,48,64,96,128,192,512] [--max-flops 10] [--min-alpha 0.75]

One pass of the head over the split without gates (method.ungated_vectors), then every k_query x
k_doc of the grid gated from those vectors exactly as `sparsify` writes them: VDR (queries top-k_query
united with their bag of words, images top-k_doc) and VDR^α (bag-of-words queries against the same
images). The chosen point: the best R@10 with FLOPs <= --max-flops whose VDR^α keeps at least
--min-alpha of it (ties: fewer FLOPs). The training k is the head's; only inference k moves.

`train-head --method vdr --target-flops F` runs the same sweep after training (`set_inference_k`, from
VDR.finish) on the validation files, or without them on a seeded sample of the training pairs, and
writes the chosen k_query / k_doc into the head it saves (training.flops_budget records the choice).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...checks import warn
from ...errors import InputError
from ...metrics.exhaustive import sparse_retrieval_metrics
from ...vocab import to_columns
from ..head import load_head, require_tokenizer
from .head import VDRHead
from .data import Split, caption_token_sets, open_split
from .method import UngatedVectors, ungated_vectors

KS = (16, 24, 32, 48, 64, 96, 128, 192, 512)
MIN_ALPHA = 0.75   # --target-flops: the chosen point's VDR^α R@10 keeps at least this share of its VDR R@10
FIGS = ("R@1", "R@5", "R@10", "MRR@10", "FLOPs", "q_nnz", "d_nnz")


def open_head_split(head, head_dir: str | Path, images: str | Path, captions: str | Path) -> Split:
    """The split of two dense files as `head` reads them (its inputs), each caption's bag of words in
    the head's columns through the head's tokenizer. InputError on unpaired files or no tokenizer."""
    want = {"text": head.config["text_input"], "image": head.config["image_input"]}
    split = open_split(Path(images), Path(captions), None, want)
    tok = require_tokenizer(head, head_dir)
    split.bows = to_columns(caption_token_sets(captions, tok, set(head.config.get("special_ids", []))),
                            head.token_ids.numpy())
    return split


def sweep(u: UngatedVectors, cap_img: np.ndarray, ks_query, ks_doc) -> list[dict]:
    """One row per (k_query, k_doc): VDR's FIGS, and VDR^α's R@1 / R@10 / FLOPs under bow_* (bag-of-words
    queries against the images at k_doc; independent of k_query). cap_img [Nq] int64: each caption's
    image row. Fractions (R@k) and FLOPs as `sparse_retrieval_metrics` gives them."""
    rows = []
    queries = {kq: u.gated_queries(kq) for kq in ks_query}   # each gate once, not once per k_doc
    for kd in ks_doc:
        docs = u.gated_images(kd)
        a = sparse_retrieval_metrics(u.bows, docs, cap_img)
        for kq in ks_query:
            r = sparse_retrieval_metrics(queries[kq], docs, cap_img)
            rows.append({"k_query": int(kq), "k_doc": int(kd), **{k: float(r[k]) for k in FIGS},
                         "bow_R@1": float(a["R@1"]), "bow_R@10": float(a["R@10"]), "bow_FLOPs": float(a["FLOPs"])})
    return rows


def choose(rows: list[dict], max_flops: float, min_alpha: float = MIN_ALPHA) -> dict | None:
    """The row of best R@10 among those with FLOPs <= max_flops and bow_R@10 >= min_alpha x R@10
    (ties: fewer FLOPs); None when no row qualifies."""
    ok = [r for r in rows if r["FLOPs"] <= max_flops and r["bow_R@10"] >= min_alpha * r["R@10"]]
    return min(ok, key=lambda r: (-r["R@10"], r["FLOPs"])) if ok else None


def run(head_dir: str, images: str, captions: str, ks=KS, max_flops: float = 10.0, min_alpha: float = MIN_ALPHA) -> dict:
    """The sweep of one head over one split: {head, images, captions, max_flops, min_alpha, rows, chosen,
    best_any_alpha} (chosen: `choose`; best_any_alpha: the same without the VDR^α condition)."""
    head = load_head(head_dir)
    if not isinstance(head, VDRHead):
        raise InputError(f"{head_dir}: a {type(head).__name__}; ksweep needs a VDR head (train-head --method vdr)")
    split = open_head_split(head, head_dir, images, captions)
    try:
        rows = sweep(ungated_vectors(head, split), split.cap_img, ks, ks)
    finally:
        split.captions.close()
        split.images.close()
    return {"head": str(head_dir), "images": str(images), "captions": str(captions), "k_train": head.config.get("k_train"),
            "max_flops": max_flops, "min_alpha": min_alpha, "rows": rows,
            "chosen": choose(rows, max_flops, min_alpha), "best_any_alpha": choose(rows, max_flops, 0.0)}


def budget_point(rows: list[dict], target: float, min_alpha: float = MIN_ALPHA) -> tuple[dict, str]:
    """The grid row a budget of `target` FLOPs takes, and the rule that chose it: "choose" (`choose`
    under target and min_alpha), "any_alpha" (no row under target keeps the VDR^α share: the best
    R@10 under target), "fewest_flops" (no row under target: the fewest FLOPs, ties: best R@10).
    ValueError on no rows."""
    if not rows:
        raise ValueError("budget_point: no grid rows")
    for rule, alpha in (("choose", min_alpha), ("any_alpha", 0.0)):
        row = choose(rows, target, alpha)
        if row is not None:
            return row, rule
    return min(rows, key=lambda r: (r["FLOPs"], -r["R@10"])), "fewest_flops"


def set_inference_k(head: VDRHead, split: Split, target: float, source: str, ks=None,
                    min_alpha: float = MIN_ALPHA, progress=None) -> dict:
    """`--target-flops`: sweep `head`'s inference k_query x k_doc over `ks` (default: the module's KS
    at call time, both sides) on `split` (its captions with split.bows, its images; see `sweep`),
    take `budget_point` under `target` FLOPs (D2S eq. 1: expected shared terms per query-image pair)
    and write it into head.config (k_query, k_doc; k_train untouched).

    source: which data decided, recorded and logged: "val" (the validation files) or "train_sample"
    (a sample of the training pairs, not held out of training). Logs one line on `progress`
    (a Reporter, or None) when the rule is "choose"; otherwise one warning line on stderr (no row
    under target names the fewest FLOPs reached). Returns the record for training.flops_budget:
    {target, k_query, k_doc, split, images, captions, rule, within (FLOPs <= target), min_alpha, grid,
    point (the chosen row: R@k and MRR@10 fractions, FLOPs, q_nnz, d_nnz, bow_R@1, bow_R@10,
    bow_FLOPs), train_gates (k_query, k_doc before, with their R@1, R@10 and FLOPs on the same split)}.
    ValueError on an empty grid."""
    ks = tuple(sorted({int(k) for k in (KS if ks is None else ks)}))
    if not ks:
        raise ValueError("set_inference_k: empty k grid")
    before = int(head.config["k_query"]), int(head.config["k_doc"])
    u = ungated_vectors(head, split, keep=max(*ks, *before))   # exact for every k of the grid and the head's
    rows = sweep(u, split.cap_img, ks, ks)
    old = u.figures(*before, split.cap_img)
    row, rule = budget_point(rows, target, min_alpha)
    head.config.update(k_query=int(row["k_query"]), k_doc=int(row["k_doc"]))
    rec = {"target": float(target), "k_query": int(row["k_query"]), "k_doc": int(row["k_doc"]), "split": source,
           "images": int(split.images.n), "captions": int(split.captions.n), "rule": rule,
           "within": bool(row["FLOPs"] <= target), "min_alpha": float(min_alpha), "grid": list(ks), "point": dict(row),
           "train_gates": {"k_query": before[0], "k_doc": before[1],
                           **{k: float(old[k]) for k in ("R@1", "R@10", "FLOPs")}}}
    what = (f"validation ({split.images.n:,} images, {split.captions.n:,} captions)" if source == "val" else
            f"no validation files: the training sample decided ({split.images.n:,} training images, "
            f"{split.captions.n:,} captions, not held out of training)")
    at = (f"k_query {row['k_query']} / k_doc {row['k_doc']}: FLOPs {row['FLOPs']:.2f} "
          f"({row['FLOPs'] / target:.2f} x the budget), R@1 {row['R@1']:.4f} R@10 {row['R@10']:.4f}, "
          f"VDR^α R@10 {row['bow_R@10']:.4f} (at the training-time k_query {before[0]} / k_doc {before[1]}: "
          f"FLOPs {old['FLOPs']:.2f}, R@10 {old['R@10']:.4f})")
    if rule == "choose":
        if progress is not None:
            progress.log(f"--target-flops {target:g}: {what}: inference {at}")
    elif rule == "any_alpha":
        warn(f"--target-flops {target:g}: {what}: no inference k under the budget keeps VDR^α R@10 >= "
             f"{min_alpha:g} x VDR's; took the best R@10 under it, {at}")
    else:
        warn(f"--target-flops {target:g}: {what}: no inference k of the grid ({ks[0]} ... {ks[-1]} per side) keeps "
             f"FLOPs <= {target:g}; the smallest reached is {row['FLOPs']:.2f}, kept: {at}")
    return rec


def summary(res: dict) -> str:
    """Markdown: the chosen point and the best ten rows under the FLOPs limit (R@k in %)."""
    lim = res["max_flops"]
    ok = sorted((r for r in res["rows"] if r["FLOPs"] <= lim), key=lambda r: (-r["R@10"], r["FLOPs"]))[:10]
    out = [f"{res['head']} on {res['captions']}: best R@10 at FLOPs <= {lim:g}",
           "", "| k_query | k_doc | R@1 | R@10 | FLOPs | VDR^α R@10 | VDR^α / VDR | VDR^α FLOPs |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['k_query']} | {r['k_doc']} | {100 * r['R@1']:.1f} | {100 * r['R@10']:.1f} | {r['FLOPs']:.2f} "
            f"| {100 * r['bow_R@10']:.1f} | {r['bow_R@10'] / max(r['R@10'], 1e-9):.2f} | {r['bow_FLOPs']:.2f} |" for r in ok]
    c = res["chosen"]
    out += ["", (f"chosen (VDR^α >= {res['min_alpha']:g} x VDR): k_query {c['k_query']}, k_doc {c['k_doc']}"
                 if c else f"no point with FLOPs <= {lim:g} keeps VDR^α >= {res['min_alpha']:g} x VDR")]
    return "\n".join(out) + "\n"
