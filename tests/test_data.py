"""Dataset readers: Karpathy (real Flickr8k JSON), COCO, image folder, captions files, Hugging Face
datasets (a DatasetDict saved with save_to_disk)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mmsparse.data import (CaptionRecord, SplitData, read_captions_file, read_coco, read_dataset, read_hf,
                           read_image_folder, read_karpathy)
from mmsparse.errors import InputError


def test_karpathy_flickr8k(flickr8k_dir):
    d = read_karpathy(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images")
    # 6000 train + 91 'restval' images (counted as train), 1000 val, 1000 test
    assert {k: len(v.images) for k, v in d.items()} == {"train": 6091, "val": 1000, "test": 1000}
    for sd in d.values():
        assert len(sd.captions) == 5 * len(sd.images)
        assert set(Counter(c.image_id for c in sd.captions).values()) == {5}
    t = d["test"]
    assert t.images[0].path.is_file() and t.images[0].id == t.images[0].path.stem
    c = t.captions[0]
    assert c.image_id == t.images[0].id and c.text and c.id.isdigit()
    small = t.limit(3)
    assert len(small.images) == 3 and len(small.captions) == 15
    assert len(small.qrels()) == 15


def test_karpathy_errors(tmp_path):
    p = tmp_path / "k.json"
    with pytest.raises(InputError, match="not found"):
        read_karpathy(p, tmp_path)
    p.write_text(json.dumps({"images": [{"filename": "a.jpg", "sentences": []}]}))
    with pytest.raises(InputError, match=r"images\[0\]: split: field missing"):
        read_karpathy(p, tmp_path)
    p.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "test", "sentences": [{"raw": "x"}]}]}))
    with pytest.raises(InputError, match="sentid: field missing"):
        read_karpathy(p, tmp_path)
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_karpathy(p, tmp_path)


def test_coco(tmp_path):
    p = tmp_path / "captions_val2014.json"
    p.write_text(json.dumps({
        "images": [{"id": 7, "file_name": "COCO_val2014_7.jpg"}, {"id": 9, "file_name": "COCO_val2014_9.jpg"}],
        "annotations": [{"id": 1, "image_id": 7, "caption": " a cat "}, {"id": 2, "image_id": 9, "caption": "a dog"}]}))
    d = read_coco(p, tmp_path)
    assert list(d) == ["val2014"]
    assert [r.id for r in d["val2014"].images] == ["COCO_val2014_7", "COCO_val2014_9"]
    assert d["val2014"].captions[0].text == "a cat" and d["val2014"].captions[1].image_id == "COCO_val2014_9"
    data, name, fmt = read_dataset(p, tmp_path)
    assert "val2014" in data and name == "captions_val2014" and fmt == "coco"
    p.write_text(json.dumps({"images": [], "annotations": [{"id": 1, "image_id": 3, "caption": "x"}]}))
    with pytest.raises(InputError, match="image_id"):
        read_coco(p, tmp_path)


def test_folder_and_captions(tmp_path):
    from PIL import Image
    (tmp_path / "imgs" / "sub").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "b.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "sub" / "a.jpg")
    (tmp_path / "imgs" / "notes.txt").write_text("x")
    d = read_image_folder(tmp_path / "imgs")
    assert [r.id for r in d["all"].images] == ["b", "sub/a"]
    assert read_dataset(tmp_path / "imgs")[0]["all"].images == d["all"].images
    assert read_dataset(tmp_path / "imgs")[2] == "folder"
    t = tmp_path / "q.txt"
    t.write_text("a dog\n\na cat\n")
    assert [(c.id, c.text) for c in read_captions_file(t)["all"].captions] == [("1", "a dog"), ("3", "a cat")]
    j = tmp_path / "q.jsonl"
    j.write_text('{"id": "q1", "text": "a dog", "image_id": "b", "split": "test"}\n{"caption": "x"}\n')
    d = read_dataset(j)[0]
    assert d["test"].captions[0].image_id == "b" and d["all"].captions[0].id == "2"
    j.write_text('{"id": "q1"}\n')
    with pytest.raises(InputError, match="text: field missing"):
        read_captions_file(j)



def test_empty_captions_dropped_with_their_ids():
    sd = SplitData(captions=[CaptionRecord("1", "a dog", "i"), CaptionRecord("2", " \t", "i"),
                             CaptionRecord("3", "", "j"), CaptionRecord("4", "x", "j")])
    kept, empty = sd.without_empty_captions()
    assert empty == ["2", "3"] and [c.id for c in kept.captions] == ["1", "4"]
    assert sd.without_empty_captions()[0] is not sd and kept.without_empty_captions() == (kept, [])


def test_read_hf_splits_rows_and_loader(flickr8k_dir, tmp_path):
    """A DatasetDict of real Flickr8k JPEG bytes: splits (validation -> val), caption ids, and the
    loader decoding the row's image exactly as the file decodes."""
    import datasets
    import numpy as np
    from PIL import Image

    k = json.loads((flickr8k_dir / "dataset_flickr8k.json").read_text())["images"][:3]
    img = [{"bytes": (flickr8k_dir / "images" / im["filename"]).read_bytes(), "path": im["filename"]} for im in k]
    feats = datasets.Features({"image": datasets.Image(), "caption": datasets.List(datasets.Value("string")),
                               "split": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"image": img, "caption": [[s["raw"] for s in im["sentences"][:2]] for im in k],
                                     "split": ["train", "validation", "train"]}, features=feats)
    datasets.disable_progress_bars()
    datasets.DatasetDict({"validation": ds.select([1]), "test": ds.select([0, 2])}).save_to_disk(str(tmp_path / "d"))
    d = read_hf(tmp_path / "d")
    assert list(d) == ["val", "test"]
    t = d["test"]
    assert [r.id for r in t.images] == ["0", "1"] and [r.row for r in t.images] == [0, 1]
    assert [c.id for c in t.captions] == ["0#0", "0#1", "1#0", "1#1"]
    assert t.captions[2].text == k[2]["sentences"][0]["raw"].strip() and t.captions[2].image_id == "1"
    got = np.asarray(t.loader(t.images[1]))
    want = np.asarray(Image.open(flickr8k_dir / "images" / k[2]["filename"]).convert("RGB"))
    assert got.shape == want.shape and (got == want).all()
    assert t.limit(1).loader is t.loader and len(t.limit(1).captions) == 2
    # rows assigned by a column; 'validation' values are read as 'val' too
    by_col = read_hf(tmp_path / "d", split_column="split")
    assert sorted(by_col) == ["train", "val"] and [r.row for r in by_col["train"].images] == [0, 1]
    with pytest.raises(InputError, match="split 'val' appears twice"):
        datasets.DatasetDict({"val": ds, "validation": ds}).save_to_disk(str(tmp_path / "e"))
        read_hf(tmp_path / "e")
    with pytest.raises(InputError, match=r"--image-column 'img': no such column; columns: image, caption, split"):
        read_hf(tmp_path / "d", image_column="img")
    with pytest.raises(InputError, match="not a file"):
        read_hf(flickr8k_dir / "dataset_flickr8k.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="cannot load as a Hugging Face dataset"):
        read_hf(tmp_path / "empty")
