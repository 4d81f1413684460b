"""The HTML report of `mmsparse inspect --html --wordcloud`: its files, and that it renders in
headless Chromium (skipped where Debian's `chromium` is not installed)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
from PIL import Image

from mmsparse.formats import write_qrels, write_run, write_sparse
from mmsparse.metrics.html_report import SHARED_COLOR

VOCAB = ["a", "dog", "##oot", "runs", "cat", "grass", "snow", "beach", "boy", "ball"]
GREEN = (0x2E, 0x7D, 0x32)  # the frame of relevant images (.rel in html_report.CSS)


@pytest.fixture()
def report(tmp_path, run_cli):
    """Two captions, six gradient 'photos'; q1 retrieves five images (relevant one at rank 3)."""
    d = tmp_path / "report"
    d.mkdir()
    q = np.zeros((2, len(VOCAB)), np.float32)
    q[0, [1, 3, 5, 2]] = [2.0, 1.0, 0.8, 0.3]  # dog runs grass -oot
    q[1, [8, 7, 9]] = [1.5, 1.2, 0.9]  # boy beach ball
    rng = np.random.default_rng(0)
    docs = rng.uniform(0.1, 2.0, (6, len(VOCAB))).astype(np.float32) * (rng.random((6, len(VOCAB))) < 0.6)
    docs[2, 1] = 3.0  # the relevant image of q1 is about a dog
    ids = [f"i{j}" for j in range(6)]
    write_sparse(d / "q.h5", ["q1", "q2"], sp.csr_matrix(q), VOCAB,
                 {"modality": "text", "head": "h", "query_mode": "expand"},
                 texts=["A dog runs on the grass .", "A boy on the beach with a ball ."])
    write_sparse(d / "d.h5", ids, sp.csr_matrix(docs), VOCAB, {"modality": "image", "head": "h", "query_mode": "doc"})
    write_run(d / "run.trec", {"q1": {i: float(6 - j) for j, i in enumerate(ids)}, "q2": {"i3": 2.0, "i1": 1.0}})
    write_qrels(d / "qrels", {"q1": {"i2": 1}, "q2": {"i5": 1}})
    (d / "imgs").mkdir()
    x = np.linspace(0, 255, 96)
    for j, i in enumerate(ids):
        rgb = np.stack(np.broadcast_arrays(x[None, :], np.full((96, 1), 40.0 * j), x[:, None]), -1)
        Image.fromarray(rgb.astype(np.uint8)).save(d / "imgs" / f"{i}.jpg")
    code, out, err = run_cli("inspect", d / "q.h5", "q1", "q2", "--html", d / "out" / "index.html", "--docs",
                             d / "d.h5", "--run", d / "run.trec", "--qrels", d / "qrels", "--image-root", d / "imgs",
                             "--wordcloud")
    assert code == 0, err
    assert "7 retrieved images" in out
    return d / "out"


def test_report_files(report):
    h = (report / "index.html").read_text()
    assert "A dog runs on the grass ." in h and "first relevant image at rank 3" in h
    assert h.count('<img class="photo" src="data:image/jpeg;base64,') == 7
    assert h.count('class="img rel"') == 1  # q2's relevant image i5 is not retrieved
    assert "no relevant image in the run" in h
    assert '<span class="m" title="dog">dog' in h and 'title="##oot">-oot' in h
    clouds = sorted(p.name for p in (report / "wordclouds").iterdir())
    assert clouds == [f"q1__i{j}.png" for j in range(5)] + ["q2__i1.png", "q2__i3.png"]
    assert all(f'src="wordclouds/{c}"' in h for c in clouds)
    img = np.asarray(Image.open(report / "wordclouds" / "q1__i2.png").convert("RGB"))
    assert img.shape == (240, 420, 3)
    orange = tuple(int(SHARED_COLOR[i:i + 2], 16) for i in (1, 3, 5))
    assert (np.abs(img.astype(int) - orange).sum(-1) < 30).sum() > 100  # "dog", shared with q1, in orange


def test_inspect_wordcloud_needs_html(report, run_cli):
    code, out, err = run_cli("inspect", report.parent / "q.h5", "q1", "--wordcloud")
    assert code == 2 and "--wordcloud goes with --html" in err


def test_wordcloud_words_stay_readable_in_the_report(tmp_path):
    """The report shows a cloud at half its pixel width: words below 20 px (10 on screen) are
    left out, not shrunk, and at most WORDCLOUD_MAX_WORDS are drawn."""
    from mmsparse.metrics.html_report import WORDCLOUD_MAX_WORDS, write_wordcloud

    terms = [(f"term{i}", 2.0 * 0.95 ** i) for i in range(80)]  # many terms of slowly falling weight
    drawn = write_wordcloud(terms, tmp_path / "wc.png", {"term1"})
    assert 10 <= len(drawn) <= WORDCLOUD_MAX_WORDS
    assert min(size for _, size in drawn) >= 20 and max(size for _, size in drawn) <= 0.4 * 240
    assert [w for w, _ in drawn][:3] == ["term0", "term1", "term2"]  # the heaviest first
    assert Image.open(tmp_path / "wc.png").size == (420, 240)
    assert len(write_wordcloud(terms, tmp_path / "wc12.png", max_words=12)) == 12
    assert write_wordcloud([], tmp_path / "empty.png") == [] and (tmp_path / "empty.png").stat().st_size > 0


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian `chromium` not installed (apt-get install -y chromium); cannot render the report")
def test_report_renders_in_headless_chromium(report, tmp_path):
    shot = tmp_path / "shot.png"
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", f"--screenshot={shot}",
           "--window-size=1200,1000", (report / "index.html").as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and shot.is_file(), p.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape == (1000, 1200, 3)
    assert (img.sum(-1) < 700).mean() > 0.05  # a good share of the page is not white
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 1000  # photos and word clouds, not just text
    near = lambda c: (np.abs(img - c).sum(-1) < 30).sum()  # noqa: E731
    assert near(GREEN) > 500  # the CSS applied: the relevant image's green frame
    assert near(tuple(int(SHARED_COLOR[i:i + 2], 16) for i in (1, 3, 5))) > 100  # word-cloud PNGs loaded
