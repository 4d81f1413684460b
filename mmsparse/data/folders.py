"""Class-labelled image sets for image-to-image retrieval (BM25-V, paper §4.1).

Layout read (`read_class_folder`), as CUB-200-2011 (images/001.Black_footed_Albatross/*.jpg),
Stanford Cars or FGVC-Aircraft sorted into class folders ship or are unpacked:

    ROOT/<class>/<image>.jpg        one sub-folder per class (files may be symlinks)

Image ids are those of the plain image-folder reader (data/plain.py: relative path without
suffix, e.g. "dog/1000268201_693b08cb0e"), so `mmsparse encode-dense ROOT` writes the same ids.
`labels="stem-prefix"` reads a flat folder whose file names start with the class, as Oxford-IIIT
Pets does (images/Abyssinian_12.jpg -> class "Abyssinian": the stem up to its last "_").

Image-to-image relevance (`class_qrels`): every image is a query; the relevant documents are the
other images of its class. The query itself is excluded, as in the paper (search with
`--exclude-self`).

`build_keyword_classes` makes such a folder from a captioned dataset (no fine-grained benchmark
is on this machine): an image gets class c when at least `min_captions` of its captions mention
a keyword of c and none of its captions mentions a keyword of another class. Files are symlinks,
never copies; classes.json beside them lists the classes, keywords and image ids.

Command line (writes under OUT only):
    python -m mmsparse.data.folders keywords dataset_flickr8k.json IMAGE_ROOT -o OUT [--class dog=dog,dogs,puppy ...]
    python -m mmsparse.data.folders qrels ROOT -o ROOT.qrels [--labels subfolder|stem-prefix]
    python -m mmsparse.data.folders gather ROOT DENSE.h5... -o ROOT-images.h5   (reuse encoded rows)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..errors import InputError
from .plain import read_image_folder
from .records import ImageRecord, load_json

LABEL_MODES = ("subfolder", "stem-prefix")

# Flickr8k classes for the example: visually distinct scenes / objects named in the captions.
FLICKR8K_CLASSES: dict[str, tuple[str, ...]] = {
    "dog": ("dog", "dogs", "puppy", "puppies"),
    "bike": ("bike", "bikes", "bicycle", "bicycles", "biker", "bikers", "cyclist", "cyclists", "bmx"),
    "beach": ("beach", "ocean", "surf", "surfer", "surfing", "waves"),
    "snow": ("snow", "snowy", "ski", "skier", "skiing", "snowboard", "snowboarder", "snowboarding"),
    "skateboard": ("skateboard", "skateboarder", "skateboarding", "skateboards", "skater"),
    "climbing": ("climbing", "climber", "climbs", "climb"),
    "football": ("football",),
    "horse": ("horse", "horses"),
    "boat": ("boat", "boats", "kayak", "canoe"),
    "pool": ("pool", "swimming"),
}


def read_class_folder(path: str | Path, labels: str = "subfolder") -> tuple[list[ImageRecord], dict[str, str]]:
    """(image records in path order, {image id: class}) of a class-labelled image folder.

    labels: subfolder (class = first path component of the id; images directly under ROOT are
    an error) or stem-prefix (class = file stem up to its last "_"). Raises InputError for a
    missing/empty folder, an unlabelled image, or fewer than 2 classes.
    """
    if labels not in LABEL_MODES:
        raise InputError(f"--labels {labels!r}: choose one of {', '.join(LABEL_MODES)}")
    recs = read_image_folder(path)["all"].images
    lab: dict[str, str] = {}
    for r in recs:
        if labels == "subfolder":
            parts = r.id.split("/")
            if len(parts) < 2:
                raise InputError(f"{r.path}: image lies directly in {path}; put each image in its class "
                                 "sub-folder (ROOT/<class>/<image>), or pass --labels stem-prefix")
            lab[r.id] = parts[0]
        else:
            stem = r.id.rsplit("/", 1)[-1]
            if "_" not in stem:
                raise InputError(f"{r.path}: file name has no '_' to split the class prefix from "
                                 "(--labels stem-prefix expects <class>_<n>.jpg)")
            lab[r.id] = stem.rsplit("_", 1)[0]
    if len(set(lab.values())) < 2:
        raise InputError(f"{path}: found {len(set(lab.values()))} class(es); image-to-image evaluation needs >= 2")
    return recs, lab


def class_qrels(labels: dict[str, str]) -> dict[str, dict[str, int]]:
    """{query id: {doc id: 1}} — every other image of the query's class (the query excluded).
    Images alone in their class get no entry (nothing is relevant to them)."""
    by_class: dict[str, list[str]] = {}
    for i, c in labels.items():
        by_class.setdefault(c, []).append(i)
    out = {}
    for i, c in labels.items():
        rel = {d: 1 for d in by_class[c] if d != i}
        if rel:
            out[i] = rel
    return out


def keyword_classes(images: list[dict], classes: dict[str, tuple[str, ...]],
                    min_captions: int = 2) -> dict[str, str]:
    """{image filename: class} for Karpathy-style image entries (filename, sentences[].tokens or
    .raw): class c when >= min_captions captions mention a keyword of c and no caption mentions
    a keyword of another class. Tokens are compared lower-case, whole words."""
    word_class = {w.lower(): c for c, ws in classes.items() for w in ws}
    out = {}
    for im in images:
        hits: Counter = Counter()
        for s in im.get("sentences", []):
            toks = s.get("tokens") or str(s.get("raw", "")).lower().replace(".", " ").replace(",", " ").split()
            hits.update({word_class[t.lower()] for t in toks if t.lower() in word_class})
        if len(hits) == 1:
            (c, n), = hits.items()
            if n >= min_captions:
                out[im["filename"]] = c
    return out


def build_keyword_classes(karpathy_json: str | Path, image_root: str | Path, out: str | Path,
                          classes: dict[str, tuple[str, ...]] | None = None, min_captions: int = 2,
                          splits: list[str] | None = None, max_per_class: int | None = None) -> dict:
    """Write OUT/<class>/<image file> symlinks (to IMAGE_ROOT/<file>) and OUT/classes.json.

    splits: only images of these Karpathy splits (default all). max_per_class: keep the first N
    images of each class in file order (default all). Replaces OUT atomically. Returns the
    classes.json content: {classes: {class: [keywords]}, min_captions, splits, counts, images: {id: class}}.
    """
    from ..atomic import atomic_path

    data = load_json(karpathy_json, "Karpathy split JSON")
    root = Path(image_root).resolve()
    if not root.is_dir():
        raise InputError(f"{image_root}: image root directory not found")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise InputError(f"{karpathy_json}: images: field missing; pass a Karpathy split file")
    classes = classes or FLICKR8K_CLASSES
    imgs = [im for im in data["images"] if splits is None or im.get("split") in splits]
    lab = keyword_classes(imgs, classes, min_captions)
    counts: Counter = Counter()
    kept: dict[str, str] = {}
    for fn in sorted(lab):
        c = lab[fn]
        if max_per_class and counts[c] >= max_per_class:
            continue
        if not (root / fn).is_file():
            raise InputError(f"{root / fn}: image listed in {karpathy_json} is missing")
        counts[c] += 1
        kept[fn] = c
    if len(counts) < 2:
        raise InputError(f"{karpathy_json}: only {len(counts)} class(es) matched the keywords; add classes")
    info = {"source": str(Path(karpathy_json).resolve()), "image_root": str(root),
            "classes": {c: list(ws) for c, ws in classes.items()}, "min_captions": min_captions,
            "splits": splits, "max_per_class": max_per_class, "counts": dict(sorted(counts.items())),
            "rule": "class c when >= min_captions captions mention a keyword of c and no caption "
                    "mentions a keyword of another class",
            "images": {f"{c}/{Path(fn).stem}": c for fn, c in kept.items()}}
    with atomic_path(out, directory=True) as tmp:
        for fn, c in kept.items():
            (tmp / c).mkdir(exist_ok=True)
            (tmp / c / fn).symlink_to(root / fn)
        (tmp / "classes.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def gather_dense(root: str | Path, dense_files: list[str | Path], out: str | Path, labels: str = "subfolder",
                 dataset: str | None = None) -> int:
    """Write OUT, a dense image HDF5 of the class folder's images taken from already-encoded dense
    files (same backbone and model), instead of encoding the same images again.

    An image of ROOT is matched by its file stem to a row id of DENSE_FILES (e.g. Karpathy ids
    "1000268201_693b08cb0e"); the output row id is the class-folder id ("dog/1000268201_693b08cb0e").
    Copies `vectors` and, when every input has them, `patch_states`.
    Attributes: the inputs' backbone/model/normalized/patch_layer, dataset = `dataset` (default
    ROOT's name), split "all". Returns the rows written. InputError for images found in no file
    or inputs from different backbones/models.
    """
    import h5py
    import numpy as np

    from ..checks import check_compatible
    from ..formats._h5 import read_strings
    from ..formats.dense import DenseWriter, read_dense_attrs

    recs, lab = read_class_folder(root, labels)
    want = {r.id.rsplit("/", 1)[-1]: r.id for r in recs}
    attrs0 = read_dense_attrs(dense_files[0])
    found: dict[str, tuple[int, int]] = {}
    extras = ["patch_states"]
    for n, p in enumerate(dense_files):
        a = read_dense_attrs(p)
        check_compatible(a, attrs0, ("backbone", "model", "modality", "patch_layer"), str(p), str(dense_files[0]),
                         "gather from files of one backbone")
        with h5py.File(p, "r") as f:
            extras = [e for e in extras if e in f]
            for row, i in enumerate(read_strings(f["ids"])):
                if i in want and i not in found:
                    found[i] = (n, row)
    missing = [want[s] for s in want if s not in found]
    if missing:
        raise InputError(f"{missing[0]}: image not found in {', '.join(map(str, dense_files))} "
                         f"({len(missing)} missing); encode the class folder with `mmsparse encode-dense {root}`")
    order = [r.id.rsplit("/", 1)[-1] for r in recs]
    keep = {k: attrs0[k] for k in ("modality", "backbone", "model", "model_fingerprint", "normalized", "patch_layer")
            if k in attrs0}
    keep.update(dataset=dataset or Path(root).resolve().name, split="all",
                source=" ".join(str(Path(p).resolve()) for p in dense_files))
    with h5py.File(dense_files[0], "r") as f0:
        dim = int(f0["vectors"].shape[1])
    handles = [h5py.File(p, "r") for p in dense_files]
    try:
        rows = {e: [] for e in ["vectors", *extras]}
        for s in order:
            n, row = found[s]
            for e in rows:
                rows[e].append(handles[n][e][row])
        with DenseWriter(out, dim, keep) as w:
            w.append([want[s] for s in order], np.stack(rows["vectors"]).astype(np.float32))
            for e in extras:
                w.append_extra(e, np.stack(rows[e]))
    finally:
        for h in handles:
            h.close()
    return len(order)


def _parse_class(spec: str) -> tuple[str, tuple[str, ...]]:
    name, _, words = spec.partition("=")
    ws = tuple(w.strip() for w in words.split(",") if w.strip())
    if not name or not ws:
        raise InputError(f"--class {spec!r}: expected NAME=word,word,...")
    return name.strip(), ws


def main(argv: list[str] | None = None) -> None:
    """Command line of this module (see the module docstring)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m mmsparse.data.folders", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    kw = sub.add_parser("keywords", help="class folder of symlinks from a Karpathy JSON by caption keywords")
    kw.add_argument("karpathy_json")
    kw.add_argument("image_root")
    kw.add_argument("-o", "--out", required=True, help="folder to write (replaced atomically)")
    kw.add_argument("--class", dest="classes", action="append", metavar="NAME=w1,w2",
                    help="a class and its keywords, repeatable (default: the 10 Flickr8k classes of FLICKR8K_CLASSES)")
    kw.add_argument("--min-captions", type=int, default=2, help="captions that must mention the class (default 2)")
    kw.add_argument("--split", action="append", help="Karpathy split(s) to draw from, repeatable (default all)")
    kw.add_argument("--max-per-class", type=int, default=None, help="cap images per class (default none)")
    q = sub.add_parser("qrels", help="image-to-image qrels (same class = relevant, query excluded)")
    q.add_argument("root")
    q.add_argument("-o", "--out", required=True)
    q.add_argument("--labels", default="subfolder", choices=LABEL_MODES)
    q.add_argument("--dataset", default=None, help="dataset name recorded for `eval` (default: ROOT's name, as "
                   "`encode-dense ROOT` records it)")
    g = sub.add_parser("gather", help="dense HDF5 of ROOT's images taken from already-encoded dense files")
    g.add_argument("root")
    g.add_argument("dense", nargs="+", help="dense image HDF5 files holding the images (ids = file stems)")
    g.add_argument("-o", "--out", required=True)
    g.add_argument("--labels", default="subfolder", choices=LABEL_MODES)
    g.add_argument("--dataset", default=None, help="dataset name recorded (default: ROOT's name)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "keywords":
            classes = dict(_parse_class(s) for s in a.classes) if a.classes else None
            info = build_keyword_classes(a.karpathy_json, a.image_root, a.out, classes, a.min_captions,
                                         a.split, a.max_per_class)
            print(f"{sum(info['counts'].values())} images in {len(info['counts'])} classes -> {a.out}: "
                  + ", ".join(f"{c} {n}" for c, n in info["counts"].items()), file=sys.stderr)
        elif a.cmd == "gather":
            n = gather_dense(a.root, a.dense, a.out, a.labels, a.dataset)
            print(f"{n} images of {a.root} -> {a.out}", file=sys.stderr)
        else:
            from ..formats.trec import write_qrels
            _, lab = read_class_folder(a.root, a.labels)
            qr = class_qrels(lab)
            name = a.dataset or Path(a.root).resolve().name
            write_qrels(a.out, qr, meta={"dataset": name, "split": "all", "labels": a.labels,
                                         "classes": len(set(lab.values()))})
            print(f"{len(qr)} image queries, {len(set(lab.values()))} classes -> {a.out}", file=sys.stderr)
    except InputError as e:
        print(f"mmsparse: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
