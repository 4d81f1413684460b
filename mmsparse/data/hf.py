"""Hugging Face `datasets` input (`encode-dense --format hf`): a dataset id on the Hub, or a local
directory written with `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (or any folder
`datasets.load_dataset` reads: parquet, arrow, imagefolder).

Splits: the dataset's own (a DatasetDict; "validation" is read as "val", as the stages name it),
or, with `split_column`, the value of that column in each row (nlphuji/flickr30k keeps
train/val/test in a `split` column). A single Dataset without a split column is one split "all".
Rows: `image_column` holds the image (an `Image` feature, or a path string relative to
IMAGE_ROOT); `caption_column` one caption (str) or several (list of str). With `id_column`, rows
with the same id are one image (datasets with one row per image-caption pair) and the id names it;
without, every row is one image whose id is its row number. Caption ids: "<image id>#<k>", k
counting that image's captions from 0 in row order.
Images stay in the dataset's memory-mapped Arrow files and are decoded only when encoded (by the
DataLoader workers, through `HFImageLoader`), so memory does not grow with the dataset.
"""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ..errors import InputError
from .records import CaptionRecord, ImageRecord, SplitData

SPLIT_ALIASES = {"validation": "val", "restval": "train"}
OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


class HFImageLoader:
    """Picklable ImageRecord -> PIL image for rows of a dataset: reads row `record.row` of
    `column` (undecoded Image feature {"bytes", "path"}, or a path string) and decodes it.
    Raises OSError/ValueError for an unreadable image, as `load_image` does."""

    def __init__(self, table, column: str, image_root: str | Path | None = None):
        self.table, self.column = table, column
        self.root = Path(image_root) if image_root else None

    def _path(self, p: str) -> Path:
        return self.root / p if self.root is not None and not Path(p).is_absolute() else Path(p)

    def __call__(self, record: ImageRecord):
        from PIL import Image

        v = self.table[int(record.row)][self.column]
        if isinstance(v, dict):
            src = io.BytesIO(v["bytes"]) if v.get("bytes") else self._path(v.get("path") or "")
        elif isinstance(v, str):
            src = self._path(v)
        elif isinstance(v, Image.Image):
            return v.convert("RGB")
        else:
            raise ValueError(f"column {self.column!r} holds {type(v).__name__}, not an image")
        with Image.open(src) as im:
            im.load()
            return im.convert("RGB")


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARS)


def _hub_reachable(timeout: float = 5.0) -> str | None:
    """None when the Hub endpoint accepts a TCP connection, else the reason."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"


def _offline_error(source: str, why: str) -> InputError:
    return InputError(f"{source}: not a local dataset directory, and the Hugging Face Hub cannot be reached "
                      f"({why}); on a machine with internet run "
                      f"`datasets.load_dataset({source!r}).save_to_disk(DIR)` and pass DIR instead")


def load_hf_dataset(source: str | Path):
    """datasets.Dataset or DatasetDict from a local directory or a Hub id. InputError when the
    directory holds no dataset, or (a Hub id) the Hub is unreachable or the id is unknown; one
    line, no retries: offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, or no connection) is
    detected before downloading."""
    import datasets

    datasets.disable_progress_bars()
    p = Path(source)
    try:
        if p.is_dir():
            if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
                return datasets.load_from_disk(str(p))
            return datasets.load_dataset(str(p))
        if p.exists():
            raise InputError(f"{p}: --format hf takes a dataset directory or a Hub id, not a file")
        if not _offline():
            why = _hub_reachable()
            if why:
                raise _offline_error(str(source), why)
        return datasets.load_dataset(str(source))
    except InputError:
        raise
    except ConnectionError as e:
        raise _offline_error(str(source), str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except Exception as e:  # noqa: BLE001 — datasets raises many kinds for "cannot load this"
        first = str(e).splitlines()[0] if str(e) else ""
        raise InputError(f"{source}: cannot load as a Hugging Face dataset ({type(e).__name__}: {first})") from None


def _column(table, name: str, what: str, source, split) -> list:
    if name not in table.column_names:
        raise InputError(f"{source} (split {split}): --{what} {name!r}: no such column; columns: "
                         f"{', '.join(table.column_names)}")
    return list(table.select_columns([name])[name])


def _split_rows(table, source, split: str, image_column: str, caption_column: str, id_column: str | None,
                rows: list[int], image_root) -> SplitData:
    caps = _column(table, caption_column, "caption-column", source, split)
    ids = _column(table, id_column, "id-column", source, split) if id_column else None
    sd = SplitData(loader=HFImageLoader(table.select_columns([image_column]), image_column, image_root))
    first: dict[str, int] = {}
    n_caps: dict[str, int] = {}
    for r in rows:
        iid = str(ids[r]) if ids is not None else str(r)
        if not iid.strip():
            raise InputError(f"{source} (split {split}): row {r}: --id-column {id_column!r} is empty")
        if iid not in first:
            first[iid] = r
            sd.images.append(ImageRecord(iid, Path(f"{source}:{split}[{r}]"), row=r))
        texts = caps[r] if isinstance(caps[r], (list, tuple)) else [caps[r]]
        for t in texts:
            k = n_caps.get(iid, 0)
            n_caps[iid] = k + 1
            sd.captions.append(CaptionRecord(f"{iid}#{k}", "" if t is None else str(t).strip(), iid))
    return sd


def read_hf(source: str | Path, image_column: str = "image", caption_column: str = "caption",
            id_column: str | None = None, split_column: str | None = None,
            image_root: str | Path | None = None) -> dict[str, SplitData]:
    """{split: SplitData} of a Hugging Face dataset (see the module docstring). Each SplitData
    has a `loader` reading its images from the dataset. InputError names a missing column (with
    the columns there are) or an unloadable source."""
    import datasets

    ds = load_hf_dataset(source)
    if Path(source).exists():  # image labels (and so the encode fingerprint) do not depend on the cwd
        source = Path(source).resolve()
    parts = dict(ds.items()) if isinstance(ds, datasets.DatasetDict) else {"all": ds}
    out: dict[str, SplitData] = {}
    for name, table in parts.items():
        if image_column not in table.column_names:
            raise InputError(f"{source} (split {name}): --image-column {image_column!r}: no such column; "
                             f"columns: {', '.join(table.column_names)}")
        if isinstance(table.features[image_column], datasets.Image):
            table = table.cast_column(image_column, datasets.Image(decode=False))
        if split_column:
            labels = [str(v) for v in _column(table, split_column, "split-column", source, name)]
            groups: dict[str, list[int]] = {}
            for r, lab in enumerate(labels):
                groups.setdefault(SPLIT_ALIASES.get(lab, lab), []).append(r)
        else:
            groups = {SPLIT_ALIASES.get(name, name): list(range(len(table)))}
        for split, rows in groups.items():
            if split in out:
                raise InputError(f"{source}: split {split!r} appears twice (as a dataset split and a "
                                 f"--split-column value, or as 'validation' and 'val'); pick one")
            out[split] = _split_rows(table, source, split, image_column, caption_column, id_column, rows,
                                     image_root)
    return out
