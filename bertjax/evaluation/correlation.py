"""Pearson and Spearman correlation in numpy (so evaluating needs no scipy at run time)."""

from __future__ import annotations

import numpy as np


def pearson(x, y) -> float:
    """NaN when either side is constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else float("nan")


def average_ranks(values) -> np.ndarray:
    """1-based ranks; tied values share the mean of their ranks (human ratings tie a lot)."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]
    first = np.flatnonzero(starts)
    sizes = np.diff(np.r_[first, len(values)])
    ranks = np.empty(len(values))
    ranks[order] = (first + (sizes + 1) / 2)[np.cumsum(starts) - 1]
    return ranks


def spearman(x, y) -> float:
    return pearson(average_ranks(x), average_ranks(y))
