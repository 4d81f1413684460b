"""`mmsparse index --engine seismic` build options (indexes/seismic.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import option

PANEL = "Seismic options"


@dataclass
class SeismicOptions:
    """Seismic (pyseismic-lsr `build_from_dataset`): how much of each posting list is kept, its
    blocks and summaries, and the k-NN graph."""

    seismic_postings: int = option(4000, "Postings kept per term on average (n_postings; a list holds at most "
                                   "max_fraction x n_postings).", min=1, panel=PANEL)
    seismic_postings_share: float | None = option(None, "n_postings as a share of the collection's documents "
                                                  "(e.g. 0.005: each list keeps about 0.5 % of the documents; "
                                                  "Seismic's authors keep about 0.14 % at 8.8M passages); replaces "
                                                  "the count of postings.", min=0.0, max=1.0, panel=PANEL)
    seismic_max_fraction: float = option(1.5, "No posting list longer than this x n_postings (max_fraction).",
                                         min=1.0, panel=PANEL)
    seismic_centroid_fraction: float = option(0.1, "Blocks per posting list as a fraction of its postings "
                                              "(centroid_fraction).", min=0.0, max=1.0, panel=PANEL)
    seismic_summary_energy: float = option(0.4, "Fraction of a block's L1 mass kept in its summary "
                                           "(summary_energy).", min=0.0, max=1.0, panel=PANEL)
    seismic_knn: int = option(0, "Neighbours per document of the k-NN graph built with the index (nknn; 0: none; "
                              "much slower to build).", min=0, panel=PANEL)
    seismic_n_knn: int = option(0, "Graph neighbours of each result scored by `search` by default (n_knn; needs "
                                "the graph; recorded, search's n_knn overrides).", min=0, panel=PANEL)

    def n_postings(self, num_docs: int) -> int:
        """n_postings for a collection of num_docs documents (the share when given)."""
        if self.seismic_postings_share is None:
            return self.seismic_postings
        return max(1, round(self.seismic_postings_share * num_docs))
