"""Exact float64 numpy references shared by several test modules (not a test module)."""

import numpy as np
import scipy.stats


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


def np_log_sinkhorn_plan(x, y, epsilon, iterations):
    """Entropic plans between x `[..., n]` (uniform masses 1/n) and targets y `[..., m]`
    (uniform 1/m) for the cost |x_i − y_j|², by the log-domain Sinkhorn updates of Cuturi
    et al. (eq. 3), on every problem of the leading axes at once; ε is a scalar or one per
    problem `[...]`. Returns the plans `[..., n, m]`."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    eps = np.asarray(epsilon, np.float64)[..., None]  # [..., 1]
    cost = (x[..., :, None] - y[..., None, :]) ** 2
    log_a, log_b = -np.log(x.shape[-1]), -np.log(y.shape[-1])
    f, g = np.zeros(x.shape), np.zeros(y.shape)

    def softmin(v, axis):
        top = v.max(axis=axis, keepdims=True)
        return (top + np.log(np.exp(v - top).sum(axis=axis, keepdims=True))).squeeze(axis)

    for _ in range(iterations):
        f = eps * log_a - eps * softmin((g[..., None, :] - cost) / eps[..., None], -1)
        g = eps * log_b - eps * softmin((f[..., :, None] - cost) / eps[..., None], -2)
    return np.exp((f[..., :, None] + g[..., None, :] - cost) / eps[..., None])


def scipy_tau(a, b):
    """τ-b of scipy, 0 where scipy is undefined (fewer than 2 items, constant input)."""
    if len(a) < 2:
        return 0.0
    t = scipy.stats.kendalltau(a, b).statistic
    return 0.0 if not np.isfinite(t) else float(t)


def np_perm_matrix(s, direction):
    order = np.argsort(-s if direction == "DESCENDING" else s, axis=-1, kind="stable")
    return np.eye(s.shape[-1])[order]


def np_dcg(labels_in_order, k=None):
    g = 2.0 ** np.asarray(labels_in_order, np.float64) - 1.0
    disc = 1.0 / np.log2(np.arange(2, g.size + 2))
    if k is not None:
        disc[k:] = 0.0
    return float(g @ disc)


def np_ndcg(labels, scores, k=None):
    """(value, weight) of one list; labels < 0 are padding; stable order by -score."""
    labels, scores = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    keep = labels >= 0
    labels, scores = labels[keep], scores[keep]
    ideal = np_dcg(np.sort(labels)[::-1], k)
    if ideal == 0:
        return 0.0, 0.0
    order = np.argsort(-scores, kind="stable")
    return np_dcg(labels[order], k) / ideal, 1.0
