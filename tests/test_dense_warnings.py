"""A head that is not sparse yet is named where it is used: train-head saving it, sparsify writing
its vectors and search walking them each print one warning line with the measured density and
the fix; --allow-dense (sparsify, search) proceeds quietly; a sparse head gets no warning."""

from __future__ import annotations

import json

import pytest

from mmsparse.formats import read_sparse

WARNING = "mmsparse: warning:"


@pytest.fixture(scope="module")
def heads(method_data, tmp_path_factory):
    """Over the whole 30,522-term vocabulary: one D2S head after 1 epoch with no sparsity pressure (near
    dense), one pushed sparse (negative bias, top-2 gates)."""
    from conftest import mmsparse_main

    root = tmp_path_factory.mktemp("dense-heads")
    common = ["train-head", method_data / "train-images.h5", method_data / "train-captions.h5",
              "--val-images", method_data / "val-images.h5", "--val-captions", method_data / "val-captions.h5",
              "--batch-size", "32", "--vocab-min-df", "0", "--lr-warmup", "0", "--l1-warmup", "0", "--seed", "1",
              "--preset", "paper"]
    assert mmsparse_main(*common, "-o", root / "dense", "--epochs", "1", "--eta", "0") == 0
    assert mmsparse_main(*common, "-o", root / "sparse", "--epochs", "1", "--eta", "0", "--init-bias", "-3",
                         "--doc-top-k", "2", "--query-top-k", "2") == 0
    return root


def _warnings(err: str) -> list[str]:
    """The density warnings of a command's stderr (the test files' other warnings left out)."""
    return [ln for ln in err.splitlines() if ln.startswith(WARNING) and ("near dense" in ln or "sparse yet" in ln)]


def test_train_head_warns_when_it_saves_a_near_dense_head(method_data, tmp_path, run_cli):
    args = ["train-head", method_data / "train-images.h5", method_data / "train-captions.h5", "--val-images",
            method_data / "val-images.h5", "--val-captions", method_data / "val-captions.h5", "--batch-size", "32",
            "--vocab-min-df", "0", "--lr-warmup", "0", "--l1-warmup", "0", "--epochs", "1", "--eta", "0",
            "--preset", "paper"]
    code, _, err = run_cli(*args, "-o", tmp_path / "h")
    (line,) = _warnings(err)
    assert code == 0 and "the saved head is near dense: validation images hold" in line
    assert "% of the" in line and "validation FLOPs" in line and "--eta" in line and "--l1-warmup" in line
    code, _, err = run_cli(*args, "-o", tmp_path / "s", "--init-bias", "-3", "--doc-top-k", "2", "--query-top-k", "2")
    assert code == 0 and not _warnings(err)


def test_train_head_without_validation_warns_from_a_sample_of_the_training_images(method_data, tmp_path, run_cli):
    """No validation files: the density is measured on a sample of the training pairs after the last
    epoch (what sparsify will write), and a near-dense head is named as with validation files."""
    args = ["train-head", method_data / "train-images.h5", method_data / "train-captions.h5", "--batch-size", "32",
            "--vocab-min-df", "0", "--lr-warmup", "0", "--l1-warmup", "0", "--epochs", "1", "--eta", "0",
            "--preset", "paper"]
    code, _, err = run_cli(*args, "-o", tmp_path / "h")
    (line,) = _warnings(err)
    assert code == 0 and "the saved head is near dense: a sample of 40 training images hold" in line
    assert "training sample's FLOPs" in line and "--eta" in line
    tr = json.loads((tmp_path / "h" / "config.json").read_text())["training"]
    assert tr["val"] is None and tr["train_sample"]["d_nnz"] > 0.1 * 30522
    code, _, err = run_cli(*args, "-o", tmp_path / "s", "--init-bias", "-3", "--doc-top-k", "2", "--query-top-k", "2")
    assert code == 0 and not _warnings(err)


def test_sparsify_and_search_warn_unless_allowed(heads, method_data, tmp_path, run_cli):
    docs, queries = tmp_path / "docs.h5", tmp_path / "q.h5"
    code, _, err = run_cli("sparsify", heads / "dense", method_data / "test-images.h5", "-o", docs)
    (line,) = _warnings(err)
    v = len(read_sparse(docs).vocab)
    terms = read_sparse(docs).matrix.getnnz(axis=1).mean()
    assert code == 0 and terms > 0.1 * v
    assert f"hold {terms:,.0f} terms on average ({terms / v:.0%} of the {v:,}-term vocabulary)" in line
    assert "is not sparse yet" in line and "--allow-dense" in line
    code, _, err = run_cli("sparsify", heads / "dense", method_data / "test-captions.h5", "-o", queries,
                           "--allow-dense")
    assert code == 0 and not _warnings(err)
    code, _, err = run_cli("index", docs, "-o", tmp_path / "idx")
    assert code == 0
    code, _, err = run_cli("search", tmp_path / "idx", queries, "-o", tmp_path / "run.trec")
    (line,) = _warnings(err)
    assert code == 0 and f"{queries}: queries hold" in line and "postings" in line and "--allow-dense" in line
    code, _, err = run_cli("search", tmp_path / "idx", queries, "-o", tmp_path / "run.trec", "--allow-dense")
    assert code == 0 and not _warnings(err)


def test_a_sparse_head_gets_no_warning(heads, method_data, tmp_path, run_cli):
    for split in ("images", "captions"):
        code, _, err = run_cli("sparsify", heads / "sparse", method_data / f"test-{split}.h5", "-o",
                               tmp_path / f"{split}.h5")
        assert code == 0 and not _warnings(err), err
    assert run_cli("index", tmp_path / "images.h5", "-o", tmp_path / "idx")[0] == 0
    code, _, err = run_cli("search", tmp_path / "idx", tmp_path / "captions.h5", "-o", tmp_path / "run.trec")
    assert code == 0 and not _warnings(err), err
