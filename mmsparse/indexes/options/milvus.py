"""`mmsparse index --engine milvus` options (indexes/milvus.py reads them, with HnswOptions)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "Milvus options"


@dataclass
class MilvusOptions:
    """Milvus: where the collection lives and how its sparse field is indexed."""

    uri: str = option("", "Milvus server, e.g. http://host:19530 (OUT then records only the connection and "
                      "collection); empty: Milvus Lite database OUT/milvus.db.", panel=PANEL)
    token: str = option("", "Milvus server token (user:password or API key); never written to OUT.", panel=PANEL,
                        envvar="MMSPARSE_MILVUS_TOKEN", secret=True)
    collection: str = option("", "Alias the collection is served under (empty: OUT's name, e.g. milvus_d2s).",
                             panel=PANEL)
    milvus_algorithm: str = option("auto", "Sparse query algorithm: auto (the engine's default), TAAT_NAIVE, "
                                   "DAAT_MAXSCORE or DAAT_WAND (Milvus Lite: TAAT_NAIVE only).", panel=PANEL)
    milvus_drop_ratio_build: float = option(0.0, "Fraction of each document's smallest sparse weights left out of "
                                            "the index: smaller, faster, less exact (Milvus Lite: 0 only).",
                                            min=0.0, max=0.99, panel=PANEL)
    batch_size: int = option(1000, "Documents per insert call (progress granularity).", min=1, panel=PANEL)
    timeout: float = option(30.0, "Seconds to wait for the Milvus server (or Milvus Lite) to connect and to answer "
                            "each call; a server that does not answer in time is an error.", min=0.1, panel=PANEL)
