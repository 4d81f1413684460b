"""`mmsparse index --engine bmp` build options (indexes/bmp.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "BMP options"


@dataclass
class BmpOptions:
    """BMP's block-max index: integer weights and block size."""

    bmp_bits: int = option(8, "Document weights become integers of this many bits (BMP stores u8); a smaller scale "
                           "is used when needed to keep every score below 2^16 (bits).", min=1, max=8, panel=PANEL)
    bmp_block_size: int = option(32, "Consecutive documents per block whose largest term weights bound the "
                                 "block's score (documents; BMP's in-block ids are u8).", min=1, max=256, panel=PANEL)
    bmp_compress_range: bool = option(False, "Store the per-block maxima sparsely: a smaller index, slower queries.",
                                      panel=PANEL)
