"""A large image collection from real pixels: augmented views of a dataset's images, encoded by
the real dual encoder (issue 17). Head-independent; the sparse collections are made from it by
`mmsparse sparsify` with the head under test.

    python -m mmsparse.bench.views KARPATHY_JSON IMAGE_ROOT -o VIEWS_DIR [--views 122000]
        [--exclude-split test] [--seed 0]

Views. The images of every split (8,091 for Flickr8k), or of every split but `--exclude-split`
(so views of the query split's images cannot become near-duplicates of the relevant documents),
are put in a seeded random order and cut into shards of `shard_images` images. Each image gets `views // n_images` views (the first
`views % n_images` images of that order one more). A view is, independently:
  - single (probability 1 - collage): a random resized crop (area fraction U(0.25, 1), aspect
    ratio log-uniform in [3/4, 4/3]; the torchvision RandomResizedCrop recipe), then
  - collage (probability `collage`): two images side by side or one above the other (50/50),
    the split at U(0.35, 0.65) of the canvas; each part is a random resized crop (area U(0.3, 1))
    of its image with the part's aspect ratio; the second image is drawn uniformly from the
    other images of the same shard (so no extra decode), giving a new scene;
  each then resized to 192 px on its shorter side, flipped left-right with probability 1/2, and
  colour-jittered (brightness, contrast and saturation factors U(0.6, 1.4), hue shift U(-0.05,
  0.05) of the circle), and finally encoded through the backbone's own image preprocessing
  (`Backbone.preprocess_images`) and `encode_pixels`, exactly like an original image.
Every random draw of shard s comes from numpy default_rng([seed, s]), so a shard's views are a
function of (dataset, seed, s) alone.

Cache (resumable): VIEWS_DIR/shards/shard-NNNNN.h5, one dense HDF5 per shard, written
atomically; a run started again skips the shards that exist (and checks their settings in
VIEWS_DIR/settings.json, where the model is named by its content fingerprint,
provenance.model_fingerprint: after a model changed in place the cache is refused, not reused).
When all shards exist they are merged into VIEWS_DIR/views.h5: a dense
HDF5 (modality image, dataset "<dataset>-views") with ids "<image id>#v<j>" (single) or
"<image id>+<image id>#c<j>" (collage; with a seed s != 0 "#s<s>v<j>" and "#s<s>c<j>"), plus the extra dataset `sources` [N, 2] int32: the
dataset-order index of the view's image(s) (second = -1 for single views). The dataset order is
that of `all_images` (every split) whether or not a split is excluded, so the `sources` of
several view sets made with different seeds or exclusions index the same images.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

SIDE = 192  # short side of a view before the backbone's own preprocessing


def all_images(karpathy_json: str | Path, image_root: str | Path) -> list:
    """ImageRecords of every split of a Karpathy JSON, split by split (the dataset order of `sources`)."""
    return [im for _, im in _split_images(karpathy_json, image_root)]


def _split_images(karpathy_json, image_root) -> list[tuple[str, object]]:
    from ..data.karpathy import read_karpathy

    splits = read_karpathy(karpathy_json, image_root)
    return [(name, im) for name, sd in splits.items() for im in sd.images]


def _rrc_box(rng, w: int, h: int, area: tuple[float, float], ratio: tuple[float, float] | float):
    """A random resized crop box (left, top, right, bottom) of a w x h image.

    area: range of the crop's area as a fraction of the image; ratio: range of width/height,
    log-uniform, or one fixed ratio. Falls back to the largest centred box of the ratio.
    """
    fixed = not isinstance(ratio, tuple)
    for _ in range(10):
        a = rng.uniform(*area) * w * h
        r = ratio if fixed else math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(a * r))), int(round(math.sqrt(a / r)))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            return x, y, x + cw, y + ch
    r = ratio if fixed else 1.0
    cw, ch = (w, max(1, int(w / r))) if w / h < r else (max(1, int(h * r)), h)
    x, y = (w - cw) // 2, (h - ch) // 2
    return x, y, x + cw, y + ch


def _short_side(im, side: int = SIDE):
    from PIL import Image

    w, h = im.size
    s = side / min(w, h)
    return im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)


def _jitter(rng, im):
    """Flip (p = 1/2), brightness/contrast/saturation U(0.6, 1.4), hue shift U(-0.05, 0.05)."""
    from PIL import Image, ImageEnhance

    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    b, c, s, hue = rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(-0.05, 0.05)
    im = ImageEnhance.Brightness(im).enhance(b)
    im = ImageEnhance.Contrast(im).enhance(c)
    im = ImageEnhance.Color(im).enhance(s)
    hsv = np.array(im.convert("HSV"))
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(round(hue * 255))) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def single_view(rng, im):
    """One augmented view of PIL image `im` (see module docstring)."""
    box = _rrc_box(rng, *im.size, area=(0.25, 1.0), ratio=(3 / 4, 4 / 3))
    return _jitter(rng, _short_side(im.crop(box)))


def collage_view(rng, a, b):
    """A two-image collage of PIL images a and b (see module docstring)."""
    from PIL import Image

    W = H = SIDE
    cut = rng.uniform(0.35, 0.65)
    canvas = Image.new("RGB", (W, H))
    if rng.random() < 0.5:  # side by side
        w1 = int(round(W * cut))
        parts = [((0, 0), (w1, H), a), ((w1, 0), (W - w1, H), b)]
    else:  # one above the other
        h1 = int(round(H * cut))
        parts = [((0, 0), (W, h1), a), ((0, h1), (W, H - h1), b)]
    for (x, y), (pw, ph), im in parts:
        box = _rrc_box(rng, *im.size, area=(0.3, 1.0), ratio=pw / ph)
        canvas.paste(im.crop(box).resize((pw, ph), Image.BILINEAR), (x, y))
    return _jitter(rng, canvas)


def shard_plan(n_images: int, n_views: int, shard_images: int, seed: int) -> list[np.ndarray]:
    """The images (dataset-order indices) of each shard: a seeded permutation cut in blocks."""
    perm = np.random.default_rng([seed, 1 << 20]).permutation(n_images)
    return [perm[s:s + shard_images] for s in range(0, n_images, shard_images)]


def views_of_shard(records: list, shard: int, images: np.ndarray, counts: np.ndarray, seed: int,
                   collage: float):
    """(ids, PIL views, sources [n, 2] int32) of one shard; deterministic in (seed, shard).

    Ids: "<image>#v<j>", "<a>+<b>#c<j>"; with seed != 0 "#s<seed>v<j>", "#s<seed>c<j>", so view
    sets of different seeds can share a collection without duplicate ids."""
    tag = f"s{seed}" if seed else ""
    from ..backbones.encode import load_image

    rng = np.random.default_rng([seed, shard])
    pics = [load_image(records[i].path) for i in images]
    ids, views, src = [], [], []
    for j, (i, c) in enumerate(zip(images, counts)):
        for v in range(int(c)):
            if len(images) > 1 and rng.random() < collage:
                o = int(rng.integers(0, len(images) - 1))
                o += o >= j  # uniform over the shard's other images
                ids.append(f"{records[i].id}+{records[images[o]].id}#{tag}c{v}")
                views.append(collage_view(rng, pics[j], pics[o]))
                src.append((int(i), int(images[o])))
            else:
                ids.append(f"{records[i].id}#{tag}v{v}")
                views.append(single_view(rng, pics[j]))
                src.append((int(i), -1))
    return ids, views, np.asarray(src, dtype=np.int32).reshape(-1, 2)


def _shard_worker(args):
    records, shard, images, counts, seed, collage, preprocess = args
    ids, views, src = views_of_shard(records, shard, images, counts, seed, collage)
    return shard, ids, preprocess(views), src


def encode_views(karpathy_json: str | Path, image_root: str | Path, out: str | Path, views: int = 122_000,
                 backbone: str = "hf-dual", model: str | Path | None = None, seed: int = 0,
                 collage: float = 0.2, shard_images: int = 64, batch: int = 128, threads: int = 2,
                 dataset: str = "flickr8k", limit_images: int = 0, exclude_splits: tuple[str, ...] = (),
                 log=print) -> Path:
    """Encode `views` augmented views of the images of KARPATHY_JSON into OUT/views.h5.

    exclude_splits: splits whose images get no view and are no collage partner (e.g. ("test",):
    the query split's images, whose views would be near-duplicates of the relevant documents).

    Resumable (see module docstring); returns the path of views.h5. Vectors: [views, d] float32,
    L2-normalised by the backbone. Preprocessing (decode, augment, the backbone's image
    processor) runs in one worker process, one shard ahead of the encoder. limit_images: use
    only the first N images of the JSON (0 = all; small test collections).
    """
    import multiprocessing as mp

    import torch

    from ..backbones import load_backbone
    from ..formats.dense import DenseWriter
    from ..provenance import model_fingerprint
    from ..settings import dual_encoder_dir

    out = Path(out)
    sdir = out / "shards"
    sdir.mkdir(parents=True, exist_ok=True)
    split_recs = _split_images(karpathy_json, image_root)
    if limit_images:
        split_recs = split_recs[:limit_images]
    records = [im for _, im in split_recs]
    unknown = set(exclude_splits) - {sp for sp, _ in split_recs}
    if unknown:
        raise SystemExit(f"{karpathy_json}: split: no image of split {sorted(unknown)[0]!r} to exclude; "
                         f"the splits are {sorted({sp for sp, _ in split_recs})}")
    pool = np.array([i for i, (sp, _) in enumerate(split_recs) if sp not in set(exclude_splits)], dtype=np.int64)
    n = len(pool)
    model = str(model or dual_encoder_dir())
    # the model by what it is: after a model changed in place its old views must not come back
    fingerprint = model_fingerprint(model)
    settings = {"dataset": dataset, "images": n, "views": views, "seed": seed, "collage": collage,
                "shard_images": shard_images, "side": SIDE, "backbone": backbone, "model_fingerprint": fingerprint,
                "recipe": "mmsparse.bench.views v1"}
    if exclude_splits:  # (absent otherwise: the settings of caches made before the option still match)
        settings["exclude_splits"] = sorted(exclude_splits)
    sfile = out / "settings.json"
    old = json.loads(sfile.read_text()) if sfile.is_file() else settings
    if old != settings and not _unchanged_since(old, settings, model, out):
        raise SystemExit(f"{sfile}: cached views were made with other settings; remove {out} or match them:\n"
                         f"{sfile.read_text()}")
    if old != settings:
        log(f"views: {out} was cached before model fingerprints; kept, as no file of {model} is newer than it")
    else:
        sfile.write_text(json.dumps(settings, indent=1))
    final = out / "views.h5"
    if final.is_file():
        return final
    torch.set_num_threads(threads)
    bb = load_backbone(backbone, model, "cpu")
    base_count = np.zeros(len(records), dtype=np.int64)  # views per image, by dataset index
    base_count[pool] = views // n
    plan = [pool[s] for s in shard_plan(n, views, shard_images, seed)]
    order = np.concatenate(plan)
    base_count[order[:views % n]] += 1
    todo = [s for s in range(len(plan)) if not (sdir / f"shard-{s:05d}.h5").is_file()]
    log(f"views: {n} images{' (not ' + ', '.join(sorted(exclude_splits)) + ')' if exclude_splits else ''}, {views} views, {len(plan)} shards, {len(plan) - len(todo)} cached")
    attrs = {"modality": "image", "backbone": backbone, "model": bb.model, "model_fingerprint": fingerprint,
             "dataset": f"{dataset}-views",
             "split": "views", "normalized": bool(bb.normalized), "view_seed": seed, "view_collage": collage}
    t0, done = time.time(), 0
    jobs = ((records, s, plan[s], base_count[plan[s]], seed, collage, bb.image_preprocessor) for s in todo)
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        for s, ids, pix, src in pool.imap(_shard_worker, jobs):
            vec = np.concatenate([bb.encode_pixels(pix[i:i + batch])["vectors"] for i in range(0, len(ids), batch)])
            path = sdir / f"shard-{s:05d}.h5"
            with DenseWriter(path, vec.shape[1], attrs) as w:
                w.append(ids, vec)
                w.append_extra("sources", src)
            done += len(ids)
            el = time.time() - t0
            log(f"shard {s + 1}/{len(plan)}: {len(ids)} views; {done / el:.1f} views/s this run")
    # merge
    from ..formats.dense import read_dense
    import h5py

    with DenseWriter(final, bb.dim, {**attrs, "view_settings": json.dumps(settings)}) as w:
        for s in range(len(plan)):
            p = sdir / f"shard-{s:05d}.h5"
            d = read_dense(p)
            with h5py.File(p, "r") as f:
                src = f["sources"][()]
            w.append(d.ids, d.vectors)
            w.append_extra("sources", src)
    log(f"views: wrote {final}")
    return final


def _unchanged_since(old: dict, settings: dict, model: str, out: Path) -> bool:
    """Whether a cache made before model fingerprints (its settings name the model's directory,
    `model`) still holds views of this model: the other settings match, and no file of the model
    is newer than the oldest cached file (the model was not changed in place since)."""
    if "model_fingerprint" in old or old.get("model") != Path(model).name:
        return False
    rest = {k: v for k, v in settings.items() if k != "model_fingerprint"}
    if {k: v for k, v in old.items() if k != "model"} != rest:
        return False
    cached = [p.stat().st_mtime_ns for p in [*(out / "shards").glob("shard-*.h5"), out / "views.h5"] if p.is_file()]
    mp = Path(model)
    if not mp.is_dir():  # a hub id: no way to tell
        return False
    made = [f.stat().st_mtime_ns for f in mp.rglob("*") if f.is_file()]
    return bool(cached) and max(made, default=0) < min(cached)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mmsparse.bench.views", description=__doc__.split("\n\n")[0])
    p.add_argument("karpathy_json", type=Path)
    p.add_argument("image_root", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True, help="views directory (cache + views.h5)")
    p.add_argument("--views", type=int, default=122_000, help="number of views (all images together)")
    p.add_argument("--backbone", default="hf-dual")
    p.add_argument("--model", default=None, help="backbone model (default: mmsparse.settings.dual_encoder_dir())")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--collage", type=float, default=0.2, help="share of two-image collage views")
    p.add_argument("--shard-images", type=int, default=64, help="images per shard (the resume unit)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the encoder")
    p.add_argument("--dataset", default="flickr8k")
    p.add_argument("--limit-images", type=int, default=0, help="only the first N images (0 = all)")
    p.add_argument("--exclude-split", action="append", default=[],
                   help="a split whose images get no view (repeatable; e.g. test: the queries' split)")
    a = p.parse_args(argv)
    encode_views(a.karpathy_json, a.image_root, a.out, a.views, a.backbone, a.model, a.seed, a.collage,
                 a.shard_images, threads=a.threads, dataset=a.dataset, limit_images=a.limit_images,
                 exclude_splits=tuple(a.exclude_split))


if __name__ == "__main__":
    main()
