"""BM25-V's Table 2: R@K and bytes per image of BM25-V, dense and the two-stage rerank.

    python -m mmsparse.methods.bm25v table --bm25v E.json --dense E.json --rerank K=E.json ...
        --sparse-index DIR --dense-index DIR -o TABLE.md
"""

from __future__ import annotations

import json
from pathlib import Path

def index_bytes(index_dir: Path) -> dict:
    """Bytes per image of an index: `model` (BM25-V: 6·L0 = 4-byte word id + uint16 value per
    posting, §4.5; dense: 4·D float32), and `disk` (the engine's files: PISA's compressed
    postings + block-max data; Faiss's index file), both / N."""
    meta = json.loads((Path(index_dir) / "mmsparse.json").read_text(encoding="utf-8"))
    n = int(meta["num_docs"])
    d = Path(index_dir)
    if meta["kind"] == "faiss":
        dim = int(meta.get("dim") or meta.get("source_attrs", {}).get("dim"))
        disk = sum(f.stat().st_size for f in d.glob("*.index"))
        return {"model": 4 * dim, "disk": disk / n, "num_docs": n}
    enc = meta["settings"]["index_encoding"]
    pisa = d / "pisa"
    disk = sum(f.stat().st_size for f in pisa.glob(f"*.{enc}")) + sum(f.stat().st_size for f in pisa.glob("*.bmw.*")
                                                                      if not f.name.endswith(enc))
    return {"model": 6 * meta["nnz"] / n, "disk": disk / n, "num_docs": n, "L0": meta["nnz"] / n}


def table(rows: list[tuple[str, Path, float]], ks=(1, 5, 10, 100)) -> str:
    """Markdown table: label, R@k (= ir-measures Success@k: a same-class image in the top k,
    the metric-learning Recall@K of the paper), bytes/image. rows: (label, eval JSON, bytes)."""
    head = "| method | " + " | ".join(f"R@{k}" for k in ks) + " | bytes/image |"
    lines = [head, "|" + "---|" * (len(ks) + 2)]
    for label, path, b in rows:
        e = json.loads(Path(path).read_text(encoding="utf-8"))
        vals = []
        for k in ks:
            v = e.get(f"Success@{k}")
            vals.append("–" if v is None else f"{v:.3f}")
        lines.append(f"| {label} | " + " | ".join(vals) + f" | {b:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """python -m mmsparse.methods.bm25v table --bm25v E.json --dense E.json --rerank K=E.json ...
    --sparse-index DIR --dense-index DIR -o TABLE.md"""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m mmsparse.methods.bm25v")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="Table-2-like summary of BM25-V / dense / two-stage evaluations")
    t.add_argument("--bm25v", required=True, type=Path)
    t.add_argument("--dense", required=True, type=Path)
    t.add_argument("--rerank", action="append", default=[], metavar="K=EVAL.json")
    t.add_argument("--sparse-index", required=True, type=Path)
    t.add_argument("--dense-index", required=True, type=Path)
    t.add_argument("-o", "--out", type=Path)
    a = ap.parse_args(argv)
    sb, db = index_bytes(a.sparse_index), index_bytes(a.dense_index)
    rows = [("Dense (exact cosine)", a.dense, db["model"]), ("BM25-V (sparse only)", a.bm25v, sb["model"])]
    for spec in a.rerank:
        k, _, path = spec.partition("=")
        rows.append((f"BM25-V top-{k} → dense rerank", Path(path), db["model"] + sb["model"]))
    text = (table(rows) + "\n\nR@K = a same-class image among the top K (ir-measures Success@K), query image "
            f"excluded. bytes/image: BM25-V 6·L0 with L0 = {sb['L0']:.2f} visual words/image (4-byte id + "
            f"uint16; PISA's compressed postings on disk: {sb['disk']:.1f}); dense 4·D float32 (Faiss file: "
            f"{db['disk']:.0f}); two-stage = both. Gallery: {sb['num_docs']} images.\n")
    print(text)
    if a.out:
        from ...atomic import write_text_atomic
        write_text_atomic(a.out, text)
    sys.stdout.flush()

