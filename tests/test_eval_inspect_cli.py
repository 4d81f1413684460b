"""`mmsparse eval` and `mmsparse inspect` end to end: real HDF5/TREC files in tmp_path, the real
console entry point (mmsparse.cli.main, in-process), exit codes and outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from mmsparse.formats import write_qrels, write_run, write_sparse

VOCAB = ["a", "dog", "##oot", "runs", "cat", "grass"]


@pytest.fixture()
def files(tmp_path):
    q = np.array([[0, 2, 0, 1, 0, 0], [0, 0, 0, 0, 3, 1], [1, 0, 0, 0, 0, 0]], np.float32)
    d = np.array([[0, 1, 0, 0, 0, 1], [0, 0, 1.5, 0, 2, 0]], np.float32)
    write_sparse(tmp_path / "q.h5", ["q1", "q2", "q3"], sp.csr_matrix(q), VOCAB,
                 {"modality": "text", "head": "h", "query_mode": "expand"},
                 texts=["a dog runs", "a cat on grass", "a"])
    write_sparse(tmp_path / "d.h5", ["i1", "i2"], sp.csr_matrix(d), VOCAB,
                 {"modality": "image", "head": "h", "query_mode": "doc"})
    write_run(tmp_path / "run.trec", {"q1": {"i1": 2, "i2": 0}, "q2": {"i2": 6, "i1": 1}, "q3": {"i1": .1}})
    write_run(tmp_path / "dense.trec", {"q1": {"i1": 2, "i2": 1}, "q2": {"i1": 3, "i2": 1}, "q3": {"i2": .1}})
    write_qrels(tmp_path / "qrels", {"q1": {"i1": 1}, "q2": {"i2": 1}, "q3": {"i2": 1}, "q4": {"i1": 1}})
    return tmp_path


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """rich wraps tables at COLUMNS (80 when unset): 200 keeps each table row on one line."""
    monkeypatch.setenv("COLUMNS", "200")


def test_eval_end_to_end(files, run_cli):
    f = files
    code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / "e.json",
                             "--queries", f / "q.h5", "--docs", f / "d.h5", "--per-query", f / "pq.tsv")
    assert code == 0, err
    r = json.loads((f / "e.json").read_text())
    # q1 hit@1, q2 hit@1, q3 miss, q4 missing from the run -> 0
    assert r["R@1"] == 0.5 and r["R@5"] == 0.5 and r["R@10"] == 0.5 and r["RR@10"] == 0.5
    assert r["queries"] == 4 and r["queries_not_in_run"] == 1 and r["queries_not_in_qrels"] == 0
    assert r["FLOPs"] == pytest.approx(3 / 6)  # dog (q1,i1), grass (q2,i1), cat (q2,i2)
    assert r["query_terms"] == pytest.approx(5 / 3) and r["doc_terms"] == 2.0
    assert r["query_terms_median"] == 2.0 and r["doc_postings_max"] == 1.0
    assert "mmsparse eval" in r["command"]
    assert "RR@10" in out and "FLOPs" in out and "missing from the run" in err
    lines = (f / "pq.tsv").read_text().splitlines()
    assert lines[0] == "qid\tR@1\tR@5\tR@10\tRR@10\tquery_terms"
    assert lines[1] == "q1\t1\t1\t1\t1\t2" and lines[4] == "q4\t0\t0\t0\t0\t"


def test_eval_measures_dense_compare_plots(files, run_cli):
    f = files
    (f / "old.json").write_text(json.dumps({"FLOPs": 2.0, "R@1": 0.4, "run": "old.trec"}))
    code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / "e.json",
                             "-m", "R@1", "-m", "P@1", "--queries", f / "q.h5", "--docs", f / "d.h5",
                             "--dense-run", f / "dense.trec", "--compare", f / "dense.trec",
                             "--plot", f / "plots", "--plot-with", f / "old.json")
    assert code == 0, err
    r = json.loads((f / "e.json").read_text())
    assert set(r) >= {"R@1", "P@1", "pearson_R@1", "pearson_P@1", "overlap@10", "compare"}
    assert "R@5" not in r
    # per-query R@1: run 1,1,0,0; dense 1,0,1,0 -> uncorrelated
    assert r["pearson_R@1"] == pytest.approx(0.0)
    # top-10 overlap/10: q1 {i1,i2}&{i1,i2}=2, q2 2, q3 {i1}&{i2}=0, q4 0 -> (.2+.2)/4
    assert r["overlap@10"] == pytest.approx(0.1)
    assert r["compare"][str(f / "dense.trec")]["p_R@1"] == 1.0  # paired diffs 0,1,-1,0: mean 0, t = 0
    assert (f / "plots" / "flops_vs_R@1.png").stat().st_size > 1000
    assert (f / "plots" / "overlap_top10.png").stat().st_size > 1000


def test_eval_deviation(files, run_cli, dual_encoder_dir):
    f = files
    np.save(f / "emb.npy", np.eye(6, 3, dtype=np.float32))
    code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / "e.json",
                             "--queries", f / "q.h5", "--docs", f / "d.h5", "--deviation-k", 2,
                             "--static-embeddings", f / "emb.npy", "--tokenizer", dual_encoder_dir)
    assert code == 0, err
    r = json.loads((f / "e.json").read_text())
    # top-2 vs caption pieces: q1 {dog,runs} both in "a dog runs"; q2 {cat,grass} both; q3 {a} in "a"
    assert r["Exact@2"] == pytest.approx((1 + 1 + 0.5) / 3)
    # one-hot embeddings for a,dog,##oot (rows 0-2), zero rows for runs/cat/grass -> cos 0
    assert r["Semantic@2"] == pytest.approx((0.5 + 0 + 0.5) / 3)


def test_eval_image_side_faithfulness(files, run_cli, dual_encoder_dir):
    f = files
    code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / "e.json", "--queries", f / "q.h5",
                             "--docs", f / "d.h5", "--tokenizer", dual_encoder_dir, "--doc-k", 10, "--doc-k", 2)
    assert code == 0, err
    r = json.loads((f / "e.json").read_text())
    # i1: relevant captions q1 "a dog runs" (q4 has no text) -> {a, dog, runs}; top terms dog, grass (tie:
    # lower id first) -> 1 of them.  i2: q2 "a cat on grass" + q3 "a" -> {a, cat, grass}; top cat, -oot -> 1
    assert r["doc_Exact@10"] == pytest.approx(0.1) and r["doc_Exact@2"] == pytest.approx(0.5)
    assert r["doc_faithfulness_docs"] == 2 and "doc_Exact@3" not in r
    # every term is in exactly one of the two images: df 1 of 2, the lowest term id wins the tie
    assert r["doc_max_df"] == 0.5 and r["doc_max_df_term"] == "dog"
    code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / "e0.json", "--queries", f / "q.h5",
                             "--docs", f / "d.h5", "--doc-k", 0)
    assert code == 0, err
    r0 = json.loads((f / "e0.json").read_text())
    assert not [k for k in r0 if k.startswith("doc_Exact")] and r0["doc_max_df"] == 0.5


def test_eval_bonferroni_over_the_runs_compared(files, run_cli):
    """Per-query R@5: run 1,1,0,0; dense 1,1,1,0 (q3's relevant i2 is in dense's list only):
    diffs 0,0,-1,0, t = -1 with 3 df, p = 0.391. The correction factor is the number of runs RUN
    is tested against in the call, unless --n-comparisons says otherwise."""
    from scipy.stats import ttest_rel

    f = files
    p = ttest_rel([1, 1, 0, 0], [1, 1, 1, 0])[1]
    cases = {"dense": ([], 1), "dense+compare": (["--compare", f / "dense.trec"], 2),
             "explicit": (["--n-comparisons", 3], 3)}
    for name, (extra, m) in cases.items():
        code, out, err = run_cli("eval", f / "run.trec", f / "qrels", "-o", f / f"{name}.json",
                                 "--dense-run", f / "dense.trec", *extra)
        assert code == 0, err
        r = json.loads((f / f"{name}.json").read_text())
        assert r["p_vs_dense_R@5"] == pytest.approx(p) and p == pytest.approx(0.391, abs=1e-3)
        assert r["n_comparisons"] == m and r["p_vs_dense_corrected_R@5"] == pytest.approx(min(1.0, m * p))
        assert r["bonferroni"].startswith(f"x{m},") and f"Bonferroni x{m}" in out
    assert "--n-comparisons" in r["bonferroni"]
    r = json.loads((f / "dense+compare.json").read_text())
    c = r["compare"][str(f / "dense.trec")]
    assert c["p_raw_R@5"] == pytest.approx(p) and c["p_R@5"] == pytest.approx(2 * p)
    assert r["dense_measures"]["R@5"] == 0.75


@pytest.mark.parametrize("case", ["missing_run", "unknown_ids", "strict", "bad_measure", "vocab", "no_docs"])
def test_eval_bad_input(files, run_cli, case):
    f = files
    args = ["eval", f / "run.trec", f / "qrels", "-o", f / "e.json"]
    if case == "missing_run":
        args[1] = f / "nope.trec"
    elif case == "unknown_ids":
        write_run(f / "other.trec", {"x1": {"i1": 1.0}, "x2": {"i2": 1.0}})
        args[1] = f / "other.trec"
    elif case == "strict":
        write_run(f / "extra.trec", {"q1": {"i1": 1.0}, "zz": {"i2": 1.0}})
        args[1:2] = [f / "extra.trec"]
        args.append("--strict")
    elif case == "bad_measure":
        args += ["--measure", "Bogus@3"]
    elif case == "vocab":
        write_sparse(f / "d2.h5", ["i1"], sp.csr_matrix(np.ones((1, 2), np.float32)), ["a", "b"],
                     {"modality": "image", "head": "h", "query_mode": "doc"})
        args += ["--queries", f / "q.h5", "--docs", f / "d2.h5"]
    elif case == "no_docs":
        args += ["--queries", f / "q.h5"]
    code, out, err = run_cli(*args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("mmsparse: error:")
    assert not (f / "e.json").exists()
    assert not [p for p in f.iterdir() if p.name.startswith(".e.json")]


def test_eval_extra_queries_warn_by_default(files, run_cli):
    f = files
    write_run(f / "extra.trec", {"q1": {"i1": 1.0}, "zz": {"i2": 1.0}})
    code, out, err = run_cli("eval", f / "extra.trec", f / "qrels", "-o", f / "e.json")
    assert code == 0 and "not in the qrels" in err
    r = json.loads((f / "e.json").read_text())
    assert r["queries_not_in_qrels"] == 1 and r["R@1"] == 0.25


def test_console_script_bad_input_exit_code(files):
    p = subprocess.run([sys.executable, "-m", "mmsparse.cli", "eval", str(files / "nope.trec"),
                        str(files / "qrels")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "nope.trec" in p.stderr


def test_inspect_rows_and_json(files, run_cli):
    f = files
    code, out, err = run_cli("inspect", f / "d.h5", "i2", "i1", "--k", 1)
    assert code == 0, err
    # k=1: i2 -> cat only (its second term, ##oot, shown as -oot, is cut); i1 -> dog
    assert "cat" in out and "oot" not in out and "dog" in out
    code, out, err = run_cli("inspect", f / "d.h5", "i2", "--k", 5)
    assert code == 0, err
    assert "-oot" in out and "##oot" not in out  # word pieces are shown glued, not raw
    code, out, err = run_cli("inspect", f / "q.h5", "q2", "--json")
    assert code == 0, err
    r = json.loads(out)["rows"][0]
    assert r["text"] == "a cat on grass" and r["nnz"] == 2
    assert r["terms"] == [{"term": "cat", "weight": 3.0}, {"term": "grass", "weight": 1.0}]


def test_inspect_explain(files, run_cli):
    f = files
    code, out, err = run_cli("inspect", f / "q.h5", "--explain", "q2", "i2",
                             "--docs", f / "d.h5", "--json")
    assert code == 0, err
    e = json.loads(out)["explain"]
    assert e["score"] == 6.0 and e["terms"] == [
        {"term": "cat", "query_weight": 3.0, "doc_weight": 2.0, "contribution": 6.0}]
    code, out, err = run_cli("inspect", f / "q.h5", "--explain", "q2", "i1",
                             "--docs", f / "d.h5")
    assert code == 0 and "grass" in out and "score 1.0000" in out


@pytest.mark.parametrize("args,needle", [
    (["q9"], "'q9'"), (["--explain", "q1", "i9", "--docs", "{d}"], "'i9'"),
    (["--explain", "q1", "i1"], "--docs"), ([], "nothing to inspect")])
def test_inspect_bad_input(files, run_cli, args, needle):
    args = [a.format(d=files / "d.h5") for a in args]
    code, out, err = run_cli("inspect", files / "q.h5", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_inspect_stats_and_html(files, run_cli, tmp_path):
    f = files
    code, out, err = run_cli("inspect", f / "q.h5", "--stats", "--png", f / "rf.png", "--json")
    assert code == 0, err
    s = json.loads(out)["stats"]
    assert s["rows"] == 3 and s["active_terms"] == 5 and s["postings"] == 5
    assert s["power_law_exponent"] == pytest.approx(0.0, abs=1e-9)  # all df = 1: flat
    assert (f / "rf.png").stat().st_size > 1000
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    from PIL import Image
    Image.new("RGB", (8, 8), (255, 0, 0)).save(imgs / "i2.jpg")
    code, out, err = run_cli("inspect", f / "q.h5", "q2", "--html", f / "r.html",
                             "--run", f / "run.trec", "--docs", f / "d.h5", "--qrels", f / "qrels",
                             "--image-root", imgs)
    assert code == 0, err
    h = (f / "r.html").read_text()
    assert "a cat on grass" in h and "data:image/jpeg;base64," in h
    assert '<span class="m" title="cat">cat' in h and 'title="##oot">-oot' in h
    assert 'class="img rel"' in h


def test_inspect_image_side_faithfulness(files, run_cli, dual_encoder_dir):
    f = files
    common = ["--captions", f / "q.h5", "--qrels", f / "qrels", "--tokenizer", dual_encoder_dir]
    code, out, err = run_cli("inspect", f / "d.h5", "i1", "i2", "--k", 2, *common, "--json")
    assert code == 0, err
    r = json.loads(out)
    i1, i2 = r["rows"]
    assert [(t["term"], t["in_captions"]) for t in i1["terms"]] == [("dog", True), ("grass", False)]
    assert [(t["term"], t["in_captions"]) for t in i2["terms"]] == [("cat", True), ("##oot", False)]
    assert i1["captions"] == ["a dog runs"] and i2["captions"] == ["a cat on grass", "a"]
    assert i1["doc_Exact@2"] == 0.5 and "faithfulness" not in r  # rows only: no collection figures
    code, out, err = run_cli("inspect", f / "d.h5", "--stats", *common, "--json")
    assert code == 0, err
    fa = json.loads(out)["faithfulness"]
    assert fa["doc_Exact@10"] == pytest.approx(0.1) and fa["doc_Exact@3"] == pytest.approx(1 / 3)
    assert fa["doc_max_df"] == 0.5 and fa["doc_max_df_term"] == "dog" and fa["doc_faithfulness_docs"] == 2
    # caption side, k = 20: q1 {dog, runs}, q2 {cat, grass}, q3 {a} all in their captions -> (2 + 2 + 1) / 20 / 3
    assert fa["Exact@20"] == pytest.approx(5 / 60) and "Semantic@20" not in fa  # head "h" has no weights
    assert json.loads(out)["stats"]["max_df"] == 0.5
    code, out, err = run_cli("inspect", f / "d.h5", "i1", *common)
    assert code == 0, err
    assert "doc_Exact@20 0.05" in out and "✓" in out and "a dog runs" in out


@pytest.mark.parametrize("args,needle", [
    (["{d}", "i1", "--captions", "{q}"], "--captions needs --qrels"),
    (["{q}", "--captions", "{q}", "--qrels", "{r}"], "no id of it is a document"),
    (["{d}", "--captions", "{d}", "--qrels", "{r}"], "stores no caption texts")])
def test_inspect_faithfulness_bad_input(files, run_cli, args, needle):
    f = files
    args = [a.format(d=f / "d.h5", q=f / "q.h5", r=f / "qrels") for a in args]
    code, out, err = run_cli("inspect", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# --- eval --table: dense vs sparse runs in one table -------------------------------------------

@pytest.fixture()
def table_files(tmp_path):
    """40 queries q0..q39, 20 images; qrels q_j -> i_(j mod 20); every run retrieves the same 3
    images per query. The relevant image is at rank 2 instead of 1 for: dense q39; sparse-a the
    even queries (R@1 0.5, p ~ 1e-6 vs dense); sparse-b q0 (R@1 0.975, p = 1: diffs -1, +1)."""
    n, m = 40, 20
    qrels = {f"q{j}": {f"i{j % m}": 1} for j in range(n)}

    def run(worse):
        r = {}
        for j in range(n):
            rel, other = j % m, (j + 1) % m
            r[f"q{j}"] = {f"i{rel}": 1.0 if j not in worse else 0.5, f"i{other}": 0.8, f"i{(j + 2) % m}": 0.1}
        return r

    write_qrels(tmp_path / "qrels", qrels)
    write_run(tmp_path / "dense.trec", run({39}))
    write_run(tmp_path / "a.trec", run(set(range(0, n, 2))))
    write_run(tmp_path / "b.trec", run({0}))
    rng = np.random.default_rng(0)
    q = sp.random(n, len(VOCAB), density=0.5, format="csr", random_state=rng, dtype=np.float32)
    d = sp.random(m, len(VOCAB), density=0.5, format="csr", random_state=rng, dtype=np.float32)
    write_sparse(tmp_path / "q.h5", [f"q{j}" for j in range(n)], q, VOCAB,
                 {"modality": "text", "head": "h", "query_mode": "expand"}, texts=["a dog runs"] * n)
    write_sparse(tmp_path / "d.h5", [f"i{j}" for j in range(m)], d, VOCAB,
                 {"modality": "image", "head": "h", "query_mode": "doc"})
    return tmp_path


def test_eval_table_dense_vs_sparse(table_files, run_cli):
    f = table_files
    assert run_cli("eval", f / "dense.trec", f / "qrels", "-o", f / "dense.json")[0] == 0
    for name in ("a", "b"):
        code, out, err = run_cli("eval", f / f"{name}.trec", f / "qrels",
                                 "-o", f / f"sparse-{name}.json", "--queries", f / "q.h5", "--docs", f / "d.h5",
                                 "--dense-run", f / "dense.trec", "--n-comparisons", 2)
        assert code == 0, err
    a = json.loads((f / "sparse-a.json").read_text())
    assert a["R@1"] == 0.5 and a["measures"] == ["R@1", "R@5", "R@10", "RR@10"]
    assert a["dense_run"] == str(f / "dense.trec") and a["n_comparisons"] == 2
    from scipy.stats import pearsonr, ttest_rel
    dense_r1 = [1.0] * 39 + [0.0]
    a_r1 = [float(j % 2) for j in range(40)]
    assert a["p_vs_dense_R@1"] == pytest.approx(ttest_rel(a_r1, dense_r1)[1]) and a["p_vs_dense_R@1"] < 1e-5
    assert a["p_vs_dense_corrected_R@1"] == pytest.approx(2 * a["p_vs_dense_R@1"])
    assert a["pearson_R@1"] == pytest.approx(pearsonr(a_r1, dense_r1)[0])
    assert a["p_vs_dense_R@5"] == 1.0  # identical per-query values
    # both runs retrieve the same 3 images for every query: 3 of the top-10 shared
    assert a["overlap@10"] == pytest.approx(0.3) and a["overlap@10_histogram"] == [0, 0, 0, 40] + [0] * 7
    b = json.loads((f / "sparse-b.json").read_text())
    assert b["p_vs_dense_R@1"] == 1.0  # diffs -1 (q0), +1 (q39): mean 0

    code, out, err = run_cli("eval", "--table", f / "dense.json", f / "sparse-a.json",
                             f / "sparse-b.json", "-o", f / "table.md", "--plot", f / "plots")
    assert code == 0, err
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith(("│", "┃"))}
    assert set(lines) >= {"run", "dense", "sparse-a", "sparse-b"}
    header = lines["run"]
    for col in ("R@1", "RR@10", "FLOPs", "query_terms", "doc_terms", "pearson_R@1", "overlap@10"):
        assert col in header
    assert "50.0†" in lines["sparse-a"] and "97.5 " in lines["sparse-b"] and "†" not in lines["sparse-b"]
    assert "†" not in lines["dense"] and "97.5 " in lines["dense"] and "–" in lines["dense"]
    assert "Bonferroni x2" in out and "vs dense" in out
    md = (f / "table.md").read_text()
    assert md.startswith("| run | R@1 | R@5 |") and "| sparse-a | 50.0† |" in md
    assert (f / "plots" / "flops_vs_R@1.png").stat().st_size > 1000
    assert (f / "plots" / "overlap_top10.png").stat().st_size > 1000
    # --label, --column, JSON output, and an explicit Bonferroni factor large enough to drop the †
    code, out, err = run_cli("eval", "--table", f / "dense.json", f / "sparse-a.json",
                             "--label", "Dense", "--label", "D2S", "--column", "R@1", "--column", "FLOPs",
                             "--n-comparisons", 10 ** 9, "-o", f / "table.json")
    assert code == 0, err
    tab = json.loads((f / "table.json").read_text())
    assert tab["columns"] == ["R@1", "FLOPs"] and [r["label"] for r in tab["rows"]] == ["Dense", "D2S"]
    assert tab["rows"][1]["significant"] == [] and tab["reference"] == "Dense"


@pytest.mark.parametrize("case,needle", [
    ("none", "--table needs"), ("missing", "not found"), ("not_json", "not an eval JSON"),
    ("labels", "--label"), ("single_opt", "--queries"), ("column", "'nope'"), ("one_path", "RUN QRELS")])
def test_eval_table_bad_input(table_files, run_cli, case, needle):
    f = table_files
    assert run_cli("eval", f / "dense.trec", f / "qrels", "-o", f / "dense.json")[0] == 0
    args = {"none": ["--table"], "missing": ["--table", f / "nope.json"],
            "not_json": ["--table", f / "qrels"], "labels": ["--table", f / "dense.json", "--label", "x", "--label", "y"],
            "single_opt": ["--table", f / "dense.json", "--queries", f / "q.h5"],
            "column": ["--table", f / "dense.json", "--column", "nope"], "one_path": [f / "dense.trec"]}[case]
    code, out, err = run_cli("eval", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_inspect_stats_of_an_index_directory(files, run_cli):
    f = files
    code, out, err = run_cli("index", f / "d.h5", "-o", f / "idx")
    assert code == 0, err
    code, out, err = run_cli("inspect", f / "idx", "--stats", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["index"] == str(f / "idx") and r["file"] == str((f / "d.h5").resolve())
    code, out2, err = run_cli("inspect", f / "d.h5", "--stats", "--json")
    assert code == 0, err
    assert r["stats"] == json.loads(out2)["stats"] and r["stats"]["postings"] == 4
    code, out, err = run_cli("inspect", f / "idx", "--stats")
    assert code == 0 and "index built from" in out and "4 postings" in out
    (f / "plain").mkdir()
    code, out, err = run_cli("inspect", f / "plain", "--stats")
    assert code == 2 and "not an mmsparse index" in err
