"""Query text files: what `sparsify` and `search` read as queries when no model encodes them.

Three layouts, told apart by content (HDF5) or else by suffix (.h5 / .hdf5: HDF5, whose reader
then says what is wrong with a damaged file):
  HDF5   a captions file of encode-dense (or a sharded directory of one): its `ids` and `texts`;
         the vectors are never read
  .tsv   `id<TAB>text` per line, the IR convention of queries.tsv (ir_datasets, MS MARCO); the
         text is everything after the first tab
  .txt   one query per line; its id is its line number, from 1 (as encode-dense numbers a .txt
         captions file, so qrels made for one fit the other)
Blank lines are skipped in both text layouts (a .txt file keeps the numbers of the lines that
remain). Bad input is an InputError naming the file, the line and the fix: a .tsv line without a
tab, an empty id or text, a duplicate id, a file with no query, a file of another layout.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, require_file

TEXT_SUFFIXES = (".tsv", ".txt")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf")


def query_file_kind(path: str | Path, what: str = "queries") -> str:
    """"hdf5" (an HDF5 file or a sharded directory), "tsv" or "txt" for the query file `path`.
    InputError when it is missing ("PATH: `what` not found"), or neither HDF5 nor named .tsv / .txt."""
    p = Path(path)
    if p.is_dir():   # a sharded output (formats/sharded.py), whose reader refuses an unfinished one
        return "hdf5"
    require_file(p, what)
    import h5py

    suffix = p.suffix.lower()
    if h5py.is_hdf5(p) or suffix in HDF5_SUFFIXES:   # a damaged .h5: the HDF5 reader names what is wrong
        return "hdf5"
    if suffix in TEXT_SUFFIXES:
        return suffix[1:]
    raise InputError(f"{p}: not an HDF5 file, and its name ends neither in .tsv (id<TAB>text per line) nor .txt "
                     "(one query per line); rename it to the suffix of its layout")


def read_query_texts(path: str | Path) -> tuple[list[str], list[str], dict]:
    """(ids, texts, attrs) of the query file `path` (module docstring): attrs are the HDF5 file's
    attributes, {} for a text file. InputError for bad input (module docstring), and for an HDF5
    file without `texts` or of image modality."""
    p = Path(path)
    kind = query_file_kind(p)
    if kind == "hdf5":
        return _hdf5_texts(p)
    try:
        lines = p.read_text(encoding="utf-8-sig").split("\n")   # as a file iterates: line numbers agree
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); save the queries as UTF-8") from None
    ids, texts, seen = [], [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if kind == "txt":
            qid, text = str(n), line
        elif "\t" not in line:
            raise InputError(f"{p}:{n}: no tab; a .tsv query file holds id<TAB>text per line (one query per "
                             "line without ids: name the file .txt)")
        else:
            qid, text = (x.strip() for x in line.split("\t", 1))
            if not qid:
                raise InputError(f"{p}:{n}: empty id before the tab; give each query an id")
        if not text.strip():
            raise InputError(f"{p}:{n}: query {qid!r} has no text; remove the line or write the query")
        if qid in seen:
            raise InputError(f"{p}:{n}: duplicate query id {qid!r} (first on line {seen[qid]}); ids must be "
                             "unique")
        seen[qid] = n
        ids.append(qid)
        texts.append(text.strip())
    if not ids:
        raise InputError(f"{p}: no queries (every line is blank); write one query per line")
    return ids, texts, {}


def _hdf5_texts(p: Path) -> tuple[list[str], list[str], dict]:
    from ._h5 import attrs_dict, check_ids, read_strings
    from .sharded import open_read

    try:
        f = open_read(p)
    except OSError as e:
        raise InputError(f"{p}: cannot open as HDF5 ({e}); the file is truncated or not HDF5") from None
    with f:
        attrs = attrs_dict(f)
        if attrs.get("modality") == "image":
            raise InputError(f"{p}: an image file (modality='image'); query texts come from a captions file, "
                             "a .tsv or a .txt file")
        if "texts" not in f or "ids" not in f:
            raise InputError(f"{p}: no 'texts' dataset; give a captions file made by encode-dense from texts, or "
                             "the queries as a .tsv (id<TAB>text) or .txt (one per line) file")
        ids, texts = read_strings(f["ids"]), read_strings(f["texts"])
    if len(ids) != len(texts):
        raise InputError(f"{p}: {len(ids)} ids but {len(texts)} texts; re-encode the captions file")
    check_ids(ids, p)
    empty = next((i for i, t in zip(ids, texts) if not str(t).strip()), None)
    if empty is not None:
        raise InputError(f"{p}: field 'texts': query {empty!r} is empty; remove it or give it a text")
    return ids, texts, attrs
