"""HNSW graph options shared by Faiss (dense), Milvus' dense field and kANNolo (sparse)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "HNSW options (Faiss, Milvus dense, kANNolo)"


@dataclass
class HnswOptions:
    """An HNSW graph: degree, build beam, default query beam (Faiss and Milvus: `hnsw` turns it on;
    kANNolo's hnsw index always uses it)."""

    hnsw: bool = option(False, "Approximate HNSW graph instead of exact flat inner-product search (Faiss, and "
                        "Milvus' dense field).", panel=PANEL)
    hnsw_m: int = option(32, "HNSW: neighbours per node (M; the authors of kANNolo use 32 on sparse MS MARCO).",
                         min=2, panel=PANEL)
    ef_construction: int = option(200, "HNSW: build beam width (efConstruction, nodes; kANNolo's authors use 2000 "
                                  "on larger machines).", min=1, panel=PANEL)
    ef_search: int = option(128, "HNSW: default query beam width (efSearch, nodes), recorded for `search`.", min=1,
                            panel=PANEL)
