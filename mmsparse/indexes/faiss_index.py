"""Faiss index over a dense HDF5 collection: exact inner product (IndexFlatIP) or HNSW.

Layout of INDEX_DIR:
  mmsparse.json   metadata (meta.py) incl. dim, metric and HNSW settings
  faiss.index     faiss.write_index of IndexFlatIP, or IndexHNSWFlat(METRIC_INNER_PRODUCT)
  ids.json        the N document ids, Faiss row i <-> ids[i]

Score: the inner product <q, d> of the float32 vectors as stored (cosine when both sides are
L2-normalised, attribute `normalized`). Flat search is exact; HNSW is approximate, tuned by
M (graph degree), efConstruction (build beam) and efSearch (query beam, >= k is sensible).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import InputError
from ..formats.dense import iter_dense, read_dense_attrs
from .meta import read_meta, source_attrs, write_meta

INDEX_FILE = "faiss.index"
IDS_FILE = "ids.json"


def build_faiss_index(src: str | Path, out_dir: str | Path, hnsw: bool = False, hnsw_m: int = 32,
                      ef_construction: int = 200, ef_search: int = 128, threads: int = 1,
                      progress: Callable[[int], None] | None = None) -> dict:
    """Build a Faiss index of dense HDF5 `src` (vectors [N, d] float32) into `out_dir` atomically.

    hnsw: IndexHNSWFlat(d, hnsw_m, METRIC_INNER_PRODUCT) instead of exact IndexFlatIP.
    ef_construction / ef_search: HNSW beam widths (ef_search is the default for `search`).
    progress: called with the number of vectors added so far. Returns the metadata.
    Raises InputError for a non-dense or empty file or bad options.
    """
    import faiss

    attrs = read_dense_attrs(src)
    d = int(attrs["dim"])
    if hnsw and (hnsw_m < 2 or ef_construction < 1 or ef_search < 1):
        raise InputError("--hnsw-m must be >= 2 and --ef-construction/--ef-search >= 1")
    faiss.omp_set_num_threads(max(1, threads))
    t0 = time.time()
    if hnsw:
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
    else:
        index = faiss.IndexFlatIP(d)
    ids: list[str] = []
    for chunk_ids, vec in iter_dense(src):
        if vec.shape[1] != d:
            raise InputError(f"{src}: 'vectors' has {vec.shape[1]} columns but attribute dim={d}")
        if not np.isfinite(vec).all():
            raise InputError(f"{src}: field 'vectors' has NaN/Inf near id {chunk_ids[0]!r}; re-encode")
        index.add(np.ascontiguousarray(vec, dtype=np.float32))
        ids.extend(chunk_ids)
        if progress:
            progress(len(ids))
    if not ids:
        raise InputError(f"{src}: field 'ids' is empty; nothing to index")
    if len(set(ids)) != len(ids):
        raise InputError(f"{src}: field 'ids' contains duplicate ids; ids must be unique")
    with atomic_path(out_dir, directory=True) as tmp:
        faiss.write_index(index, str(tmp / INDEX_FILE))
        (tmp / IDS_FILE).write_text(json.dumps(ids), encoding="utf-8")
        meta = {
            "kind": "faiss",
            "source": str(Path(src).resolve()),
            "source_attrs": source_attrs(attrs),
            "num_docs": len(ids),
            "dim": d,
            "metric": "inner_product",
            "settings": {"engine": "faiss", "engine_version": faiss.__version__,
                         "index_type": "IndexHNSWFlat" if hnsw else "IndexFlatIP",
                         "threads": threads,
                         **({"hnsw_m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
                            if hnsw else {})},
            "build_seconds": round(time.time() - t0, 3),
        }
        write_meta(tmp, meta)
    return meta


class FaissSearcher:
    """Top-k inner-product search of dense queries over a Faiss index directory.

    threads: OpenMP threads for Faiss. ef_search: HNSW query beam (None: the index's setting);
    a search for k results uses max(ef_search, k).
    """

    kind = "faiss"

    def __init__(self, index_dir: str | Path, threads: int = 1, ef_search: int | None = None):
        import faiss

        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        if self.meta["kind"] != "faiss":
            raise InputError(f"{self.dir}: index kind is {self.meta['kind']!r}, not faiss")
        for name in (INDEX_FILE, IDS_FILE):
            if not (self.dir / name).is_file():
                raise InputError(f"{self.dir}: index is incomplete (no {name}); rebuild it")
        faiss.omp_set_num_threads(max(1, threads))
        self.index = faiss.read_index(str(self.dir / INDEX_FILE))
        self.ids: list[str] = json.loads((self.dir / IDS_FILE).read_text(encoding="utf-8"))
        self.dim = int(self.meta["dim"])
        self._hnsw_params = None
        if ef_search is not None:
            if not hasattr(self.index, "hnsw"):
                raise InputError("--ef-search applies to HNSW indexes only; this index is IndexFlatIP")
            self.index.hnsw.efSearch = int(ef_search)

    def _params(self, k: int):
        """HNSW search parameters with efSearch >= k: Faiss returns at most about efSearch
        results (padding the rest with -1), so a beam narrower than k would truncate the list."""
        if not hasattr(self.index, "hnsw") or self.index.hnsw.efSearch >= k:
            return None
        if self._hnsw_params is None or self._hnsw_params.efSearch != k:
            import faiss

            self._hnsw_params = faiss.SearchParametersHNSW(efSearch=k)
        return self._hnsw_params

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Top-k of each query. queries: [nq, d] float32. Returns nq lists of (doc row, <q, d>)."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise InputError(f"queries have dimension {q.shape[-1]}, the index has {self.dim}")
        k = min(k, self.index.ntotal)
        scores, rows = self.index.search(q, k, params=self._params(k))
        return [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0] for rr, ss in zip(rows, scores)]

    def search_one(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of one query vector [d] float32: (doc rows int64, scores float32), no padding."""
        k = min(k, self.index.ntotal)
        scores, rows = self.index.search(np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1), k,
                                         params=self._params(k))
        keep = rows[0] >= 0
        return rows[0][keep], scores[0][keep]
