"""Dataset readers: each yields per-split image records and caption records."""

from .records import CaptionRecord, ImageRecord, SplitData
from .karpathy import read_karpathy

__all__ = ["CaptionRecord", "ImageRecord", "SplitData", "read_karpathy"]
