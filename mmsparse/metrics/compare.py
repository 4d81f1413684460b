"""Comparing runs: faithfulness to a dense run (Pearson, top-k overlap; D2S Table 5, Fig. 2b),
paired t-tests with Bonferroni correction (Tables 1, 3), and power-law fits of term frequencies."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def _paired(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    qs = [q for q in a if q in b]
    return np.array([a[q] for q in qs], dtype=np.float64), np.array([b[q] for q in qs], dtype=np.float64)


def pearson_per_query(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Pearson r (scipy.stats.pearsonr) of per-query values {qid: value} over the shared qids.
    NaN when fewer than 2 shared queries or either side is constant (r is undefined)."""
    from scipy.stats import pearsonr

    x, y = _paired(a, b)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(pearsonr(x, y)[0])


def paired_ttest(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float]:
    """Paired two-tailed t-test (scipy.stats.ttest_rel) of per-query values over the shared qids:
    (t statistic, p-value). Identical samples give (0.0, 1.0); fewer than 2 pairs give (nan, nan)."""
    from scipy.stats import ttest_rel

    x, y = _paired(a, b)
    if len(x) < 2:
        return math.nan, math.nan
    if np.all(x == y):
        return 0.0, 1.0
    t, p = ttest_rel(x, y)
    return float(t), float(p)


def mean_sd(values: Sequence[float]) -> tuple[float | None, float]:
    """Mean and standard deviation (ddof 1; 0.0 for one value) of per-seed figures; (None, 0.0) when empty."""
    if not len(values):
        return None, 0.0
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def welch(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of Welch's t-test (scipy.stats.ttest_ind, equal_var=False) of two seed samples;
    None with fewer than two values a side or no spread in either."""
    from scipy.stats import ttest_ind

    if len(a) < 2 or len(b) < 2 or (np.std(a) == 0 and np.std(b) == 0):
        return None
    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def bonferroni(p: float, n_tests: int) -> float:
    """Bonferroni-corrected p-value: min(1, p * n_tests); NaN stays NaN."""
    return p if math.isnan(p) else min(1.0, p * max(1, n_tests))


def top_k(docs: Mapping[str, float], k: int) -> list[str]:
    """Doc ids of the k best scores, ties broken by doc id (the order write_run uses). Only the
    entries scoring at least the k-th best score are sorted (a run of 1,000 results: ~10)."""
    if len(docs) > 4 * k > 0:
        s = np.fromiter(docs.values(), dtype=np.float64, count=len(docs))
        keep = np.flatnonzero(s >= np.partition(s, len(s) - k)[len(s) - k])
        ids = list(docs)
        docs = {ids[i]: s[i] for i in keep.tolist()}
    return [d for d, _ in sorted(docs.items(), key=lambda x: (-x[1], x[0]))[:k]]


def overlap_at_k(run_a: Mapping[str, Mapping[str, float]], run_b: Mapping[str, Mapping[str, float]],
                 k: int = 10, qids: Sequence[str] | None = None) -> dict[str, float]:
    """{qid: |top_k(a) ∩ top_k(b)| / k} for `qids` (default: queries in both runs); a query
    missing from either run scores 0."""
    qs = list(qids) if qids is not None else [q for q in run_a if q in run_b]
    out = {}
    for q in qs:
        a, b = set(top_k(run_a.get(q, {}), k)), set(top_k(run_b.get(q, {}), k))
        out[q] = len(a & b) / k
    return out


def overlap_histogram(overlaps: Mapping[str, float], k: int = 10) -> list[int]:
    """Fig. 2b as counts: [k + 1] ints, entry j = number of queries with j of their top-k shared
    (from overlap_at_k's fractions)."""
    counts = [0] * (k + 1)
    for v in overlaps.values():
        counts[min(k, max(0, round(v * k)))] += 1
    return counts


def power_law_fit(freqs: np.ndarray) -> tuple[float, float, float]:
    """Fit freq ≈ C * rank^(-a) by least squares in log-log space over the non-zero `freqs`
    (sorted decreasingly, rank 1 = most frequent), sampled at ~100 log-spaced ranks (as BM25-V
    Sec. 5 / Fig. 1). Returns (a, C, R² of the log-log fit); (nan, nan, nan) with < 2 points."""
    f = np.sort(np.asarray(freqs, dtype=np.float64)[np.asarray(freqs) > 0])[::-1]
    if len(f) < 2:
        return math.nan, math.nan, math.nan
    # fit on ~100 log-spaced ranks so the long tail (most ranks) does not dominate the fit
    r = np.unique(np.geomspace(1, len(f), 100).round().astype(np.int64))
    x, y = np.log(r), np.log(f[r - 1])
    slope, intercept = np.polyfit(x, y, 1)
    ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return float(-slope) + 0.0, float(math.exp(intercept)), r2


def power_law_exponent(freqs: np.ndarray) -> tuple[float, float]:
    """(a, C) of power_law_fit."""
    a, c, _ = power_law_fit(freqs)
    return a, c
