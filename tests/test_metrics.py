"""Measures of `mmsparse eval` / `inspect` against hand-computed examples (real ir-measures, scipy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from mmsparse import metrics as M
from mmsparse.errors import InputError

# --- FLOPs (eq. 1) and sparsity -------------------------------------------------------------

# vocab:            a  dog ##oot runs cat grass
Q = sp.csr_matrix(np.array([[0, 2, 0, 1, 0, 0],
                            [0, 0, 0, 0, 3, 1],
                            [1, 0, 0, 0, 0, 0]], dtype=np.float32))
D = sp.csr_matrix(np.array([[0, 1, 0, 0, 0, 1],
                            [0, 0, 1, 0, 2, 0]], dtype=np.float32))


def test_flops_hand_example():
    # pairs sharing terms: (q1,d1) dog; (q2,d1) grass; (q2,d2) cat -> 3 shared terms over 3x2 pairs
    assert M.term_df(Q).tolist() == [1, 1, 0, 1, 1, 1]
    assert M.term_df(D).tolist() == [0, 1, 1, 0, 1, 1]
    assert M.flops(Q, D) == pytest.approx(3 / 6)
    assert M.flops_brute_force(Q, D) == pytest.approx(3 / 6)


def test_flops_matches_brute_force_on_random_collections():
    rng = np.random.default_rng(0)
    for density in (0.01, 0.1, 0.5):
        q = sp.random(37, 200, density=density, format="csr", random_state=rng, dtype=np.float32)
        d = sp.random(53, 200, density=density, format="csr", random_state=rng, dtype=np.float32)
        assert M.flops(q, d) == pytest.approx(M.flops_brute_force(q, d), rel=1e-12)


def test_flops_ignores_explicit_zeros_and_checks_vocab():
    q = sp.csr_matrix((np.array([0.0, 1.0], np.float32), np.array([0, 1]), np.array([0, 2])), shape=(1, 3))
    d = sp.csr_matrix(np.array([[1, 1, 0]], np.float32))
    assert M.flops(q, d) == 1.0  # term 0 is stored with weight 0 in q: not activated
    with pytest.raises(ValueError):
        M.flops(q, sp.csr_matrix((1, 4), dtype=np.float32))
    assert M.flops(sp.csr_matrix((0, 3), dtype=np.float32), d) == 0.0


def test_sparsity_stats_hand_example():
    s = M.sparsity_stats(D, "doc")
    assert s["doc_terms"] == 2.0 and s["doc_terms_median"] == 2.0 and s["doc_terms_max"] == 2.0
    assert s["doc_active_terms"] == 4.0 and s["doc_postings_max"] == 1.0
    m = sp.csr_matrix(np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], np.float32))
    s = M.sparsity_stats(m, "q")
    assert M.row_nnz(m).tolist() == [3, 1, 2, 0]
    assert s["q_terms"] == 1.5 and s["q_terms_median"] == 1.5
    assert M.posting_lengths(m).tolist() == [3, 2, 1]
    assert s["q_postings_mean"] == 2.0 and s["q_postings_median"] == 2.0 and s["q_postings_max"] == 3.0


# --- effectiveness through ir-measures --------------------------------------------------------

QRELS = {"q1": {"i1": 1}, "q2": {"i2": 1, "i3": 1}, "q3": {"i3": 1}, "q4": {"i1": 1}}
RUN = {"q1": {"i2": 3.0, "i1": 2.0},             # relevant at rank 2
       "q2": {"i2": 5.0, "i4": 4.0, "i3": 1.0},  # relevant at ranks 1 and 3 of 2 relevant
       "q3": {"i1": 1.0, "i2": 0.5},             # relevant not retrieved
       "q5": {"i1": 1.0}}                        # not in the qrels; q4 missing from the run


def test_evaluate_run_hand_example():
    r = M.evaluate_run(RUN, QRELS)
    assert r.queries == 4
    assert r.aggregate["R@1"] == pytest.approx((0 + 0.5 + 0 + 0) / 4)
    assert r.aggregate["R@5"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert r.aggregate["R@10"] == pytest.approx(0.5)
    assert r.aggregate["RR@10"] == pytest.approx((0.5 + 1 + 0 + 0) / 4)
    assert r.per_query["RR@10"] == {"q1": 0.5, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    assert r.not_in_run == ["q4"] and r.not_in_qrels == ["q5"]


def test_missing_queries_are_not_flattering():
    only_good = {"q2": RUN["q2"]}
    r = M.evaluate_run(only_good, QRELS)
    assert r.aggregate["RR@10"] == pytest.approx(1 / 4)  # not 1.0
    assert r.not_in_run == ["q1", "q3", "q4"]


def test_strict_no_overlap_and_bad_measure():
    with pytest.raises(InputError, match="q5"):
        M.evaluate_run(RUN, QRELS, strict=True)
    with pytest.raises(InputError, match="no query id"):
        M.evaluate_run({"x": {"i1": 1.0}}, QRELS)
    with pytest.raises(InputError, match="Bogus@3"):
        M.parse_measures(["Bogus@3"])
    ms = M.parse_measures(["P@1", "nDCG@10", "P@1"])
    assert [str(m) for m in ms] == ["P@1", "nDCG@10"]
    r = M.evaluate_run(RUN, QRELS, ms)
    assert r.aggregate["P@1"] == pytest.approx(1 / 4)


# --- faithfulness and significance ------------------------------------------------------------

def test_pearson_hand_example():
    a = {"q1": 1, "q2": 2, "q3": 3, "q4": 4}
    b = {"q1": 2, "q2": 4, "q3": 5, "q4": 9, "extra": 100}
    assert M.pearson_per_query(a, b) == pytest.approx(11 / math.sqrt(130))
    assert math.isnan(M.pearson_per_query(a, {q: 1.0 for q in a}))  # constant: undefined


def test_paired_ttest_hand_example():
    a = {"q1": 1, "q2": 0, "q3": 1, "q4": 1}
    b = {"q1": 0, "q2": 0, "q3": 0, "q4": 1}
    # diffs 1,0,1,0: mean .5, sd sqrt(1/3), t = sqrt(3); Student t with 3 df: p = 1/2 - 1/pi
    t, p = M.paired_ttest(a, b)
    assert t == pytest.approx(math.sqrt(3))
    assert p == pytest.approx(0.5 - 1 / math.pi)
    assert M.paired_ttest(a, a) == (0.0, 1.0)
    assert M.bonferroni(0.02, 3) == pytest.approx(0.06) and M.bonferroni(0.5, 3) == 1.0


def test_overlap_at_k_counts():
    a = {"q1": {"d1": 3, "d2": 2, "d3": 1}, "q2": {"d1": 1}}
    b = {"q1": {"d3": 9, "d2": 8, "d9": 7}, "q2": {"d2": 1}}
    assert M.overlap_at_k(a, b, k=2) == {"q1": 0.5, "q2": 0.0}
    assert M.overlap_at_k(a, b, k=3, qids=["q1", "q3"]) == {"q1": 2 / 3, "q3": 0.0}


def test_power_law_exponent_recovers_zipf():
    r = np.arange(1, 501)
    a, c = M.power_law_exponent(np.r_[1000.0 * r ** -1.5, 0, 0])
    assert a == pytest.approx(1.5) and c == pytest.approx(1000.0)
    assert math.isnan(M.power_law_exponent(np.array([5]))[0])


# --- semantic deviation (eq. 2-3) ---------------------------------------------------------------

VOCAB = ["a", "dog", "puppy", "grass", "car"]
EMB = np.array([[1, 1], [1, 0], [0.6, 0.8], [0, 1], [-1, 0]], dtype=np.float32)


def test_exact_and_semantic_at_k_hand_example():
    s = sp.csr_matrix(np.array([[0, 0.3, 0.9, 0.1, 0.5],   # top-3: puppy, car, dog
                                [0, 0, 0, 1.0, 0],          # one term only
                                [0, 1.0, 0, 0, 0]], np.float32))
    cap = M.caption_term_ids([["a", "dog"], ["grass", "##s"], ["xyz"]], VOCAB)
    assert [c.tolist() for c in cap] == [[0, 1], [3], []]
    exact, sem = M.exact_semantic_at_k(s, cap, 3, EMB)
    assert exact.tolist() == pytest.approx([1 / 3, 1 / 3, 0.0])
    # puppy: max(cos(puppy,a)=1.4/sqrt2, cos(puppy,dog)=.6); car: max(-1/sqrt2, -1); dog: 1
    assert sem[0] == pytest.approx((1.4 / math.sqrt(2) - 1 / math.sqrt(2) + 1) / 3, rel=1e-6)
    assert sem[1:].tolist() == pytest.approx([1 / 3, 0.0])
    exact2, sem2 = M.exact_semantic_at_k(s, cap, 1)
    assert exact2.tolist() == [0.0, 1.0, 0.0] and sem2 is None


def test_doc_exact_at_k_hand_example():
    vocab = VOCAB + ["##s"]  # a dog puppy grass car ##s
    docs = sp.csr_matrix(np.array([[0.1, 0.9, 0, 0.5, 0.3, 0],      # d1: dog grass car a
                                   [0, 0, 0.2, 0.9, 1.0, 0.95],     # d2: car ##s grass puppy
                                   [0.5, 0, 0, 0, 0, 0]], np.float32))  # d3: a
    caption_terms = {"c1": np.array([1, 3]),     # "dog on grass"
                     "c2": np.array([0, 2]),     # "a puppy"
                     "c3": np.array([0, 4, 5])}  # "a cars" -> a car ##s
    qrels = {"c1": {"d1": 1, "d3": 0},  # relevance 0: c1 does not describe d3
             "c2": {"d2": 1}, "c3": {"d2": 2},
             "c9": {"d1": 1}}  # a caption without text (not in caption_terms) adds nothing
    assert M.doc_caption_terms(["d2"], qrels, caption_terms)[0].tolist() == [0, 2, 4, 5]
    words = M.doc_caption_terms(["d1", "d2", "d3"], qrels, caption_terms, vocab)  # '##s' is not a word
    assert words[0].tolist() == [1, 3] and words[1].tolist() == [0, 2, 4] and words[2] is None
    # d1: top-1 dog (hit), top-2 dog grass (2 hits), top-3 + car (2 of 3), top-10 all 4 terms (2 of 10)
    # d2: top-1 car (hit), top-2 car ##s (1 of 2), top-3 + grass (1 of 3), top-4 + puppy (2 of 4)
    for k, want in [(1, [1, 1]), (2, [1, 0.5]), (3, [2 / 3, 1 / 3]), (4, [0.5, 0.5]), (10, [0.2, 0.2])]:
        got = M.doc_exact_at_k(docs, words, k)
        assert got[:2].tolist() == pytest.approx(want) and math.isnan(got[2])
    summary, per = M.doc_faithfulness(docs, ["d1", "d2", "d3"], vocab, qrels, caption_terms, ks=(2, 3))
    assert summary["doc_Exact@2"] == pytest.approx(0.75) and summary["doc_Exact@3"] == pytest.approx(0.5)
    assert summary["doc_faithfulness_docs"] == 2 and per[3][:2].tolist() == pytest.approx([2 / 3, 1 / 3])
    # df: a 2 (d1, d3), grass 2, car 2, dog 1, puppy 1, ##s 1 -> 2 of 3 documents; tie -> lowest id "a"
    assert summary["doc_max_df"] == pytest.approx(2 / 3) and summary["doc_max_df_term"] == "a"
    assert M.max_df(sp.csr_matrix((0, 5), dtype=np.float32), VOCAB) == (0.0, None, 0)


def test_load_static_embeddings(tmp_path):
    from safetensors.numpy import save_file

    np.save(tmp_path / "e.npy", EMB)
    assert np.array_equal(M.load_static_embeddings(tmp_path / "e.npy", 5), EMB)
    head = tmp_path / "head"
    head.mkdir()
    # a D2S head directory (heads/d2s.py): w1 [ω, d], w2 [|V|, ω] + bias [|V|]
    save_file({"w1.weight": np.zeros((2, 7), np.float32), "w2.weight": EMB, "w2.bias": np.zeros(5, np.float32)},
              str(head / "model.safetensors"))
    assert np.array_equal(M.load_static_embeddings(head, 5), EMB)
    save_file({"w2": EMB.T.copy()}, str(tmp_path / "t.safetensors"))
    assert np.array_equal(M.load_static_embeddings(tmp_path / "t.safetensors", 5), EMB)  # [e, |V|] transposed
    with pytest.raises(InputError, match="do not match"):
        M.load_static_embeddings(tmp_path / "e.npy", 6)
    with pytest.raises(InputError, match="no tensor"):
        M.load_static_embeddings(head, 5, key="nope")


def test_tokenize_captions_with_the_real_tokenizer(dual_encoder_dir):
    from mmsparse.metrics.semantics import tokenize_captions

    assert tokenize_captions(["A dog in the snowboot."], dual_encoder_dir) == [
        ["a", "dog", "in", "the", "snow", "##boot", "."]]
    # a batch of different lengths: no [PAD] (the model's tokenizer.json pads batches)
    assert tokenize_captions(["A dog .", "A dog in the snowboot ."], dual_encoder_dir)[0] == ["a", "dog", "."]


# --- term views ------------------------------------------------------------------------------------

def test_explain_pair_and_term_display():
    score, rows = M.explain_pair(np.array([1, 3, 4]), np.array([2.0, 1.0, 3.0]),
                                 np.array([1, 4, 5]), np.array([1.0, 2.0, 9.0]), VOCAB + ["x"])
    assert score == 8.0
    assert [(r["term"], r["contribution"]) for r in rows] == [("car", 6.0), ("dog", 2.0)]
    assert M.display_term("##oot") == "-oot" and M.display_term("##") == "##" and M.display_term("dog") == "dog"
    assert M.df_table(np.array([2, 0, 5, 2]), ["a", "b", "c", "d"], 3) == [
        {"rank": 1, "term": "c", "df": 5}, {"rank": 2, "term": "a", "df": 2}, {"rank": 3, "term": "d", "df": 2}]


# --- the comparison table (eval --table) ---------------------------------------------------------

def test_table_bonferroni_over_the_compared_rows():
    from mmsparse.metrics import table as T

    dense = {"R@1": 0.8, "measures": ["R@1"], "run": "/w/dense.trec", "qrels": "q", "queries": 10}
    a = {"R@1": 0.6, "measures": ["R@1"], "FLOPs": 3.14159, "query_terms": 12.345, "pearson_R@1": 0.5,
         "p_vs_dense_R@1": 0.01, "dense_run": "/w/dense.trec", "qrels": "q", "queries": 10}
    b = {**a, "R@1": 0.7, "p_vs_dense_R@1": 0.03, "Semantic@20": 0.5, "Exact@20": 0.2}
    t = T.build_table([dense, a, b], ["dense", "a", "b"])
    assert t["columns"] == ["R@1", "FLOPs", "query_terms", "pearson_R@1", "Exact@20", "Semantic@20"]
    assert t["bonferroni_n"] == 2 and t["reference"] == "dense" and t["warnings"] == []
    # 0.01 * 2 < 0.05 -> †; 0.03 * 2 = 0.06 -> not significant (it would be without the correction)
    assert [r["significant"] for r in t["rows"]] == [[], ["R@1"], []]
    assert T.cells(t, t["rows"][1]) == ["60.0†", "3.14", "12.3", "50.0", "–", "–"]
    assert T.build_table([dense, b], ["dense", "b"])["rows"][1]["significant"] == ["R@1"]
    assert T.build_table([dense, a], ["dense", "a"], n_comparisons=10)["rows"][1]["significant"] == []
    assert "Bonferroni x2" in T.caption(t, 10) and "vs dense" in T.caption(t)
    odd = T.build_table([{**dense, "qrels": "other"}, {**a, "dense_run": "/w/x.trec"}], ["d", "a"])
    assert any("different qrels" in w for w in odd["warnings"])
    assert any("not a row of the table" in w for w in odd["warnings"]) and odd["reference"] is None
    assert T.format_cell("doc_postings_max", 1234.0) == "1234" and T.format_cell("R@1", float("nan")) == "–"


def test_overlap_histogram_counts():
    assert M.overlap_histogram({"q1": 0.3, "q2": 0.3, "q3": 1.0, "q4": 0.0}, 10) == [1, 0, 0, 2] + [0] * 6 + [1]


def test_evaluation_depth_truncation_changes_nothing():
    # scores from 3 levels: many ties around every cutoff; AP (no cutoff) turns the truncation off
    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(60)]
    run = {f"q{j}": {d: float(rng.integers(0, 3)) for d in docs} for j in range(30)}
    qrels = {f"q{j}": {docs[j]: 1, docs[j + 20]: 1} for j in range(30)}
    cut = M.evaluate_run(run, qrels, ["R@1", "R@5", "RR@10", "P@5"])
    full = M.evaluate_run(run, qrels, ["R@1", "R@5", "RR@10", "P@5", "AP"])
    for n in cut.per_query:
        assert cut.per_query[n] == full.per_query[n]


def test_power_law_fit_r2():
    r = np.arange(1, 501)
    a, c, r2 = M.power_law_fit(1000.0 * r ** -1.5)
    assert a == pytest.approx(1.5) and r2 == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    noisy = 1000.0 * r ** -1.5 * np.exp(rng.normal(0, 0.5, r.size))
    assert 0.5 < M.power_law_fit(noisy)[2] < 1.0


# --- figures ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flops", [(2.1, 3.2, 4.4), (1.7, 26.7), (0.05, 12.0, 800.0), (1.57, 13.6)])
def test_flops_plot_log_axis_labels_are_plain_and_do_not_overlap(flops):
    """Matplotlib's default log axis labels minor ticks "2×10⁰ 3×10⁰ 4×10⁰" over each other when
    the FLOPs span less than a couple of decades (issue 18)."""
    from mmsparse.metrics.plots import flops_figure

    fig, ax = flops_figure([(f"run{i}", x, 0.01 * (i + 1)) for i, x in enumerate(flops)],
                           references=[("dense", 0.02)])
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    lo, hi = ax.get_xlim()
    labels = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
              if t.get_text() and t.get_visible() and lo <= t.get_position()[0] <= hi]
    assert len(labels) >= 2  # enough ticks to read a value off the axis
    assert not [t.get_text() for t in labels if "times" in t.get_text() or "×" in t.get_text()]
    boxes = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.x0)
    # at least 10 px apart: "8 9 10" one character apart read as one number (1.57..13.6 FLOPs did)
    assert all(a.x1 + 10 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
    import matplotlib.pyplot as plt
    plt.close(fig)
