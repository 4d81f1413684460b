"""`mmsparse index --engine kannolo` build options (indexes/kannolo.py reads them, with HnswOptions)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "kANNolo options"
INDEX_TYPES = ("hnsw", "flat")


@dataclass
class KannoloOptions:
    """kANNolo: the index type and the graph search's early exit (its graph: HnswOptions)."""

    kannolo_index: str = option("hnsw", "hnsw: a graph over the sparse vectors (approximate; --hnsw-m, "
                                "--ef-construction, --ef-search); flat: exhaustive, exact.", choices=INDEX_TYPES,
                                panel=PANEL)
    early_exit_threshold: float | None = option(None, "hnsw: kANNolo's early termination threshold of the graph "
                                                "search, recorded as the default of `search` (none: off).", min=0.0,
                                                panel=PANEL)
