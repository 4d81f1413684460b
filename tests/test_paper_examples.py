"""examples/mscoco-blip and examples/flickr30k-albef (issue 19): `make -n` with the defaults prints the
D2S paper's settings, and both Makefiles run end to end on a small dataset in their layout (real
Flickr8k images: the official COCO 2017 caption-file pair, and a Karpathy JSON) with the hf-dual
backbone and the shared dual encoder, with tiny training settings. Their `joint` targets (the joint
paper's heads over the towers' final layers): `make -n` runs every stage with the authors' schedule,
and each runs end to end with tiny random weights of the example's own backbone (BLIP, ALBEF)."""

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
