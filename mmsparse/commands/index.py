"""`mmsparse index`: build a PISA, Seismic, BMP, kANNolo, Faiss or Milvus index from an HDF5 collection."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

PISA, SEISMIC, BMP, KANNOLO, FAISS, MILVUS, BM25 = (
    "PISA options", "Seismic options", "BMP options", "kANNolo options", "HNSW options (Faiss, Milvus dense, kANNolo)",
    "Milvus options", "BM25 weighting")


def main(
    input: Path = typer.Argument(..., help="Sparse or dense HDF5 collection (usually the images)."),
    out: Path = typer.Option(..., "-o", "--out", help="Index directory to create (replaced if it exists)."),
    engine: str = typer.Option("auto", help="auto: PISA for sparse input, Faiss for dense; "
                               "or pisa | seismic | bmp | kannolo (sparse) | faiss (dense) | milvus (sparse and/or dense); "
                               "docs/search-benchmark.md compares them."),
    threads: int = typer.Option(1, min=1, help="Indexing threads (PISA, Seismic, kANNolo, Faiss; BMP builds on one)."),
    quant_bits: int = typer.Option(8, min=1, max=16, help="Document weights are scaled so the largest "
                                   "becomes 2^bits-1 and rounded to integers (bits).", rich_help_panel=PISA),
    index_encoding: str = typer.Option("block_simdbp", help="Posting-list codec (PISA --encoding).",
                                       rich_help_panel=PISA),
    block_size: int = typer.Option(64, min=1, help="Postings per block of the block-max WAND data.",
                                   rich_help_panel=PISA),
    query_algorithm: str = typer.Option("block_max_wand", help="Query algorithm recorded as the "
                                        "default for `search` (block_max_wand, maxscore, ...).", rich_help_panel=PISA),
    seismic_postings: int = typer.Option(4000, min=1, help="Postings kept per term (n_postings).",
                                         rich_help_panel=SEISMIC),
    seismic_centroid_fraction: float = typer.Option(0.1, min=0.0, max=1.0, help="Blocks per posting list as a "
                                                    "fraction of its postings (centroid_fraction).",
                                                    rich_help_panel=SEISMIC),
    seismic_summary_energy: float = typer.Option(0.4, min=0.0, max=1.0, help="Fraction of a block's L1 mass "
                                                 "kept in its summary (summary_energy).", rich_help_panel=SEISMIC),
    bmp_bits: int = typer.Option(8, "--bmp-bits", min=1, max=8, help="Document weights become integers of this "
                                 "many bits (BMP stores u8); a smaller scale is used when needed to keep every "
                                 "score below 2^16 (bits).", rich_help_panel=BMP),
    bmp_block_size: int = typer.Option(32, "--bmp-block-size", min=1, max=256, help="Consecutive documents per "
                                       "block whose largest term weights bound the block's score (documents).",
                                       rich_help_panel=BMP),
    bmp_compress_range: bool = typer.Option(False, "--bmp-compress-range", help="Store the per-block maxima "
                                            "sparsely: a smaller index, slower queries.", rich_help_panel=BMP),
    kannolo_index: str = typer.Option("hnsw", "--kannolo-index", help="hnsw: a graph over the sparse vectors "
                                      "(approximate; --hnsw-m, --ef-construction, --ef-search); flat: exhaustive, "
                                      "exact.", rich_help_panel=KANNOLO),
    hnsw: bool = typer.Option(False, "--hnsw", help="Approximate HNSW graph instead of exact flat "
                              "inner-product search (Faiss, and Milvus' dense field).", rich_help_panel=FAISS),
    hnsw_m: int = typer.Option(32, min=2, help="HNSW: neighbours per node (M).", rich_help_panel=FAISS),
    ef_construction: int = typer.Option(200, min=1, help="HNSW: build beam width (efConstruction, nodes).",
                                        rich_help_panel=FAISS),
    ef_search: int = typer.Option(128, min=1, help="HNSW: default query beam width (efSearch, nodes), recorded for `search`.",
                                  rich_help_panel=FAISS),
    dense: Optional[Path] = typer.Option(None, "--dense", help="Dense HDF5 of the same documents, stored beside "
                                         "the sparse vectors of INPUT for dense and hybrid search.",
                                         rich_help_panel=MILVUS),
    uri: str = typer.Option("", "--uri", help="Milvus server, e.g. http://host:19530 (OUT then records only the "
                            "connection and collection); empty: Milvus Lite database OUT/milvus.db.",
                            rich_help_panel=MILVUS),
    token: str = typer.Option("", "--token", envvar="MMSPARSE_MILVUS_TOKEN", show_default=False,
                              help="Milvus server token (user:password or API key); never written to OUT.",
                              rich_help_panel=MILVUS),
    collection: str = typer.Option("", "--collection", help="Alias the collection is served under "
                                   "(empty: OUT's name, e.g. milvus_d2s).", rich_help_panel=MILVUS),
    milvus_algorithm: str = typer.Option("auto", "--milvus-algorithm", help="Sparse query algorithm: auto (the "
                                         "engine's default), TAAT_NAIVE, DAAT_MAXSCORE or DAAT_WAND "
                                         "(Milvus Lite: TAAT_NAIVE only).", rich_help_panel=MILVUS),
    milvus_drop_ratio_build: float = typer.Option(0.0, "--milvus-drop-ratio-build", min=0.0, max=0.99,
                                                  help="Fraction of each document's smallest sparse weights left "
                                                  "out of the index: smaller, faster, less exact (Milvus Lite: 0 "
                                                  "only).", rich_help_panel=MILVUS),
    batch_size: int = typer.Option(1000, "--batch-size", min=1, help="Documents per insert call (progress "
                                   "granularity).", rich_help_panel=MILVUS),
    timeout: float = typer.Option(30.0, "--timeout", min=0.1, help="Seconds to wait for the Milvus server (or "
                                  "Milvus Lite) to connect and to answer each call; a server that does not answer "
                                  "in time is an error.", rich_help_panel=MILVUS),
    weighting: str = typer.Option("none", "--weighting", help="Sparse: none (index the weights as stored) or "
                                  "bm25 (replace them by Okapi BM25 term weights, IDF from the indexed documents, "
                                  "|d| = L1 norm; queries then count as binary terms; BM25-V, eq. 1/2/9).",
                                  rich_help_panel=BM25),
    bm25_k1: float = typer.Option(1.5, "--bm25-k1", min=0.0, help="Term-frequency saturation k1.",
                                  rich_help_panel=BM25),
    bm25_b: float = typer.Option(0.75, "--bm25-b", min=0.0, max=1.0, help="Length normalisation b (0 = none, "
                                 "1 = full).", rich_help_panel=BM25),
) -> None:
    """Index a collection: sparse HDF5 -> PISA inverted index, dense HDF5 -> Faiss; or Seismic, BMP
    (block-max pruning), kANNolo (a graph over the sparse vectors), or Milvus (sparse and/or dense in one collection, Milvus Lite or a server; see docs/milvus.md).

    Writes OUT/ with the engine's files and mmsparse.json (kind, source file and its attributes,
    number of documents, quantisation scale, settings, build time). The directory appears only
    when the build succeeds; a Milvus rebuild builds a new collection, then swaps the alias.
    """
    from ..api.indexing import build_index
    from ..cli_ui import RichReporter

    build_index(input, out=out, engine=engine, threads=threads, quant_bits=quant_bits, index_encoding=index_encoding,
                block_size=block_size, query_algorithm=query_algorithm, hnsw=hnsw, hnsw_m=hnsw_m,
                ef_construction=ef_construction, ef_search=ef_search, seismic_postings=seismic_postings,
                seismic_centroid_fraction=seismic_centroid_fraction, seismic_summary_energy=seismic_summary_energy,
                bmp_bits=bmp_bits, bmp_block_size=bmp_block_size, bmp_compress_range=bmp_compress_range,
                kannolo_index=kannolo_index, weighting=weighting, bm25_k1=bm25_k1, bm25_b=bm25_b, dense=dense, uri=uri, token=token,
                collection=collection, milvus_algorithm=milvus_algorithm,
                milvus_drop_ratio_build=milvus_drop_ratio_build, batch_size=batch_size, timeout=timeout,
                progress=RichReporter())
