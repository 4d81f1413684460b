"""Options of the dense baseline trained alike (`train-head --method dense`): CLIP's symmetric InfoNCE
with a learnable temperature over the towers' final layers and projections, on the data, schedule
and budget a VDR run uses (VDR paper Table 2 compares VDR_cm with CLIP and CLIP-BERT "following the
same training conditions"). The schedule options and their defaults are VDR's (vdr/config.py
PairSchedule: App. A, which follows CLIP), so one set of flags trains both alike."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import option
from ..vdr.config import PairSchedule


@dataclass
class DenseConfig(PairSchedule):
    """VDR's schedule and data stream, then the dense side's own temperature. --lr applies to the
    projections and τ, --final-lr to the final layers."""

    tau_init: float = option(0.07, "Initial learnable temperature τ (logits = cos/τ; kept >= 0.01).", min=0.01,
                             paper="0.07 (CLIP)")
