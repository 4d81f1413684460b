"""encode-dense: the CLI and mmsparse.encode_dense end to end on real Flickr8k images (--limit),
DataLoader workers, broken images and empty captions (skip or --strict), Hugging Face datasets,
precision, resuming; the CUDA paths run only where a GPU is present."""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import mmsparse
from mmsparse.backbones import load_backbone
from mmsparse.backbones.encode import encode_images_file, image_batches
from mmsparse.data import read_image_folder, read_karpathy
from mmsparse.errors import InputError
from mmsparse.formats import read_dense, read_qrels
from mmsparse.progress import Reporter
from mmsparse.runtime import cpu_bf16

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")


class Logs(Reporter):
    """A Reporter that keeps the log lines and the task descriptions it was given."""

    def __init__(self):
        self.lines, self.tasks = [], []

    def task(self, description, total=None):
        self.tasks.append(description)
        return super().task(description, total)

    def log(self, message):
        self.lines.append(message)


@pytest.fixture
def image_dir(tmp_path):
    rng = np.random.default_rng(1)
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(10):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(d / f"im{i:02d}.png")
    return d


@pytest.fixture
def small_karpathy(flickr8k_dir, tmp_path):
    """A Karpathy JSON over 6 real Flickr8k test images copied to tmp/images (5 captions each)."""
    data = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text())
    ims = [im for im in data["images"] if im["split"] == "test"][:6]
    (tmp_path / "images").mkdir()
    for im in ims:
        shutil.copy(flickr8k_dir / "images" / im["filename"], tmp_path / "images" / im["filename"])
    ann = tmp_path / "dataset_small.json"
    ann.write_text(json.dumps({"dataset": "small", "images": ims}))
    return ann, tmp_path / "images", ims


def test_cli_real_flickr8k(run_cli, flickr8k_dir, dual_encoder_dir, tmp_path):
    out = tmp_path / "dense"
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", "-o", out,
                           "--model", dual_encoder_dir, "--split", "test", "--limit", "20", "--workers", "0",
                           "--batch-size", "16")
    assert code == 0, err
    assert "test images: 20 rows" in err and "images/s" in err and "test captions: 100 rows" in err
    im, cap = read_dense(out / "test-images.h5"), read_dense(out / "test-captions.h5")
    assert im.vectors.shape == (20, 512) and cap.vectors.shape == (100, 512)
    for c in (im, cap):
        assert c.attrs["backbone"] == "hf-dual" and c.attrs["model"] == str(dual_encoder_dir.resolve())
        assert c.attrs["dataset"] == "flickr8k" and c.attrs["split"] == "test" and c.attrs["normalized"]
        assert "precision" not in c.attrs  # fp32 files keep the attributes (and fingerprint) they had
        np.testing.assert_allclose(np.linalg.norm(c.vectors, axis=1), 1, atol=1e-5)
        assert str(dual_encoder_dir.resolve()) in c.attrs["inputs"]  # the model is a recorded input
    assert im.modality == "image" and cap.modality == "text" and len(cap.texts) == 100
    qrels = read_qrels(out / "test.qrels")
    assert len(qrels) == 100 and all(list(v)[0] in im.ids for v in qrels.values())
    assert cap.image_ids == [list(qrels[c])[0] for c in cap.ids]
    # a trained model ranks the right image above chance (20 candidates: chance mean rank 10.5)
    rank = (cap.vectors @ im.vectors.T > (cap.vectors * im.vectors[[im.ids.index(i) for i in cap.image_ids]])
            .sum(1, keepdims=True)).sum(1) + 1
    assert rank.mean() < 8


def test_cli_errors(run_cli, flickr8k_dir, tmp_path):
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                           "-o", tmp_path, "--split", "nope")
    assert code == 2 and "split(s) nope not found" in err
    code, _, err = run_cli("encode-dense", tmp_path / "missing.json", tmp_path, "-o", tmp_path)
    assert code == 2 and "not found" in err
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                           "-o", tmp_path / "o", "--precision", "fp16", "--device", "cpu")
    assert code == 2 and "--precision fp16: float16 autocast runs on CUDA only" in err and not (tmp_path / "o").exists()
    if cpu_bf16() is None:   # emulated bf16 is refused; test_bf16_on_cpu runs bf16
        code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                               "-o", tmp_path / "o", "--precision", "bf16", "--device", "cpu")
        assert code == 2 and "has no bf16 matrix unit (AMX or AVX512-BF16)" in err and not (tmp_path / "o").exists()
    code, _, err = run_cli("encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images",
                           "-o", tmp_path / "o", "--precision", "fp8")
    assert code == 2 and "--precision 'fp8'" in err


def test_bf16_on_cpu(run_cli, small_karpathy, dual_encoder_dir, tmp_path, monkeypatch):
    """encode-dense --precision bf16 on the CPU: allowed where the CPU has a bf16 matrix unit, the
    vectors within bf16 rounding of fp32's and the precision recorded. Where the CPU has none the
    test declares one (oneDNN then emulates bf16: slower, the same rounding), so it runs everywhere."""
    from mmsparse import runtime

    if cpu_bf16() is None:
        monkeypatch.setattr(runtime, "cpu_bf16", lambda: "amx_bf16")
    ann, images, _ = small_karpathy
    base = (ann, images, "--model", dual_encoder_dir, "--split", "test", "--limit", "4", "--workers", "0",
            "--device", "cpu")
    code, _, err = run_cli("encode-dense", *base, "-o", tmp_path / "fp32")
    assert code == 0, err
    code, _, err = run_cli("encode-dense", *base, "-o", tmp_path / "bf16", "--precision", "bf16")
    assert code == 0, err
    assert "; bf16, " in err  # the load line says what it computes in
    for name in ("test-images.h5", "test-captions.h5"):
        ref, v = read_dense(tmp_path / "fp32" / name), read_dense(tmp_path / "bf16" / name)
        assert v.attrs["precision"] == "bf16" and v.vectors.dtype == np.float32 and v.ids == ref.ids
        cos = (v.vectors * ref.vectors).sum(1)
        assert cos.min() > 0.99 and not np.array_equal(v.vectors, ref.vectors), (name, cos.min())


@pytest.mark.slow  # two real encodes: ~25 s
def test_workers_give_byte_identical_vectors(flickr8k_dir, dual_encoder_dir, tmp_path):
    """64 real images through the DataLoader with 2 worker processes and in this process."""
    recs = read_karpathy(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")["test"].images[:64]
    bb = load_backbone("hf-dual", dual_encoder_dir, "cpu")
    attrs = {"modality": "image", "dataset": "t", "split": "test"}
    one = encode_images_file(bb, recs, tmp_path / "w0.h5", attrs, batch_size=32, workers=0)
    two = encode_images_file(bb, recs, tmp_path / "w2.h5", attrs, batch_size=32, workers=2)
    assert one.rows == two.rows == 64 and not one.skipped
    with h5py.File(tmp_path / "w0.h5") as a, h5py.File(tmp_path / "w2.h5") as b:
        assert a["ids"][()].tolist() == b["ids"][()].tolist()
        assert a["vectors"][()].tobytes() == b["vectors"][()].tobytes()
        first = a["vectors"][:32]
    # and both are what the backbone gives for the same batch, decoded here without a DataLoader
    direct = bb.encode_images([Image.open(r.path) for r in recs[:32]])
    assert direct.tobytes() == first.tobytes()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_jpeg_and_empty_caption_skipped_with_warning(run_cli, small_karpathy, tiny_clip, tmp_path):
    ann, images, ims = small_karpathy
    _truncate(images / ims[2]["filename"])
    data = json.loads(ann.read_text())
    data["images"][4]["sentences"][1]["raw"] = "  "
    empty_id = str(data["images"][4]["sentences"][1]["sentid"])
    ann.write_text(json.dumps(data))
    out = tmp_path / "o"
    code, _, err = run_cli("encode-dense", ann, images, "-o", out, "--backbone", "clip", "--model", tiny_clip,
                           "--workers", "1", "--batch-size", "4")
    assert code == 0, err
    assert "skipped 1 unreadable image(s)" in err and "image file is truncated" in err
    assert f"skipped 1 empty caption(s) (e.g. '{empty_id}')" in err and "--strict" in err
    im, cap = read_dense(out / "test-images.h5"), read_dense(out / "test-captions.h5")
    bad_img = ims[2]["filename"].rsplit(".", 1)[0]
    assert len(im.ids) == 5 and bad_img not in im.ids
    assert len(cap.ids) == 6 * 5 - 5 - 1 and empty_id not in cap.ids and bad_img not in cap.image_ids
    qrels = read_qrels(out / "test.qrels")
    assert set(qrels) == set(cap.ids)
    with h5py.File(out / "test-images.h5") as f:  # the skipped image is listed in the file
        assert [s.decode().split("\t")[0] for s in f["skipped"][()]] == [bad_img]


def test_strict_fails_on_truncated_jpeg_or_empty_caption(run_cli, small_karpathy, tiny_clip, tmp_path):
    ann, images, ims = small_karpathy
    args = ["--backbone", "clip", "--model", tiny_clip, "--workers", "0", "--strict"]
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "ok", *args)
    assert code == 0, err  # a clean copy passes --strict
    _truncate(images / ims[3]["filename"])
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "o1", *args)
    assert code == 2 and f"{ims[3]['filename']}: cannot read image" in err and "truncated" in err, err
    assert not (tmp_path / "o1" / "test-images.h5").exists()
    data = json.loads(ann.read_text())
    data["images"][0]["sentences"][3]["raw"] = ""
    ann.write_text(json.dumps(data))
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "o2", *args)
    sid = data["images"][0]["sentences"][3]["sentid"]
    assert code == 2 and f"caption '{sid}' is empty" in err and "loaded" not in err, err  # before the model
    assert not (tmp_path / "o2").exists()


def test_broken_png_folder_and_rerun(run_cli, tiny_clip, image_dir, tmp_path):
    (image_dir / "im03.png").write_bytes(b"not an image")
    args = ["--backbone", "clip", "--model", tiny_clip, "--batch-size", "4", "--patch-states", "--pre-projection"]
    code, _, err = run_cli("encode-dense", image_dir, "-o", tmp_path / "o", "--workers", "1", *args)
    assert code == 0, err
    assert "skipped 1 unreadable image" in err
    c = read_dense(tmp_path / "o" / "all-images.h5")
    assert len(c.ids) == 9 and "im03" not in c.ids
    # the stored vectors are what the backbone gives for the same images (worker path == direct path)
    bb = load_backbone("clip", tiny_clip, "cpu")
    imgs = [Image.open(image_dir / f"{i}.png") for i in c.ids[:4]]
    np.testing.assert_allclose(c.vectors[:4], bb.encode_images(imgs), atol=1e-5)
    with h5py.File(tmp_path / "o" / "all-images.h5") as f:
        assert f["patch_states"].shape == (9, 17, 32) and f["patch_states"].dtype == np.float16
        assert f["pre_projection"].shape == (9, 32) and f["image_proj_weight"].shape == (24, 32)
    # a rerun with the same settings (any number of workers) keeps the finished file, and marks it
    # checked (mtime now) so Make does not rerun every later stage on each call
    out = tmp_path / "o" / "all-images.h5"
    os.utime(out, (1e9, 1e9))
    code, _, err = run_cli("encode-dense", image_dir, "-o", tmp_path / "o", "--workers", "0", *args)
    assert code == 0 and "already encoded" in err and "skipped 1" in err, err
    assert out.stat().st_mtime > 1e9 + 1 and len(read_dense(out).ids) == 9


def test_interrupted_encode_resumes_to_same_file(tiny_clip, image_dir, tmp_path):
    bb = load_backbone("clip", tiny_clip, "cpu")
    recs = read_image_folder(image_dir)["all"].images
    attrs = {"modality": "image", "dataset": "t", "split": "all"}
    rep = Logs()
    kw = dict(batch_size=2, workers=0, shard_rows=3, pre_projection=True, progress=rep)
    full = encode_images_file(bb, recs, tmp_path / "full.h5", attrs, **kw)
    assert full.rows == 10 and full.encoded == 10 and rep.tasks == ["full.h5"]
    good = (image_dir / "im07.png").read_bytes()
    (image_dir / "im07.png").write_bytes(b"broken")  # the run dies in shard 2 (rows 6-8)
    with pytest.raises(InputError, match="im07.png"):
        encode_images_file(bb, recs, tmp_path / "r.h5", attrs, strict=True, **kw)
    assert not (tmp_path / "r.h5").exists()
    assert len(list((tmp_path / "r.h5.partial").glob("shard-*.h5"))) == 2
    (image_dir / "im07.png").write_bytes(good)
    res = encode_images_file(bb, recs, tmp_path / "r.h5", attrs, **kw)
    assert res.encoded == 4 and any("resuming r.h5.partial: 2 finished shard(s)" in m for m in rep.lines)
    assert not (tmp_path / "r.h5.partial").exists()
    a, b = read_dense(tmp_path / "full.h5"), read_dense(tmp_path / "r.h5")
    assert a.ids == b.ids
    np.testing.assert_array_equal(a.vectors, b.vectors)
    with h5py.File(tmp_path / "full.h5") as fa, h5py.File(tmp_path / "r.h5") as fb:
        np.testing.assert_array_equal(fa["pre_projection"][()], fb["pre_projection"][()])
    again = encode_images_file(bb, recs, tmp_path / "r.h5", attrs, **kw)
    assert again.encoded == 0 and rep.tasks[-1] == "r.h5 (up to date)"
    # two workers decoding ahead across the 4 shards (batches never span one) write the same bytes
    kw["workers"] = 2
    encode_images_file(bb, recs, tmp_path / "w2.h5", attrs, **kw)
    assert read_dense(tmp_path / "w2.h5").vectors.tobytes() == a.vectors.tobytes()


def test_captions_file_with_token_states(run_cli, tiny_clip, tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "q1", "text": "a dog runs"}\n{"id": "q2", "text": "the cat on the grass"}\n'
                 '{"id": "q3", "text": "a cat"}\n')
    code, _, err = run_cli("encode-dense", q, "-o", tmp_path / "o", "--backbone", "clip", "--model", tiny_clip,
                           "--token-states", "--pre-projection", "--batch-size", "2", "--dtype", "float16")
    assert code == 0, err
    assert not (tmp_path / "o" / "all-images.h5").exists() and not (tmp_path / "o" / "all.qrels").exists()
    c = read_dense(tmp_path / "o" / "all-captions.h5")
    assert c.ids == ["q1", "q2", "q3"] and c.texts[1] == "the cat on the grass"
    with h5py.File(tmp_path / "o" / "all-captions.h5") as f:
        assert f["vectors"].dtype == np.float16
        L = int(f.attrs["max_length"])
        assert f["token_states"].shape == (3, L, 32) and f["token_mask"].shape == (3, L)
        assert f["token_mask"][()].sum(1).tolist() == [5, 7, 4]  # [CLS] words [SEP]
        assert f["token_ids"][0, :5].tolist() == [2, 5, 6, 8, 3] and f["text_proj_weight"].shape == (24, 32)
        assert "image_proj_weight" not in f


def test_coco_file_split_renamed(run_cli, tiny_clip, small_karpathy, tmp_path):
    _, images, ims = small_karpathy
    ann = tmp_path / "captions_val2017.json"
    ann.write_text(json.dumps({
        "images": [{"id": n, "file_name": im["filename"]} for n, im in enumerate(ims[:3])],
        "annotations": [{"id": 10 * n + k, "image_id": n, "caption": s["raw"]}
                        for n, im in enumerate(ims[:3]) for k, s in enumerate(im["sentences"][:2])]}))
    base = ["--backbone", "clip", "--model", tiny_clip, "--workers", "0"]
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "a", *base)
    assert code == 0, err
    assert {p.name for p in (tmp_path / "a").glob("*.h5")} == {"val2017-images.h5", "val2017-captions.h5"}
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "b", "--split", "test", *base)
    assert code == 0, err
    im = read_dense(tmp_path / "b" / "test-images.h5")
    assert im.attrs["split"] == "test" and len(im.ids) == 3 and len(read_qrels(tmp_path / "b" / "test.qrels")) == 6
    assert (read_dense(tmp_path / "a" / "val2017-images.h5").vectors.tobytes() == im.vectors.tobytes())
    code, _, err = run_cli("encode-dense", ann, images, "-o", tmp_path / "c", "--split", "x", "--split", "y", *base)
    assert code == 2 and "split(s) x, y not found" in err and "which a single --split renames" in err


# -- Hugging Face datasets --------------------------------------------------------------------

@pytest.fixture
def hf_dir(small_karpathy, tmp_path):
    """The 6 real images of small_karpathy as a DatasetDict saved with save_to_disk: test (4 rows,
    image bytes + a list of 5 captions) and validation (2 rows)."""
    import datasets
    _, images, ims = small_karpathy
    feats = datasets.Features({"image": datasets.Image(), "caption": datasets.List(datasets.Value("string")),
                               "filename": datasets.Value("string")})

    def part(rows):
        return datasets.Dataset.from_dict(
            {"image": [{"bytes": (images / im["filename"]).read_bytes(), "path": im["filename"]} for im in rows],
             "caption": [[s["raw"] for s in im["sentences"]] for im in rows],
             "filename": [im["filename"] for im in rows]}, features=feats)

    d = tmp_path / "hf"
    datasets.disable_progress_bars()
    datasets.DatasetDict({"test": part(ims[:4]), "validation": part(ims[4:])}).save_to_disk(str(d))
    return d


def test_hf_dataset_directory_matches_files(hf_dir, small_karpathy, tiny_clip, tmp_path):
    ann, images, ims = small_karpathy
    rep = Logs()
    out = mmsparse.encode_dense(hf_dir, out=tmp_path / "hf-out", format="hf", backbone="clip", model=tiny_clip,
                                split=["test", "val"], workers=2, batch_size=3, progress=rep)
    assert out == tmp_path / "hf-out"
    assert any(m.startswith("test images: 4 rows") for m in rep.lines)
    im, cap = read_dense(out / "test-images.h5"), read_dense(out / "test-captions.h5")
    assert im.ids == ["0", "1", "2", "3"] and cap.ids[:2] == ["0#0", "0#1"] and len(cap.ids) == 20
    assert cap.texts[:5] == [s["raw"] for s in ims[0]["sentences"]]
    assert read_dense(out / "val-images.h5").ids == ["0", "1"]  # 'validation' is read as 'val'
    assert read_qrels(out / "test.qrels")["3#4"] == {"3": 1}
    # the same images as files (Karpathy JSON) give the same bytes
    ref = mmsparse.encode_dense(ann, images, out=tmp_path / "ref", backbone="clip", model=tiny_clip,
                                split=["test"], workers=0, batch_size=3, limit=4)
    assert read_dense(ref / "test-images.h5").vectors.tobytes() == im.vectors.tobytes()
    assert read_dense(ref / "test-captions.h5").vectors.tobytes() == cap.vectors.tobytes()
    inputs = json.loads(im.attrs["inputs"])
    assert {r["kind"] for r in inputs} >= {"model"} and any(r["path"] == str(hf_dir.resolve()) for r in inputs)


def test_hf_id_column_split_column_and_errors(run_cli, hf_dir, tiny_clip, tmp_path):
    import datasets
    t = datasets.load_from_disk(str(hf_dir))["test"]
    # one row per image-caption pair, splits in a column, ids in a column
    rows = {"image": [], "caption": [], "filename": [], "split": []}
    for n, r in enumerate(t.cast_column("image", datasets.Image(decode=False))):
        for c in r["caption"][:2]:
            rows["image"].append(r["image"])
            rows["caption"].append(c)
            rows["filename"].append(r["filename"])
            rows["split"].append("train" if n < 3 else "test")
    pairs = tmp_path / "pairs"
    datasets.Dataset.from_dict(rows, features=datasets.Features(
        {"image": datasets.Image(), "caption": datasets.Value("string"), "filename": datasets.Value("string"),
         "split": datasets.Value("string")})).save_to_disk(str(pairs))
    base = ["--format", "hf", "--backbone", "clip", "--model", tiny_clip, "--workers", "0"]
    code, _, err = run_cli("encode-dense", pairs, "-o", tmp_path / "o", *base, "--id-column", "filename",
                           "--split-column", "split", "--split", "train", "--split", "test")
    assert code == 0, err
    tr, cap = read_dense(tmp_path / "o" / "train-images.h5"), read_dense(tmp_path / "o" / "train-captions.h5")
    assert tr.ids == t["filename"][:3] and len(cap.ids) == 6 and cap.ids[1] == f"{t['filename'][0]}#1"
    assert read_dense(tmp_path / "o" / "test-images.h5").ids == [t["filename"][3]]
    code, _, err = run_cli("encode-dense", hf_dir, "-o", tmp_path / "e", *base, "--caption-column", "text")
    assert code == 2 and "--caption-column 'text': no such column; columns: image, caption, filename" in err
    assert not (tmp_path / "e").exists()


def test_hf_hub_id_offline_is_one_clear_line(run_cli, tiny_clip, tmp_path, monkeypatch):
    base = ["--format", "hf", "--backbone", "clip", "--model", tiny_clip, "-o", tmp_path / "o"]
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, _, err = run_cli("encode-dense", "someone/no-such-dataset", *base)
    assert code == 2, err
    errs = [ln for ln in err.splitlines() if ln.strip()]
    assert len(errs) == 1 and "someone/no-such-dataset: not a local dataset directory, and the Hugging Face Hub " \
        "cannot be reached" in errs[0] and "save_to_disk(DIR)" in errs[0]
    # not flagged offline but no connection (a closed local port as the Hub): the same line, no retries
    for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    code, _, err = run_cli("encode-dense", "someone/no-such-dataset", *base)
    assert code == 2 and "Hub cannot be reached (127.0.0.1:9:" in err and len(err.strip().splitlines()) == 1, err


# -- CUDA (skipped, with the reason shown, where there is no GPU) ------------------------------

@CUDA
def test_cuda_pinned_batches_and_autocast(flickr8k_dir, dual_encoder_dir, tmp_path):
    recs = read_karpathy(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")["test"].images[:64]
    bb = load_backbone("hf-dual", dual_encoder_dir, "cuda")
    ids, pv, bad = next(iter(image_batches(bb, recs, 16, 2)))
    assert pv.is_pinned() and len(ids) == 16 and not bad
    attrs = {"modality": "image", "dataset": "t", "split": "test"}
    ref = read_dense(encode_images_file(bb, recs, tmp_path / "fp32.h5", attrs, batch_size=32).path).vectors
    cpu = load_backbone("hf-dual", dual_encoder_dir, "cpu")
    np.testing.assert_allclose(ref, read_dense(encode_images_file(cpu, recs, tmp_path / "cpu.h5", attrs,
                                                                  batch_size=32, workers=0).path).vectors, atol=2e-3)
    for p in ("bf16", "fp16"):
        if p == "bf16" and not torch.cuda.is_bf16_supported():
            continue
        r = encode_images_file(bb, recs, tmp_path / f"{p}.h5", attrs, batch_size=32, precision=p)
        v = read_dense(r.path)
        assert v.attrs["precision"] == p and v.vectors.dtype == np.float32
        cos = (v.vectors * ref).sum(1)
        assert cos.min() > 0.99, (p, cos.min())
