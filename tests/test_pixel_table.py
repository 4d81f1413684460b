"""The image processor's lookup-table fast path (mmsparse/backbones/pixel_table.py): bit for bit the
processor's own pixel values, used only where the probe proves it, the processor elsewhere."""

import numpy as np
import pytest
import torch
from PIL import Image

from mmsparse.backbones.hf_dual import ImagePreprocessor
from mmsparse.backbones.pixel_table import build_table


def _images(flickr8k_dir, n=12):
    files = sorted((flickr8k_dir / "images").glob("*.jpg"))[:n]
    return [Image.open(f).convert("RGB") for f in files]


def _processor(dual_encoder_dir):
    from transformers import AutoProcessor
    return AutoProcessor.from_pretrained(dual_encoder_dir).image_processor


def test_real_images_bit_for_bit(flickr8k_dir, dual_encoder_dir):
    """Flickr8k's 224 x 224 images through the table equal the shared model's processor exactly;
    a grey image (converted to RGB first, as before) and a batch with another size fall back alike."""
    ip = _processor(dual_encoder_dir)
    pre = ImagePreprocessor(ip)
    ims = _images(flickr8k_dir)
    got = pre(ims)
    assert pre._table is not None, "the shared model's processor should get the fast path"
    assert got.dtype == torch.float32 and got.shape == (len(ims), 3, 224, 224) and got.is_contiguous()
    assert torch.equal(got, ip(images=ims, return_tensors="pt")["pixel_values"])
    grey = [ims[0].convert("L")]
    assert torch.equal(pre(grey), ip(images=[grey[0].convert("RGB")], return_tensors="pt")["pixel_values"])
    mixed = [ims[1], ims[2].resize((300, 260))]
    assert torch.equal(pre(mixed), ip(images=mixed, return_tensors="pt")["pixel_values"])


def test_table_is_the_processors_function(dual_encoder_dir):
    """Every value of every channel maps as the processor maps it (a random image, all 256 values)."""
    ip = _processor(dual_encoder_dir)
    (h, w), table = build_table(ip)
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    want = ip(images=[Image.fromarray(arr, "RGB")], return_tensors="np")["pixel_values"][0]
    np.testing.assert_array_equal(table[np.arange(3)[:, None, None], arr.transpose(2, 0, 1)], want)


@pytest.mark.parametrize("kw", [
    {"size": {"shortest_edge": 40}, "crop_size": {"height": 32, "width": 32}},  # resize, then crop: not identity
    {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}, "do_convert_rgb": True,
     "image_mean": [0.5, 0.5, 0.5]},
])
def test_no_table_unless_proven(kw):
    """A processor that resizes an image of its crop size gets no table (and its outputs stay its own);
    one that leaves it alone gets one."""
    from transformers import CLIPImageProcessor
    ip = CLIPImageProcessor(**kw)
    built = build_table(ip)
    assert (built is None) == (kw["size"]["shortest_edge"] != 32)
    rng = np.random.default_rng(2)
    ims = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "RGB") for _ in range(3)]
    assert torch.equal(ImagePreprocessor(ip)(ims), ip(images=ims, return_tensors="pt")["pixel_values"])
