"""Benchmark of one VDR training step (issue 42: "a VDR step that fits the budget").

    python -m mmsparse.bench.vdr_step STATES_DIR -o work/bench/vdr-step.json [--vocab-min-df 5] [--k 48]

STATES_DIR holds train-images.h5 / train-captions.h5 of `encode-dense --final-layer-inputs`. Every row
runs what `mmsparse.trainer.fit` runs for one optimizer step of B caption-image pairs (the loss of
methods/vdr, backward, AdamW) on real batches of VDR's data stream, and reports the median of --steps
timed steps after --warmup untimed ones, pairs_per_s = B / step_s, the batch's distinct images U, and
one profiled step split into text forward, image forward, loss, backward and optimizer:

  states        the final layers frozen and their per-position outputs computed before the step (VDR on
                stored token / patch states, the method before final-layer tuning), float32
  final         the final layers tuned with the heads, float32
  final-bf16    the same under bf16 autocast (only where the CPU has AMX or AVX512-BF16, or on CUDA)
  final-bf16-image  the same with --batch-by image: B captions from ~B/5 images, each with all its captions

All rows on the current machine and thread count, one after the other in this process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _rows(args) -> list[tuple[str, bool, str, str]]:
    """(row name, tune final layers, amp, batch_by)."""
    return [("states", False, "none", "caption"), ("final", True, "none", "caption"),
            ("final-bf16", True, "bf16", "caption"), ("final-bf16-image", True, "bf16", "image")]


def bench(states: Path, vocab_min_df: int = 5, k: int = 48, batch: int = 256, steps: int = 5, warmup: int = 2,
          threads: int | None = None, rows: list[str] | None = None, progress=None) -> list[dict]:
    """The rows of the module docstring as dicts (name, step_s, pairs_per_s, images, parts {text, image,
    loss, backward, optimizer} seconds of one profiled step, statistic); bf16 rows are skipped, with
    the reason, where bf16 would be emulated."""
    import torch

    from ..methods.base import TrainInputs
    from ..methods.vdr.config import VDRConfig
    from ..methods.vdr.data import batches, load_batch
    from ..methods.vdr.loss import vdr_loss
    from ..methods.vdr.method import VDR
    from ..runtime import autocast, native_bf16
    from ..trainer import make_optimizer

    if threads:
        torch.set_num_threads(threads)
    out = []
    inputs = TrainInputs(states / "train-images.h5", states / "train-captions.h5")
    for name, tune, amp, by in _rows(None):
        if rows and name not in rows:
            continue
        if amp == "bf16" and not native_bf16("cpu"):
            out.append({"name": name, "skipped": "bf16 is not native on this CPU (it would be emulated)"})
            continue
        cfg = VDRConfig(batch_size=batch, vocab_min_df=vocab_min_df, vdr_train_k=k, vdr_query_k=k, vdr_doc_k=k,
                        tune_final_layer=tune, amp=amp, batch_by=by)
        m = VDR(cfg)
        head, train, _ = m.setup(inputs)
        opt = make_optimizer(m.param_groups(head), 1e-4, 0.01)
        head.train()
        gen = torch.Generator().manual_seed(0)
        it = batches(train, batch, gen, by_image=by == "image")
        v = int(head.config["vocab_size"])
        precision = "bf16" if amp == "bf16" else "fp32"

        def step(parts=None):
            xc, mc, xi, cap, bow = load_batch(train, next(it), v)
            t = [time.perf_counter()]
            with autocast("cpu", precision):
                if tune:
                    vq = head(xc, mc, "text")
                    t.append(time.perf_counter())
                    vp = head(xi, None, "image")
                else:     # positions precomputed, as stored token / patch states would be read
                    with torch.no_grad():
                        pc, pm = head.positions(xc, "text", mc)
                        pi, _ = head.positions(xi, "image")
                    t0 = time.perf_counter()
                    vq = head.text(pc, pm)
                    t.append(time.perf_counter())
                    vp = head.image(pi)
                    t[0] = t0
                t.append(time.perf_counter())
                loss, _ = vdr_loss(vq, vp, bow, cap, k, head.scale, gen=gen)
            t.append(time.perf_counter())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t.append(time.perf_counter())
            opt.step()
            t.append(time.perf_counter())
            if parts is not None:
                parts.update(zip(("text", "image", "loss", "backward", "optimizer"),
                                 (round(b - a, 4) for a, b in zip(t, t[1:]))))
            return t[-1] - t[0], len(xi)

        for _ in range(warmup):
            step()
        times, imgs = [], []
        for _ in range(steps):
            s, u = step()
            times.append(s)
            imgs.append(u)
        parts: dict = {}
        step(parts)
        s = statistics.median(times)
        row = {"name": name, "tune_final_layer": tune, "amp": amp, "batch_by": by, "batch": batch,
               "images": round(statistics.mean(imgs), 1), "vocab_size": v, "k": k, "step_s": round(s, 4),
               "pairs_per_s": round(batch / s, 1), "parts": parts,
               "statistic": f"median of {steps} steps after {warmup} warm-up steps; parts: one more step",
               "threads": torch.get_num_threads()}
        out.append(row)
        if progress:
            progress(row)
    return out


def table(rows: list[dict]) -> str:
    """Markdown table of bench rows."""
    lines = ["| row | images / step | step (s) | pairs/s | text fwd | image fwd | loss | backward | AdamW |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['name']} | skipped: {r['skipped']} |||||||")
            continue
        p = r["parts"]
        lines.append(f"| {r['name']} | {r['images']:.0f} | {r['step_s']:.3f} | {r['pairs_per_s']:.0f} | "
                     + " | ".join(f"{p[x]:.3f}" for x in ("text", "image", "loss", "backward", "optimizer")) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m mmsparse.bench.vdr_step", description=__doc__.split("\n")[0])
    ap.add_argument("states", type=Path, help="folder of train-{images,captions}.h5 with final_input")
    ap.add_argument("-o", "--out", type=Path, required=True, help="JSON output (a .md table beside it)")
    ap.add_argument("--vocab-min-df", type=int, default=5, help="VDR's --vocab-min-df (default 5: 2,810 terms)")
    ap.add_argument("--k", type=int, default=48, help="query top-k in training (default 48, 1.7 %% of 2,810)")
    ap.add_argument("--batch", type=int, default=256, help="captions per step (default 256)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per row (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--row", action="append", help="only these rows (repeatable)")
    a = ap.parse_args(argv)
    from ..atomic import write_text_atomic
    from ..runtime import cpu_name

    rows = bench(a.states, a.vocab_min_df, a.k, a.batch, a.steps, a.warmup, a.threads, a.row,
                 progress=lambda r: print(json.dumps(r), flush=True))
    doc = {"machine": cpu_name(), "rows": rows}
    write_text_atomic(a.out, json.dumps(doc, indent=2))
    md = f"VDR training step, {cpu_name()}\n\n" + table(rows)
    write_text_atomic(a.out.with_suffix(".md"), md)
    print(md)


if __name__ == "__main__":
    main()
