"""Exact float64 numpy references shared by several test modules (not a test module)."""

import numpy as np


def np_window_mean(x, low, high, weights=None):
    """Mean of the values whose cumulative mass lies in [low, high] (fractional overlap)."""
    x = np.asarray(x, np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, np.float64)
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order] / w.sum()
    upto = np.cumsum(ws)
    before = upto - ws
    overlap = np.clip(np.minimum(upto, high) - np.maximum(before, low), 0.0, None)
    return float(overlap @ xs / overlap.sum())
