"""train-head --target-flops F (mmsparse.methods.budget): the sparsity weights' multiplier follows the
measured FLOPs, resumes exactly, bounds the saved epoch, and moves a real training run's FLOPs to F."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmsparse.methods.budget import FlopsBudget


def test_budget_multiplier_moves_against_the_error_and_settles():
    b = FlopsBudget(6.0)
    assert b.scale == 1.0 and b.limit == pytest.approx(6.9)
    assert b.update(24.0) == pytest.approx(2.0)          # too many FLOPs: x2 (the largest step)
    assert b.update(24.0) == pytest.approx(4.0)          # still, flat: x2 again
    s = b.update(3.0)                                    # crossed below (and falling): back, by a halved step
    assert s < 4.0 and s == pytest.approx(4.0 / math.sqrt(2))
    s2 = b.update(6.0)                                   # on the budget but rising: hold almost still
    assert abs(math.log(s2 / s)) < 0.5 * math.log(2)
    before = b.scale
    b2 = FlopsBudget(6.0)
    b2.load_state_dict(json.loads(json.dumps(b.state_dict())))    # a resumed run continues exactly
    assert b2.update(8.0) == pytest.approx(b.update(8.0)) and b2.trace == b.trace and b.scale != before
    assert FlopsBudget(1.0).update(0.25) == pytest.approx(0.5)    # too few FLOPs: lower the weights
    low = FlopsBudget(1.0)
    for _ in range(200):
        low.update(1e9)
    assert low.scale == pytest.approx(1e4)                       # bounded
    assert [t["epoch"] for t in b.trace] == [None] * len(b.trace)
    with pytest.raises(ValueError):
        FlopsBudget(0.0)


def _train(data, target, epochs=15, fit_args=None, **extra):
    """A D2S head on the synthetic pairs of tests/test_d2s.py (seeded), through mmsparse.trainer.fit."""
    from mmsparse.methods.base import make_config
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.expansion import ExpansionControl
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.methods.d2s.method import D2S
    from mmsparse.trainer import fit
    from mmsparse.vocab import Vocab, document_frequency

    train, val, vocab, tok = data
    cfg = make_config(D2SConfig, dict(epochs=epochs, batch_size=20, eta=0.02, sparsity_loss="flops",
                                      expansion="full", l1_warmup=0, lr_warmup=0, lr=3e-2, vocab_lr=3e-2,
                                      lr_schedule="constant", target_flops=target, **extra))
    m = D2S(cfg)
    m.pec = ExpansionControl(cfg.expansion, document_frequency(tok, len(vocab)), cfg.epochs)
    m.l1_warm = 0
    voc = Vocab(vocab, torch.randn(len(vocab), 8, generator=torch.Generator().manual_seed(3)), None, "random")
    torch.manual_seed(0)
    head = D2SHead.from_vocab(16, voc, {})
    return m, fit(m, head, train, val, **(fit_args or {}))


@pytest.fixture(scope="module")
def synthetic():
    from test_d2s import _synthetic_pairs

    train, vocab, tok = _synthetic_pairs(200, n_img=80)
    val, _, _ = _synthetic_pairs(200, n_img=80)
    return train, val, vocab, tok


def test_target_flops_moves_validation_flops_to_the_budget(synthetic):
    """Without a budget the head sits near F0; with F0 / 3 the controller raises η until validation
    FLOPs come down to it, and the saved epoch keeps them within F·(1 ± 15 %)."""
    torch.set_num_threads(1)
    _, free = _train(synthetic, None)
    f0 = free.history[-1]["val"]["FLOPs"]
    target = f0 / 3
    m, res = _train(synthetic, target)
    saved = res.history[res.best_epoch - 1]
    assert [h["eta_scale"] for h in res.history][0] == 1.0 and max(h["eta_scale"] for h in res.history) > 2
    assert saved["val"]["FLOPs"] <= target * 1.15 and saved["val"]["FLOPs"] >= target / 1.15
    assert m.budget.trace[-1]["epoch"] == len(res.history)


def test_budget_resumes_exactly(synthetic, tmp_path):
    """A run killed after epoch 6 and rerun continues the budget where it was: the same multipliers,
    the same saved epoch and weights as an uninterrupted run."""
    torch.set_num_threads(1)
    target = 5.0
    _, whole = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "a"})
    _, part = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "b", "stop_after_epoch": 6})
    assert not part.finished and len(part.history) == 6
    _, rest = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "b"})
    assert [h["eta_scale"] for h in rest.history] == [h["eta_scale"] for h in whole.history]
    assert rest.best_epoch == whole.best_epoch
    for k in whole.state:
        torch.testing.assert_close(rest.state[k], whole.state[k])


def test_frontier_table_and_picture(tmp_path):
    """python -m mmsparse.metrics.frontier: a row per head with its budget, where validation FLOPs
    landed, R@k ± standard error and the share of dense; points; the paired t-tests; the PNG."""
    from mmsparse.errors import InputError
    from mmsparse.metrics.frontier import main

    def write(path, obj):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))

    write(tmp_path / "dense.json", {"R@1": 0.2, "R@10": 0.6, "queries": 5000})
    for name, budget, val, r1 in (("a2", 2.0, 2.2, 0.15), ("a6", 6.0, 5.7, 0.19), ("b6", 6.0, 6.4, 0.18)):
        write(tmp_path / "heads" / name / "config.json", {"training": {"flops_budget": {"target": budget},
                                                                       "val": {"FLOPs": val}, "precision": "bf16"}})
        write(tmp_path / f"{name}.json", {"R@1": r1, "R@10": 0.55, "FLOPs": val * 0.98, "queries": 5000,
                                          "doc_Exact@10": 0.41})
    write(tmp_path / "pair.json", {"R@1": 0.18, "R@10": 0.55, "queries": 5000, "n_comparisons": 1,
                                   "compare": {"runs/a6.trec": {"R@1": 0.19, "R@10": 0.56, "p_R@1": 0.01,
                                                                "p_R@10": 0.2}}})
    rows = [f"--row={m}={tmp_path / 'heads' / h}={tmp_path / h}.json" for m, h in (("A", "a2"), ("A", "a6"),
                                                                                   ("B", "b6"))]
    out = tmp_path / "frontier" / "table.md"
    assert main(["--dense", str(tmp_path / "dense.json"), *rows, "--point", f"VDR (k=48)={tmp_path / 'a2.json'}",
                 "--paired", f"B vs A={tmp_path / 'pair.json'}", "-o", str(out), "--plot",
                 str(tmp_path / "frontier" / "f.png")]) == 0
    md = out.read_text()
    assert "| A | 2 | 2.20 (1.10) | 2.16 | 15.0 ± 0.5 | 55.0 ± 0.7 | 0.750 | 0.917 | 41.0 |" in md
    assert "| B vs A | 18.0 | 19.0 | -1.0 | 0.01 |" in md and "| VDR (k=48) |" in md and "| dense |" in md
    assert (tmp_path / "frontier" / "f.png").stat().st_size > 1000
    assert len(json.loads(out.with_suffix(".json").read_text())["rows"]) == 3
    with pytest.raises(InputError, match="exactly one --compare"):
        main(["--dense", str(tmp_path / "dense.json"), "--paired", f"x={tmp_path / 'dense.json'}", "-o", str(out)])


def test_make_frontier_trains_every_budget(tmp_path):
    """`make -n frontier`: one head per budget with --target-flops (the main job's head stands for its own
    budget, D2S_BUDGET), joint with D2S's options, the paired tests, and a budget added later is trained
    although a table already exists (the rows file)."""
    import shlex
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def dry(*args):
        p = subprocess.run(["make", "-n", "-C", str(root / "examples" / "flickr8k"), f"WORK={tmp_path}", *args,
                            "frontier"], capture_output=True, text=True, check=True)
        cmds = [shlex.split(c) for c in p.stdout.replace("\\\n", " ").splitlines() if c.startswith(("mmsparse", "python"))]
        return {c[c.index("-o") + 1].rsplit("/", 1)[1]: c for c in cmds if c[:2] == ["mmsparse", "train-head"]}, cmds

    train, cmds = dry()
    budgets = {h: c[c.index("--target-flops") + 1] for h, c in train.items()}
    assert budgets == {"front-d2s-2": "2", "front-d2s-4": "4", "front-d2s-6": "6", "front-d2s-8": "8", "d2s": "9.4",
                       "front-d2s-12": "12", "front-if-0.5": "0.5", "front-if-1": "1", "front-if-2": "2",
                       "front-joint-6": "6", "front-joint-9.4": "9.4"}
    assert "--doc-max-share" in train["front-joint-6"] and "--method" in train["front-joint-6"]
    assert sum(c[:3] == ["mmsparse", "eval", f"{tmp_path}/runs/front-joint-6.expand.trec"] and "--compare" in c
               for c in cmds) == 1
    (tmp_path / "frontier").mkdir(exist_ok=True)
    (tmp_path / "frontier" / "table.md").write_text("an older table")
    train, _ = dry("FRONTIER_D2S=3", "FRONTIER_IF=", "FRONTIER_JOINT=")
    assert "front-d2s-3" in train and (tmp_path / "frontier" / "rows.txt").read_text().count("D2S=") == 1
