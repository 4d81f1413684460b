"""Benchmark of `encode-dense`'s throughput: images/s and captions/s of the real encoder on real
Flickr8k files, one configuration per row, each in a fresh process (the allocator setting is
process-wide), all rows in one run on one machine so their ratios compare like with like.

    python -m mmsparse.bench.encode KARPATHY_JSON IMAGE_ROOT --model DIR -o work/bench/encode.json
        [--split train] [--images 512] [--captions 4096] [--device cpu] [--rows all]

Rows (`config`): the allocator (glibc's defaults, as mmsparse ran before it set them:
MMSPARSE_MALLOC=system, or mmsparse's), precision (fp32, and bf16 where it is native: AMX or
AVX512-BF16 on a CPU, a GPU that supports it; otherwise the row says why it was skipped), the
image tower's layout (channels-last / contiguous), torch threads and DataLoader workers (the
machine's defaults, and one thread), and the runtime (PyTorch, or ONNX Runtime: `--runtime onnx`,
fp32, skipped without the onnx extra or off the CPU). Each row times `encode_images_file` / `encode_captions_file`
(the stage's own code, shards and HDF5 writes included) on the first N images and captions of the
split, after the model is loaded, and records user and system CPU seconds, minor page faults and
peak RSS of its process. `ratio` is images/s (captions/s) over the first row's: the code as it
ran before the allocator setting, with the machine's default threads and workers. Rows named
"tower alone" time only the forward passes over batches decoded and preprocessed (tokenized)
beforehand, in memory: a stage row's rate over its runtime's tower-alone rate is how much the
input side (decoding, preprocessing, HDF5 writes) costs. The CPU model and the load average
before and after are printed and recorded: rows measured on a loaded machine do not compare.
Writes the JSON and a markdown table beside it (OUT with .md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = {   # name: (allocator, precision, memory format, threads, workers, runtime, tower alone; None = default)
    "before: glibc malloc, fp32": ("system", "fp32", "contiguous", None, None, "torch", False),
    "fp32": ("mmsparse", "fp32", "contiguous", None, None, "torch", False),
    "fp32, channels-last": ("mmsparse", "fp32", "channels-last", None, None, "torch", False),
    "fp32, channels-last, tower alone": ("mmsparse", "fp32", "channels-last", None, None, "torch", True),
    "fp32, 1 thread": ("mmsparse", "fp32", "contiguous", 1, None, "torch", False),
    "bf16": ("mmsparse", "bf16", "contiguous", None, None, "torch", False),
    "bf16, channels-last": ("mmsparse", "bf16", "channels-last", None, None, "torch", False),
    "bf16, channels-last, tower alone": ("mmsparse", "bf16", "channels-last", None, None, "torch", True),
    "before: glibc malloc, bf16": ("system", "bf16", "contiguous", None, None, "torch", False),
    "onnx (fp32)": ("mmsparse", "fp32", "contiguous", None, None, "onnx", False),
    "onnx (fp32), tower alone": ("mmsparse", "fp32", "contiguous", None, None, "onnx", True),
}

CHILD = r"""
import json, resource, sys, time
import mmsparse
from mmsparse.backbones import load_backbone
from mmsparse.backbones.encode import encode_captions_file, encode_images_file, load_image
from mmsparse.data import read_karpathy
from mmsparse.runtime import autocast, default_threads, default_workers, torch_threads
a = json.loads(sys.argv[1])
split = read_karpathy(a["annotations"], a["image_root"])[a["split"]]
threads = a["threads"] or default_threads()
workers = default_workers() if a["workers"] is None else a["workers"]
out = {"threads": threads, "workers": workers}


def tower(bb, kind, recs, bs):
    # decoded, preprocessed (tokenized) batches in memory first, then only the forward passes timed
    if kind == "images":
        batches = [bb.preprocess_images([load_image(r.path) for r in recs[i:i + bs]]) for i in range(0, len(recs), bs)]
        run = bb.encode_pixels
    else:
        texts = sorted((c.text for c in recs), key=len)
        batches = [bb.tokenize(texts[i:i + bs]) for i in range(0, len(texts), bs)]
        run = bb.encode_tokens
    import torch
    with torch.inference_mode(), autocast(bb.device, a["precision"]):
        run(batches[0])   # warm-up (one batch, not timed)
        t0 = time.perf_counter()
        for b in batches:
            run(b)
        return len(recs), time.perf_counter() - t0


with torch_threads(threads):
    bb = load_backbone("hf-dual", a["model"], a["device"])
    out["runtime"] = bb.set_runtime(a["runtime"], threads)
    out["memory_format"] = bb.set_memory_format(a["memory_format"]) if out["runtime"] == "torch" else "onnx"
    for kind, recs, fn, kw in (("images", split.images[:a["images"]], encode_images_file, {"workers": workers}),
                               ("captions", split.captions[:a["captions"]], encode_captions_file, {})):
        if not recs:
            continue
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if a["tower"]:
            n, wall = tower(bb, kind, recs, a["batch_size"])
        else:
            modality = "image" if kind == "images" else "text"
            res = fn(bb, recs, a["tmp"] + f"/{kind}.h5", {"modality": modality, "dataset": "bench", "split": a["split"]},
                     batch_size=a["batch_size"], precision=a["precision"], force=True, **kw)
            n, wall = res.rows, time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        c = resource.getrusage(resource.RUSAGE_CHILDREN)   # DataLoader workers, once they have exited
        out[kind] = {"n": n, "per_s": round(n / wall, 1), "wall_s": round(wall, 2),
                     "user_s": round(r1.ru_utime - r0.ru_utime, 2), "system_s": round(r1.ru_stime - r0.ru_stime, 2),
                     "minor_faults": r1.ru_minflt - r0.ru_minflt,
                     "workers_user_s": round(c.ru_utime, 2), "workers_system_s": round(c.ru_stime, 2)}
out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
out["allocator"] = mmsparse.runtime.tune_allocator()
print(json.dumps(out))
"""


def run_row(name: str, args, tmp: str) -> dict:
    """One configuration in a fresh interpreter; its figures, or {"skipped": why}."""
    from ..backbones.onnx_towers import onnxruntime_available
    from ..errors import InputError
    from ..runtime import resolve_precision

    alloc, precision, layout, threads, workers, runtime, alone = ROWS[name]
    try:
        resolve_precision(precision, args.device)
    except InputError as e:
        return {"config": name, "skipped": str(e).split(";")[0]}
    if runtime == "onnx" and (str(args.device) != "cpu" or not onnxruntime_available()):
        return {"config": name, "skipped": "ONNX Runtime runs on the CPU, with the onnx extra installed"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["MMSPARSE_MALLOC"] = "system" if alloc == "system" else ""
    spec = {"annotations": str(args.annotations), "image_root": str(args.image_root), "model": str(args.model),
            "split": args.split, "images": args.images, "captions": args.captions, "device": args.device,
            "batch_size": args.batch_size, "precision": precision, "memory_format": layout, "threads": threads,
            "workers": workers, "tmp": tmp, "runtime": runtime, "tower": alone}
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"bench encode: row {name!r} failed:\n{p.stderr[-3000:]}")
    return {"config": name, "allocator": alloc, "precision": precision, "tower_alone": alone,
            **json.loads(p.stdout.strip().splitlines()[-1])}


def markdown(rows: list[dict], machine: dict) -> str:
    head = ("| config | threads | workers | layout | images/s | × | sys % | faults/image | captions/s | × | sys % "
            "| peak RSS MB |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [f"Machine: {machine['cpu']}, {machine['cores']} cores, bf16 unit: {machine['bf16'] or 'none'}; "
             f"{machine['images']} images and {machine['captions']} captions of the {machine['split']} split, "
             f"batch {machine['batch_size']}, device {machine['device']}; load average (1, 5, 15 min) "
             f"{machine['load_before']} before, {machine['load_after']} after. Tower alone: decoded, preprocessed "
             f"(tokenized) batches in memory, only the forward passes timed; the other rows time the stage.", "",
             head]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['config']} | – | – | – | skipped: {r['skipped']} | | | | | | | |")
            continue
        cells = [r["config"], r["threads"], "–" if r.get("tower_alone") else r["workers"], r["memory_format"]]
        for kind in ("images", "captions"):
            k = r.get(kind, {})
            cpu = (k.get("user_s", 0) + k.get("system_s", 0)) or 1
            cells += [k.get("per_s", "–"), r.get(f"ratio_{kind}", "–"), round(100 * k.get("system_s", 0) / cpu)]
            if kind == "images":
                cells.append(round(k.get("minor_faults", 0) / max(k.get("n", 1), 1)))
        cells.append(r["peak_rss_mb"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.encode", description=__doc__.split("\n\n")[0])
    p.add_argument("annotations", type=Path, help="Karpathy split JSON (dataset_flickr8k.json)")
    p.add_argument("image_root", type=Path, help="folder of its images")
    p.add_argument("--model", type=Path, required=True, help="the dual encoder (a local directory)")
    p.add_argument("-o", "--out", type=Path, required=True, help="JSON to write (and OUT.md)")
    p.add_argument("--split", default="train", help="split whose first images and captions are encoded (default train)")
    p.add_argument("--images", type=int, default=512, help="images per row (default 512)")
    p.add_argument("--captions", type=int, default=4096, help="captions per row (default 4096)")
    p.add_argument("--batch-size", type=int, default=64, help="encode-dense --batch-size (default 64)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--rows", default="all", help="row names separated by ';' (or ',' when no name holds "
                   "one; default all: " + "; ".join(ROWS) + ")")
    args = p.parse_args(argv)
    from ..runtime import cpu_bf16, cpu_name, available_cores

    sep = ";" if ";" in args.rows else ","   # row names hold commas: separate them with ';'
    names = list(ROWS) if args.rows == "all" else [args.rows] if args.rows in ROWS else \
        [n.strip() for n in args.rows.split(sep)]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: unknown row {unknown[0]!r}; rows: {'; '.join(ROWS)}")
    rows = []
    load_before = tuple(round(x, 2) for x in os.getloadavg())
    print(f"{cpu_name()}, {available_cores()} cores; load average {load_before}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="mmsparse-bench-encode-") as tmp:
        for n in names:
            t0 = time.perf_counter()
            rows.append(run_row(n, args, tmp))
            print(f"{n}: {json.dumps({k: rows[-1].get(k) for k in ('images', 'captions', 'skipped') if k in rows[-1]})}"
                  f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    base = rows[0] if "skipped" not in rows[0] else {}
    for r in rows:
        for kind in ("images", "captions"):
            if kind in r and kind in base:
                r[f"ratio_{kind}"] = round(r[kind]["per_s"] / base[kind]["per_s"], 2)
    machine = {"cpu": cpu_name(), "cores": available_cores(), "bf16": cpu_bf16(), "split": args.split,
               "images": args.images, "captions": args.captions, "batch_size": args.batch_size, "device": args.device,
               "load_before": load_before, "load_after": tuple(round(x, 2) for x in os.getloadavg())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    md = markdown(rows, machine)
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
