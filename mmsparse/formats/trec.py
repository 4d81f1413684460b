"""TREC run and qrels text formats.

run:   `qid Q0 docid rank score tag` per line, ranked by decreasing score per query
qrels: `qid 0 docid relevance` per line
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from ..atomic import atomic_path
from ..errors import InputError, require_file

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def write_run(path: str | Path, run: Mapping[str, Mapping[str, float]] | Iterable[tuple[str, list[tuple[str, float]]]],
              tag: str = "mmsparse") -> None:
    """Write a run atomically. `run`: {qid: {docid: score}} or iterable of (qid, [(docid, score)...])."""
    items = run.items() if isinstance(run, Mapping) else run
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in items:
            pairs = docs.items() if isinstance(docs, Mapping) else docs
            ranked = sorted(pairs, key=lambda x: (-x[1], x[0]))
            for rank, (did, score) in enumerate(ranked, 1):
                f.write(f"{qid} Q0 {did} {rank} {score:.6g} {tag}\n")


def read_run(path: str | Path) -> Run:
    """{qid: {docid: score}}. Raises InputError naming the line of a malformed entry."""
    p = require_file(path, "TREC run")
    run: Run = {}
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise InputError(f"{p}:{n}: malformed run line (expected 'qid Q0 docid rank score tag'): {line.strip()!r}")
            try:
                score = float(parts[4])
            except ValueError:
                raise InputError(f"{p}:{n}: score {parts[4]!r} is not a number") from None
            run.setdefault(parts[0], {})[parts[2]] = score
    return run


def write_qrels(path: str | Path, qrels: Mapping[str, Mapping[str, int]]) -> None:
    """Write qrels atomically: {qid: {docid: relevance}}."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in qrels.items():
            for did, rel in docs.items():
                f.write(f"{qid} 0 {did} {int(rel)}\n")


def read_qrels(path: str | Path) -> Qrels:
    """{qid: {docid: relevance}}. Raises InputError naming the line of a malformed entry."""
    p = require_file(path, "qrels")
    qrels: Qrels = {}
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
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
