"""--target-flops 12,9.4,6: one run through every budget (a head per budget, each in its band, resumed
exactly), and the budget controller's defects of issue 55, each with a test that fails without its fix."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from mmsparse.methods import budget as B
from mmsparse.methods.budget import FlopsBudget, diagnose, parse_budgets
from test_flops_budget import _probe_head, _train, pair_files, synthetic  # noqa: F401 (fixtures)


def test_budgets_parse_as_written_largest_first():
    assert parse_budgets("12, 9.4,6") == [("12", 12.0), ("9.4", 9.4), ("6", 6.0)]
    assert parse_budgets(9.4) == [("9.4", 9.4)] and parse_budgets(None) == []
    for bad, says in (("6,9.4", "largest first"), ("9.4,x", "'x' is not a number"), ("0", "> 0"),
                      ("6,6", "largest first")):
        with pytest.raises(ValueError, match=says):
            parse_budgets(bad)


def test_each_later_stage_has_its_own_schedule_and_the_first_is_the_single_runs():
    from mmsparse.trainer import Stage, lr_factor, staged_lr_factor

    stages = [Stage("12", 12, 4), Stage("6", 6, 2, 0.5)]
    for s in range(8):   # the first budget: exactly a single run's schedule over its own epochs
        assert staged_lr_factor(s, stages, 2, 0.1, "linear") == lr_factor(s, 8, 0.1, "linear")
    assert staged_lr_factor(8, stages, 2, 0.1, "linear") == pytest.approx(0.5)        # restarts at lr_scale
    assert staged_lr_factor(11, stages, 2, 0.1, "linear") == pytest.approx(0.5 / 4)   # and decays over its 4 steps


@pytest.fixture(scope="module")
def start_flops(synthetic):
    torch.set_num_threads(1)
    _, _, res = _train(synthetic, None, epochs=3, eta=0.02)
    return res.history[-1]["val"]["FLOPs"]


def test_a_path_saves_each_budget_in_its_own_band_and_resumes_to_identical_heads(synthetic, start_flops, tmp_path,
                                                                                 monkeypatch):
    """Two budgets in one run: each stage's saved epoch is one of its own epochs, inside its own band;
    the multiplier's first step towards the second budget is taken as the stage starts (traced);
    a run killed inside the second stage and rerun gives the same heads as an uninterrupted one."""
    import mmsparse.trainer as T

    torch.set_num_threads(1)
    targets = [("a", start_flops / 6), ("b", start_flops / 12)]
    built = {}
    real = T.fit

    def fit(method, head, train, val=None, **kw):   # hand on_stage the method _train built
        built["m"] = method
        return real(method, head, train, val, **kw)

    monkeypatch.setattr(T, "fit", fit)
    stages = [T.Stage(lab, f, e) for (lab, f), e in zip(targets, (12, 6))]
    args = {"stages": stages, "on_stage": lambda i, rec: built["m"].retarget(stages[i].target, rec)}
    m, head, whole = _train(synthetic, targets[0][1], epochs=12, eta=0.02, fit_args=dict(args, ckpt_dir=tmp_path / "a"))
    assert len(whole.history) == 18 and len(whole.stages) == 2
    for i, ((lab, f), (best, state)) in enumerate(zip(targets, whole.stages)):
        rec = whole.history[best - 1]
        assert rec["stage"] == i
        assert f / 1.15 <= rec["val"]["FLOPs"] <= f * 1.15, (lab, rec["val"]["FLOPs"], f)
    retargets = [t for t in m.budget.trace if "retarget" in t]
    assert [t["retarget"] for t in retargets] == [pytest.approx(targets[1][1])]
    assert retargets[0]["scale"] > whole.history[11]["eta_scale"]     # tightened at once
    _, _, part = _train(synthetic, targets[0][1], epochs=12, eta=0.02,
                        fit_args=dict(args, ckpt_dir=tmp_path / "b", stop_after_epoch=14))
    assert not part.finished
    _, _, rest = _train(synthetic, targets[0][1], epochs=12, eta=0.02, fit_args=dict(args, ckpt_dir=tmp_path / "b"))
    assert [h["eta_scale"] for h in rest.history] == [h["eta_scale"] for h in whole.history]
    for (b1, s1), (b2, s2) in zip(whole.stages, rest.stages):
        assert b1 == b2
        for k in s1:
            torch.testing.assert_close(s1[k], s2[k])


def test_train_head_writes_a_head_per_budget_with_its_record(pair_files, tmp_path, caplog):  # noqa: F811
    """The API (as the CLI): OUT/flops-F per budget as written, each a normal head whose record names
    its budget, its saved epoch, the stage's epochs and where the path came from; one summary line per
    budget; no checkpoint left."""
    import mmsparse
    from mmsparse.progress import LogReporter

    torch.set_num_threads(1)
    out = tmp_path / "path"
    with caplog.at_level(logging.INFO, logger="mmsparse"):
        mmsparse.train_head(pair_files / "train-images.h5", pair_files / "train-captions.h5", out=out,
                            epochs=12, batch_size=64, l1_warmup=0, target_flops="3,2", path_epochs=4,
                            progress=LogReporter())
    assert sorted(p.name for p in out.iterdir()) == ["flops-2", "flops-3"]
    assert not (tmp_path / "path.ckpt").exists()
    for label, stage, epochs, frm in (("3", 1, [1, 12], None), ("2", 2, [13, 16], "3")):
        tr = json.loads((out / f"flops-{label}" / "config.json").read_text())["training"]
        assert tr["path"] == {"budgets": ["3", "2"], "budget": label, "stage": stage, "epochs": epochs,
                              "lr_scale": 1.0, "from": frm}
        assert tr["config"]["target_flops"] == float(label) and tr["flops_budget"]["target"] == float(label)
        assert epochs[0] <= tr["best_epoch"] <= epochs[1]
        assert float(label) / 1.15 <= tr["val"]["FLOPs"] <= float(label) * 1.15
        assert f"--target-flops {label}: {out / f'flops-{label}'} epoch {tr['best_epoch']}" in caplog.text
    head = mmsparse.load_head(out / "flops-2")
    assert head.config["training"]["path"]["budget"] == "2"


def test_a_method_without_a_path_refuses_several_budgets(tmp_path):
    import mmsparse
    from mmsparse.errors import InputError

    with pytest.raises(InputError, match=r"--target-flops 9,6: --method vdr trains one budget per run"):
        mmsparse.train_head(tmp_path / "a.h5", tmp_path / "b.h5", out=tmp_path / "h", method="vdr", target_flops="9,6")
    with pytest.raises(InputError, match="largest first"):
        mmsparse.train_head(tmp_path / "a.h5", tmp_path / "b.h5", out=tmp_path / "h", target_flops="6,9")


def test_a_head_outside_its_band_is_written_recorded_off_budget_and_exits_3(pair_files, tmp_path, monkeypatch,  # noqa: F811
                                                                           capsys):
    """A budget the run cannot reach: the head is written (for inspection), its record says off_budget
    with the FLOPs it landed at, and the command says so in one line and exits 3."""
    import sys

    from mmsparse import cli

    torch.set_num_threads(1)
    out = tmp_path / "head"
    monkeypatch.setattr(sys, "argv", ["mmsparse", "train-head", str(pair_files / "train-images.h5"),
                                      str(pair_files / "train-captions.h5"), "-o", str(out), "--epochs", "2",
                                      "--batch-size", "64", "--l1-warmup", "0", "--target-flops", "0.05"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 3
    err = capsys.readouterr().err.strip().splitlines()
    line = [x for x in err if x.startswith("mmsparse: error:")]
    assert len(line) == 1 and "--target-flops 0.05: saved epoch" in line[0] and "outside 0.0435..0.0575" in line[0]
    fb = json.loads((out / "config.json").read_text())["training"]["flops_budget"]
    assert fb["off_budget"] is True and fb["landed"] > 0.0575


def test_diagnose_says_too_short_only_where_more_epochs_would_help():
    falling = [{"epoch": e, "val": {"FLOPs": f}} for e, f in ((1, 40.0), (2, 20.0), (3, 10.0))]
    flat = [{"epoch": e, "val": {"FLOPs": f}} for e, f in ((1, 40.0), (2, 10.0), (3, 10.0))]
    assert "too short" in diagnose(falling, 2.0) and "about 3 more epochs" in diagnose(falling, 2.0)
    assert "too short" not in diagnose(flat, 2.0) and "stopped falling" in diagnose(flat, 2.0)
    assert "refused" in diagnose(falling, 2.0, refused=True)
    assert "under the band" in diagnose([{"epoch": 1, "val": {"FLOPs": 0.0}}], 2.0)   # FLOPs 0: no crash


def test_the_guard_catches_a_slow_fall_not_only_a_sudden_one():
    """4 % an epoch is under MAX_DROP each time, 7.8 % over two: m stops rising."""
    b = FlopsBudget(4.0)
    b.update(400.0, metric=0.200)
    b.update(390.0, metric=0.192)
    up = b.update(380.0, metric=0.184)
    assert b.refused and b.update(370.0, metric=0.177) == pytest.approx(up)


def test_the_multiplier_holds_where_cutting_it_does_not_raise_the_flops():
    """Anti-windup: FLOPs stuck under the band (the gates cap the head) stop m falling after INEFFECTIVE
    cuts, so a later budget does not have to climb back from 1e-4; the gates may turn then."""
    b = FlopsBudget(10.0)
    for _ in range(12):
        b.update(5.0)
    assert b.scale > 0.2 and b.saturated and b.gates_turn(5.0)
    b.update(20.0)   # above the budget again: m may rise
    assert not b.saturated


def test_retarget_starts_the_controller_afresh_and_steps_at_once():
    b = FlopsBudget(12.0)
    for f in (30.0, 20.0, 12.5, 12.1):
        b.update(f, metric=0.2)
    before = b.scale
    after = b.retarget(6.0, 12.1, epoch=4)
    assert after == pytest.approx(2 * before) and b.target == 6.0 and b.trace[-1]["retarget"] == 6.0
    assert b.metrics == [] and not b.refused and b.limit == pytest.approx(6.9)


def test_the_collapse_warning_ignores_epochs_before_the_warm_up():
    hist = [{"epoch": 1, "step": 5, "val": {"R@1": 0.5}}, {"epoch": 2, "step": 10, "val": {"R@1": 0.2}}]
    assert B.collapsed(hist, 1, "R@1") is not None
    assert B.collapsed(hist, 1, "R@1", lambda h: h["step"] >= 10) is None


def test_the_gate_probe_centres_once():
    """--center mean: the probe's figures at the head's gates are those sparsify writes (the head
    centres its input itself; centring before it too aimed every gate step with wrong figures)."""
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.methods.d2s.method import D2S, evaluate_head
    from mmsparse.vocab import Vocab

    _, val = _probe_head()
    g = torch.Generator().manual_seed(1)
    voc = Vocab([f"t{i}" for i in range(120)], torch.randn(120, 8, generator=g), None, "random")
    torch.manual_seed(0)
    head = D2SHead.from_vocab(16, voc, {}, init_bias=-0.3, doc_top_k=24, query_top_k=12, center="mean")
    head.center_image.copy_(0.5 * torch.randn(16, generator=g))
    head.center_text.copy_(0.5 * torch.randn(16, generator=g))
    m = D2S(D2SConfig(target_flops=3.0, center="mean"))
    m.budget.gates = m.head_gates(head)
    got = m.gate_probe(head, val).figures(m.budget.gates)
    want = evaluate_head(head, val)
    for k in ("FLOPs", "R@1", "d_nnz"):
        assert got[k] == pytest.approx(want[k], rel=1e-6), k


def test_the_inference_free_paper_preset_uses_the_flops_regulariser():
    from mmsparse.methods.base import preset_values
    from mmsparse.methods.inference_free.config import InferenceFreeConfig

    assert preset_values(InferenceFreeConfig, "paper")["sparsity_loss"] == "flops"


def test_held_out_images_never_reach_training(pair_files):  # noqa: F811
    """Without validation files the budget's images are held out of training: none of them is among the
    training pairs the batches are drawn from."""
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S

    m = D2S(D2SConfig(target_flops=2.0))
    _, train, val = m.setup(TrainInputs(pair_files / "train-images.h5", pair_files / "train-captions.h5",
                                        None, None, None, None))
    assert len(val.img_ids) == 25 and len(train.img_ids) == 125
    assert not set(val.img_ids) & set(train.img_ids)
    assert not set(val.img_ids) & {train.img_ids[i] for i in train.cap_img.tolist()}


def test_paths_against_independent_heads_by_seed_with_the_student_interval(tmp_path, capsys):
    """python -m mmsparse.metrics.paths: per budget the per-seed differences, their mean and 95 % Student
    interval, and the −0.5-point rule (fails when a budget's interval reaches below it)."""
    from scipy.stats import t

    from mmsparse.metrics import paths

    def head(name, budget, seed, r1, r10):
        d = tmp_path / name
        d.mkdir()
        d.joinpath("config.json").write_text(json.dumps({"training": {
            "config": {"target_flops": budget, "seed": seed}, "best_epoch": 3,
            "val": {"R@1": r1, "R@10": r10, "FLOPs": budget}}}))
        return str(d)

    pairs = [f"{head(f'p{s}', 6.0, s, 0.190 + dp, 0.590)}={head(f'i{s}', 6.0, s, 0.190, 0.590 - dp)}"
             for s, dp in ((1, 0.001), (2, 0.002), (3, 0.003))]
    assert paths.main([*sum((["--pair", p] for p in pairs), []), "-o", str(tmp_path / "t.md")]) == 0
    rows, ok = paths.compare([tuple(p.split("=")) for p in pairs])
    mean, lo, hi = rows[0]["R@1"]
    half = t.ppf(0.975, 2) * 0.1 / 3 ** 0.5      # differences 0.1, 0.2, 0.3 points: sd 0.1
    assert mean == pytest.approx(0.2) and lo == pytest.approx(0.2 - half) and hi == pytest.approx(0.2 + half)
    assert ok and "holds: train from paths" in (tmp_path / "t.md").read_text()       # lower end −0.05 > −0.5
    worse = [f"{head(f'q{s}', 4.0, s, 0.180 - dp, 0.57)}={head(f'j{s}', 4.0, s, 0.180, 0.57)}"
             for s, dp in ((1, 0.002), (2, 0.008), (3, 0.014))]   # −0.2, −0.8, −1.4 points
    assert not paths.compare([tuple(p.split("=")) for p in pairs + worse])[1]
    assert paths.main(["--pair", pairs[0].split("=")[0] + "=" + worse[0].split("=")[1]]) == 2   # budgets differ
    assert "not the same budget and seed" in capsys.readouterr().err
