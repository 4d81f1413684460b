"""D2S expansion × η ablation (paper Table 3 / Fig. 2a): evaluate many heads on one split.

    python -m mmsparse.methods.d2s.ablation HEAD_DIR... --images test-images.h5 --captions test-captions.h5
        -o work/ablation/table.json --plot work/ablation/flops_vs_R@1.png

Each head is scored exhaustively (every caption against every image, sparse dot products) — the
same ranking a rank-safe PISA query gives — so 16 heads take a minute. A row: head, expansion,
eta, query_mode, R@1, R@5, R@10, RR@10 (MRR@10), FLOPs (eq. 1), query_terms and doc_terms (mean
non-zeros per caption / image), Exact@20 (eq. 2: share of a query's 20 heaviest terms that are
its caption's own word pieces), their standard errors over the queries (`SE_R@1`, `SE_FLOPs`,
`SE_Exact@20`, ...), best_epoch, train_seconds, and the same measures for both query
modes as `R@1_expand`, `FLOPs_caption-terms`, ... The headline query mode follows training, as
in the paper's Table 3: a head trained with expansion `none` never learned to expand captions,
so its queries are the caption's own terms (`caption-terms`); every other head's queries are the
full head output (`expand`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ...atomic import atomic_path


def evaluate_heads(head_dirs: list[Path], images: Path, captions: Path, qrels: Path | None = None) -> list[dict]:
    """One row per head (see the module doc); heads must share the dense files' dimension. qrels pairs
    captions with images when the captions file has no image_ids. Raises InputError on bad inputs."""
    import numpy as np

    from ...metrics.exhaustive import sparse_retrieval_metrics
    from ...metrics.semantics import exact_semantic_at_k
    from ..head import load_head, require_tokenizer
    from ..pairs import load_pairs
    from .method import encode_queries, encode_sparse

    data = load_pairs(images, captions, qrels)
    n = len(data.cap_ids)
    rows = []
    for h in head_dirs:
        head = load_head(h)
        head.eval()
        tr = head.config.get("training", {})
        cfg = tr.get("config", {})
        exp = cfg.get("expansion")
        row = {"head": Path(h).name, "expansion": exp, "eta": cfg.get("eta"),
               "query_mode": "caption-terms" if exp == "none" else "expand"}
        # each caption's own terms in this head's columns: the caption-term queries' mask, and x_C of Exact@20
        data.tokenize(require_tokenizer(head, h))
        data.set_columns(head.token_ids.numpy())
        d = encode_sparse(head, data.z_img, side="image")
        df = np.asarray((d > 0).sum(axis=0)).ravel() / max(d.shape[0], 1)  # share of images holding term t
        for mode in ("expand", "caption-terms"):
            q = encode_queries(head, data, mode)
            m = sparse_retrieval_metrics(q, d, data.cap_img.cpu().numpy())
            flops_q = (q > 0).astype(np.float64) @ df  # eq. 1 per query: its expected shared terms
            exact, _ = exact_semantic_at_k(q, data.token_ids, 20)
            vals = {"R@1": m["R@1"], "R@5": m["R@5"], "R@10": m["R@10"], "RR@10": m["MRR@10"],
                    "FLOPs": m["FLOPs"], "query_terms": m["q_nnz"], "doc_terms": m["d_nnz"],
                    "Exact@20": float(exact.mean())}
            # standard errors over the n queries: binomial for R@k, sample s.d. / sqrt(n) otherwise
            vals.update({f"SE_{k}": float(np.sqrt(vals[k] * (1 - vals[k]) / n)) for k in ("R@1", "R@5", "R@10")})
            vals["SE_FLOPs"] = float(flops_q.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
            vals["SE_Exact@20"] = float(exact.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
            if mode == row["query_mode"]:
                row.update(vals)
            row.update({f"{k}_{mode}": x for k, x in vals.items() if k != "doc_terms"})
        row.update(best_epoch=tr.get("best_epoch"), train_seconds=tr.get("seconds"))
        rows.append(row)
    return rows


def plot_ablation(rows: list[dict], path: Path, measure: str = "R@1") -> None:
    """FLOPs (log x) vs `measure` (%), one line per expansion mode through its η values (Fig. 2a)."""
    from ...metrics.plots import _figure, format_log_axis, save_png
    from .config import PAPER_NAMES

    fig, ax = _figure()
    xs = [r["FLOPs"] for r in rows if r["FLOPs"] > 0]
    for mode in PAPER_NAMES:
        pts = sorted((r["FLOPs"], r[measure], r["eta"]) for r in rows if r["expansion"] == mode and r["FLOPs"] > 0)
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=f"{mode} ({PAPER_NAMES[mode]})")
        for x, y, eta in pts:
            ax.annotate(f"η={eta:g}", (x, 100 * y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    ax.set_xscale("log")
    if xs:
        format_log_axis(ax.xaxis, min(xs), max(xs))
    ax.set_xlabel("FLOPs (mean shared terms per query-image pair)")
    ax.set_ylabel(f"{measure} (%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_png(fig, Path(path))


def markdown(rows: list[dict]) -> str:
    """The table of the rows: R@k, RR@10 and Exact@20 x100, FLOPs as is, each ± its standard error
    where the row has one."""
    def pm(r, k, scale=100.0, nd=2):
        se = r.get(f"SE_{k}")
        return f"{scale * r[k]:.{nd}f}" + (f" ± {scale * se:.{nd}f}" if se is not None else "")

    head = ("| expansion | η | queries | R@1 | R@5 | RR@10 | FLOPs | Exact@20 | query terms | doc terms |\n"
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
    return head + "".join(
        f"| {r['expansion']} | {r['eta']:g} | {r['query_mode']} | {pm(r, 'R@1')} | {pm(r, 'R@5')} | {100 * r['RR@10']:.2f} "
        f"| {pm(r, 'FLOPs', 1.0)} | {pm(r, 'Exact@20', 100.0, 1) if 'Exact@20' in r else '–'} "
        f"| {r['query_terms']:.1f} | {r['doc_terms']:.1f} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", nargs="+", type=Path, help="D2S head directories")
    ap.add_argument("--images", type=Path, required=True, help="dense HDF5 of the evaluation images")
    ap.add_argument("--captions", type=Path, required=True, help="dense HDF5 of the evaluation captions")
    ap.add_argument("--qrels", type=Path, help="caption id -> image id qrels, if the captions file has no image_ids")
    ap.add_argument("-o", "--out", type=Path, required=True, help="table JSON (a list of rows)")
    ap.add_argument("--plot", type=Path, help="PNG of FLOPs vs R@1 (Fig. 2a)")
    a = ap.parse_args(argv)
    rows = evaluate_heads(a.heads, a.images, a.captions, a.qrels)
    order = {m: i for i, m in enumerate(("none", "full", "caption", "caption-word"))}
    rows.sort(key=lambda r: (order.get(r["expansion"], 9), -(r["eta"] or 0)))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(a.out) as tmp:
        Path(tmp).write_text(json.dumps(rows, indent=1))
    md = markdown(rows)
    with atomic_path(a.out.with_suffix(".md")) as tmp:
        Path(tmp).write_text(md)
    if a.plot:
        plot_ablation(rows, a.plot)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
