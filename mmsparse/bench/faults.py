"""Fault injection for the resumable stages: interrupt each many times at random points, rerun it,
and compare the result with a clean run's.

    python -m mmsparse.bench.faults -o work/bench/faults.json [--kills 50] [--seed 0]
        [--stages encode-images,encode-captions,train-head,sparsify,index] [--data DIR] [--model DIR]

Inputs are real: the first Flickr8k test images and their captions (--data, default the shared
Flickr8k folder) through the real dual encoder (--model), a D2S head trained on their vectors,
PISA. Each stage first runs once, uninterrupted: its output is the reference. Then each trial
(seeded) runs the same command and interrupts it one to three times before letting it finish:
SIGKILL or SIGINT (Ctrl-C), either at a random one of the stage's own interruption points
(`mmsparse.atomic.kill_point`, once per batch, step or build phase: MMSPARSE_TEST_KILL_AFTER and
MMSPARSE_TEST_KILL_SIGNAL) or after a random delay from outside, which lands anywhere: in a
write, a rename, the merge of shards, the clean-up. After the final run the output must equal the
reference: byte for byte for encode-dense, sparsify and the index's files, by recorded content for
train-head (weights, vocabulary, tokenizer, and config.json without its wall-clock seconds) and for
the index's mmsparse.json (without its build time); and nothing may be left beside it (temporary
siblings, OUT.partial/, OUT.ckpt/, lock files). A trial that ends otherwise is a failure, and the
run says which file differed.

`encode-images` and `encode-captions` are one encode-dense command whose interruptions are aimed
at the images' or the captions' batches (kill points of that phase; delays within its share of
the clean run's time). Interruptions are counted when they stopped the run (non-zero exit: a
SIGINT that lands in a finaliser is reported by Python and lost, and the run goes on). Writes OUT
(JSON: per stage the trials, interruptions, failures and what failed) and OUT with .md (a table).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("encode-images", "encode-captions", "train-head", "sparsify", "index")
LIMIT, BATCH = 12, 4           # images of the encode (and 5 captions each), rows per batch


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "mmsparse.cli", *map(str, args)]


def _sigint_default() -> None:
    """In the stage's process: SIGINT as at a terminal. A shell starts background jobs with SIGINT
    ignored, and Python installs no KeyboardInterrupt handler for a signal ignored at start-up."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Stage:
    """One command with its output, how its interruption points split into phases, and how its
    output is compared."""

    def __init__(self, name: str, cmd: list[str], out: Path, points: tuple[int, int], share: tuple[float, float]):
        self.name, self.cmd, self.out = name, cmd, out
        self.points = points        # kill points of this stage's phase: [first, last] (the last counted)
        self.share = share          # the phase's fraction of the clean run's time: (start, end)
        self.seconds = 0.0          # the clean run's wall time

    def run(self, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_sigint_default)


def _snapshot(path: Path, skip_keys=("seconds", "build_seconds")) -> dict:
    """{relative file: content} of an output (file or directory): bytes, or for JSON files the
    parsed object without wall-clock keys."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out = {}
    for f in files:
        rel = f.name if path.is_file() else str(f.relative_to(path))
        if f.suffix == ".json" and f.name in ("config.json", "mmsparse.json"):
            out[rel] = _strip(json.loads(f.read_text()), skip_keys)
        else:
            out[rel] = f.read_bytes()
    return out


def _strip(obj, keys):
    if isinstance(obj, dict):
        return {k: _strip(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_strip(v, keys) for v in obj]
    return obj


def _leftovers(out: Path) -> list[str]:
    """What a finished stage must not leave beside its output: temporary siblings, partial and
    checkpoint directories, lock files."""
    parent = out.parent
    bad = []
    for p in parent.iterdir():
        n = p.name
        if n.startswith(f".{out.name}") or n in (f"{out.name}.partial", f"{out.name}.ckpt") \
                or (n.startswith(".") and (".tmp-" in n or ".old-" in n or n.endswith(".lock"))):
            bad.append(n)
    return sorted(bad)


def _difference(ref: dict, got: dict) -> str | None:
    if ref.keys() != got.keys():
        return f"files: only in the reference {sorted(set(ref) - set(got))}, only here {sorted(set(got) - set(ref))}"
    for k in ref:
        if ref[k] != got[k]:
            return f"{k} differs"
    return None


def setup(root: Path, data: Path, model: Path) -> dict[str, Stage]:
    """The inputs (a small Karpathy JSON; the encode, head, sparse file the later stages read),
    made once without interruptions, and each stage's command."""
    ann = json.loads((data / "dataset_flickr8k.json").read_text())
    ims = [im for im in ann["images"] if im["split"] == "test"][:LIMIT]
    (root / "data.json").write_text(json.dumps({"dataset": "faults", "images": ims}))
    dense = root / "dense"
    enc = _cli("encode-dense", root / "data.json", data / "images", "--model", model, "--split", "test",
               "--batch-size", BATCH, "--workers", 1, "-o", dense)
    subprocess.run(enc, check=True, capture_output=True)
    head = root / "head"
    train = _cli("train-head", dense / "test-images.h5", dense / "test-captions.h5", "-o", head, "--epochs", 3,
                 "--batch-size", 16, "--vocab-min-df", 1, "--lr-warmup", 0, "--l1-warmup", 2, "--eta", 0.05,
                 "--sparsity-loss", "flops", "--doc-top-k", 32, "--query-top-k", 16, "--seed", 3)
    subprocess.run(train, check=True, capture_output=True)
    docs = root / "docs.h5"
    subprocess.run(_cli("sparsify", head, dense / "test-images.h5", "-o", docs, "--batch-size", 4), check=True,
                   capture_output=True)
    img_batches = -(-LIMIT // BATCH)
    cap_batches = -(-5 * LIMIT // BATCH)
    steps = 3 * -(-5 * LIMIT // 16)
    work = {name: root / "work" / name for name in STAGES}   # one folder each: leftovers are the stage's own
    for w in work.values():
        w.mkdir(parents=True)
    split = img_batches / (img_batches + cap_batches)

    def encode(name):
        return [*enc[:enc.index("-o")], "-o", str(work[name] / "dense")]

    return {
        "encode-images": Stage("encode-images", encode("encode-images"), work["encode-images"] / "dense",
                               (1, img_batches), (0.0, split)),
        "encode-captions": Stage("encode-captions", encode("encode-captions"), work["encode-captions"] / "dense",
                                 (img_batches + 1, img_batches + cap_batches), (split, 1.0)),
        "train-head": Stage("train-head", [*train[:train.index("-o")], "-o", str(work["train-head"] / "head"),
                                           *train[train.index("-o") + 2:]], work["train-head"] / "head", (1, steps),
                            (0.0, 1.0)),
        "sparsify": Stage("sparsify", _cli("sparsify", head, dense / "test-captions.h5", "-o", work["sparsify"] / "q.h5",
                                           "--batch-size", 4), work["sparsify"] / "q.h5", (1, cap_batches), (0.0, 1.0)),
        "index": Stage("index", _cli("index", docs, "-o", work["index"] / "index"), work["index"] / "index", (1, 3),
                       (0.0, 1.0)),
    }


def _clean(stage: Stage) -> None:
    for p in stage.out.parent.iterdir():
        if p.name == stage.out.name or p.name.startswith(f".{stage.out.name}") or p.name.startswith(
                f"{stage.out.name}."):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def interrupt(stage: Stage, rng: random.Random) -> dict:
    """One interrupted run of `stage`: at a kill point, or after a delay from outside."""
    sig = rng.choice(["KILL", "INT"])
    if rng.random() < 0.5:
        n = rng.randint(*stage.points)
        p = stage.run({"MMSPARSE_TEST_KILL_AFTER": str(n), "MMSPARSE_TEST_KILL_SIGNAL": sig})
        return {"how": "kill point", "at": n, "signal": sig, "exit": p.returncode}
    lo, hi = stage.share
    delay = stage.seconds * rng.uniform(lo, hi)
    proc = subprocess.Popen(stage.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_sigint_default)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        if sig == "KILL":   # the process alone, as the OOM killer or `kill -9 PID` does
            proc.kill()
        else:               # Ctrl-C: the terminal signals the whole process group (DataLoader workers too)
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    return {"how": "delay", "at": round(delay, 2), "signal": sig, "exit": proc.returncode}


def trial(stage: Stage, ref: dict, rng: random.Random) -> dict:
    _clean(stage)
    kills = [interrupt(stage, rng) for _ in range(rng.randint(1, 3))]
    final = stage.run()
    rec = {"kills": kills, "exit": final.returncode}
    if final.returncode:
        rec["failure"] = f"final run exited {final.returncode}: {final.stderr.strip().splitlines()[-1:]}"
        return rec
    diff = _difference(ref, _snapshot(stage.out))
    left = _leftovers(stage.out)
    if diff or left:
        rec["failure"] = diff or f"left behind: {left}"
    return rec


def run(stages: list[str], kills: int, seed: int, data: Path, model: Path, progress=print) -> dict:
    """Every stage of `stages`, `kills` interruptions each (trials of 1-3); returns the report."""
    report = {"seed": seed, "stages": {}}
    with tempfile.TemporaryDirectory(prefix="mmsparse-faults-") as tmp:
        all_stages = setup(Path(tmp), data, model)
        for name in stages:
            st = all_stages[name]
            _clean(st)
            count = Path(tmp) / f"{name}.points"
            t0 = time.perf_counter()
            st.run({"MMSPARSE_TEST_COUNT_POINTS": str(count)}).check_returncode()
            st.seconds = time.perf_counter() - t0
            total = int(count.read_text())
            if name == "encode-images":
                st.points = (1, min(st.points[1], total))
            else:
                st.points = (st.points[0], total) if name == "encode-captions" else (1, total)
            ref = _snapshot(st.out)
            rng = random.Random(f"{seed}-{name}")
            trials, n = [], 0
            while n < kills:   # interruptions that stopped the run (a SIGINT inside a finaliser can be lost)
                trials.append(trial(st, ref, rng))
                n += sum(k["exit"] != 0 for k in trials[-1]["kills"])
                last = ", ".join(f"{k['signal']} {k['how']} {k['at']}: exit {k['exit']}" for k in trials[-1]["kills"])
                progress(f"{name}: {n} interruptions, {sum('failure' in t for t in trials)} failed trial(s) "
                         f"(last trial: {last})")
            fails = [t for t in trials if "failure" in t]
            landed = [k for t in trials for k in t["kills"] if k["exit"] != 0]
            report["stages"][name] = {"clean_seconds": round(st.seconds, 2), "kill_points": list(st.points),
                                      "trials": len(trials), "interruptions": n, "failed_trials": len(fails),
                                      "by": {h: sum(k["how"] == h for k in landed) for h in ("kill point", "delay")},
                                      "signals": {s: sum(k["signal"] == s for k in landed) for s in ("KILL", "INT")},
                                      "failures": fails, "trial_log": trials}
    return report


def markdown(report: dict) -> str:
    rows = ["| stage | interruptions | trials | at kill points / after delays | SIGKILL / SIGINT | reruns equal to "
            "the clean run |", "|---|---:|---:|---|---|---:|"]
    for name, s in report["stages"].items():
        rows.append(f"| {name} | {s['interruptions']} | {s['trials']} | {s['by']['kill point']} / {s['by']['delay']} "
                    f"| {s['signals']['KILL']} / {s['signals']['INT']} | {s['trials'] - s['failed_trials']} of "
                    f"{s['trials']} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    from ..settings import dual_encoder_dir, flickr8k_dir

    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", type=Path, required=True, help="report JSON (and .md beside it)")
    p.add_argument("--kills", type=int, default=50, help="interruptions per stage (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the interruption points and signals (default 0)")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {', '.join(STAGES)} (default all)")
    p.add_argument("--data", type=Path, default=None, help="Flickr8k folder (default: the shared one)")
    p.add_argument("--model", type=Path, default=None, help="the dual encoder (default: the shared one)")
    a = p.parse_args(argv)
    stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        p.error(f"--stages: unknown stage {bad[0]!r}; choose from {', '.join(STAGES)}")
    report = run(stages, a.kills, a.seed, a.data or flickr8k_dir(), a.model or dual_encoder_dir(),
                 progress=lambda m: print(m, file=sys.stderr, flush=True))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    md = markdown(report)
    a.out.with_suffix(".md").write_text(md)
    print(md)
    return 1 if any(s["failed_trials"] for s in report["stages"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
