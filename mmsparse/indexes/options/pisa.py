"""`mmsparse index --engine pisa` build options (indexes/pisa.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "PISA options"
ALGORITHMS = ("block_max_wand", "block_max_maxscore", "maxscore", "wand", "ranked_or", "ranked_or_taat")


@dataclass
class PisaOptions:
    """PISA's inverted index: integer weights, codec, block-max blocks, default algorithm."""

    quant_bits: int = option(8, "Document weights are scaled so the largest becomes 2^bits-1 and rounded to "
                             "integers (bits).", min=1, max=16, panel=PANEL)
    index_encoding: str = option("block_simdbp", "Posting-list codec (PISA --encoding).", panel=PANEL)
    block_size: int = option(64, "Postings per block of the block-max WAND data.", min=1, panel=PANEL)
    query_algorithm: str = option("block_max_wand", "Query algorithm recorded as the default for `search` "
                                  "(block_max_wand, maxscore, ...).", panel=PANEL)
