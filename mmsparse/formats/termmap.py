"""Term maps as JSON lines: the sparse vectors in the form search engines ingest.

One line per row of a sparse HDF5 file, UTF-8, "\\n" line ends:

    {"id": "1000268201_693b08cb0e", "terms": {"dog": 1.8125, "grass": 0.73046875, "##s": 0.25}}

`terms` maps each vocabulary term of the row to its weight: the row's terms in vocabulary order
(the sparse file's column order), weights the float32 values written in their shortest form that
reads back to the same float32 (numpy's repr), so export -> import -> export gives the same bytes.
A row without terms is written with `"terms": {}`.

Seismic's form (`seismic`): `{"id": N, "vector": {term: weight}}`, N the row number (Seismic's
loader wants integer ids and the key `vector`), and the rows' ids, line N+1 = row N, in a text file
beside it (`ids_path`: FILE.ids.txt for FILE.jsonl); `read_jsonl` reads both forms and maps the
numbers back through that file when it is there.

Escaping (`escape_dots`): Elasticsearch's `rank_features` and `sparse_vector` fields refuse "." in a
feature name, and a WordPiece vocabulary holds "." (and "..."). With escaping, "%" becomes "%25"
and "." becomes "%2E" (percent-encoding of those two characters only, so no two terms collide and
`unescape_term` inverts it); the same flag on import reads such a file back.

`write_jsonl` streams a sparse file in batches of rows (memory O(batch), whatever the file's
size); `read_jsonl` yields batches of (ids, CSR) for `SparseWriter` (sparse.py), naming the file,
line and field of the first line that is not a term map.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path, kill_point
from ..errors import InputError, require_file
from ._h5 import open_h5, read_strings

_ESCAPES = {"%": "%25", ".": "%2E"}
_UNESCAPE = re.compile(r"%(25|2E)")


def escape_term(term: str) -> str:
    """`term` with "%" -> "%25" and "." -> "%2E" (a feature name Elasticsearch accepts)."""
    return "".join(_ESCAPES.get(c, c) for c in term) if ("." in term or "%" in term) else term


def unescape_term(term: str) -> str:
    """The inverse of escape_term."""
    return _UNESCAPE.sub(lambda m: "%" if m.group(1) == "25" else ".", term) if "%" in term else term


def _keys(vocab: list[str], escape_dots: bool) -> np.ndarray:
    """Per vocabulary term its JSON key and separator, '"term": ', as a numpy string array."""
    return np.array([json.dumps(escape_term(t) if escape_dots else t, ensure_ascii=False) + ": " for t in vocab])


def ids_path(jsonl: str | Path) -> Path:
    """The id map beside a Seismic-form file: FILE.ids.txt for FILE.jsonl (FILE.jsonl.ids.txt otherwise)."""
    p = Path(jsonl)
    return p.with_name(p.name.removesuffix(".jsonl") + ".ids.txt")


def write_jsonl(sparse: str | Path, out: str | Path, *, escape_dots: bool = False, seismic: bool = False,
                batch_rows: int = 2048, progress=None) -> int:
    """Write the rows of sparse HDF5 file (or sharded directory) `sparse` as JSON lines to `out`
    (atomically: a killed export leaves the previous file or none), reading `batch_rows` rows at a
    time; seismic: Seismic's form, and the ids to ids_path(out) (module docstring). Returns the
    number of lines. InputError when `sparse` is not a sparse file (a dense one included: the
    message says so), or, with seismic, an id holds a line break."""
    from contextlib import ExitStack

    from ..progress import reporter

    with open_h5(sparse, "sparse") as f, ExitStack() as stack:
        keys = _keys(read_strings(f["vocab"]), escape_dots)
        n = f["ids"].shape[0]
        w = stack.enter_context(open(stack.enter_context(atomic_path(out)), "w", encoding="utf-8", newline="\n"))
        idw = (stack.enter_context(open(stack.enter_context(atomic_path(ids_path(out))), "w", encoding="utf-8",
                                        newline="\n")) if seismic else None)
        bar = stack.enter_context(reporter(progress).task(f"export {Path(out).name}", total=n))
        field = "vector" if seismic else "terms"
        for s in range(0, n, batch_rows):
            e = min(n, s + batch_rows)
            ptr = f["indptr"][s:e + 1].astype(np.int64)
            idx = f["indices"][ptr[0]:ptr[-1]]
            pairs = np.char.add(keys[idx], f["weights"][ptr[0]:ptr[-1]].astype(np.float32).astype(str))
            ptr -= ptr[0]
            ids = read_strings(f["ids"][s:e])
            if seismic:
                bad = next((i for i in ids if "\n" in i or "\r" in i), None)
                if bad is not None:
                    raise InputError(f"{sparse}: id {bad!r} holds a line break; --seismic writes one id per line")
                idw.write("".join(f"{i}\n" for i in ids))
            keys_out = (str(s + r) for r in range(e - s)) if seismic else (json.dumps(i, ensure_ascii=False)
                                                                           for i in ids)
            w.write("".join(f'{{"id": {i}, "{field}": {{{", ".join(pairs[ptr[r]:ptr[r + 1]])}}}}}\n'
                            for r, i in enumerate(keys_out)))
            bar.advance(e - s)
            kill_point()  # tests: MMSPARSE_TEST_KILL_AFTER interrupts here
    return n


def read_jsonl(path: str | Path, vocab: list[str], *, escape_dots: bool = False,
               batch_lines: int = 8192) -> Iterator[tuple[list[str], sp.csr_matrix]]:
    """Batches of (ids, CSR [B, |vocab|] float32) from JSON lines `path` (write_jsonl's format;
    blank lines skipped). A term is looked up in `vocab` (after unescape_term with escape_dots).
    InputError "PATH:LINE: FIELD: ..." for a line that is not a JSON object with a string (or
    integer) `id` and a `terms` object of term -> finite number >= 0, or a term `vocab` lacks."""
    p = require_file(path, "JSON lines term-map file")
    col = {t: j for j, t in enumerate(vocab)}
    names = _id_map(p)
    ids: list[str] = []
    rows, cols, vals = [], [], []
    with open(p, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            i, terms, vector = _parse(line, p, no)
            if vector and names is not None:
                if not i.isdigit() or int(i) >= len(names):
                    raise InputError(f"{p}:{no}: id: {i!r} is not a row of the id map {ids_path(p).name} "
                                     f"({len(names)} ids)")
                i = names[int(i)]
            r = len(ids)
            for t, v in terms.items():
                if escape_dots and "." in t:
                    raise InputError(f"{p}:{no}: terms: {t!r} holds a '.', which an escaped file never does; drop "
                                     "--escape-dots (the file was exported without it)")
                j = col.get(unescape_term(t) if escape_dots else t)
                if j is None:
                    raise InputError(f"{p}:{no}: terms: {t!r} is not a term of the vocabulary ({len(vocab)} terms); "
                                     "pass the --vocab the file was exported with"
                                     + ("" if escape_dots else " (and --escape-dots if it was escaped)"))
                if v:
                    rows.append(r)
                    cols.append(j)
                    vals.append(v)
            ids.append(i)
            if len(ids) == batch_lines:
                yield ids, _csr(rows, cols, vals, len(ids), len(vocab))
                ids, rows, cols, vals = [], [], [], []
    if ids:
        yield ids, _csr(rows, cols, vals, len(ids), len(vocab))


def _id_map(path: Path) -> list[str] | None:
    """The ids of a Seismic-form file (ids_path), or None when there is no such file beside it."""
    m = ids_path(path)
    if not m.is_file():
        return None
    names = m.read_text(encoding="utf-8").split("\n")
    return names[:-1] if names and names[-1] == "" else names


def _parse(line: str, path: Path, no: int) -> tuple[str, dict, bool]:
    """(id, terms, whether in Seismic's form) of one line, checked (see read_jsonl); Seismic's
    `vector` is read as `terms`."""
    try:
        o = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{no}: not a JSON object ({e.msg}); each line must be "
                         '{"id": ..., "terms": {term: weight}}') from None
    if not isinstance(o, dict):
        raise InputError(f'{path}:{no}: a JSON {type(o).__name__}, not an object {{"id": ..., "terms": {{...}}}}')
    i = o.get("id")
    if isinstance(i, bool) or not isinstance(i, (str, int)) or i == "":
        raise InputError(f"{path}:{no}: id: missing or not a non-empty string ({i!r}); give each line an \"id\"")
    terms = o.get("terms", o.get("vector"))
    if not isinstance(terms, dict):
        raise InputError(f"{path}:{no}: terms: not an object of term -> weight ({type(terms).__name__}); write "
                         '"terms": {"dog": 1.5, ...}')
    for t, v in terms.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise InputError(f"{path}:{no}: terms: weight of {t!r} is {v!r}; weights must be finite numbers >= 0")
    return str(i), terms, "terms" not in o


def _csr(rows, cols, vals, n: int, v: int) -> sp.csr_matrix:
    """CSR [n, v] float32 of (row, column, value) triples, columns sorted within rows."""
    m = sp.csr_matrix((np.asarray(vals, dtype=np.float32), (np.asarray(rows, dtype=np.int64),
                       np.asarray(cols, dtype=np.int64))), shape=(n, v))
    m.sort_indices()
    return m
