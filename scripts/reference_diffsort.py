"""Golden values of the diffsort package (Petersen et al., differentiable sorting
networks) written to `tests/golden/diffsort.json` for `tests/ops/test_sorting_networks.py`,
which compares `softsort_tf.ops.sorting_networks` against them without PyTorch.

diffsort and PyTorch are in the `benchmark` extra; install the CPU wheel of torch first
so that pip never pulls the CUDA build:

    pip install torch==2.13.0          # the CPU wheel
    pip install diffsort==0.2.0
    python scripts/reference_diffsort.py

Each case runs `diffsort.DiffSortNet(network, n, steepness=β, art_lambda=λ,
distribution=sigmoid)` in float64 on fixed rows (`_inputs`: standard normal rows, one
with a tie) and records its sorted values, its permutation matrix and a vector-Jacobian
product (the gradient of Σ c_v ⊙ values + Σ c_P ⊙ X for fixed cotangents). diffsort
sorts ascending and returns X with X[j, i] = weight of input j at position i; the file
stores P = Xᵀ (row i = position i), the package's orientation. 'DESCENDING' is recorded
as diffsort applied to −x (P = Xᵀ(−x), values −y(−x)), the convention of
`sorting_network_permutation_matrix`.

Bitonic cases use n where diffsort's network for n not a power of two (comparators that
touch the discarded wires dropped) equals the padded network of `sorting_networks`
(see its module docstring); `NON_MATCHING_BITONIC` lists n where they differ.
"""

from __future__ import annotations

import importlib.metadata
import json
import os

import numpy as np
import torch
from diffsort import DiffSortNet

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "diffsort.json")
SIGMOIDS = ("logistic", "logistic_phi", "gaussian", "reciprocal", "cauchy", "optimal")
STEEPNESS = (2.0, 10.0)
SIZES = (3, 5, 8)
LONG = 13  # one row, steepness 10, ascending
NON_MATCHING_BITONIC = (11, 19, 21, 22, 23, 27)


def _inputs():
    rng = np.random.default_rng(20250601)
    rows = {n: rng.standard_normal((2, n)) for n in SIZES}
    rows[8][1, 5] = rows[8][1, 2]  # a tie
    rows[LONG] = rng.standard_normal((1, LONG))
    return {n: np.array(_round(x)).reshape(x.shape) for n, x in rows.items()}


def _cotangents(batch, n):
    rng = np.random.default_rng(1000 + n)
    return rng.standard_normal((batch, n)), rng.standard_normal((batch, n, n))


def _run(x, network, sigmoid, steepness, art_lambda, direction):
    """(values, P, vjp) of diffsort in the package's orientation and direction."""
    sign = 1.0 if direction == "ASCENDING" else -1.0
    net = DiffSortNet(network, x.shape[1], steepness=steepness, art_lambda=art_lambda,
                      distribution=sigmoid)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    y, big_x = net(sign * xt)
    values = sign * y
    perm = big_x.transpose(1, 2)
    c_values, c_perm = _cotangents(*x.shape)
    total = (values * torch.tensor(c_values)).sum() + (perm * torch.tensor(c_perm)).sum()
    (vjp,) = torch.autograd.grad(total, xt)
    return values.detach().numpy(), perm.detach().numpy(), vjp.numpy()


def _round(a):
    return [float(f"{v:.10g}") for v in np.asarray(a).ravel()]


def main():
    inputs = _inputs()
    cases = []

    def add(network, n, sigmoid, steepness, art_lambda=0.25, direction="ASCENDING"):
        x = inputs[n]
        values, perm, vjp = _run(x, network, sigmoid, steepness, art_lambda, direction)
        if not all(np.all(np.isfinite(a)) for a in (values, perm, vjp)):
            raise RuntimeError(f"diffsort is not finite for {network}, n={n}, {sigmoid}")
        cases.append(dict(network=network, n=n, sigmoid=sigmoid, steepness=steepness,
                          art_lambda=art_lambda, direction=direction, shape=list(x.shape),
                          values=_round(values), perm=_round(perm), vjp=_round(vjp)))

    for network in ("odd_even", "bitonic"):
        for sigmoid in SIGMOIDS:
            for n in SIZES:
                for steepness in STEEPNESS:
                    add(network, n, sigmoid, steepness)
            add(network, 5, sigmoid, 10.0, direction="DESCENDING")
            add(network, LONG, sigmoid, 10.0)
        for art_lambda in (0.0, 0.5):
            add(network, 5, "logistic_phi", 10.0, art_lambda=art_lambda)
    payload = dict(
        source=f"diffsort {importlib.metadata.version('diffsort')}, "
               f"torch {torch.__version__}, float64",
        inputs={str(n): _round(x) for n, x in inputs.items()},
        input_shapes={str(n): list(x.shape) for n, x in inputs.items()},
        cotangent_seed="numpy default_rng(1000 + n): values [batch, n], then P [batch, n, n]",
        non_matching_bitonic=list(NON_MATCHING_BITONIC),
        cases=cases,
    )
    with open(OUT, "w") as f:
        json.dump(payload, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)} "
          f"({os.path.getsize(OUT) // 1024} KiB)")


if __name__ == "__main__":
    main()
