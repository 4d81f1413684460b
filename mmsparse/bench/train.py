"""Benchmark of one `train-head` (D2S) optimizer step against the bare vocabulary projection.

    python -m mmsparse.bench.train -o work/bench/train-head.json [--head DIR --images H5 --captions H5]

For each shape (d, ω, |V|, batch B) it times, on the current device and thread count:
  step_s             training.train_step: head forward on B captions + U distinct images, the
                     caption-word expansion mask, eq. 7, backward, AdamW, LR step (median of --steps)
  bare_projection_s  x [B+U, ω] @ W2ᵀ [ω, |V|] forward + backward (grad of x and W2) alone
and reports pairs_per_s = B / step_s, step_over_bare = step_s / bare_projection_s and the peak
RSS (MiB) of a subprocess that ran only that shape.

Shapes: `paper` (D2S §5: d=256, ω=768 (BERT), |V|=30522, B=512), `issue` (d=512, ω=384 (MiniLM),
|V|=30522, B=512) with synthetic vectors, and `demo` (the Flickr8k example head and its real
training vectors, when --head/--images/--captions are given). Each is measured in two states:
`init` (W2 = vocabulary embeddings (demo: the trained W2 with W1/LayerNorm re-initialised), bias 0:
about half the outputs are active, as in the first steps) and `sparse` (a trained head: the demo head itself, or for synthetic shapes a bias that
leaves --active terms per row, like the Flickr8k head's ~60, among --live columns). The demo shape
also has `epoch1`: the mean step over the first epoch of a real run from the init state (lr 1e-3,
the η warm-up), i.e. what training actually costs while the head turns sparse.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"paper": dict(d=256, omega=768, vocab=30522, batch=512),
          "issue": dict(d=512, omega=384, vocab=30522, batch=512)}


def _median_time(fn, steps: int, warmup: int) -> float:
    import statistics
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _synthetic(shape: dict, seed: int = 0):
    """A head over random 'vocabulary embeddings' (std 0.05, like BERT's) and 5 captions per image
    of random unit vectors; caption term ids drawn Zipf-like (12 per caption)."""
    import numpy as np
    import torch

    from ..methods.d2s.head import D2SHead
    from ..methods.pairs import PairData

    g = np.random.default_rng(seed)
    d, v = shape["d"], shape["vocab"]
    n_img = 4 * shape["batch"]
    n_cap = 5 * n_img

    class V:  # the fields D2SHead.from_vocab reads
        embeddings = (0.05 * g.standard_normal((v, shape["omega"]))).astype(np.float32)
        terms = [f"t{i}" for i in range(v)]
        token_ids = np.arange(v)
        source = "synthetic"
        tokenizer = None

    torch.manual_seed(seed)
    head = D2SHead.from_vocab(d, V)
    zi = torch.nn.functional.normalize(torch.randn(n_img, d), dim=1)
    zc = torch.nn.functional.normalize(zi.repeat_interleave(5, 0) + 0.5 * torch.randn(n_cap, d), dim=1)
    ranks = np.minimum(g.zipf(1.3, size=(n_cap, 12)) - 1, v - 1)
    data = PairData(zi, zc, torch.arange(n_img).repeat_interleave(5), [], [], [], {}, {})
    data.token_ids = [np.unique(r) for r in ranks]
    from ..vocab import pad_ids
    data.tok = torch.from_numpy(pad_ids(data.token_ids, v))
    return head, data


def _sparsen(head, data, active: int, live: int) -> None:
    """Make the synthetic head look trained: only `live` random vocabulary columns can fire (the
    others get a bias of -1e4), and their bias leaves about `active` positive terms per row."""
    import torch

    with torch.no_grad():
        v = head.w2.weight.shape[0]
        keep = torch.randperm(v, generator=torch.Generator().manual_seed(1))[:live]
        pre = head.norm(head.w1(data.z_img[:256])) @ head.w2.weight[keep].T
        thr = float(torch.quantile(pre.flatten()[:2_000_000], 1.0 - active / live))
        head.w2.bias.fill_(-1e4)
        head.w2.bias[keep] = -thr


def measure(name: str, shape: dict, state: str, steps: int, warmup: int, active: int, live: int,
            head_dir: str | None = None, images: str | None = None, captions: str | None = None,
            run_steps: int = 60) -> dict:
    """Time one shape in one state; returns a row of the JSON (see the module doc)."""
    import numpy as np
    import torch

    from ..methods.d2s.config import D2SConfig as TrainConfig
    from ..methods.d2s.expansion import ExpansionControl
    from ..methods.d2s.method import D2S
    from ..methods.pairs import load_pairs
    from ..trainer import make_optimizer
    from ..vocab import document_frequency

    if name == "demo":
        from ..methods.head import load_head, require_tokenizer
        head = load_head(head_dir)
        data = load_pairs(images, captions)
        data.tokenize(require_tokenizer(head, head_dir))
        data.set_columns(head.token_ids.numpy())
        if state in ("init", "epoch1"):  # W1 and LayerNorm re-initialised, bias 0: dense as at the start
            with torch.no_grad():
                torch.manual_seed(0)
                head.w1.reset_parameters()
                head.norm.reset_parameters()
                head.w2.bias.zero_()
        shape = dict(d=int(head.config["dim"]), omega=int(head.config["omega"]),
                     vocab=int(head.config["vocab_size"]), batch=shape["batch"])
    else:
        head, data = _synthetic(shape)
        if state == "sparse":
            _sparsen(head, data, active, live)
    cfg = TrainConfig()
    v = shape["vocab"]
    pec = ExpansionControl("caption-word", document_frequency(data.token_ids, v), cfg.epochs)
    pec.set_epoch(cfg.epochs // 2)   # mid-training: masks of both levels active
    opt = make_optimizer([{"params": list(head.parameters())}], cfg.lr if state == "epoch1" else 1e-6, cfg.weight_decay)
    method = D2S(cfg)
    method.pec = pec

    def train_step(idx, step):  # one optimizer step of the D2S method (loss, backward, AdamW)
        loss, _ = method.loss(head, (idx, data), step, gen, "cpu")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(data.z_cap.shape[0], generator=gen)
    B = shape["batch"]
    it = {"b": 0}
    head.train()

    def step():
        b = it["b"] % (len(perm) // B)
        it["b"] += 1
        train_step(perm[b * B:(b + 1) * B], cfg.warmup_steps)   # past the L1 warm-up: full η

    rows_u = [len(torch.unique(data.cap_img[perm[b * B:(b + 1) * B]])) for b in range(3)]
    if state == "epoch1":  # the first epoch of a real run: η warm-up, the head turning sparse
        pec.set_epoch(0)
        times = []
        for b in range(min(run_steps, len(perm) // B)):
            t0 = time.perf_counter()
            train_step(perm[b * B:(b + 1) * B], b)
            times.append(time.perf_counter() - t0)
        step_s = sum(times) / len(times)
    else:
        step_s = _median_time(step, steps, warmup)
    head.eval()
    with torch.no_grad():  # after the timed steps: for epoch1, the head the epoch ended with
        s = head(torch.cat([data.z_cap[perm[:B]], data.z_img[:rows_u[0]]]))
        active_per_row = float((s > 0).sum(1).float().mean())
        live_cols = int((s > 0).any(0).sum())

    rows = B + int(np.mean(rows_u))
    x = torch.randn(rows, shape["omega"], requires_grad=True)
    w = torch.nn.Parameter(head.w2.weight.detach().clone())
    gy = torch.randn(rows, v)

    def bare():
        x.grad = None
        w.grad = None
        (x @ w.T).backward(gy)

    bare_s = _median_time(bare, steps, warmup)
    return {"shape": name, "state": state, "d": shape["d"], "omega": shape["omega"], "vocab": v,
            "batch": B, "rows": rows, "active_terms_per_row": round(active_per_row, 1), "live_columns": live_cols,
            "threads": torch.get_num_threads(), "step_s": round(step_s, 6),
            "pairs_per_s": round(B / step_s, 1), "bare_projection_s": round(bare_s, 6),
            "bare_pairs_per_s": round(B / bare_s, 1), "step_over_bare": round(step_s / bare_s, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", type=Path, help="JSON output (a list of rows)")
    ap.add_argument("--shapes", default="paper,issue,demo", help="comma list of paper, issue, demo")
    ap.add_argument("--states", default="init,sparse,epoch1",
                    help="comma list of init, sparse, epoch1 (demo only; default: all three)")
    ap.add_argument("--batch", type=int, default=512, help="captions per step (default 512)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per measurement (median; default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--active", type=int, default=60, help="active terms per row of the synthetic sparse state")
    ap.add_argument("--live", type=int, default=3000,
                    help="vocabulary columns that can fire in the synthetic sparse state (default 3000)")
    ap.add_argument("--head", help="demo shape: a trained D2S head directory")
    ap.add_argument("--images", help="demo shape: training image dense HDF5")
    ap.add_argument("--captions", help="demo shape: training caption dense HDF5")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: shape:state, run in this process
    a = ap.parse_args(argv)
    if a.one:
        name, state = a.one.split(":")
        shape = dict(SHAPES.get(name, {}), batch=a.batch)
        print(json.dumps(measure(name, shape, state, a.steps, a.warmup, a.active, a.live, a.head, a.images, a.captions)))
        return 0
    rows = []
    for name in a.shapes.split(","):
        if name == "demo" and not (a.head and a.images and a.captions):
            print("skipping demo: needs --head, --images and --captions", file=sys.stderr)
            continue
        for state in a.states.split(","):
            if state == "epoch1" and name != "demo":
                continue  # needs real captions and images to turn sparse
            cmd = [sys.executable, "-m", "mmsparse.bench.train", "--one", f"{name}:{state}",
                   "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
                   "--active", str(a.active), "--live", str(a.live)]
            if name == "demo":
                cmd += ["--head", a.head, "--images", a.images, "--captions", a.captions]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(f"{name:6s} {state:6s} d={row['d']} ω={row['omega']} |V|={row['vocab']} B={row['batch']}: "
                  f"step {row['step_s']:.3f}s ({row['pairs_per_s']:.0f} pairs/s), bare {row['bare_projection_s']:.3f}s, "
                  f"ratio {row['step_over_bare']:.2f}, active {row['active_terms_per_row']:.0f}/row, "
                  f"{row['live_columns']} live columns, "
                  f"peak RSS {row['peak_rss_mb']:.0f} MiB", flush=True)
    if a.out:
        from ..atomic import atomic_path
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(a.out) as tmp:
            Path(tmp).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
