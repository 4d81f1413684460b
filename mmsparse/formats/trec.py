"""TREC run and qrels text formats.

run:   `qid Q0 docid rank score tag` per line, ranked by decreasing score per query
qrels: `qid 0 docid relevance` per line

TREC text has no header, so each writer also leaves a provenance sidecar FILE.meta.json
({"format": "run" | "qrels", mmsparse_version, command, inputs, ...}; see provenance.py),
written after the file itself, each atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..atomic import atomic_path, write_text_atomic
from ..errors import InputError, require_file

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def write_run(path: str | Path, run: Mapping[str, Mapping[str, float]] | Iterable[tuple[str, list[tuple[str, float]]]],
              tag: str = "mmsparse", meta: dict | None = None) -> None:
    """Write a run atomically. `run`: {qid: {docid: score}} or iterable of (qid, [(docid, score)...]).
    Then the sidecar PATH.meta.json: provenance plus `meta` (e.g. the queries' attributes)."""
    items = run.items() if isinstance(run, Mapping) else run
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", buffering=1 << 20) as f:
        for qid, docs in items:
            pairs = list(docs.items() if isinstance(docs, Mapping) else docs)
            if not pairs:
                continue
            dids = [d for d, _ in pairs]
            scores = np.fromiter((s for _, s in pairs), dtype=np.float64, count=len(pairs))
            # rank by decreasing score, ties by doc id (stable and reproducible)
            order = np.lexsort((np.array(dids), -scores)) if len(set(scores.tolist())) < len(pairs) \
                else np.argsort(-scores, kind="stable")
            sl = scores.tolist()
            f.write("".join([f"{qid} Q0 {dids[j]} {r} {sl[j]:.6g} {tag}\n"
                             for r, j in enumerate(order.tolist(), 1)]))
    _write_sidecar(path, "run", dict(meta or {}))


def _write_sidecar(path, kind: str, meta: dict) -> None:
    """PATH.meta.json: {"format": kind, provenance (provenance.record), **meta}, atomically."""
    import json

    from ..provenance import record, sidecar_path

    write_text_atomic(sidecar_path(path), json.dumps({"format": kind, **record(), **meta}, indent=2,
                                                     ensure_ascii=False) + "\n")


def read_run(path: str | Path) -> Run:
    """{qid: {docid: score}}. Raises InputError naming the line of a malformed entry.

    Parsed by pandas' C reader (5M lines in a few seconds, ~10x the line loop); any file it
    cannot take cleanly goes through the line-by-line parser, whose errors name the line."""
    p = require_file(path, "TREC run")
    fast = _read_run_pandas(p)
    return fast if fast is not None else _read_run_lines(p)


def _read_run_pandas(p: Path) -> Run | None:
    import numpy as np
    import pandas as pd

    ids = {0: object, 1: object, 2: object, 5: object}   # Python strings: pandas' arrow strings convert 30x slower
    df = None
    for sep in (" ", r"\s+"):   # one space as write_run writes (3x faster to split), then any whitespace
        try:
            df = pd.read_csv(p, sep=sep, header=None, names=range(6), dtype=ids, engine="c", encoding="utf-8",
                             keep_default_na=False,   # ids "NaN", "None" are ids; only missing fields are NaN
                             on_bad_lines="error", skip_blank_lines=True,
                             quoting=3, comment=None)  # csv.QUOTE_NONE: a '"' in an id is a character, not a quote
        except (ValueError, pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError):
            df = None
            continue
        if len(df) and not df[5].isna().any():   # fields fill from the left: a short line leaves the tag empty
            break
    if df is None or len(df) == 0 or df[5].isna().any() or not pd.api.types.is_integer_dtype(df[3]) \
            or not pd.api.types.is_numeric_dtype(df[4]) or not np.isfinite(df[4].to_numpy(dtype=np.float64)).all():
        return None
    run: Run = {}
    q, d, sc = df[0].to_numpy(), df[2].to_numpy(), df[4].to_numpy(dtype=np.float64).tolist()
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])       # runs are grouped by query; tolerate any order
    ends = np.r_[starts[1:], len(q)]
    for a, b in zip(starts.tolist(), ends.tolist()):
        run.setdefault(q[a], {}).update(zip(d[a:b].tolist(), sc[a:b]))
    return run


def _read_run_lines(p: Path) -> Run:
    run: Run = {}
    for n, line in _lines(p, "TREC run"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise InputError(f"{p}:{n}: malformed run line (expected 'qid Q0 docid rank score tag'): {line.strip()!r}")
        try:
            score = float(parts[4])
        except ValueError:
            raise InputError(f"{p}:{n}: score {parts[4]!r} is not a number") from None
        if score != score or score in (float("inf"), float("-inf")):
            raise InputError(f"{p}:{n}: score {parts[4]!r} is not finite")
        if not parts[3].lstrip("-").isdigit():
            raise InputError(f"{p}:{n}: rank {parts[3]!r} is not an integer")
        run.setdefault(parts[0], {})[parts[2]] = score
    return run


def _lines(p: Path, what: str):
    """(line number, line) of a UTF-8 text file; InputError for a binary / non-UTF-8 file."""
    try:
        with open(p, encoding="utf-8") as f:
            yield from enumerate(f, 1)
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a UTF-8 text file; expected a {what} file") from None


def write_qrels(path: str | Path, qrels: Mapping[str, Mapping[str, int]], meta: dict | None = None) -> None:
    """Write qrels atomically: {qid: {docid: relevance}}; then the sidecar PATH.meta.json with
    provenance plus `meta` (e.g. {"dataset": ..., "split": ...}, checked by `eval`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in qrels.items():
            for did, rel in docs.items():
                f.write(f"{qid} 0 {did} {int(rel)}\n")
    _write_sidecar(path, "qrels", dict(meta or {}))


def read_qrels(path: str | Path) -> Qrels:
    """{qid: {docid: relevance}}. Raises InputError naming the line of a malformed entry."""
    p = require_file(path, "qrels")
    qrels: Qrels = {}
    for n, line in _lines(p, "TREC qrels"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4:
            raise InputError(f"{p}:{n}: malformed qrels line (expected 'qid 0 docid relevance'): {line.strip()!r}")
        try:
            rel = int(parts[3])
        except ValueError:
            raise InputError(f"{p}:{n}: relevance {parts[3]!r} is not an integer") from None
        qrels.setdefault(parts[0], {})[parts[2]] = rel
    return qrels
