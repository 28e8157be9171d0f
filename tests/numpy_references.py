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


def np_window_shares(x, low, high):
    """Per-example shares B·c_i of the batch-statistic losses in the hard limit, with
    uniform masses: c_i = overlap_i · x_i / (high − low), Σ_i c_i the window mean."""
    x = np.asarray(x, np.float64)
    n = x.size
    order = np.argsort(x, kind="stable")
    upto = np.arange(1, n + 1) / n
    overlap = np.clip(np.minimum(upto, high) - np.maximum(upto - 1 / n, low), 0.0, None)
    shares = np.empty(n)
    shares[order] = n * overlap * x[order] / (high - low)
    return shares
