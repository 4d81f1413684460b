"""Reusable checks every stage makes before doing work (bad input -> InputError, exit 2).

Compatibility is read from the files' provenance attributes: two files that must come from the
same backbone / model / head / split are compared key by key, and a mismatch names both files
and both values. Models are compared by what they are (`model_fingerprint`), not where they lay:
a model moved or copied elsewhere is the same model, one changed in place is not. `force=True`
turns a mismatch a user may knowingly want (e.g. searching images with images) into a warning
on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable, Sequence

from .errors import InputError


def _show(v) -> str:
    return "(not recorded)" if v is None else repr(v)


def check_compatible(a_attrs: dict, b_attrs: dict, keys: Sequence[str], a_name: str, b_name: str,
                     fix: str = "", force: bool | None = None) -> list[str]:
    """Compare `keys` of two attribute dicts; a key recorded in both with different values is a
    mismatch. Raises InputError "A: key='x' but B: key='y'; FIX" for the first one, unless
    `force` is True (then warns and returns the mismatch messages). `force=None` means the
    command has no --force: the message does not offer it."""
    msgs = []
    for k in keys:
        a, b = a_attrs.get(k), b_attrs.get(k)
        if k == "model":
            m = _model_mismatch(a_attrs, b_attrs, a_name, b_name)
            if m:
                msgs.append(m)
            continue
        if a is None or b is None or _norm(a) == _norm(b):
            continue
        msgs.append(f"{a_name}: {k}={_show(a)} but {b_name}: {k}={_show(b)}")
    if msgs and not force:
        if msgs[0].endswith(CHANGED_FIX):  # the model changed in place: the caller's fix does not apply
            fix = ""
        hint = f"; {fix}" if fix else ""
        more = f" (and {len(msgs) - 1} more mismatch(es))" if len(msgs) > 1 else ""
        tail = "; pass --force to use them together anyway" if force is False else ""
        raise InputError(f"{msgs[0]}{more}{hint}{tail}")
    for m in msgs:
        warn(f"{m} (--force: going ahead)")
    return msgs


CHANGED_FIX = ("re-encode with encode-dense and retrain the heads made from the old vectors, so that both "
               "come from one version")
_said: set = set()  # notes and warnings said once per process


def _model_mismatch(a_attrs: dict, b_attrs: dict, a_name: str, b_name: str) -> str | None:
    """Whether two files' models differ, by `model_fingerprint` (what the model is) where both
    record one, else by `model` (where it lay; one warning line per process says so). The same
    fingerprint at another path is the same model (moved: a note); another fingerprint at the
    same path is a model changed in place. Returns the mismatch message, or None."""
    a, b = a_attrs.get("model"), b_attrs.get("model")
    fa, fb = a_attrs.get("model_fingerprint"), b_attrs.get("model_fingerprint")
    same_place = a is not None and b is not None and _norm(a) == _norm(b)
    if fa and fb:
        if fa == fb:
            if a is not None and b is not None and not same_place:
                _once(("moved", str(a), str(b)), f"mmsparse: note: {a_name} and {b_name} name one model at two "
                      f"paths ({str(a)!r}, {str(b)!r}; same model_fingerprint {_short(fa)}): it moved; going ahead")
            return None
        if same_place:
            return (f"{a_name} and {b_name} come from different versions of model {str(a)!r} (model_fingerprint "
                    f"{_short(fa)} vs {_short(fb)}): the model changed in place; {CHANGED_FIX}")
        return f"{a_name}: model={_show(a)} but {b_name}: model={_show(b)} (another model_fingerprint)"
    if a is None or b is None:
        return None
    old = a_name if not fa else b_name
    _once("legacy", f"mmsparse: warning: {old} records no model_fingerprint (written by an older mmsparse): "
                    "models are compared by path only, so a model changed in place goes unnoticed; re-encode "
                    "it (encode-dense --force) to record one")
    return None if same_place else f"{a_name}: model={_show(a)} but {b_name}: model={_show(b)}"


def _short(fp) -> str:
    """A fingerprint shortened for messages: sha256:9a27c25da2b3, hf:org/name@1a2b3c4d5e6f."""
    s = str(fp)
    return s[:s.index(":") + 13] if s.startswith("sha256:") else s[:s.rfind("@") + 13] if "@" in s else s


def _once(key, line: str) -> None:
    if key not in _said:
        _said.add(key)
        print(line, file=sys.stderr)


def _norm(v):
    if isinstance(v, str):
        p = Path(v)
        if p.is_absolute() and p.exists():  # the same model directory spelled two ways
            return str(p.resolve())
    if isinstance(v, (bool, int, float)):
        return v
    return str(v)


def check_modality(attrs: dict, expected: str, path, what: str) -> None:
    """InputError unless the file's `modality` is `expected` (image | text)."""
    got = attrs.get("modality")
    if got != expected:
        noun = {"image": "images", "text": "captions"}
        raise InputError(f"{path}: modality={_show(got)} but {what} must be {noun.get(expected, expected)} "
                         f"(modality={expected!r}); pass the {noun.get(expected, expected)} file")


def check_cross_modal(query_attrs: dict, doc_attrs: dict, query_path, doc_name: str, force: bool) -> None:
    """Queries and documents of a cross-modal search have different modalities (captions search
    images, images search captions). Same modality -> InputError unless `force`."""
    q, d = query_attrs.get("modality"), doc_attrs.get("modality")
    if q is None or d is None or q != d:
        return
    other = "text" if d == "image" else "image"
    msg = (f"{query_path}: modality={q!r} but {doc_name} holds modality={d!r} documents; cross-modal "
           f"search expects modality={other!r} queries")
    if not force:
        raise InputError(msg + "; pass --force to search within one modality")
    warn(msg + " (--force: going ahead)")


def check_captions(captions: Iterable, source) -> None:
    """Every caption record (`.id`, `.text`) has non-empty text. InputError naming the first
    empty one and the count."""
    empty = [c.id for c in captions if not str(c.text).strip()]
    if empty:
        raise InputError(f"{source}: caption {empty[0]!r} is empty (zero-length text; {len(empty)} empty "
                         f"caption(s) in all); fix or remove them")


def check_ids(ids: Sequence[str], path, field: str = "ids") -> None:
    """Ids are non-empty and unique; InputError naming the first offender."""
    seen: set[str] = set()
    for n, i in enumerate(ids):
        if not i or not str(i).strip():
            raise InputError(f"{path}: field '{field}' has an empty id at row {n}; ids must be non-empty")
        if i in seen:
            raise InputError(f"{path}: field '{field}' has duplicate id {i!r} (row {n}); ids must be unique")
        seen.add(i)


def check_finite(vectors, path, ids: Sequence[str] | None = None, start: int = 0) -> None:
    """InputError if `vectors` [n, d] hold NaN/Inf, naming the count and the first row (id)."""
    import numpy as np

    bad = ~np.isfinite(vectors).all(axis=1)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        which = f"id {ids[r]!r}" if ids is not None else f"row {start + r}"
        raise InputError(f"{path}: field 'vectors' has NaN/Inf in {int(bad.sum())} row(s) (first: {which}); "
                         "re-encode them")


def read_sidecar(path) -> dict:
    """The provenance sidecar RUN.meta.json of a run or qrels file ({} when absent/unreadable)."""
    from .provenance import sidecar_path

    p = sidecar_path(path)
    if not p.is_file():
        return {}
    try:
        o = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return o if isinstance(o, dict) else {}


def check_run_qrels(run_path, qrels_path, force: bool | None = None) -> None:
    """The run's queries and the qrels come from the same dataset and split (as their
    sidecars record); InputError naming both values otherwise."""
    r, q = read_sidecar(run_path).get("queries", {}), read_sidecar(qrels_path)
    check_compatible(r, q, ("dataset", "split"), f"{run_path} (its queries)", str(qrels_path),
                     "evaluate a run against the qrels of the same split", force)


# A sparse vector holding more than this share of its vocabulary is "near dense": an index of such vectors
# walks most posting lists for every query. A D2S head after one epoch of the paper's defaults: 8,710 terms
# per image and 15,452 per query of 30,522 (5,000 Flickr8k test captions searched for over 20 minutes);
# the Flickr8k example's heads: 116 and 64 terms of 6,740 (D2S), 273 and 11 (inference-free).
NEAR_DENSE = 0.10
NEAR_DENSE_MIN = 64   # fewer terms per vector is sparse whatever the vocabulary (a 16-term test vocabulary)
DENSE_FIX = "train it further (more epochs, a larger η --eta, a shorter sparsity warm-up --l1-warmup)"


def near_dense(terms: float, vocab_size: int) -> bool:
    """Whether vectors holding `terms` terms on average (of `vocab_size`) are near dense: more than
    NEAR_DENSE of the vocabulary and more than NEAR_DENSE_MIN terms."""
    return vocab_size > 0 and terms > max(NEAR_DENSE * vocab_size, NEAR_DENSE_MIN)


def terms_share(what: str, terms: float, vocab_size: int) -> str:
    """'<what> hold 8,710 terms on average (29% of the 30,522-term vocabulary)'."""
    return f"{what} hold {terms:,.0f} terms on average ({terms / max(vocab_size, 1):.0%} of the {vocab_size:,}-term vocabulary)"


def warn(msg: str) -> None:
    """One warning line on stderr."""
    print(f"mmsparse: warning: {msg}", file=sys.stderr)
