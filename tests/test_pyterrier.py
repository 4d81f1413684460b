"""mmsparse inside PyTerrier: `SparseQueryEncoder >> retriever(PISA index)` (pyterrier-pisa) and
`DenseQueryEncoder >> retriever(Faiss index)` in pt.Experiment on the real Flickr8k test captions
(conftest `search_setup`) give the R@10 the shell chain (sparsify + search + eval) gives."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pt = pytest.importorskip("pyterrier")

from ir_measures import RR, R  # noqa: E402  (ir-measures names: R@10 is the measure R with cutoff 10)

from mmsparse.pyterrier import (DenseQueryEncoder, PisaRetriever, SparseQueryEncoder,  # noqa: E402
                                qrels_frame, retriever, topics_frame)


@pytest.mark.slow  # a PyTerrier experiment beside the shell chain: ~12 s
def test_experiment_matches_the_shell_chain(search_setup, run_cli, tmp_path, capfd):
    s = search_setup
    caps, qrels = s["dense"] / "test-captions.h5", s["dense"] / "test.qrels"
    # the shell chain
    shell = {}
    for name, index, queries in (("d2s", s["pisa"], tmp_path / "q.h5"), ("dense", s["faiss"], caps)):
        if name == "d2s":
            assert run_cli("sparsify", s["head"], caps, "-o", queries)[0] == 0
        assert run_cli("search", index, queries, "-o", tmp_path / f"{name}.trec", "--k", "100")[0] == 0
        code, out, err = run_cli("eval", tmp_path / f"{name}.trec", qrels, "-o", tmp_path / f"{name}.json")
        assert code == 0, err
        shell[name] = json.loads((tmp_path / f"{name}.json").read_text())
    # the same in PyTerrier
    topics, qrels_df = topics_frame(caps), qrels_frame(qrels)
    assert len(topics) == 500 and set(qrels_df.columns) == {"qid", "docno", "label"}
    sparse = SparseQueryEncoder(s["pisa"]) >> retriever(s["pisa"], num_results=100)
    dense = DenseQueryEncoder(s["faiss"]) >> retriever(s["faiss"], num_results=100)
    assert isinstance(retriever(s["pisa"]), PisaRetriever)
    table = pt.Experiment([dense, sparse], topics, qrels_df, eval_metrics=[R@1, R@10, RR@10],
                          names=["dense (Faiss)", "d2s (PISA)"], baseline=0, correction="bonferroni")
    rows = table.set_index("name")
    assert rows.loc["d2s (PISA)", "R@10"] == pytest.approx(shell["d2s"]["R@10"], abs=1e-12)
    assert rows.loc["d2s (PISA)", "R@1"] == pytest.approx(shell["d2s"]["R@1"], abs=1e-12)
    assert rows.loc["dense (Faiss)", "R@10"] == pytest.approx(shell["dense"]["R@10"], abs=1e-12)
    assert 0 < rows.loc["d2s (PISA)", "R@10"] < 1
    assert {"R@10 p-value", "R@10 reject"} <= set(table.columns)              # significance vs the baseline
    assert pd.isna(rows.loc["dense (Faiss)", "R@10 p-value"]) and 0 <= rows.loc["d2s (PISA)", "R@10 p-value"] <= 1
    with capfd.disabled():
        cols = ["name", "R@1", "R@10", "RR@10", "R@10 +", "R@10 -", "R@10 p-value", "R@10 reject"]
        print("\npt.Experiment, Flickr8k test (first 100 images, 500 captions):\n"
              + table[[c for c in cols if c in table.columns]].to_string(index=False)
              + f"\nshell chain R@10: d2s {shell['d2s']['R@10']:.4f}, dense {shell['dense']['R@10']:.4f}")


def test_encoder_output_is_pisa_learned_sparse_input(search_setup):
    """query_toks is a {term: weight} dict per query (blank queries: {}), and PisaRetriever takes it
    with pyterrier-pisa; a term outside the index vocabulary is refused."""
    from mmsparse.errors import InputError

    s = search_setup
    enc = SparseQueryEncoder(s["pisa"])
    frame = enc(pd.DataFrame({"qid": ["1", "2"], "query": ["a dog running on the beach", " "]}))
    toks = frame["query_toks"].tolist()
    assert toks[1] == {} and "dog" in toks[0] and all(isinstance(v, float) and v > 0 for v in toks[0].values())
    res = retriever(s["pisa"], num_results=5)(frame)
    assert set(res.columns) >= {"qid", "query", "docno", "score", "rank"}
    assert res["qid"].tolist() == ["1"] * 5 and res["rank"].tolist() == [0, 1, 2, 3, 4]
    assert res["score"].is_monotonic_decreasing
    with pytest.raises(InputError, match="not in the vocabulary"):
        retriever(s["pisa"], num_results=5)(pd.DataFrame({"qid": ["1"], "query_toks": [{"ǂǂǂ": 1.0}]}))
