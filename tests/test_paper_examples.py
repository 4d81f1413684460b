"""examples/mscoco-blip and examples/flickr30k-albef (issue 19): `make -n` with the defaults prints the
D2S paper's settings, and both Makefiles run end to end on a small dataset in their layout (real
Flickr8k images: the official COCO 2017 caption-file pair, and a Karpathy JSON) with the hf-dual
backbone and the shared dual encoder, with tiny training settings. Their `joint` targets (the joint
paper's heads over the towers' final layers) and `vdr` / `vdr-ablation` targets (the VDR paper's Table 2,
Figure 3 and Fig. 7 against the dense model trained alike, over the same final-layer inputs): `make -n`
runs every stage with the papers' schedules, and each runs end to end with tiny random weights of the
example's own backbone (BLIP, ALBEF)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mmsparse
from mmsparse import settings
from mmsparse.formats import read_dense, read_qrels

# the paper examples end to end: ~6.5 minutes on 2 cores (CI runs -m slow)
pytestmark = pytest.mark.slow

EXAMPLES = settings.REPO_ROOT / "examples"
PAPER = {"mscoco-blip": ("blip", "Salesforce/blip-itm-base-coco", "dataset_coco.json"),
         "flickr30k-albef": ("albef", "models/albef-flickr30k", "dataset_flickr30k.json")}
# tiny training and CPU settings for the end-to-end runs (the defaults are the paper's, for a GPU)
TINY = ["DEVICE=cpu", "WORKERS=0", "EPOCHS=2", "BATCH_SIZE=32", "VOCAB_MIN_DF=1", "ETAS=1e-3", "K=100"]


def make(example: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    # the Makefiles call `mmsparse`: the one installed beside this interpreter, even without an activated venv
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "MAKEFLAGS": "", "MFLAGS": "", "PATH": path}
    p = subprocess.run(["make", "--no-print-directory", "-C", str(EXAMPLES / example), *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def commands(dry_run: str) -> list[list[str]]:
    """`make -n` output -> the commands (continuation lines joined), each split into words."""
    return [shlex.split(c) for c in dry_run.replace("\\\n", " ").splitlines() if c.strip()]


def flag(cmd: list[str], name: str) -> list[str]:
    """Every value given to option `name` in `cmd`."""
    return [cmd[i + 1] for i, w in enumerate(cmd[:-1]) if w == name]


@pytest.mark.parametrize("example", sorted(PAPER))
def test_dry_run_prints_the_paper_settings(example, tmp_path):
    backbone, model, ann = PAPER[example]
    p = make(example, "-n", f"WORK={tmp_path / 'work'}")
    cmds = commands(p.stdout)
    mm = [c for c in cmds if c[0] == "mmsparse"]
    stage = [c[1] for c in mm]
    enc = [c for c in mm if c[1] == "encode-dense"]
    assert len(enc) == 1 and enc[0][2].endswith(f"/{ann}") and flag(enc[0], "--split") == ["train", "val", "test"]
    assert flag(enc[0], "--backbone") == [backbone] and flag(enc[0], "--model")[0].endswith(model)
    assert flag(enc[0], "--device") == ["cuda"] and flag(enc[0], "--precision") == ["fp32"]
    train = [c for c in mm if c[1] == "train-head"]
    assert [flag(c, "--eta") for c in train] == [["1e-3"], ["1e-5"]]  # the two η of Table 1
    for c in train:  # §5.1: batch 512, 200 epochs, τ = 0.001, the whole vocabulary; exp = c
        assert flag(c, "--epochs") == ["200"] and flag(c, "--batch-size") == ["512"]
        assert flag(c, "--expansion") == ["caption"] and flag(c, "--temperature") == ["0.001"]
        assert flag(c, "--vocab-min-df") == ["0"] and flag(c, "--device") == ["cuda"]
        assert flag(c, "--val-images")[0].endswith("val-images.h5")
    heads = [flag(c, "-o")[0].rsplit("/", 1)[1] for c in train]
    assert heads == ["d2s-eta1e-3", "d2s-eta1e-5"]
    evals = [c for c in mm if c[1] == "eval" and "--table" not in c]
    sparse_evals = [c for c in evals if "--dense-run" in c]
    assert len(evals) == 3 and [flag(c, "--n-comparisons") for c in sparse_evals] == [["2"], ["2"]]
    assert stage[0] == "encode-dense" and stage.index("train-head") < stage.index("sparsify")
    assert {"index", "search", "eval"} <= set(stage)
    table = mm[-1]  # the table is printed last, after inspect
    assert table[1:3] == ["eval", "--table"] and flag(table, "--label") == ["dense", *heads]
    assert [c for c in mm if c[1] == "inspect"] and stage.index("inspect") < len(stage) - 1


def test_dry_run_coco_2017_layout(tmp_path):
    data = tmp_path / "coco"
    (data / "annotations").mkdir(parents=True)
    for s in ("train2017", "val2017"):
        (data / "annotations" / f"captions_{s}.json").write_text("{}")
    cmds = commands(make("mscoco-blip", "-n", f"DATA={data}", f"WORK={tmp_path / 'work'}").stdout)
    enc = [c for c in cmds if c[:2] == ["mmsparse", "encode-dense"]]
    assert sorted((c[2], c[3], flag(c, "--split")) for c in enc) == [
        (f"{data}/annotations/captions_train2017.json", f"{data}/train2017", ["train"]),
        (f"{data}/annotations/captions_val2017.json", f"{data}/val2017", ["test"])]
    links = [c for c in cmds if c[0] == "ln"]  # val-* stand for test-* (train-head reads no val qrels)
    assert sorted((c[2], c[3].rsplit("/", 1)[1]) for c in links) == [("test-captions.h5", "val-captions.h5"),
                                                                      ("test-images.h5", "val-images.h5")]


# the authors' released training configs (holi-lab/mm-sparse-retrieval training_config/*.json) as train-head flags
JOINT_PAPER = {"mscoco-blip": {"--w1": "0.1", "--w2": "0.1", "--lambda-dense": "0.9", "--lambda-sparse": "0.3",
                               "--eta": "5e-4", "--eta-image": "3e-5", "--final-lr": "5e-5"},
               "flickr30k-albef": {"--w1": "0.1", "--w2": "0.2", "--lambda-dense": "0.3", "--lambda-sparse": "0.3",
                                   "--eta": "1e-4", "--eta-image": "2e-5", "--final-lr": "1e-5"}}


@pytest.mark.parametrize("example", sorted(PAPER))
def test_dry_run_joint_runs_every_stage(example, tmp_path):
    """`make -n joint`: encode with --final-layer-inputs, train the joint head with the authors' schedule,
    sparsify (with the tuned dense vectors), index, search and evaluate both, then the table (Tables 1-2);
    `make -n joint-ablation` adds Table 3's two variants."""
    backbone, _, _ = PAPER[example]
    work = tmp_path / "work"
    mm = [c for c in commands(make(example, "-n", "joint", f"WORK={work}").stdout) if c[0] == "mmsparse"]
    states = f"{work}/dense/{backbone}-final"
    enc = [c for c in mm if c[1] == "encode-dense" and "--final-layer-inputs" in c]
    assert len(enc) == 1 and flag(enc[0], "-o") == [states] and flag(enc[0], "--split") == ["train", "val", "test"]
    assert flag(enc[0], "--backbone") == [backbone] and flag(enc[0], "--device") == ["cuda"]
    (train,) = [c for c in mm if c[1:4] == ["train-head", "--method", "joint"]]
    assert train[4:6] == [f"{states}/train-images.h5", f"{states}/train-captions.h5"]
    assert flag(train, "-o") == [f"{work}/heads/joint"] and flag(train, "--device") == ["cuda"]
    assert (flag(train, "--epochs"), flag(train, "--batch-size"), flag(train, "--expansion")) == (["200"], ["256"], ["full"])
    assert all(flag(train, k) == [v] for k, v in JOINT_PAPER[example].items())
    sp = [c for c in mm if c[1:3] == ["sparsify", f"{work}/heads/joint"]]
    assert sorted(flag(c, "--dense-out")[0].rsplit("/", 1)[1] for c in sp) == ["test-captions.h5", "test-images.h5"]
    assert all(c[3].startswith(states) for c in sp)
    assert {flag(c, "-o")[0] for c in mm if c[1] == "index"} >= {f"{work}/index/joint", f"{work}/index/dense-joint"}
    assert {c[2] for c in mm if c[1] == "search"} >= {f"{work}/index/joint", f"{work}/index/dense-joint"}
    evals = {flag(c, "-o")[0].rsplit("/", 1)[1] for c in mm if c[1] == "eval" and "--table" not in c}
    assert {"dense.json", "dense-joint.json", "joint.expand.json", "d2s-eta1e-3.expand.json"} <= evals
    table = mm[-1]
    assert table[1:3] == ["eval", "--table"] and flag(table, "-o") == [f"{work}/eval/joint-table.md"]
    assert flag(table, "--label") == [f"dense ({backbone})", "joint dense", "d2s-eta1e-3 sparse", "d2s-eta1e-5 sparse",
                                      "joint sparse"]
    at = {(c[1], flag(c, "-o")[0]): i for i, c in enumerate(mm) if flag(c, "-o")}
    assert at[("encode-dense", states)] < at[("train-head", f"{work}/heads/joint")] \
        < at[("sparsify", f"{work}/sparse/joint/test-images.h5")] < at[("index", f"{work}/index/joint")] \
        < at[("search", f"{work}/runs/joint.expand.trec")] < at[("eval", f"{work}/eval/joint.expand.json")]
    ablation = [c for c in commands(make(example, "-n", "joint-ablation", f"WORK={work}").stdout)
                if c[:4] == ["mmsparse", "train-head", "--method", "joint"]]
    variants = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in ablation}
    assert sorted(variants) == ["joint", "joint-frozen", "joint-nodistill"]
    assert "--no-distill" in variants["joint-nodistill"]
    assert {"--freeze-final-layer", "--freeze-projection"} <= set(variants["joint-frozen"])


def _pick(flickr8k_dir: Path, n_train: int, n_val: int, n_test: int) -> dict[str, list[dict]]:
    ims = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text())["images"]
    out = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        out[split] = [im for im in ims if im["split"] == split][:n]
    return out


def _link_images(src: Path, dst: Path, names) -> None:
    dst.mkdir(parents=True)
    for n in names:
        (dst / n).symlink_to(src / n)


def _check_run(work: Path, out: str, n_test_images: int, n_test_captions: int, inspect_ids: list[str]) -> None:
    dense = work / "dense" / "hf-dual"
    im, cap = read_dense(dense / "test-images.h5"), read_dense(dense / "test-captions.h5")
    assert len(im.ids) == n_test_images and len(cap.ids) == n_test_captions
    assert len(read_qrels(dense / "test.qrels")) == n_test_captions
    cfg = json.loads((work / "heads" / "d2s-eta1e-3" / "config.json").read_text())["training"]["config"]
    assert (cfg["epochs"], cfg["batch_size"], cfg["eta"], cfg["expansion"], cfg["temperature"]) == \
        (2, 32, 1e-3, "caption", 1e-3)
    dense_eval = json.loads((work / "eval" / "dense.json").read_text())
    sparse_eval = json.loads((work / "eval" / "d2s-eta1e-3.expand.json").read_text())
    assert dense_eval["queries"] == sparse_eval["queries"] == n_test_captions
    assert dense_eval["R@1"] > 1.5 / n_test_images  # the dense model beats chance
    assert sparse_eval["FLOPs"] > 0 and sparse_eval["n_comparisons"] == 1  # one head: Bonferroni x1
    table = (work / "eval" / "table.md").read_text()
    rows = {r.split("|")[1].strip(): r for r in table.splitlines() if r.startswith("| ") and "---" not in r}
    assert list(rows) == ["run", "dense", "d2s-eta1e-3"]
    # † marks exactly the measures whose corrected p-value vs dense is < 0.05
    cols = [c.strip() for c in rows["run"].split("|")[1:-1]]
    cells = dict(zip(cols, (c.strip() for c in rows["d2s-eta1e-3"].split("|")[1:-1])))
    for m in ("R@1", "R@5", "RR@10"):
        assert cells[m].endswith("†") == (sparse_eval[f"p_vs_dense_corrected_{m}"] < 0.05), (m, cells[m])
        assert abs(float(cells[m].rstrip("†")) - 100 * sparse_eval[m]) < 0.051
    # inspect shows the first test images' top terms, and the table comes after it
    assert f"{work}/sparse/d2s-eta1e-3/test-images.h5 {' '.join(inspect_ids)} " in out
    tail = out[out.rindex("mmsparse eval --table"):]  # the printed table is the last thing
    assert out.rindex(inspect_ids[-1]) < out.rindex("mmsparse eval --table") and "┃ term" not in tail
    assert "d2s-eta1e-3" in tail and "† p < 0.05 vs dense" in tail


def _flickr30k_layout(flickr8k_dir: Path, tmp_path: Path) -> tuple[Path, dict]:
    """dataset_flickr30k.json + flickr30k-images/ (links) over 40/10/10 real Flickr8k train/val/test
    images in tmp_path/flickr30k: (that folder, the picked Karpathy image records per split)."""
    picked = _pick(flickr8k_dir, 40, 10, 10)
    data = tmp_path / "flickr30k"
    _link_images(flickr8k_dir / "images", data / "flickr30k-images",
                 [im["filename"] for ims in picked.values() for im in ims])
    (data / "dataset_flickr30k.json").write_text(json.dumps(
        {"dataset": "flickr30k", "images": [im for ims in picked.values() for im in ims]}))
    return data, picked


def test_flickr30k_albef_runs_on_a_karpathy_dataset(flickr8k_dir, dual_encoder_dir, tmp_path):
    """dataset_flickr30k.json + flickr30k-images/ over 40/10/10 real Flickr8k images."""
    data, picked = _flickr30k_layout(flickr8k_dir, tmp_path)
    work = tmp_path / "work"
    p = make("flickr30k-albef", f"DATA={data}", f"WORK={work}", "BACKBONE=hf-dual", f"MODEL={dual_encoder_dir}",
             *TINY)
    ids = [im["filename"].rsplit(".", 1)[0] for im in picked["test"][:3]]
    _check_run(work, p.stdout, 10, 50, ids)
    assert read_dense(work / "dense" / "hf-dual" / "val-images.h5").attrs["split"] == "val"


def _coco_layout(flickr8k_dir: Path, tmp_path: Path) -> Path:
    """annotations/captions_{train,val}2017.json + train2017/ val2017/ (links) over 40 + 10 real Flickr8k
    train/test images in tmp_path/coco (COCO-style numeric ids and file names): that folder."""
    picked = _pick(flickr8k_dir, 40, 0, 10)
    data = tmp_path / "coco"
    (data / "annotations").mkdir(parents=True)
    for split, folder in (("train", "train2017"), ("test", "val2017")):
        ims = picked[split]
        names = {im["filename"]: f"{n + 1 + (0 if split == 'train' else 1000):012d}.jpg" for n, im in enumerate(ims)}
        (data / folder).mkdir()
        for src, dst in names.items():
            (data / folder / dst).symlink_to(flickr8k_dir / "images" / src)
        (data / "annotations" / f"captions_{folder}.json").write_text(json.dumps({
            "images": [{"id": int(names[im["filename"]][:12]), "file_name": names[im["filename"]]} for im in ims],
            "annotations": [{"id": s["sentid"], "image_id": int(names[im["filename"]][:12]), "caption": s["raw"]}
                            for im in ims for s in im["sentences"]]}))
    return data


def test_mscoco_blip_runs_on_the_coco_2017_caption_files(flickr8k_dir, dual_encoder_dir, tmp_path):
    """annotations/captions_{train,val}2017.json + train2017/ val2017/ over 40 + 10 real Flickr8k images
    (COCO-style numeric ids and file names)."""
    data = _coco_layout(flickr8k_dir, tmp_path)
    work = tmp_path / "work"
    p = make("mscoco-blip", f"DATA={data}", f"WORK={work}", "BACKBONE=hf-dual", f"MODEL={dual_encoder_dir}", *TINY)
    _check_run(work, p.stdout, 10, 50, [f"{1001 + n:012d}" for n in range(3)])
    val = work / "dense" / "hf-dual" / "val-images.h5"
    assert val.is_symlink() and os.readlink(val) == "test-images.h5"  # 2017 has no third split
    assert read_dense(work / "dense" / "hf-dual" / "train-images.h5").attrs["split"] == "train"


@pytest.mark.parametrize("example", sorted(PAPER))
def test_joint_runs_with_the_papers_backbone(example, flickr8k_dir, tiny_blip, tiny_albef, tmp_path):
    """`make joint` end to end on the CPU with the example's own backbone, tiny random weights (no hub)
    and a tiny schedule: BLIP over the COCO 2017 layout, ALBEF over a Karpathy JSON, real Flickr8k
    images (10 test images, 50 captions); the rows of Tables 1-2."""
    backbone = PAPER[example][0]
    data = _coco_layout(flickr8k_dir, tmp_path) if backbone == "blip" else _flickr30k_layout(flickr8k_dir, tmp_path)[0]
    work = tmp_path / "work"
    make(example, "joint", f"DATA={data}", f"WORK={work}", f"MODEL={tiny_blip if backbone == 'blip' else tiny_albef}",
         *TINY, "JOINT_FLAGS=--epochs 2 --batch-size 8 --vocab-min-df 1 --final-lr 1e-3")
    cfg = json.loads((work / "heads" / "joint" / "config.json").read_text())
    assert {k: v["kind"] for k, v in cfg["final_layers"].items()} == {"text": "bert", "image": "vit"}
    assert cfg["training"]["config"]["epochs"] == 2 and cfg["final_layers_tuned"] is True
    tuned = read_dense(work / "dense" / "joint" / "test-images.h5")
    orig = read_dense(work / "dense" / backbone / "test-images.h5")
    assert list(tuned.ids) == list(orig.ids) and len(orig.ids) == 10
    for name in ("dense-joint.json", "joint.expand.json"):
        assert json.loads((work / "eval" / name).read_text())["queries"] == 50
    rows = [r.split("|")[1].strip() for r in (work / "eval" / "joint-table.md").read_text().splitlines()
            if r.startswith("| ") and "---" not in r]
    assert rows == ["run", f"dense ({backbone})", "joint dense", "d2s-eta1e-3 sparse", "joint sparse"]


# VDR's settings in the examples: App. A's schedule (batch 2048 by image where the paper has 4096: what an 80 GB GPU
# holds), the whole vocabulary and k = 512, the paper's image init and image positions; the final layers at the joint
# authors' rate on the example's checkpoint
VDR_SCHEDULE = {"--epochs": "20", "--batch-size": "2048", "--batch-by": "image", "--lr": "2e-4", "--lr-schedule": "cosine",
                "--lr-warmup": "0.05", "--select-metric": "R@10"}
VDR_OWN = {"--vocab-min-df": "0", "--vdr-train-k": "512", "--vdr-query-k": "512", "--vdr-doc-k": "512",
           "--vdr-image-init": "random"}
VDR_FINAL_LR = {"mscoco-blip": "5e-5", "flickr30k-albef": "1e-5"}


def _outputs(mm: list[list[str]], work: Path, stage: str, sub: str) -> list[str]:
    """Names (relative to work/sub) of the -o outputs of `mmsparse STAGE` commands under work/sub."""
    return [o[len(f"{work}/{sub}/"):] for c in mm if c[1] == stage for o in flag(c, "-o")
            if o.startswith(f"{work}/{sub}/")]


@pytest.mark.parametrize("example", sorted(PAPER))
def test_dry_run_vdr_runs_every_stage(example, tmp_path):
    """`make -n vdr`: the final-layer inputs encoded once (the joint targets' directory: `make -n joint vdr`
    encodes once too), VDR, its bag-of-words twin and the dense model trained alike trained with one schedule,
    sparsify / index / search / eval of VDR and VDR^α at k = 512 and of both dense models, paired tests against
    the dense model trained alike, the D2S rows, then Table 2, the word clouds and the validation curve."""
    backbone, _, _ = PAPER[example]
    work = tmp_path / "work"
    cmds = commands(make(example, "-n", "vdr", f"WORK={work}").stdout)
    mm, py = [c for c in cmds if c[0] == "mmsparse"], [c for c in cmds if c[:2] == ["python", "-m"]]
    states = f"{work}/dense/{backbone}-final"
    enc = [c for c in mm if c[1] == "encode-dense" and "--final-layer-inputs" in c]
    assert len(enc) == 1 and flag(enc[0], "-o") == [states] and flag(enc[0], "--device") == ["cuda"]
    assert flag(enc[0], "--precision") == ["fp32"]
    both = commands(make(example, "-n", "joint", "vdr", f"WORK={work}").stdout)
    assert len([c for c in both if c[:2] == ["mmsparse", "encode-dense"] and "--final-layer-inputs" in c]) == 1
    train = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in mm if c[1] == "train-head"}
    assert {"vdr", "vdr-nobow", "vdr-dense"} <= set(train)
    for name in ("vdr", "vdr-nobow", "vdr-dense"):
        c = train[name]
        assert c[2:4] == ["--method", "dense" if name == "vdr-dense" else "vdr"]
        assert c[4:6] == [f"{states}/train-images.h5", f"{states}/train-captions.h5"]
        assert flag(c, "--val-images") == [f"{states}/val-images.h5"] and flag(c, "--device") == ["cuda"]
        assert all(flag(c, k) == [v] for k, v in VDR_SCHEDULE.items()), name
        assert flag(c, "--final-lr") == [VDR_FINAL_LR[example]]
    for name in ("vdr", "vdr-nobow"):
        assert all(flag(train[name], k) == [v] for k, v in VDR_OWN.items()) and "--no-vdr-image-cls" in train[name]
    assert "--no-vdr-np-entry" in train["vdr-nobow"] and "--no-vdr-np-entry" not in train["vdr"]
    assert not any(w.startswith("--vdr-") and w != "--vdr-buffer-rows" for w in train["vdr-dense"])
    sparse = _outputs(mm, work, "sparsify", "sparse")
    assert {"vdr/test-images.k512.h5", "vdr/test-captions.vdr.k512.h5", "vdr/test-captions.bow.h5",
            "vdr/test-images.all.h5", "vdr-nobow/test-images.all.h5"} <= set(sparse)
    sp = {flag(c, "-o")[0].rsplit("/", 2)[1] + "/" + flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in mm if c[1] == "sparsify"}
    assert flag(sp["vdr/test-images.k512.h5"], "--vdr-doc-k") == ["512"]
    assert flag(sp["vdr/test-captions.vdr.k512.h5"], "--vdr-query-k") == ["512"]
    assert flag(sp["vdr/test-captions.bow.h5"], "--query-mode") == ["bow"] and "--allow-dense" in sp["vdr/test-images.all.h5"]
    assert {"vdr-dense/test-images.h5", "vdr-dense/test-captions.h5"} <= set(_outputs(mm, work, "sparsify", "dense"))
    assert {"vdr-k512", "vdr-dense", "vdr-backbone"} <= set(_outputs(mm, work, "index", "index"))
    assert [c[2] for c in mm if c[1] == "index" and flag(c, "-o") == [f"{work}/index/vdr-backbone"]] == \
        [f"{states}/test-images.h5"]   # the backbone's own vectors, from the same files
    assert {"vdr-k512.trec", "vdr-bow-k512.trec", "vdr-dense.trec", "vdr-backbone.trec"} <= \
        set(_outputs(mm, work, "search", "runs"))
    evals = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in mm if c[1] == "eval" and "--table" not in c}
    alike = f"{work}/runs/vdr-dense.trec"
    for name in ("vdr-backbone.json", "vdr-k512.json", "vdr-bow-k512.json", "d2s-eta1e-3.vs-vdr-dense.json",
                 "d2s-eta1e-5.vs-vdr-dense.json"):
        assert flag(evals[name], "--dense-run") == [alike], name
    assert flag(evals["vdr-dense.json"], "--dense-run") == []
    assert flag(evals["vdr-k512.json"], "--queries") == [f"{work}/sparse/vdr/test-captions.vdr.k512.h5"]
    assert evals["vdr-k512.json"][3] == f"{states}/test.qrels"
    table = [c for c in mm if c[1:3] == ["eval", "--table"]]
    assert len(table) == 1 and flag(table[0], "-o") == [f"{work}/eval/vdr-table.md"]
    labels = [f"dense ({backbone})", "dense trained alike", "VDR (k=512)", "VDR^α (k=512)", "d2s-eta1e-3 sparse",
              "d2s-eta1e-5 sparse"]
    assert flag(table[0], "--label") == labels and "--column" in table[0]
    se, clouds, curve = ([c for c in py if c[2:4] == [mod, what]] for mod, what in (
        ("mmsparse.methods.joint", "se"), ("mmsparse.methods.vdr", "clouds"), ("mmsparse.methods.vdr", "curve")))
    assert [a.rpartition("=")[0] for a in se[0][4:-2]] == labels and flag(se[0], "-o") == [f"{work}/eval/vdr-se.md"]
    assert [a.rpartition("=")[2] for a in clouds[0][4:6]] == [f"{work}/sparse/vdr/test-images.all.h5",
                                                           f"{work}/sparse/vdr-nobow/test-images.all.h5"]
    assert curve[0][4:6] == [f"{work}/heads/vdr", f"{work}/heads/vdr-dense"]
    at = {(c[1], flag(c, "-o")[0]): i for i, c in enumerate(mm) if flag(c, "-o")}
    assert at[("encode-dense", states)] < at[("train-head", f"{work}/heads/vdr")] \
        < at[("sparsify", f"{work}/sparse/vdr/test-images.k512.h5")] < at[("index", f"{work}/index/vdr-k512")] \
        < at[("search", f"{work}/runs/vdr-k512.trec")] < at[("eval", f"{work}/eval/vdr-k512.json")] \
        < at[("eval", f"{work}/eval/vdr-table.md")]


@pytest.mark.parametrize("example", sorted(PAPER))
def test_dry_run_vdr_ablation_runs_every_stage(example, tmp_path):
    """`make -n vdr-ablation`: Figure 3's three variants and the frozen final layers, each with VDR's flags plus
    its own, searched with both query kinds and tested against VDR's (VDR^α's) run; the two tables and their
    standard errors."""
    work = tmp_path / "work"
    out = make(example, "-n", "vdr-ablation", f"WORK={work}").stdout
    mm = [c for c in commands(out) if c[0] == "mmsparse"]
    train = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in mm if c[1:4] == ["train-head", "--method", "vdr"]}
    assert sorted(train) == ["vdr", "vdr-frozen", "vdr-mean", "vdr-nobow", "vdr-nomask"]
    own = {"vdr-nomask": ["--no-vdr-cts-mask"], "vdr-nobow": ["--no-vdr-np-entry"], "vdr-mean": ["--vdr-pool", "mean"],
           "vdr-frozen": ["--freeze-final-layer"]}
    for name, extra in own.items():
        base = [f"{work}/heads/{name}" if w == f"{work}/heads/vdr" else w for w in train["vdr"]]
        assert [w for w in train[name] if w not in extra] == base and all(w in train[name] for w in extra), name
    evals = {flag(c, "-o")[0].rsplit("/", 1)[1]: c for c in mm if c[1] == "eval" and "--table" not in c}
    for name in own:
        assert flag(evals[f"{name}-k512.json"], "--dense-run") == [f"{work}/runs/vdr-k512.trec"]
        assert flag(evals[f"{name}-bow-k512.json"], "--dense-run") == [f"{work}/runs/vdr-bow-k512.trec"]
    assert flag(evals["vdr-ref-k512.json"], "--dense-run") == [] and evals["vdr-ref-k512.json"][2].endswith("vdr-k512.trec")
    tables = {flag(c, "-o")[0].rsplit("/", 1)[1]: flag(c, "--label") for c in mm if c[1:3] == ["eval", "--table"]}
    rows = ["VDR", "VDR − contrastive mask", "VDR − bag-of-words entry", "VDR, mean pooling", "VDR, frozen final layers"]
    assert tables == {"vdr-ablation.md": rows, "vdr-ablation-bow.md": [r.replace("VDR", "VDR^α") for r in rows]}
    (se,) = [c for c in commands(out) if c[:4] == ["python", "-m", "mmsparse.methods.joint", "se"]]
    assert len(se) == 4 + 10 + 2 and flag(se, "-o") == [f"{work}/eval/vdr-ablation-se.md"]


def _rows(path: Path) -> list[str]:
    """First-column labels of a markdown table (`eval --table`), header included."""
    return [r.split("|")[1].strip() for r in path.read_text().splitlines() if r.startswith("| ") and "---" not in r]


@pytest.mark.parametrize("example", sorted(PAPER))
def test_vdr_runs_with_the_papers_backbone(example, flickr8k_dir, tiny_blip, tiny_albef, tmp_path):
    """`make vdr` end to end on the CPU with the example's own backbone, tiny random weights and a tiny schedule
    (BLIP: the paper's image side, random init over the patches, two k and the D2S row; ALBEF: the words init
    over [CLS] and the patches, one k, no D2S row, and `make vdr-ablation` too), real Flickr8k images (10 test
    images, 50 captions): Table 2's rows, paired tests against the dense model trained alike, Fig. 7's clouds and
    the validation curve."""
    backbone = PAPER[example][0]
    blip = backbone == "blip"
    data = _coco_layout(flickr8k_dir, tmp_path) if blip else _flickr30k_layout(flickr8k_dir, tmp_path)[0]
    work = tmp_path / "work"
    flags = "--vocab-min-df 1 --vdr-train-k 4 --vdr-query-k 4 --vdr-doc-k 8" + ("" if blip else
                                                                              " --vdr-image-init words --vdr-image-cls")
    make(example, "vdr", *([] if blip else ["vdr-ablation"]), f"DATA={data}", f"WORK={work}",
         f"MODEL={tiny_blip if blip else tiny_albef}", *TINY, "VDR_EPOCHS=2", "VDR_BATCH_SIZE=10", "VDR_LR=1e-3",
         "VDR_FINAL_LR=1e-3", "VDR_BUFFER_ROWS=64", f"VDR_FLAGS={flags}",
         *(["VDR_KS=4 8"] if blip else ["VDR_KS=4", "VDR_REFERENCE="]), timeout=1800)
    cfg = json.loads((work / "heads" / "vdr" / "config.json").read_text())
    assert {k: v["kind"] for k, v in cfg["final_layers"].items()} == {"text": "bert", "image": "vit"}
    assert cfg["final_layers_tuned"] is True and cfg["training"]["config"]["epochs"] == 2
    assert cfg.get("image_skip_cls", False) is blip and (cfg.get("image_init") == "words") is not blip
    assert json.loads((work / "heads" / "vdr-dense" / "config.json").read_text())["method"] == "dense"
    assert json.loads((work / "heads" / "vdr-nobow" / "config.json").read_text())["training"]["config"][
        "vdr_np_entry"] is False
    ev = {p.name: json.loads(p.read_text()) for p in (work / "eval").glob("*.json")}
    for name in ("vdr-backbone.json", "vdr-dense.json", "vdr-k4.json", "vdr-bow-k4.json"):
        assert ev[name]["queries"] == 50, name
    assert "p_vs_dense_R@1" in ev["vdr-k4.json"] and "p_vs_dense_R@1" not in ev["vdr-dense.json"]
    labels = [f"dense ({backbone})", "dense trained alike", "VDR (k=4)", "VDR^α (k=4)"]
    if blip:
        assert ev["vdr-k8.json"]["FLOPs"] > ev["vdr-k4.json"]["FLOPs"] > 0          # documents keep k terms
        assert ev["d2s-eta1e-3.vs-vdr-dense.json"]["queries"] == 50
        labels += ["VDR (k=8)", "VDR^α (k=8)", "d2s-eta1e-3 sparse"]
    else:   # no D2S head: the plain encode never ran
        assert not (work / "dense" / backbone).exists() and not (work / "heads" / "d2s-eta1e-3").exists()
    assert _rows(work / "eval" / "vdr-table.md") == ["run", *labels]
    assert all(f"| {lab} |" in (work / "eval" / "vdr-se.md").read_text() for lab in labels)
    for png in ("vdr-clouds.png", "vdr-curve.png"):
        assert (work / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    tuned, orig = read_dense(work / "dense" / "vdr-dense" / "test-images.h5"), read_dense(
        work / "dense" / f"{backbone}-final" / "test-images.h5")
    assert list(tuned.ids) == list(orig.ids) and len(orig.ids) == 10
    if not blip:
        rows = ["VDR", "VDR − contrastive mask", "VDR − bag-of-words entry", "VDR, mean pooling", "VDR, frozen final layers"]
        assert _rows(work / "eval" / "vdr-ablation.md") == ["run", *rows]
        assert _rows(work / "eval" / "vdr-ablation-bow.md") == ["run", *(r.replace("VDR", "VDR^α") for r in rows)]
        frozen = json.loads((work / "heads" / "vdr-frozen" / "config.json").read_text())
        assert frozen["final_layers_tuned"] is False
        assert json.loads((work / "heads" / "vdr-mean" / "config.json").read_text())["pool"] == "mean"
        assert ev["vdr-mean-k4.json"]["queries"] == 50 and "p_vs_dense_R@1" in ev["vdr-mean-bow-k4.json"]


# -- GPU paths (skipped, with the reason shown, where there is no GPU) -------------------------

def _faiss_gpus() -> int:
    import faiss
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_flickr30k_albef_on_cuda_with_bf16_encode(flickr8k_dir, dual_encoder_dir, tmp_path):
    """The examples' GPU defaults: encode-dense --device cuda (pinned batches, bf16 autocast) and
    train-head --device cuda, on the small Karpathy dataset."""
    data, picked = _flickr30k_layout(flickr8k_dir, tmp_path)
    work = tmp_path / "work"
    tiny = [a for a in TINY if not a.startswith("DEVICE=")]
    p = make("flickr30k-albef", f"DATA={data}", f"WORK={work}", "BACKBONE=hf-dual", f"MODEL={dual_encoder_dir}",
             "DEVICE=cuda", "PRECISION=bf16", "WORKERS=2", *tiny)
    _check_run(work, p.stdout, 10, 50, [im["filename"].rsplit(".", 1)[0] for im in picked["test"][:3]])
    assert read_dense(work / "dense" / "hf-dual" / "test-images.h5").attrs["precision"] == "bf16"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_gpu_extra_faiss_matches_cpu(flickr8k_dir, dual_encoder_dir, tmp_path):
    """`pip install '.[gpu]'` (faiss-gpu), which the examples' READMEs point GPU users to: an exact
    inner-product search on the GPU returns the CPU's top 10 for real dense vectors. (mmsparse's
    index stage itself has no GPU path: this checks the extra, not an mmsparse option.)"""
    import faiss
    import numpy as np
    if _faiss_gpus() == 0:
        pytest.skip("faiss has no GPU support here (install the [gpu] extra: faiss-gpu)")
    out = mmsparse.encode_dense(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out=tmp_path / "d",
                                model=dual_encoder_dir, split=["test"], limit=200, device="cuda")
    im, cap = read_dense(out / "test-images.h5"), read_dense(out / "test-captions.h5")
    cpu = faiss.IndexFlatIP(im.vectors.shape[1])
    cpu.add(np.ascontiguousarray(im.vectors, dtype=np.float32))
    gpu = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, cpu)
    q = np.ascontiguousarray(cap.vectors, dtype=np.float32)
    d_cpu, i_cpu = cpu.search(q, 10)
    d_gpu, i_gpu = gpu.search(q, 10)
    np.testing.assert_allclose(d_gpu, d_cpu, atol=1e-4)
    assert (i_gpu[:, 0] == i_cpu[:, 0]).mean() > 0.99
