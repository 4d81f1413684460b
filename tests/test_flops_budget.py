"""train-head --target-flops F (mmsparse.methods.budget): the gates and the sparsity weights' multiplier
follow the FLOPs of the vectors sparsify writes, each step bounded in what it may cost, the saved epoch
keeps the budget from the defaults and from the paper's settings, with and without validation files,
resumes exactly, and a collapsed head is never saved silently."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from mmsparse.methods import budget as B
from mmsparse.methods.budget import FlopsBudget


def test_multiplier_moves_against_the_error_holds_while_the_gates_move_and_resumes():
    b = FlopsBudget(6.0)
    assert b.scale == 1.0 and b.limit == pytest.approx(6.9)
    assert b.update(24.0) == pytest.approx(2.0)                    # too many FLOPs: x2 (the largest step)
    assert b.update(24.0, moved=True) == pytest.approx(2.0)        # the gates moved this epoch: m holds
    assert b.update(24.0) == pytest.approx(4.0)
    assert b.update(3.0) < 4.0                                     # crossed below: back down
    c = FlopsBudget(6.0)
    c.gates = {"text": 32, "image": 64}
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))    # a resumed run continues exactly
    assert c.update(8.0, metric=0.2) == pytest.approx(b.update(8.0, metric=0.2)) and c.trace == b.trace
    assert FlopsBudget(1.0).update(0.25) == pytest.approx(0.5)    # too few FLOPs: lower the weights


def test_multiplier_never_rises_after_the_metric_fell():
    """The paper-preset collapse of issue 49: m doubling every epoch while validation R@1 fell to 0.3.
    After an epoch whose metric fell by more than MAX_DROP, m does not rise, whatever the FLOPs say."""
    b = FlopsBudget(4.0)
    b.update(1600.0, metric=0.19)
    rose = b.update(1500.0, metric=0.185)                          # small loss: m may rise
    assert rose > 2.0
    held = b.update(1400.0, metric=0.10)                           # the head paid for it: no further rise
    assert held == pytest.approx(rose)
    for _ in range(100):
        b.update(1e9)
    assert b.scale == pytest.approx(1e4)                          # bounded


def _probe_head(v=120, d=16, seed=0):
    """A D2S head with random weights over v terms (W2 biased so each row holds ~v/3 positive weights),
    the posting floor set on 60 random images, and validation pairs of 40 images x 2 captions."""
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.methods.pairs import PairData
    from mmsparse.vocab import Vocab

    g = torch.Generator().manual_seed(seed)
    voc = Vocab([f"t{i}" for i in range(v)], torch.randn(v, 8, generator=g), None, "random")
    torch.manual_seed(seed)
    head = D2SHead.from_vocab(d, voc, {}, init_bias=-0.3, doc_top_k=24, query_top_k=12, doc_max_share=0.3)
    head.prune_postings(torch.randn(60, d, generator=g), 0.3)
    zi = torch.nn.functional.normalize(torch.randn(40, d, generator=g), dim=1)
    cap_img = torch.arange(40).repeat_interleave(2)
    zc = torch.nn.functional.normalize(zi[cap_img] + 0.4 * torch.randn(80, d, generator=g), dim=1)
    val = PairData(zi, zc, cap_img, [f"i{i}" for i in range(40)], [f"c{i}" for i in range(80)], [""] * 80, {}, {})
    return head, val


def test_gate_probe_is_what_sparsify_writes_at_any_gate():
    """The probe re-gates the validation vectors without the head: at every gate pair its FLOPs and
    figures equal those of the head's own vectors with those gates set (sparsify's encode_csr: top-k,
    then the posting floor), the floor included."""
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S, evaluate_head
    from mmsparse.metrics.efficiency import flops

    head, val = _probe_head()
    m = D2S(D2SConfig(target_flops=3.0))
    m.budget.gates = m.head_gates(head)
    probe = m.gate_probe(head, val)
    assert probe.sides == ("text", "image") and probe.q_cols.shape[1] == 24 and probe.d_cols.shape[1] == 48
    floors = 0
    for gates in ({"text": 12, "image": 24}, {"text": 6, "image": 48}, {"text": 24, "image": 11}):
        D2S.set_gates(head, gates)
        want = evaluate_head(head, val)
        got = probe.figures(gates)
        for k in ("R@1", "R@10", "FLOPs", "q_nnz", "d_nnz"):
            assert got[k] == pytest.approx(want[k], rel=1e-6), (gates, k)
        assert probe.flops(gates) == pytest.approx(flops(probe.matrix("text", gates["text"]),
                                                         probe.matrix("image", gates["image"])))
        floors += int((probe.matrix("image", gates["image"]).getnnz(1) < gates["image"]).sum())
    assert floors > 0   # the floor cut some images below their gate: it is inside the measurement


def test_plan_reaches_the_goal_with_the_best_pair_and_bounds_the_step(monkeypatch):
    """plan: the new gates' FLOPs reach the goal (at most RATIO x nearer F than now), the pair taken is
    the best of those measured, and with no loss allowed (MAX_DROP 0) a step that costs the metric is
    not taken."""
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.method import D2S

    head, val = _probe_head()
    m = D2S(D2SConfig(target_flops=0.5))
    m.budget.gates = m.head_gates(head)
    probe = m.gate_probe(head, val)
    now = probe.figures(m.budget.gates)
    goal = max(0.5, now["FLOPs"] / B.RATIO)
    monkeypatch.setattr(B, "MAX_DROP", 1.0)
    gates = FlopsBudget(0.5)
    gates.gates = dict(m.budget.gates)
    new = gates.plan(probe, now)
    assert new != m.budget.gates and probe.flops(new) <= goal * (1 + B.TOLERANCE / 3)
    assert probe.flops(new) >= goal / 3          # a step toward F, not a jump to the smallest gates
    monkeypatch.setattr(B, "MAX_DROP", 0.0)
    strict = FlopsBudget(0.5)
    strict.gates = dict(m.budget.gates)
    kept = strict.plan(probe, now)
    assert kept == m.budget.gates or probe.figures(kept)["R@1"] >= now["R@1"]
    inside = FlopsBudget(now["FLOPs"])                # inside the band nothing moves
    inside.gates = dict(m.budget.gates)
    assert inside.plan(probe, now) == m.budget.gates


def _train(data, target, epochs=15, fit_args=None, preset="default", **extra):
    """A D2S head on the synthetic pairs of tests/test_d2s.py (seeded), through mmsparse.trainer.fit;
    the preset's values, then a small-data schedule, then `extra`."""
    from mmsparse.methods.base import make_config, preset_values
    from mmsparse.methods.d2s.config import D2SConfig
    from mmsparse.methods.d2s.expansion import ExpansionControl
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.methods.d2s.method import D2S
    from mmsparse.trainer import fit
    from mmsparse.vocab import Vocab, document_frequency

    train, val, vocab, tok = data
    small = dict(epochs=epochs, batch_size=20, expansion="full", l1_warmup=0, lr_warmup=0, lr=3e-2, vocab_lr=3e-2,
                 lr_schedule="constant", target_flops=target, doc_words_weight=0.0)
    cfg = make_config(D2SConfig, {**preset_values(D2SConfig, preset), **small, **extra})
    m = D2S(cfg)
    m.pec = ExpansionControl(cfg.expansion, document_frequency(tok, len(vocab)), cfg.epochs)
    m.l1_warm = 0
    voc = Vocab(vocab, torch.randn(len(vocab), 8, generator=torch.Generator().manual_seed(3)), None, "random")
    torch.manual_seed(0)
    head = D2SHead.from_vocab(16, voc, {}, doc_top_k=cfg.doc_top_k, query_top_k=cfg.query_top_k,
                              doc_max_share=cfg.doc_max_share)
    return m, head, fit(m, head, train, val, **(fit_args or {}))


@pytest.fixture(scope="module")
def synthetic():
    from test_d2s import _synthetic_pairs

    train, vocab, tok = _synthetic_pairs(200, n_img=80)
    val, _, _ = _synthetic_pairs(200, n_img=80)
    return train, val, vocab, tok


@pytest.mark.parametrize("preset", ["default", "paper"])
def test_target_flops_lands_from_the_defaults_and_the_paper_preset(synthetic, preset):
    """From either preset (the paper's: no gates, L1 η) a budget an eighth of where the head starts is
    reached through the gates within ±15 %, the saved epoch keeps the limit and at least half the run's
    best validation R@1 (not collapsed), and its gates are what the head is saved with."""
    torch.set_num_threads(1)
    m, head, res = _train(synthetic, None, epochs=3, preset=preset, eta=0.02)
    f0 = res.history[-1]["val"]["FLOPs"]
    target = f0 / 8
    m, head, res = _train(synthetic, target, preset=preset, eta=0.02)
    i = res.best_epoch - 1
    saved = res.history[i]
    assert target / 1.15 <= saved["val"]["FLOPs"] <= target * 1.15
    assert B.collapsed(res.history, i, "R@1") is None
    assert all(0 < k for k in saved["gates"].values())          # the budget gated both sides
    head.load_state_dict(res.state)
    m.load_epoch(head, saved)
    assert {"text": head.top_k("text"), "image": head.top_k("image")} == saved["gates"]
    assert [t["epoch"] for t in m.budget.trace] == [h["epoch"] for h in res.history]


def test_budget_resumes_exactly(synthetic, tmp_path):
    """A run killed after epoch 6 and rerun continues the budget where it was: the same multipliers and
    gates, the same saved epoch and weights as an uninterrupted run."""
    torch.set_num_threads(1)
    target = 5.0
    _, _, whole = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "a"})
    _, _, part = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "b", "stop_after_epoch": 6})
    assert not part.finished and len(part.history) == 6
    _, _, rest = _train(synthetic, target, epochs=10, fit_args={"ckpt_dir": tmp_path / "b"})
    assert [(h["eta_scale"], h["gates"]) for h in rest.history] == [(h["eta_scale"], h["gates"]) for h in whole.history]
    assert len({json.dumps(h["gates"]) for h in whole.history}) > 1          # the gates did move
    assert rest.best_epoch == whole.best_epoch
    for k in whole.state:
        torch.testing.assert_close(rest.state[k], whole.state[k])


def test_collapse_is_reported(tmp_path, capsys):
    """A saved epoch under half the run's best validation metric, or whose validation queries often share
    no term with any image, gets a warning naming both figures."""
    from mmsparse.api.training import _warn_if_collapsed

    hist = [{"epoch": 1, "val": {"R@1": 0.19, "q_empty": 0.0}}, {"epoch": 2, "val": {"R@1": 0.05, "q_empty": 0.04}}]
    _warn_if_collapsed(tmp_path / "h", hist, 1, "R@1")
    err = capsys.readouterr().err
    assert "collapsed" in err and "0.0500" in err and "0.1900 at epoch 1" in err and "4.0% of the validation" in err
    _warn_if_collapsed(tmp_path / "h", hist, 0, "R@1")
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory, dual_encoder_dir):
    """150 training images (2 captions each, real tokenizer) in dense files, no validation files."""
    from conftest import write_dense_pair

    root = tmp_path_factory.mktemp("budget-pairs")
    write_dense_pair(root, dual_encoder_dir, 150)
    return root


@pytest.mark.parametrize("method", ["d2s", "inference-free"])
def test_budget_without_validation_files_holds_out_and_reports(pair_files, tmp_path, caplog, method):
    """No validation files: a sixth of the training images is held out, the saved epoch is chosen on them
    within the budget's limit, the report line is printed and the head's config says where the figures
    came from; the inference-free head is gated on the image side only."""
    import mmsparse
    from mmsparse.progress import LogReporter

    torch.set_num_threads(1)
    out = tmp_path / "head"
    with caplog.at_level(logging.INFO, logger="mmsparse"):
        mmsparse.train_head(pair_files / "train-images.h5", pair_files / "train-captions.h5", out=out,
                            method=method, epochs=12, batch_size=64, l1_warmup=0, target_flops=2.5,
                            progress=LogReporter())
    tr = json.loads((out / "config.json").read_text())["training"]
    assert tr["holdout"] == {"images": 25, "source": "images held out of training"}
    assert 2.5 / 1.15 <= tr["val"]["FLOPs"] <= 2.5 * 1.15
    assert tr["history"][tr["best_epoch"] - 1]["val"] == tr["val"]
    assert set(tr["flops_budget"]["gates"]) == ({"text", "image"} if method == "d2s" else {"image"})
    log = caplog.text
    assert "the budget reads images held out of training (25 images)" in log
    assert "--target-flops 2.5: images held out of training (25 images) FLOPs" in log


def test_frontier_aggregates_seeds_decides_on_validation_and_compares_over_seeds(tmp_path, dual_encoder_dir):
    """python -m mmsparse.metrics.frontier on heads' config.json (their validation figures) and real
    `mmsparse eval` outputs of TREC runs: per method and budget the mean and standard deviation over
    seeds, the budget chosen from validation figures even where test says otherwise, Welch's t-test
    over seeds, the PNG; a head without validation figures is refused in one line."""
    from scipy.stats import ttest_ind

    import mmsparse
    from conftest import write_dense_pair
    from mmsparse.errors import InputError
    from mmsparse.formats.trec import write_qrels, write_run
    from mmsparse.metrics.frontier import dense_val, main

    write_dense_pair(tmp_path, dual_encoder_dir, 30, split="val")
    qrels = {f"q{i}": {f"d{i % 10}": 1} for i in range(40)}
    write_qrels(tmp_path / "test.qrels", qrels)
    rng = np.random.default_rng(0)

    def head(name, method_budget, seed, val_r1, val_r10, hit):
        """A head directory and the eval JSON of a run that ranks the gold image first for a `hit`
        share of the queries."""
        d = tmp_path / "heads" / name
        d.mkdir(parents=True)
        d.joinpath("config.json").write_text(json.dumps({"training": {
            "flops_budget": {"target": method_budget}, "config": {"seed": seed}, "best_epoch": 3,
            "val": {"R@1": val_r1, "R@10": val_r10, "FLOPs": method_budget * 1.02}}}))
        run = {}
        for i, q in enumerate(qrels):
            gold = i % 10
            top = gold if rng.random() < hit else (gold + 1) % 10
            run[q] = {f"d{j}": (2.0 if j == top else rng.random()) for j in range(10)}
        write_run(tmp_path / f"{name}.trec", run)
        mmsparse.evaluate(tmp_path / f"{name}.trec", tmp_path / "test.qrels", out=tmp_path / f"{name}.json")
        return f"{d}={tmp_path / name}.json"

    dense_v = dense_val(tmp_path / "val-images.h5", tmp_path / "val-captions.h5")
    rows = []
    for s in (1, 2, 3):   # budget 2 fails the rule on validation (though it wins on test), budget 4 keeps it
        rows.append("D2S=" + head(f"d2-{s}", 2.0, s, 0.5 * dense_v["R@1"], dense_v["R@10"], 0.9))
        rows.append("D2S=" + head(f"d4-{s}", 4.0, s, dense_v["R@1"], dense_v["R@10"], 0.5))
        rows.append("joint=" + head(f"j4-{s}", 4.0, s, dense_v["R@1"], dense_v["R@10"], 0.2))
    write_run(tmp_path / "dense.trec", {q: {f"d{i % 10}": 1.0} for i, q in enumerate(qrels)})
    mmsparse.evaluate(tmp_path / "dense.trec", tmp_path / "test.qrels", out=tmp_path / "dense.json")
    out = tmp_path / "frontier" / "table.md"
    args = ["--dense", str(tmp_path / "dense.json"), "--val-images", str(tmp_path / "val-images.h5"),
            "--val-captions", str(tmp_path / "val-captions.h5"), *[f"--row={r}" for r in rows],
            "--versus", "joint=D2S", "-o", str(out), "--plot", str(tmp_path / "frontier" / "f.png")]
    assert main(args) == 0
    got = json.loads(out.with_suffix(".json").read_text())
    assert got["chosen"] == {"D2S": 4.0, "joint": 4.0}
    d4 = [json.loads((tmp_path / f"d4-{s}.json").read_text())["R@1"] for s in (1, 2, 3)]
    j4 = [json.loads((tmp_path / f"j4-{s}.json").read_text())["R@1"] for s in (1, 2, 3)]
    pt = next(p for p in got["points"] if p["method"] == "D2S" and p["budget"] == 4.0)
    assert pt["R@1"] == pytest.approx(np.mean(d4)) and pt["R@1_sd"] == pytest.approx(np.std(d4, ddof=1))
    assert pt["seeds"] == [1, 2, 3] and pt["val_R@1"] == pytest.approx(dense_v["R@1"])
    (vs,) = got["versus"]
    assert vs["budget"] == 4.0 and vs["p_R@1"] == pytest.approx(ttest_ind(j4, d4, equal_var=False).pvalue)
    md = out.read_text()
    assert "| D2S | 4 | 3 |" in md and "Chosen on validation" in md and "| joint vs D2S | 4 |" in md
    assert (tmp_path / "frontier" / "f.png").stat().st_size > 1000
    bad = tmp_path / "heads" / "bad"
    bad.mkdir()
    bad.joinpath("config.json").write_text(json.dumps({"training": {}}))
    with pytest.raises(InputError, match="no validation figures"):
        main([*args[:6], f"--row=D2S={bad}={tmp_path / 'dense.json'}", "-o", str(out)])


def test_make_frontier_trains_every_budget_and_seed(tmp_path):
    """`make -n frontier`: by default one run per method and seed through all its budgets (a budget path,
    largest first) with nothing but --target-flops and --seed (the defaults), each budget's head linked
    under a plain name; joint on its final-layer inputs; FRONTIER_PATHS=0: one head per method, budget and
    seed, the main job's head standing for its own budget and seed when it trains the frontier's 30 epochs;
    the table decided on validation files; a budget added later is trained although a table exists."""
    import shlex
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def dry(*args):
        p = subprocess.run(["make", "-n", "-C", str(root / "examples" / "flickr8k"), f"WORK={tmp_path}", *args,
                            "frontier"], capture_output=True, text=True, check=True)
        lines = p.stdout.replace("\\\n", " ").splitlines()
        cmds = [shlex.split(c) for c in lines if c.startswith(("mmsparse", "python"))]
        links = [shlex.split(c)[2:] for c in lines if c.startswith("ln -sfn")]
        return {c[c.index("-o") + 1].rsplit("/", 1)[1]: c for c in cmds if c[:2] == ["mmsparse", "train-head"]}, cmds, links

    train, cmds, links = dry("TRAIN_FLAGS=")
    flags = {h: c[c.index("-o") + 2:] for h, c in train.items()}
    assert set(train) == {f"front-{m}-s{s}" for m in ("d2s", "if", "joint") for s in (1, 2, 3)}
    assert flags["front-d2s-s3"] == ["--target-flops", "12,9.4,6,4,2", "--seed", "3"]
    assert flags["front-if-s2"] == ["--target-flops", "1.5,1,0.5", "--seed", "2"]
    assert train["front-if-s2"][2:4] == ["--method", "inference-free"]
    assert flags["front-joint-s1"] == ["--target-flops", "9.4,6", "--seed", "1"]
    assert train["front-joint-s1"][2:4] == ["--method", "joint"] and "hf-dual-final" in train["front-joint-s1"][4]
    assert ["front-d2s-s1/flops-9.4", f"{tmp_path}/heads/front-d2s-9.4-s1"] in links and len(links) == 3 * (5 + 3 + 2)
    (table,) = [c for c in cmds if c[:3] == ["python", "-m", "mmsparse.metrics.frontier"]]
    assert "--val-images" in table and table.count("--row") == 30 and table[table.index("--versus") + 1] == "joint=D2S"
    assert f"D2S={tmp_path}/heads/front-d2s-9.4-s1={tmp_path}/eval/front-d2s-9.4-s1.expand.json" in table

    train, _, _ = dry("TRAIN_FLAGS=", "FRONTIER_PATHS=0", "D2S_EPOCHS=30")
    flags = {h: c[c.index("-o") + 2:] for h, c in train.items()}
    assert flags["d2s"] == ["--target-flops", "9.4", "--seed", "1", "--epochs", "30"]
    assert flags["front-d2s-2-s3"] == ["--target-flops", "2", "--seed", "3"]
    assert flags["front-if-0.5-s2"] == ["--method", "inference-free", "--target-flops", "0.5", "--seed", "2"]
    assert flags["front-joint-9.4-s1"] == ["--target-flops", "9.4", "--seed", "1"]
    assert len(train) == 3 * (5 + 3 + 2) and "front-d2s-9.4-s1" not in train
    # the main job's own 15 epochs: its head is not a frontier head, which trains with the defaults
    train, _, _ = dry("TRAIN_FLAGS=", "FRONTIER_PATHS=0")
    flags = {h: c[c.index("-o") + 2:] for h, c in train.items()}
    assert "d2s" not in train and flags["front-d2s-9.4-s1"] == ["--target-flops", "9.4", "--seed", "1"]
    (tmp_path / "frontier").mkdir(exist_ok=True)
    (tmp_path / "frontier" / "table.md").write_text("an older table")
    train, _, _ = dry("FRONTIER_D2S=3", "FRONTIER_IF=", "FRONTIER_JOINT=", "FRONTIER_SEEDS=1")
    assert set(train) == {"flops-3"} and train["flops-3"][train["flops-3"].index("-o") + 1].endswith("front-d2s-s1/flops-3")
    assert (tmp_path / "frontier" / "rows.txt").read_text().count("D2S=") == 1


def test_a_schedule_too_short_for_the_budget_says_so(pair_files, tmp_path):
    """A budget the schedule cannot reach (2 epochs, FLOPs 0.05) is not saved silently: the run fails
    (BudgetMissed, exit 3) in one line saying no epoch kept the band, that the FLOPs were still falling
    and how many epochs it needs; the controller did act (m rose, the FLOPs fell), so the message is
    not what a run without a controller would print."""
    import re

    import mmsparse
    from mmsparse.errors import BudgetMissed

    torch.set_num_threads(1)
    with pytest.raises(BudgetMissed) as e:
        mmsparse.train_head(pair_files / "train-images.h5", pair_files / "train-captions.h5", out=tmp_path / "head",
                            epochs=2, batch_size=64, l1_warmup=0, target_flops=0.05)
    msg = str(e.value)
    m = re.search(r"outside 0.0435..0.0575; the schedule is too short: from ([\d,.]+) at epoch 1 the FLOPs were still "
                  r"falling \(([\d.]+) at the last epoch\).* needs about (\d+) more epochs", msg)
    assert m, msg
    assert float(m.group(2)) < float(m.group(1).replace(",", "")) and int(m.group(3)) >= 2
    fb = json.loads((tmp_path / "head" / "config.json").read_text())["training"]["flops_budget"]
    assert fb["off_budget"] and (fb["scale"] > 1.0 or fb["gates"] != {"text": 64, "image": 128})   # it acted


def test_make_vdr_compares_with_every_seed_of_the_frontier_d2s(tmp_path):
    """`make -n vdr-table`: D2S's row and VDR's --compare runs take the frontier's D2S heads of
    VDR_D2S_BUDGET under the names `make frontier` gives them, seed 1 included: front-d2s-9.4-sS from the
    paths, and with FRONTIER_PATHS=0 the main job's head standing for D2S_BUDGET and SEED (it was looked
    for as front-d2s-9.4-s1 and dropped) when it is trained as the frontier's heads are (D2S_EPOCHS=30);
    the main job's 15-epoch head is not one of them."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for paths, epochs, heads in (("1", "15", ["front-d2s-9.4-s1", "front-d2s-9.4-s2", "front-d2s-9.4-s3"]),
                                 ("0", "30", ["d2s", "front-d2s-9.4-s2", "front-d2s-9.4-s3"]),
                                 ("0", "15", ["front-d2s-9.4-s1", "front-d2s-9.4-s2", "front-d2s-9.4-s3"])):
        work = tmp_path / f"{paths}-{epochs}"
        (work / "runs").mkdir(parents=True)
        (work / "eval").mkdir()
        for h in heads:
            (work / "runs" / f"{h}.expand.trec").write_text("")
            (work / "eval" / f"{h}.expand.json").write_text("{}")
        p = subprocess.run(["make", "-n", "-C", str(root / "examples" / "flickr8k"), f"WORK={work}",
                            f"FRONTIER_PATHS={paths}", f"D2S_EPOCHS={epochs}", "vdr-table"], capture_output=True,
                           text=True, check=True)
        (row,) = [w for w in p.stdout.split('"') if w.startswith("D2S (F = 9.4)=")]
        assert row.split("=", 2)[2].split(",") == [str(work / "eval" / f"{h}.expand.json") for h in heads]
        for s, h in zip((1, 2, 3), heads):
            (cmd,) = [c for c in p.stdout.splitlines() if f"-o {work}/eval/vdr-s{s}-q24-d192.json" in c]
            assert f"--compare {work}/runs/{h}.expand.trec" in cmd
