"""Milvus index: sparse, dense, or both in one collection, served by Milvus Lite or a Milvus server.

Milvus stores learned sparse vectors natively (SPARSE_FLOAT_VECTOR, inner product,
SPARSE_INVERTED_INDEX) next to dense vectors (FLOAT_VECTOR: FLAT or HNSW, inner product), and
fuses the two in one `hybrid_search` call. The same pymilvus client talks to Milvus Lite (an
embedded engine in this process, data under a local `*.db` directory) and to a Milvus server or
cluster (`uri=http://host:19530`, `token=user:password` or an API key).

Layout of INDEX_DIR:
  mmsparse.json   metadata (meta.py) incl. the connection (uri, or the Lite database below),
                  the alias and the physical collection it was built as, the fields, and the
                  index settings; never the token
  milvus.db/      Milvus Lite only: the database directory (Milvus Lite requires the `.db` name)
With a server INDEX_DIR holds only mmsparse.json.

Collection: primary key `id` (VARCHAR, the document ids of the HDF5 file), `sparse`
(SPARSE_FLOAT_VECTOR: term id -> weight, the vocab index of the sparse file) and/or `dense`
(FLOAT_VECTOR [d]). Scores are inner products, exactly as the other engines define them:
sparse <q, d> = sum_t q_t d_t over shared terms (no quantisation), dense <q, d> (cosine for
L2-normalised vectors). Milvus rejects empty sparse vectors, so a document without terms is
stored with weight 1 on the marker dimension |V|, which no query holds: it scores 0 and never
appears in sparse results (it is still found by dense search).

Rebuilding is atomic for readers: a build writes a new collection `<alias>__<ms>`, points
mmsparse.json at it, then moves the alias `<alias>` onto it (what an application querying
Milvus directly should use) and only then drops the previous collection. A build killed
midway leaves the previous collection, metadata and alias in place; the next build drops the
half-built collection.

Hybrid search (Milvus `hybrid_search`): the sparse and the dense route each fetch `candidates`
documents, then a ranker fuses them:
  rrf       score(d) = sum over routes r where d appears of 1 / (rrf_k + rank_r(d))
            (Cormack et al. 2009; rank from 1)
  weighted  score(d) = w_sparse * norm(s_sparse(d)) + w_dense * norm(s_dense(d)), with Milvus'
            normalisation of inner products norm(s) = 1/2 + arctan(s)/pi; a route that missed d
            adds 0. arctan saturates: sparse scores of tens or more all map to ~1, so weighted
            fusion hardly separates strong sparse matches; RRF uses ranks only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..atomic import atomic_path
from ..errors import InputError
from .meta import META_NAME, read_meta, source_attrs, write_meta

LITE_DB = "milvus.db"
ID_FIELD, SPARSE_FIELD, DENSE_FIELD = "id", "sparse", "dense"
ALGORITHMS = ("auto", "TAAT_NAIVE", "DAAT_MAXSCORE", "DAAT_WAND")
# Milvus Lite (3.x) scores sparse queries exhaustively term at a time and refuses drop ratios; it
# silently ignores other index parameters, so mmsparse refuses them for Lite itself.
LITE_ALGORITHMS = ("auto", "TAAT_NAIVE")
FUSIONS = ("rrf", "weighted")
MODES = ("sparse", "dense", "hybrid")
QUERIES_PER_RPC = 64  # queries per search request: responses stay well under gRPC message limits
MAX_ID_BYTES = 65535  # Milvus VARCHAR max_length
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


def _pymilvus():
    try:
        import pymilvus
    except ImportError:
        raise InputError("--engine milvus needs pymilvus and milvus-lite: pip install 'mmsparse[scale]'") from None
    return pymilvus


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """pymilvus and Milvus Lite log every failed call with a traceback; mmsparse reports the
    failure itself as one line, so their loggers are muted for the duration of the block."""
    loggers = [logging.getLogger(n) for n in ("pymilvus", "milvus_lite", "grpc")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _call(what: str, fn: Callable, *args, **kwargs):
    """Run one Milvus call; a MilvusException becomes an InputError naming `what` and the
    engine's message (Milvus errors are almost always settings or data it refuses)."""
    from pymilvus.exceptions import MilvusException

    try:
        return fn(*args, **kwargs)
    except MilvusException as e:
        msg = getattr(e, "message", None) or str(e)
        raise InputError(f"Milvus {what}: {msg}") from None


@contextlib.contextmanager
def connect(uri: str = "", token: str = "", lite_db: str | Path | None = None,
            timeout: float = 30.0) -> Iterator[object]:
    """A pymilvus MilvusClient, closed on exit.

    uri: a Milvus server (`http://host:19530`, `https://...`); empty: Milvus Lite on `lite_db`
    (a directory whose name ends in `.db`, created if missing; its parent must exist). Milvus
    Lite runs in this process and is stopped on exit (unless this process had it running
    already), which releases its lock so another process can open the database.
    timeout: seconds for connecting and for each call. Raises InputError when the server does not
    answer or the Lite database cannot be opened (e.g. another process holds it).
    """
    pm = _pymilvus()
    with _quiet_logs():
        stop = None
        if uri:
            where = uri
        else:
            if lite_db is None or not str(lite_db).endswith(".db"):
                raise ValueError("Milvus Lite needs a database path ending in .db")
            try:
                from milvus_lite.server_manager import server_manager_instance as lite
            except ImportError:
                raise InputError("Milvus Lite is not installed: pip install 'mmsparse[scale]' "
                                 "(or pass --uri of a Milvus server)") from None
            path = str(Path(lite_db).resolve())
            running = path in getattr(lite, "_servers", {})
            where = lite.start_and_get_uri(path)
            if where is None:
                raise InputError(f"{lite_db}: Milvus Lite cannot open this database (another process may be "
                                 "using it: Milvus Lite serves one process at a time); wait for it to finish, "
                                 "or use a Milvus server (--uri)")
            stop = None if running else (lambda: lite.release_server(path))
        try:
            try:
                client = pm.MilvusClient(uri=where, token=token or "", timeout=timeout)
            except pm.exceptions.MilvusException as e:
                raise InputError(f"{uri or lite_db}: Milvus does not answer ({getattr(e, 'message', e)}); "
                                 "check --uri and --token, or start the server") from None
            try:
                yield client
            finally:
                client.close()
        finally:
            if stop is not None:
                stop()


def default_collection(index_dir: str | Path) -> str:
    """The alias a build uses when none is given: INDEX_DIR's name with characters Milvus does not
    allow in names replaced by '_' (e.g. index/milvus-d2s -> milvus_d2s)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(index_dir).resolve().name) or "mmsparse"
    if not re.match(r"[A-Za-z_]", name):
        name = "c_" + name
    return name[:200]


def vocab_sha256(vocab: list[str]) -> str:
    """sha256 of the vocab terms joined by newlines: how a query file's vocab is matched to the
    index's without storing the vocab outside Milvus."""
    return hashlib.sha256("\n".join(vocab).encode("utf-8")).hexdigest()


def sparse_dicts(m: sp.csr_matrix, empty_dim: int | None = None) -> list[dict[int, float]]:
    """Rows of CSR [n, |V|] float32 as Milvus sparse vectors {term id: weight}; an empty row
    becomes {empty_dim: 1.0} when `empty_dim` is given, else {}."""
    out = []
    ind, dat, ptr = m.indices.tolist(), m.data.tolist(), m.indptr.tolist()
    for i in range(m.shape[0]):
        s, e = ptr[i], ptr[i + 1]
        out.append(dict(zip(ind[s:e], dat[s:e])) if e > s else ({empty_dim: 1.0} if empty_dim is not None else {}))
    return out


class _Docs:
    """The documents of a build: ids, sparse CSR (or None), dense [n, d] float32 (or None)."""

    def __init__(self, src: Path, dense: Path | None):
        from ..indexes.meta import hdf5_format

        self.src, self.dense_src = Path(src), (Path(dense) if dense is not None else None)
        fmt = hdf5_format(src, "collection HDF5")
        self.matrix = self.vocab = self.vectors = self.dense_attrs = None
        if fmt == "sparse":
            from ..formats.sparse import read_sparse

            col = read_sparse(src)
            self.ids, self.matrix, self.vocab, self.attrs = col.ids, col.matrix, col.vocab, col.attrs
            if self.matrix.shape[0] and self.matrix.nnz == 0:
                raise InputError(f"{src}: field 'weights' has no positive weight; every document is empty")
            if dense is not None:
                self._add_dense(dense)
        else:
            if dense is not None:
                raise InputError(f"{src}: is a dense file; --dense adds dense vectors to a sparse collection "
                                 "(pass the sparse file as INPUT)")
            from ..formats.dense import read_dense

            dc = read_dense(src)
            self.ids, self.vectors, self.attrs = dc.ids, dc.vectors, dc.attrs
        if not self.ids:
            raise InputError(f"{src}: field 'ids' is empty; nothing to index")
        longest = max(len(i.encode("utf-8")) for i in self.ids)
        if longest > MAX_ID_BYTES:
            raise InputError(f"{src}: field 'ids' has an id of {longest} bytes; Milvus keys hold at most {MAX_ID_BYTES}")
        self.id_bytes = longest

    def _add_dense(self, dense: Path) -> None:
        from ..checks import check_compatible
        from ..formats.dense import read_dense

        dc = read_dense(dense)
        pos = {i: r for r, i in enumerate(dc.ids)}
        missing = [i for i in self.ids if i not in pos]
        if missing or len(dc.ids) != len(self.ids):
            example = f" (e.g. {missing[0]!r} is missing)" if missing else ""
            raise InputError(f"{dense}: field 'ids' holds {len(dc.ids)} ids, not the {len(self.ids)} documents of "
                             f"{self.src}{example}; --dense must hold the same documents")
        check_compatible(dc.attrs, self.attrs, ("modality", "backbone", "model", "dataset", "split"), str(dense),
                         str(self.src), "pass the dense file the sparse vectors were made from")
        self.vectors = dc.vectors[[pos[i] for i in self.ids]]
        self.dense_attrs = dc.attrs

    @property
    def n(self) -> int:
        return len(self.ids)

    def rows(self, s: int, e: int) -> list[dict]:
        """Insert payload of documents s..e."""
        out = [{ID_FIELD: i} for i in self.ids[s:e]]
        if self.matrix is not None:
            for r, v in zip(out, sparse_dicts(self.matrix[s:e], empty_dim=len(self.vocab))):
                r[SPARSE_FIELD] = v
        if self.vectors is not None:
            for r, v in zip(out, self.vectors[s:e].tolist()):
                r[DENSE_FIELD] = v
        return out


def _sparse_index(algorithm: str, drop_ratio_build: float) -> dict:
    params = {}
    if algorithm != "auto":
        params["inverted_index_algo"] = algorithm
    if drop_ratio_build:
        params["drop_ratio_build"] = drop_ratio_build
    return {"index_type": "SPARSE_INVERTED_INDEX", "metric_type": "IP", "params": params}


def _dense_index(hnsw: bool, hnsw_m: int, ef_construction: int) -> dict:
    if hnsw:
        return {"index_type": "HNSW", "metric_type": "IP", "params": {"M": hnsw_m, "efConstruction": ef_construction}}
    return {"index_type": "FLAT", "metric_type": "IP", "params": {}}


def _fill(client, alias: str, docs: _Docs, sparse_index: dict, dense_index: dict, batch_size: int,
          progress: Callable[[int], None] | None) -> str:
    """Create collection `<alias>__<ms>`, insert every document in batches, index, load, and run
    one probe search per field (so settings the engine refuses fail the build, not a later
    search). Returns the collection name; drops it again if anything but a kill fails."""
    from pymilvus import DataType

    name = f"{alias}__{int(time.time() * 1000)}"
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(ID_FIELD, DataType.VARCHAR, is_primary=True, max_length=max(1, docs.id_bytes))
    if docs.matrix is not None:
        schema.add_field(SPARSE_FIELD, DataType.SPARSE_FLOAT_VECTOR)
    if docs.vectors is not None:
        schema.add_field(DENSE_FIELD, DataType.FLOAT_VECTOR, dim=int(docs.vectors.shape[1]))
    _call("create_collection", client.create_collection, name, schema=schema)
    try:
        if progress:
            progress(0)
        for s in range(0, docs.n, batch_size):
            e = min(docs.n, s + batch_size)
            _call("insert", client.insert, name, docs.rows(s, e))
            if progress:
                progress(e)
        _call("flush", client.flush, name)
        params = client.prepare_index_params()
        for field, spec in ((SPARSE_FIELD, sparse_index if docs.matrix is not None else None),
                            (DENSE_FIELD, dense_index if docs.vectors is not None else None)):
            if spec is not None:
                params.add_index(field_name=field, index_name=field, **spec)
        _call("create_index", client.create_index, name, params)
        _call("load_collection", client.load_collection, name)
        if docs.matrix is not None:
            probe = next(i for i in range(docs.n) if docs.matrix.indptr[i + 1] > docs.matrix.indptr[i])
            _call("search (sparse probe)", client.search, name, data=sparse_dicts(docs.matrix[probe]),
                  anns_field=SPARSE_FIELD, limit=1, output_fields=[ID_FIELD])
        if docs.vectors is not None:
            _call("search (dense probe)", client.search, name, data=[docs.vectors[0].tolist()],
                  anns_field=DENSE_FIELD, limit=1, output_fields=[ID_FIELD])
    except Exception:
        with contextlib.suppress(Exception):
            client.drop_collection(name)
        raise
    return name


def _swap(client, alias: str, new: str) -> list[str]:
    """Point `alias` at collection `new`, then drop every other `<alias>__*` collection.
    Returns the dropped names."""
    aliases = _call("list_aliases", client.list_aliases, new)
    if alias not in (aliases.get("aliases", []) if isinstance(aliases, dict) else aliases):
        try:
            current = client.describe_alias(alias)
        except Exception:  # no such alias yet
            current = None
        if current:
            _call("alter_alias", client.alter_alias, new, alias)
        else:
            _call("create_alias", client.create_alias, new, alias)
    dropped = []
    for c in _call("list_collections", client.list_collections):
        if c.startswith(f"{alias}__") and c != new:
            _call("drop_collection", client.drop_collection, c)
            dropped.append(c)
    return dropped


def _drop_orphans(client, alias: str, keep: set[str]) -> list[str]:
    """Drop `<alias>__*` collections that neither the alias nor the index metadata point at: the
    half-built collections of killed builds."""
    try:
        target = client.describe_alias(alias).get("collection_name")
    except Exception:
        target = None
    dropped = []
    for c in _call("list_collections", client.list_collections):
        if c.startswith(f"{alias}__") and c not in keep and c != target:
            _call("drop_collection", client.drop_collection, c)
            dropped.append(c)
    return dropped


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _existing(out_dir: Path) -> dict | None:
    """The metadata of a Milvus index at `out_dir`, or None."""
    if not (out_dir / META_NAME).is_file():
        return None
    try:
        meta = read_meta(out_dir)
    except InputError:
        return None
    return meta if meta.get("kind") == "milvus" else None


def build_milvus_index(src: str | Path, out_dir: str | Path, dense: str | Path | None = None, uri: str = "",
                       token: str = "", collection: str = "", algorithm: str = "auto",
                       drop_ratio_build: float = 0.0, hnsw: bool = False, hnsw_m: int = 32,
                       ef_construction: int = 200, ef_search: int = 128, batch_size: int = 1000,
                       timeout: float = 30.0, progress: Callable[[int], None] | None = None) -> dict:
    """Index `src` (sparse or dense HDF5; with `dense`, a dense HDF5 of the same documents stored
    beside the sparse vectors) into a Milvus collection. Returns the metadata written to
    `out_dir`/mmsparse.json.

    uri/token: a Milvus server; empty uri: Milvus Lite under out_dir/milvus.db. collection: the
    alias (default: from out_dir's name). algorithm: sparse query algorithm (auto = the engine's
    default; TAAT_NAIVE, DAAT_MAXSCORE, DAAT_WAND). drop_ratio_build: fraction in [0, 1) of each
    document's smallest sparse weights left out of the index. hnsw (hnsw_m, ef_construction,
    ef_search the default query beam): HNSW instead of exact FLAT for the dense field.
    batch_size: documents per insert call; progress: called with the documents inserted so far.
    Raises InputError for bad input or settings the engine refuses; the previous collection then
    stays in place.
    """
    if algorithm not in ALGORITHMS:
        raise InputError(f"--milvus-algorithm {algorithm!r} unknown; choose one of {', '.join(ALGORITHMS)}")
    if not 0.0 <= drop_ratio_build < 1.0:
        raise InputError(f"--milvus-drop-ratio-build must be in [0, 1), got {drop_ratio_build}")
    if collection and not _NAME.match(collection):
        raise InputError(f"--collection {collection!r}: Milvus names are letters, digits and '_', starting with a "
                         "letter or '_', at most 200 characters")
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    if not uri and (algorithm not in LITE_ALGORITHMS or drop_ratio_build):
        raise InputError(f"Milvus Lite implements only exact sparse search (--milvus-algorithm TAAT_NAIVE, drop "
                         f"ratio 0; got {algorithm}, {drop_ratio_build}); pass --uri of a Milvus server for "
                         "DAAT_MAXSCORE, DAAT_WAND and drop ratios")
    pm = _pymilvus()
    t0 = time.time()
    out_dir = Path(out_dir)
    docs = _Docs(Path(src), Path(dense) if dense is not None else None)
    alias = collection or default_collection(out_dir)
    sparse_spec = _sparse_index(algorithm, drop_ratio_build)
    dense_spec = _dense_index(hnsw, hnsw_m, ef_construction)
    old = _existing(out_dir)
    old_coll = old["milvus"]["collection"] if old else None
    in_place = bool(old) and not uri and not old["milvus"].get("uri") and (out_dir / LITE_DB).is_dir() \
        and old["milvus"].get("alias") == alias

    def meta_for(client, new: str, lite_db: Path | None) -> dict:
        fields = ([SPARSE_FIELD] if docs.matrix is not None else []) + ([DENSE_FIELD] if docs.vectors is not None else [])
        meta = {
            "kind": "milvus",
            "source": str(docs.src.resolve()),
            "source_attrs": source_attrs(docs.attrs),
            "num_docs": docs.n,
            "fields": fields,
            "metric": "inner_product",
            "milvus": {"uri": uri or None, "lite_db": LITE_DB if lite_db is not None else None, "alias": alias,
                       "collection": new, "token": "given at build (not stored)" if token else None},
            "settings": {"engine": "milvus", "engine_version": str(_call("get_server_version",
                                                                          client.get_server_version)),
                         "client": f"pymilvus {pm.__version__}", "batch_size": batch_size},
            "bytes": {"ids": int(sum(len(i.encode("utf-8")) for i in docs.ids))},
        }
        if docs.matrix is not None:
            meta.update(vocab_size=len(docs.vocab), vocab_sha256=vocab_sha256(docs.vocab), nnz=int(docs.matrix.nnz),
                        empty_docs=int((np.diff(docs.matrix.indptr) == 0).sum()), empty_marker_dim=len(docs.vocab))
            meta["settings"]["sparse_index"] = sparse_spec
            meta["bytes"]["sparse_payload"] = int(docs.matrix.nnz) * 8  # uint32 term id + float32 weight
        if docs.vectors is not None:
            meta.update(dim=int(docs.vectors.shape[1]))
            meta["settings"]["dense_index"] = {**dense_spec, **({"search_params": {"ef": ef_search}} if hnsw else {})}
            meta["bytes"]["dense_payload"] = int(docs.vectors.size) * 4
            if docs.dense_src is not None:
                meta.update(dense_source=str(docs.dense_src.resolve()), dense_source_attrs=source_attrs(docs.dense_attrs))
        if lite_db is not None:
            meta["bytes"]["lite_db"] = _du(lite_db)
        meta["build_seconds"] = round(time.time() - t0, 3)
        return meta

    if in_place:  # rebuild inside the existing Lite database: new collection, metadata, alias, drop old
        db = out_dir / LITE_DB
        with connect(lite_db=db, timeout=timeout) as client:
            _drop_orphans(client, alias, {old_coll})
            new = _fill(client, alias, docs, sparse_spec, dense_spec, batch_size, progress)
            meta = meta_for(client, new, db)
            write_meta(out_dir, meta)
            _swap(client, alias, new)
        meta["bytes"]["lite_db"] = _du(db)  # once Milvus Lite has stopped and compacted its files
        write_meta(out_dir, meta)
        return meta
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is a file; --out must be a directory path")
    with atomic_path(out_dir, directory=True) as tmp:
        if uri:
            with connect(uri, token, timeout=timeout) as client:
                _drop_orphans(client, alias, {old_coll} if old_coll else set())
                new = _fill(client, alias, docs, sparse_spec, dense_spec, batch_size, progress)
                meta = meta_for(client, new, None)
                write_meta(tmp, meta)
        else:
            db = tmp / LITE_DB
            with connect(lite_db=db, timeout=timeout) as client:  # stopped before the directory is renamed
                new = _fill(client, alias, docs, sparse_spec, dense_spec, batch_size, progress)
                _swap(client, alias, new)
                meta = meta_for(client, new, db)
            meta["bytes"]["lite_db"] = _du(db)  # once Milvus Lite has stopped and compacted its files
            write_meta(tmp, meta)
    if uri:  # the directory names the new collection: now move the alias and drop the old one
        with connect(uri, token, timeout=timeout) as client:
            _swap(client, alias, new)
    return meta


class MilvusSearcher:
    """Top-k search over a Milvus index directory: sparse, dense, or hybrid (both, fused).

    token: for a server index (never stored in the directory). drop_ratio_search: fraction in
    [0, 1) of each sparse query's smallest weights ignored. ef_search: HNSW query beam (0: the
    index's setting; at least k is used). threads: unused (Milvus parallelises on the server).
    A context manager; `close()` releases the connection (and stops Milvus Lite).
    Raises InputError if the directory, database or collection is missing.
    """

    kind = "milvus"
    ids = None  # results carry the document ids themselves

    def __init__(self, index_dir: str | Path, threads: int = 1, token: str = "", drop_ratio_search: float = 0.0,
                 ef_search: int = 0, timeout: float = 30.0):
        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "milvus":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not milvus")
        if not 0.0 <= drop_ratio_search < 1.0:
            raise InputError(f"--milvus-drop-ratio-search must be in [0, 1), got {drop_ratio_search}")
        m = self.meta["milvus"]
        self.collection, self.fields = m["collection"], list(self.meta["fields"])
        self.dim = self.meta.get("dim")
        self.vocab_size, self.vocab_sha256 = self.meta.get("vocab_size"), self.meta.get("vocab_sha256")
        self.drop_ratio_search = drop_ratio_search
        dense = self.meta.get("settings", {}).get("dense_index", {})
        self.hnsw = dense.get("index_type") == "HNSW"
        self.ef_search = ef_search or dense.get("search_params", {}).get("ef", 0)
        if ef_search and not self.hnsw:
            raise InputError(f"--ef-search applies to HNSW indexes only; {self.dir} has a "
                             f"{dense.get('index_type', 'no')} dense index")
        self._stack = contextlib.ExitStack()
        where = m.get("uri")
        if not where and drop_ratio_search:
            raise InputError(f"{self.dir}: Milvus Lite implements only exact sparse search "
                             "(--milvus-drop-ratio-search 0); drop ratios need a Milvus server index (index --uri)")
        if not where:
            db = self.dir / (m.get("lite_db") or LITE_DB)
            if not db.is_dir():
                raise InputError(f"{self.dir}: index is incomplete (no {db.name}/); rebuild it")
        try:
            self.client = self._stack.enter_context(connect(where or "", token, None if where else db, timeout))
            with _quiet_logs():
                if not _call("has_collection", self.client.has_collection, self.collection):
                    raise InputError(f"{self.dir}: collection {self.collection!r} is gone from "
                                     f"{where or db}; rebuild the index with `mmsparse index --engine milvus`")
                _call("load_collection", self.client.load_collection, self.collection)
        except BaseException:
            self._stack.close()
            raise

    def close(self) -> None:
        """Close the connection (stop Milvus Lite if this searcher started it)."""
        self._stack.close()

    def __enter__(self) -> "MilvusSearcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _need(self, field: str) -> None:
        if field not in self.fields:
            what = {"sparse": "a sparse collection as INPUT", "dense": "--dense DENSE.h5 (or a dense INPUT)"}[field]
            raise InputError(f"{self.dir}: the collection has no {field} vectors (fields: {', '.join(self.fields)}); "
                             f"build it with {what}")

    def _sparse_param(self) -> dict:
        params = {"drop_ratio_search": self.drop_ratio_search} if self.drop_ratio_search else {}
        return {"metric_type": "IP", "params": params}

    def _dense_param(self, k: int) -> dict:
        return {"metric_type": "IP", "params": {"ef": max(int(self.ef_search), k)} if self.hnsw else {}}

    @staticmethod
    def _hits(res) -> list[list[tuple[str, float]]]:
        return [[(str(h[ID_FIELD] if ID_FIELD in h else h["id"]), float(h["distance"])) for h in hits] for hits in res]

    def search_sparse(self, queries: sp.csr_matrix, k: int) -> list[list[tuple[str, float]]]:
        """Top-k of each sparse query row (CSR [nq, |V|] float32 >= 0, the index's vocab):
        nq lists of (doc id, <q, d>) by decreasing score; empty rows get []."""
        self._need(SPARSE_FIELD)
        q = sp.csr_matrix(queries)
        out: list[list[tuple[str, float]]] = [[] for _ in range(q.shape[0])]
        live = np.flatnonzero(np.diff(q.indptr) > 0)
        k = min(k, int(self.meta["num_docs"]))
        with _quiet_logs():
            for s in range(0, len(live), QUERIES_PER_RPC):
                rows = live[s:s + QUERIES_PER_RPC]
                res = _call("search", self.client.search, self.collection, data=sparse_dicts(q[rows]),
                            anns_field=SPARSE_FIELD, limit=k, output_fields=[ID_FIELD],
                            search_params=self._sparse_param())
                for r, hits in zip(rows, self._hits(res)):
                    out[r] = hits
        return out

    def search_dense(self, vectors: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """Top-k of each dense query [nq, d] float32: nq lists of (doc id, <q, d>)."""
        self._need(DENSE_FIELD)
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(f"queries have dimension {x.shape[-1]}, the index has {self.dim}")
        k = min(k, int(self.meta["num_docs"]))
        out = []
        with _quiet_logs():
            for s in range(0, len(x), QUERIES_PER_RPC):
                res = _call("search", self.client.search, self.collection, data=x[s:s + QUERIES_PER_RPC].tolist(),
                            anns_field=DENSE_FIELD, limit=k, output_fields=[ID_FIELD],
                            search_params=self._dense_param(k))
                out.extend(self._hits(res))
        return out

    def search_hybrid(self, queries: sp.csr_matrix, vectors: np.ndarray, k: int, candidates: int = 1000,
                      fusion: str = "rrf", rrf_k: int = 60, sparse_weight: float = 0.5,
                      dense_weight: float = 0.5) -> list[list[tuple[str, float]]]:
        """Hybrid top-k: per query, the sparse route (row of `queries`) and the dense route (row of
        `vectors`, same order) each fetch `candidates` documents and the ranker fuses them
        (module docstring: rrf or weighted). Returns nq lists of (doc id, fused score). A query
        with an empty sparse vector is ranked by its dense route alone."""
        from pymilvus import AnnSearchRequest, RRFRanker, WeightedRanker

        self._need(SPARSE_FIELD)
        self._need(DENSE_FIELD)
        if fusion not in FUSIONS:
            raise InputError(f"--fusion {fusion!r} unknown; choose rrf or weighted")
        if fusion == "rrf" and rrf_k < 1:
            raise InputError(f"--rrf-k must be >= 1, got {rrf_k}")
        if fusion == "weighted" and (sparse_weight < 0 or dense_weight < 0 or sparse_weight + dense_weight <= 0):
            raise InputError("--sparse-weight and --dense-weight must be >= 0 and not both 0")
        q = sp.csr_matrix(queries)
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(f"dense queries have dimension {x.shape[-1]}, the index has {self.dim}")
        if x.shape[0] != q.shape[0]:
            raise ValueError("sparse and dense queries must have the same rows")
        c = min(candidates, int(self.meta["num_docs"]))
        k = min(k, int(self.meta["num_docs"]))
        ranker = RRFRanker(rrf_k) if fusion == "rrf" else WeightedRanker(sparse_weight, dense_weight)
        no_term = int(self.vocab_size) + 1  # a dimension no document holds: the empty query matches nothing
        out = []
        with _quiet_logs():
            for s in range(0, q.shape[0], QUERIES_PER_RPC):
                e = min(q.shape[0], s + QUERIES_PER_RPC)
                sq = [d or {no_term: 1.0} for d in sparse_dicts(q[s:e])]
                reqs = [AnnSearchRequest(data=sq, anns_field=SPARSE_FIELD, param=self._sparse_param(), limit=c),
                        AnnSearchRequest(data=x[s:e].tolist(), anns_field=DENSE_FIELD, param=self._dense_param(c),
                                         limit=c)]
                res = _call("hybrid_search", self.client.hybrid_search, self.collection, reqs, ranker, limit=k,
                            output_fields=[ID_FIELD])
                out.extend(self._hits(res))
        return out

