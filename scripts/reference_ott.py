"""Reference values of ott-jax's `soft_sort` on small fixed problems, in float64.

ott-jax is not a dependency of softsort_tf or of its tests: run this script in a
separate environment and paste what it prints into `tests/ops/sinkhorn/test_target_grid.py`
(`OTT_REFERENCE`), which checks our operators with `targets='regular'` against it:

    python3 -m venv /tmp/ottenv && /tmp/ottenv/bin/pip install ott-jax jax jaxlib
    /tmp/ottenv/bin/python scripts/reference_ott.py

ott-jax places m targets on the regular grid y = linspace(0, 1, m) (the paper's Fig. 2
and eq. 4) and solves with the cost |x − y|² and an absolute ε, as we do. The problems:

- "x8": eight fixed values in [0, 1] with squashing off on both sides
  (`squashing_fun=lambda z: z`, our `squash=None`), at ε = 1e-2 and 3e-2: sort, ranks
  (ott-jax's are 0-based), quantiles at (0.25, 0.5, 0.8) with width 0.05, the top-3
  values (the largest, increasing) and the top-3 mask.
- "u100": 100 values uniform on [0, 1] (`numpy.random.default_rng(0)`), levels
  (0.1, 0.8, 0.4) as in ott-jax's own quantile test, at ε = 1e-2, with the squashing
  matched explicitly: our 'logistic' is sigmoid(π z / √3) of the z-score z (population
  standard deviation), passed to ott-jax as `squashing_fun`. Width 0.015, ott-jax's
  default for these levels and n (min(0.02, 1.5 / n, half the smallest gap)).

Every solve uses a tight threshold (1e-13) so that both sides are converged far below
the 1e-5 the test asks for, and the script checks that ott-jax's solver converged on
each problem; problems where it does not are left out (the top-3 mask at ε = 1e-2, and
every "x8" problem at ε = 1e-3, do not converge within 200,000 iterations). The top-k
problems are mirrored for our operators (which transport −x for 'DESCENDING'): see
the test.
"""

from __future__ import annotations

import json
import math

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import ott  # noqa: E402
from ott.tools import soft_sort  # noqa: E402

X8 = [0.62, 0.05, 0.91, 0.33, 0.48, 0.27, 0.76, 0.14]
SOLVER = dict(threshold=1e-13, max_iterations=200_000)
IDENTITY = lambda z: z  # noqa: E731


def matched_logistic(z):
    """Our 'logistic' squash: sigmoid(π z / √3) of the z-score (population std)."""
    return jax.nn.sigmoid((math.pi / math.sqrt(3.0)) * (z - jnp.mean(z)) / jnp.std(z))


def converged(x, target_weights, **kw) -> bool:
    """Whether ott-jax's solver converges on this problem (if not, its numbers depend on
    its iteration count, not on the problem, and are left out)."""
    n = x.shape[0]
    out = soft_sort.transport_for_sort(x, jnp.ones(n) / n, jnp.asarray(target_weights), **kw)
    return bool(out.converged)


def quantile_weights(q, width):
    """Target weights of ott-jax's `quantile` (and ours) for sorted levels q."""
    fillers = np.diff(np.concatenate([[0.0], q, [1.0]])) - width
    fillers[[0, -1]] += width / 2
    return np.insert(fillers, np.arange(1, len(fillers)), width)


def x8_problem(epsilon: float) -> dict:
    x = jnp.asarray(X8, jnp.float64)
    kw = dict(epsilon=epsilon, squashing_fun=IDENTITY, **SOLVER)
    n, k, q = len(X8), 3, [0.25, 0.5, 0.8]
    ops = {  # name: (target weights, operator)
        "sort": (np.full(n, 1 / n), lambda: soft_sort.sort(x, **kw)),
        "ranks": (np.full(n, 1 / n), lambda: soft_sort.ranks(x, **kw)),
        "quantile": (quantile_weights(q, 0.05),
                     lambda: soft_sort.quantile(x, q=jnp.asarray(q), weight=0.05, **kw)),
        "top3": (np.r_[1 - k / n, np.full(k, 1 / n)], lambda: soft_sort.sort(x, topk=k, **kw)),
        "top3_mask": ([1 - k / n, k / n], lambda: soft_sort.topk_mask(x, k=k, **kw)),
    }
    return {name: op() for name, (b, op) in ops.items() if converged(x, b, **kw)}


def u100_problem(epsilon: float) -> dict:
    x = jnp.asarray(np.random.default_rng(0).uniform(size=100))
    q = jnp.asarray([0.1, 0.8, 0.4])
    kw = dict(epsilon=epsilon, squashing_fun=matched_logistic, **SOLVER)
    assert converged(x, quantile_weights([0.1, 0.4, 0.8], 0.015), **kw)
    return {"quantile": soft_sort.quantile(x, q=q, weight=0.015, **kw)}


def main():
    out = {
        "x8_eps1e-2": x8_problem(1e-2),
        "x8_eps3e-2": x8_problem(3e-2),
        "u100_eps1e-2": u100_problem(1e-2),
    }
    out = {name: {k: [float(f"{v:.10g}") for v in np.asarray(val).ravel()]
                  for k, val in problem.items()}
           for name, problem in out.items()}
    print(f"# ott-jax {ott.__version__}, jax {jax.__version__}")
    print("OTT_REFERENCE = {")
    for name, problem in out.items():
        print(f"    {name!r}: {{")
        for key, values in problem.items():
            print(f"        {key!r}: {json.dumps(values)},")
        print("    },")
    print("}")


if __name__ == "__main__":
    main()
