"""Benchmark of one `train-head` (D2S) optimizer step against the bare vocabulary projection
(issue 20: the same statistic for every row, simulated rows labelled, a real head at |V| = 30522).

    python -m mmsparse.bench.train -o work/bench/train-head.json [--head DIR --images H5 --captions H5]
        [--trained-head DIR]

Every row times, on the current device and thread count, with ONE statistic: the median of
--steps timed calls after --warmup untimed ones (`statistic` in each row says so):
  step_s             one D2S optimizer step exactly as `mmsparse.trainer.fit` runs it: the method's
                     loss on B captions + their U distinct images (head forward restricted to the live
                     columns, caption-word expansion mask, eq. 7), backward, AdamW, LR-scheduler step
  bare_projection_s  x [B+U, ω] @ W2ᵀ [ω, |V|] forward + backward (grads of x and W2) alone: the
                     full-width vocabulary projection with no head, no loss and no optimiser
and reports pairs_per_s = B / step_s, step_over_bare = step_s / bare_projection_s, the live columns
and active terms of the measured batch, and the peak RSS (MiB) of a subprocess that ran only that row.

Rows (`shape` x `state`; `simulated` says whether the sparsity is forced):
  paper  (d=256, ω=768 (BERT), |V|=30522, B=512) and issue (d=512, ω=384, |V|=30522, B=512): a head over
         random vocabulary embeddings and random unit vectors (5 captions per image, 12 Zipf-drawn terms):
           init               W2 = the embeddings, bias 0: about half the outputs fire, as in the first steps
           sparse-simulated   SIMULATED: every column but --live gets a -1e4 bias and the rest a bias leaving
                              --active terms per row; no training made it sparse
  demo   the Flickr8k example head (--head) on its real training vectors:
           init               W1 and LayerNorm re-initialised, bias 0 (the start of a run)
           epoch1             the first --run-steps steps of a real run from the init state (lr 1e-3, the η
                              warm-up: the head turning sparse); median after --warmup of them
           trained            the trained head itself (lr 1e-6 so it stays as trained)
  v30522 a head trained through the CLI at the paper's vocabulary (--trained-head: `mmsparse train-head
         --vocab-min-df 0`, |V| = 30522) on the real vectors:
           trained            that head, really sparse from training, timed as `demo trained`
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"paper": dict(d=256, omega=768, vocab=30522, batch=512),
          "issue": dict(d=512, omega=384, vocab=30522, batch=512)}
STATES = {"paper": ("init", "sparse-simulated"), "issue": ("init", "sparse-simulated"),
          "demo": ("init", "epoch1", "trained"), "v30522": ("trained",)}


def _median_time(fn, steps: int, warmup: int) -> float:
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
    from ..vocab import Vocab, pad_ids

    g = np.random.default_rng(seed)
    d, v = shape["d"], shape["vocab"]
    n_img = 4 * shape["batch"]
    n_cap = 5 * n_img
    voc = Vocab([f"t{i}" for i in range(v)], (0.05 * g.standard_normal((v, shape["omega"]))).astype(np.float32),
                None, "synthetic")
    torch.manual_seed(seed)
    head = D2SHead.from_vocab(d, voc)
    zi = torch.nn.functional.normalize(torch.randn(n_img, d), dim=1)
    zc = torch.nn.functional.normalize(zi.repeat_interleave(5, 0) + 0.5 * torch.randn(n_cap, d), dim=1)
    ranks = np.minimum(g.zipf(1.3, size=(n_cap, 12)) - 1, v - 1)
    data = PairData(zi, zc, torch.arange(n_img).repeat_interleave(5), [], [], [], {}, {})
    data.token_ids = [np.unique(r) for r in ranks]
    data.tok = torch.from_numpy(pad_ids(data.token_ids, v))
    return head, data


def _sparsen(head, data, active: int, live: int) -> None:
    """SIMULATED sparsity: only `live` random vocabulary columns can fire (the others get a bias of
    -1e4), and their bias leaves about `active` positive terms per row."""
    import torch

    with torch.no_grad():
        v = head.w2.weight.shape[0]
        keep = torch.randperm(v, generator=torch.Generator().manual_seed(1))[:live]
        pre = head.norm(head.w1(data.z_img[:256])) @ head.w2.weight[keep].T
        thr = float(torch.quantile(pre.flatten()[:2_000_000], 1.0 - active / live))
        head.w2.bias.fill_(-1e4)
        head.w2.bias[keep] = -thr


def _real(method, head_dir: str, images: str, captions: str):
    """The method set up exactly as `train-head` does on the real training files (vocabulary at the
    trained head's --vocab-min-df), with the trained head's weights loaded into its fresh head."""
    from ..methods.base import TrainInputs
    from ..methods.head import load_head

    trained = load_head(head_dir)
    method.cfg.vocab_min_df = int(trained.config.get("training", {}).get("vocab_min_df", method.cfg.vocab_min_df))
    head, data, _ = method.setup(TrainInputs(Path(images), Path(captions)))
    if head.vocab != trained.vocab:
        raise SystemExit(f"{head_dir}: its vocabulary differs from the one train-head builds from {captions}")
    head.load_state_dict(trained.state_dict())
    return head, data


def _prepare_synthetic(method, head, data, vocab_size: int) -> None:
    """What D2S.setup sets besides the data and head, for the synthetic shapes (no files to read)."""
    from ..methods.d2s.expansion import ExpansionControl
    from ..methods.d2s.method import image_words
    from ..trainer import warmup_steps
    from ..vocab import document_frequency

    cfg = method.cfg
    method.pec = ExpansionControl(cfg.expansion, document_frequency(data.token_ids, vocab_size), cfg.epochs,
                                  cfg.mask_caption_terms, cfg.pec_end)
    method.l1_warm = warmup_steps(cfg.l1_warmup, method.steps_per_epoch(data) * cfg.epochs)
    if cfg.doc_words_weight > 0:   # the default configuration trains with the caption-word loss
        method.img_words, method.word_weight = image_words(data, head.vocab, cfg.doc_words_target,
                                                           cfg.doc_words_max_df)


def measure(name: str, shape: dict, state: str, steps: int, warmup: int, active: int, live: int,
            head_dir: str | None = None, images: str | None = None, captions: str | None = None,
            run_steps: int = 60, amp: str = "none") -> dict:
    """Time one shape in one state; returns a row of the JSON (see the module doc). amp bf16: the
    forward passes under bf16 autocast, as `train-head --amp bf16` (where the CPU has it natively)."""
    import numpy as np
    import torch

    from ..runtime import autocast

    from ..methods.d2s.config import D2SConfig
    from ..methods.d2s.method import D2S
    from ..trainer import make_optimizer
    from .search import peak_rss_mb

    precision = "fp32" if amp == "none" else amp
    simulated = state == "sparse-simulated"
    cfg = D2SConfig(batch_size=shape["batch"])
    method = D2S(cfg)
    if name in ("demo", "v30522"):
        head, data = _real(method, head_dir, images, captions)
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
        if simulated:
            _sparsen(head, data, active, live)
        _prepare_synthetic(method, head, data, shape["vocab"])
    v = shape["vocab"]
    method.start_epoch(cfg.epochs // 2)   # mid-training: masks of both levels active
    opt = make_optimizer(method.param_groups(head), cfg.lr, cfg.weight_decay)
    if state != "epoch1":  # keep the head as it is (its sparsity is the state measured): a tiny step size
        for g in opt.param_groups:
            g["lr"] = 1e-6
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    gen = torch.Generator().manual_seed(0)
    batches = list(method.batches(data, gen, 0))
    B = shape["batch"]
    it = {"b": 0, "step": method.l1_warm}  # timed steps after the sparsity warm-up: full η
    if state == "epoch1":
        method.start_epoch(0)
        it["step"] = 0
    head.train()

    def step():
        b = it["b"] % len(batches)
        with autocast("cpu", precision):
            loss, _ = method.loss(head, batches[b], it["step"], gen, "cpu")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        method.after_step(head)
        it["b"] += 1
        it["step"] += 1

    if state == "epoch1":  # the first run_steps steps of a real run; median after the warm-up ones
        times = []
        for _ in range(max(run_steps, warmup + 1)):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        step_s, n_timed = statistics.median(times[warmup:]), len(times) - warmup
    else:
        step_s, n_timed = _median_time(step, steps, warmup), steps
    head.eval()
    idx0 = batches[0][0]
    u0 = torch.unique(data.cap_img[idx0])
    with torch.no_grad():  # after the timed steps: for epoch1, the head the steps ended with
        s = head(torch.cat([data.z_cap[idx0], data.z_img[u0]]))
        active_per_row = float((s > 0).sum(1).float().mean())
        live_cols = int((s > 0).any(0).sum())
    rows = B + int(np.mean([len(torch.unique(data.cap_img[b[0]])) for b in batches[:3]]))
    x = torch.randn(rows, shape["omega"], requires_grad=True)
    w = torch.nn.Parameter(head.w2.weight.detach().clone())
    gy = torch.randn(rows, v)

    def bare():
        x.grad = None
        w.grad = None
        with autocast("cpu", precision):
            y = x @ w.T
        y.backward(gy.to(y.dtype))

    bare_s = _median_time(bare, steps, warmup)
    return {"shape": name, "state": state, "amp": amp, "simulated": simulated, "d": shape["d"], "omega": shape["omega"],
            "vocab": v, "batch": B, "rows": rows, "active_terms_per_row": round(active_per_row, 1),
            "live_columns": live_cols, "threads": torch.get_num_threads(), "step_s": round(step_s, 6),
            "statistic": f"median of {n_timed} steps after {warmup} untimed",
            "pairs_per_s": round(B / step_s, 1), "bare_projection_s": round(bare_s, 6),
            "bare_pairs_per_s": round(B / bare_s, 1), "step_over_bare": round(step_s / bare_s, 3),
            "peak_rss_mb": peak_rss_mb()}


def markdown(rows: list[dict]) -> str:
    cols = ("shape", "state", "amp", "simulated", "vocab", "batch", "step_s", "pairs_per_s", "bare_projection_s",
            "step_over_bare", "active_terms_per_row", "live_columns", "peak_rss_mb", "statistic")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", type=Path, help="JSON output (a list of rows; + .md)")
    ap.add_argument("--shapes", default="paper,issue,demo,v30522", help="comma list of paper, issue, demo, v30522")
    ap.add_argument("--batch", type=int, default=512, help="captions per step (default 512)")
    ap.add_argument("--steps", type=int, default=7, help="timed steps per measurement (median; default 7)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--run-steps", type=int, default=60, help="demo epoch1: steps of the real run (default 60)")
    ap.add_argument("--active", type=int, default=60, help="active terms per row of the simulated sparse state")
    ap.add_argument("--live", type=int, default=3000,
                    help="vocabulary columns that can fire in the simulated sparse state (default 3000)")
    ap.add_argument("--head", help="demo shape: the example's trained D2S head directory")
    ap.add_argument("--trained-head", help="v30522 shape: a D2S head trained with --vocab-min-df 0")
    ap.add_argument("--images", help="demo/v30522: training image dense HDF5")
    ap.add_argument("--captions", help="demo/v30522: training caption dense HDF5")
    ap.add_argument("--amp", default="none", help="comma list of none, bf16: each row once per setting; bf16 rows "
                    "run under bf16 autocast where the CPU has a bf16 unit (AMX, AVX512-BF16) and are skipped, "
                    "saying so, elsewhere (default none)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: shape:state:amp, run in this process
    a = ap.parse_args(argv)
    if a.one:
        name, state, amp = a.one.split(":")
        shape = dict(SHAPES.get(name, {}), batch=a.batch)
        hd = a.trained_head if name == "v30522" else a.head
        print(json.dumps(measure(name, shape, state, a.steps, a.warmup, a.active, a.live, hd, a.images, a.captions,
                                 a.run_steps, amp)))
        return 0
    from ..runtime import cpu_bf16
    amps = [x for x in a.amp.split(",") if x != "bf16" or cpu_bf16()]
    if len(amps) < len(a.amp.split(",")):
        print("skipping the bf16 rows: this CPU has no bf16 matrix unit (AMX or AVX512-BF16)", file=sys.stderr)
    rows = []
    for name, amp in ((n, x) for x in amps for n in a.shapes.split(",")):
        need = a.trained_head if name == "v30522" else a.head
        if name in ("demo", "v30522") and not (need and a.images and a.captions):
            print(f"skipping {name}: needs {'--trained-head' if name == 'v30522' else '--head'}, --images and "
                  "--captions", file=sys.stderr)
            continue
        for state in STATES[name]:
            cmd = [sys.executable, "-m", "mmsparse.bench.train", "--one", f"{name}:{state}:{amp}", "--batch", str(a.batch),
                   "--steps", str(a.steps), "--warmup", str(a.warmup), "--active", str(a.active), "--live",
                   str(a.live), "--run-steps", str(a.run_steps)]
            if name in ("demo", "v30522"):
                cmd += ["--images", a.images, "--captions", a.captions]
                cmd += ["--trained-head", a.trained_head] if name == "v30522" else ["--head", a.head]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(f"{name:6s} {state:16s} {amp:4s} d={row['d']} ω={row['omega']} |V|={row['vocab']} B={row['batch']}: "
                  f"step {row['step_s']:.3f}s ({row['pairs_per_s']:.0f} pairs/s), bare {row['bare_projection_s']:.3f}s, "
                  f"ratio {row['step_over_bare']:.2f}, active {row['active_terms_per_row']:.0f}/row, "
                  f"{row['live_columns']} live columns, peak RSS {row['peak_rss_mb']:.0f} MiB "
                  f"[{row['statistic']}]", flush=True)
    if a.out:
        from ..atomic import atomic_path
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(a.out) as tmp:
            Path(tmp).write_text(json.dumps(rows, indent=1))
        a.out.with_suffix(".md").write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
