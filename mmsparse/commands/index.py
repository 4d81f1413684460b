"""`mmsparse index`: build a PISA (sparse) or Faiss (dense) index from an HDF5 collection."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import InputError


def main(
    input: Path = typer.Argument(..., help="Sparse or dense HDF5 collection (usually the images)."),
    out: Path = typer.Option(..., "-o", "--out", help="Index directory to create (replaced if it exists)."),
    engine: str = typer.Option("auto", help="auto: PISA for sparse input, Faiss for dense; "
                               "or pisa | seismic (sparse) | faiss (dense)."),
    threads: int = typer.Option(1, min=1, help="Indexing threads."),
    quant_bits: int = typer.Option(8, min=1, max=16, help="PISA: document weights are scaled so the "
                                   "largest becomes 2^bits-1 and rounded to integers."),
    index_encoding: str = typer.Option("block_simdbp", help="PISA posting-list codec (PISA --encoding)."),
    block_size: int = typer.Option(64, min=1, help="PISA: postings per block of the block-max WAND data."),
    query_algorithm: str = typer.Option("block_max_wand", help="PISA query algorithm recorded as the "
                                        "default for `search` (block_max_wand, maxscore, ...)."),
    hnsw: bool = typer.Option(False, "--hnsw", help="Faiss: approximate HNSW graph instead of exact "
                              "flat inner-product search."),
    hnsw_m: int = typer.Option(32, min=2, help="Faiss HNSW: neighbours per node (M)."),
    ef_construction: int = typer.Option(200, min=1, help="Faiss HNSW: build beam width (efConstruction)."),
    ef_search: int = typer.Option(128, min=1, help="Faiss HNSW: default query beam width (efSearch)."),
    seismic_postings: int = typer.Option(4000, min=1, help="Seismic: postings kept per term (n_postings)."),
    seismic_centroid_fraction: float = typer.Option(0.1, min=0.0, max=1.0, help="Seismic: blocks per "
                                                    "posting list as a fraction of its postings (centroid_fraction)."),
    seismic_summary_energy: float = typer.Option(0.4, min=0.0, max=1.0, help="Seismic: fraction of the "
                                                 "block's L1 mass kept in its summary (summary_energy)."),
    weighting: str = typer.Option("none", "--weighting", help="Sparse: none (index the weights as stored) or "
                                  "bm25 (replace them by Okapi BM25 term weights, IDF from the indexed documents, "
                                  "|d| = L1 norm; queries then count as binary terms; BM25-V, eq. 1/2/9)."),
    bm25_k1: float = typer.Option(1.5, "--bm25-k1", min=0.0, help="--weighting bm25: term-frequency saturation k1."),
    bm25_b: float = typer.Option(0.75, "--bm25-b", min=0.0, max=1.0, help="--weighting bm25: length normalisation b."),
) -> None:
    """Index a collection: sparse HDF5 -> PISA inverted index, dense HDF5 -> Faiss.

    Writes OUT/ with the engine's files and mmsparse.json (kind, source file and its attributes,
    number of documents, quantisation scale, settings, build time). The directory appears only
    when the build succeeds.
    """
    from ..atomic import kill_point
    from ..indexes._quiet import console
    from ..indexes.meta import hdf5_format

    fmt = hdf5_format(input, "collection HDF5")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is a file; --out must be a directory path")
    if engine == "auto":
        engine = "pisa" if fmt == "sparse" else "faiss"
    want = {"pisa": "sparse", "seismic": "sparse", "faiss": "dense"}
    if engine not in want:
        raise InputError(f"--engine {engine!r} unknown; choose auto, pisa, seismic or faiss")
    if want[engine] != fmt:
        raise InputError(f"{input}: is a {fmt} file but --engine {engine} indexes {want[engine]} files")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    con = console()
    import contextlib

    from ..indexes import bm25
    if weighting not in bm25.WEIGHTINGS or (weighting == "bm25" and fmt != "sparse"):
        raise InputError(f"--weighting {weighting!r}: choose none or bm25 (bm25 needs a sparse collection)")
    source = input
    with contextlib.ExitStack() as stack, \
            Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     console=con, transient=True, disable=not con.is_terminal) as bar:
        if weighting == "bm25":  # the engine indexes BM25 weights; mmsparse.json keeps the tf source
            input, bm25_info = stack.enter_context(bm25.bm25_source(source, bm25_k1, bm25_b))
        task = bar.add_task(f"indexing ({engine})", total=_count(input))

        def done(n: int) -> None:
            bar.update(task, completed=n)
            kill_point()  # tests (MMSPARSE_TEST_KILL_AFTER): interrupt the build here

        if engine == "pisa":
            from ..indexes.pisa import build_pisa_index
            meta = build_pisa_index(input, out, quant_bits=quant_bits, threads=threads,
                                    index_encoding=index_encoding, block_size=block_size,
                                    query_algorithm=query_algorithm, progress=done)
        elif engine == "seismic":
            from ..indexes.seismic import build_seismic_index
            meta = build_seismic_index(input, out, n_postings=seismic_postings,
                                       centroid_fraction=seismic_centroid_fraction,
                                       summary_energy=seismic_summary_energy, threads=threads, progress=done)
        else:
            from ..indexes.faiss_index import build_faiss_index
            meta = build_faiss_index(input, out, hnsw=hnsw, hnsw_m=hnsw_m, ef_construction=ef_construction,
                                     ef_search=ef_search, threads=threads, progress=done)
        if weighting == "bm25":
            meta = bm25.annotate_index(out, source, bm25_info)
    extra = ""
    if meta["kind"] == "pisa":
        extra = f", {meta['postings']} postings, scale {meta['quantization']['scale']:.4g}"
        if meta["dropped_postings"]:
            extra += f", {meta['dropped_postings']} weights rounded to 0 and dropped"
    con.print(f"indexed {meta['num_docs']} documents -> {out} ({meta['kind']}{extra}, "
              f"{meta['build_seconds']:.1f} s)", highlight=False, soft_wrap=True)


def _count(path: Path) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        return int(f["ids"].shape[0]) if "ids" in f else 0
