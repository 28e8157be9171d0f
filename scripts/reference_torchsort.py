"""Golden values of torchsort's `soft_rank` and `soft_sort` (values and vector-Jacobian
products, float64), written to `tests/golden/torchsort.json` for
`tests/ops/test_permutahedron.py`, which compares the permutahedron operators against them
without PyTorch.

torchsort (the PyTorch implementation of Blondel et al. 2020) cannot be a requirement of
softsort_tf or of any of its extras: it is published as source only and its build needs
a C++ toolchain (and, as published, a CUDA toolkit). PyTorch itself is in the
`benchmark` extra. To regenerate the golden values, build torchsort for CPU:

    pip install torch==2.13.0                   # the CPU wheel
    # pip's download step builds the sdist's metadata, which fails without CUDA; keep
    # the unpacked source instead:
    TMPDIR=/tmp/ts pip download torchsort==0.1.10 --no-deps --no-binary :all: \\
        --no-build-isolation --no-clean -d /tmp/ts
    mv /tmp/ts/pip-download-*/torchsort_* /tmp/ts/torchsort-0.1.10
    # setup.py adds the CUDA extension whenever an `nvcc` runs: build the CPU one only
    # (make `cuda_toolkit_available()` in /tmp/ts/torchsort-0.1.10/setup.py return False)
    pip install --no-build-isolation /tmp/ts/torchsort-0.1.10
    python scripts/reference_torchsort.py

The problems (fixed inputs, in `INPUTS`): ties and a batch of 2 at n = 5, a batch of 3
standard normal rows at n = 8 (one row with ties), the same rows scaled by 100 (large
θ/ε: the log-domain paths), and a batch of 2 at n = 64. For each, both regularizations
('l2', 'kl'), the strengths in `STRENGTHS`, and both directions: torchsort is ascending
only; 'DESCENDING' is recorded as torchsort applied to −x (ranks: `soft_rank(−x)`;
sort: `−soft_sort(−x)`), the convention of `softsort_tf.ops.permutahedron`. The VJP is
the gradient of Σ cotangent ⊙ output with a fixed cotangent per input. Cases whose
torchsort values or VJPs are not finite are left out (the 'kl' ranks of "wide8" at
ε = 0.1, where torchsort's isotonic solver exponentiates θ/ε ≈ 3000).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

import numpy as np
import torch
import torchsort

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "torchsort.json")
STRENGTHS = (0.1, 1.0, 10.0)
DESCENDING_STRENGTHS = (1.0,)


def _inputs():
    rng = np.random.default_rng(20240525)
    normal8 = rng.standard_normal((3, 8))
    normal8[2, [1, 4, 6]] = normal8[2, 3]          # three ties with entry 3
    return {
        "ties5": np.array([[5.0, 1.0, 2.0, 2.0, 3.0], [0.5, 0.5, 0.5, -1.0, 2.0]]),
        "normal8": normal8,
        "wide8": 100.0 * normal8,
        "normal64": rng.standard_normal((2, 64)),
    }


def _round(a):
    return [[float(f"{v:.15g}") for v in row] for row in np.asarray(a)]


def _run(op, x, cotangent, regularization, strength, direction):
    fn = torchsort.soft_rank if op == "rank" else torchsort.soft_sort
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    sign = -1.0 if direction == "DESCENDING" else 1.0
    out = fn(sign * xt, regularization=regularization, regularization_strength=strength)
    if op == "sort":
        out = sign * out
    (out * torch.tensor(cotangent, dtype=torch.float64)).sum().backward()
    return out.detach().numpy(), xt.grad.numpy()


def main():
    # Rounded as stored, so that the test feeds exactly the inputs used here.
    inputs = {name: np.array(_round(x)) for name, x in _inputs().items()}
    rng = np.random.default_rng(7)
    cotangents = {name: np.array(_round(rng.standard_normal(x.shape)))
                  for name, x in inputs.items()}
    cases = []
    skipped = []
    for name, x in inputs.items():
        for op in ("rank", "sort"):
            for regularization in ("l2", "kl"):
                for direction, strengths in (("ASCENDING", STRENGTHS),
                                             ("DESCENDING", DESCENDING_STRENGTHS)):
                    for strength in strengths:
                        value, vjp = _run(op, x, cotangents[name], regularization,
                                          strength, direction)
                        if not (np.all(np.isfinite(value)) and np.all(np.isfinite(vjp))):
                            skipped.append(f"{name} {op} {regularization} {strength} "
                                           f"{direction}")
                            continue
                        cases.append(dict(input=name, op=op, regularization=regularization,
                                          strength=strength, direction=direction,
                                          value=_round(value), vjp=_round(vjp)))
    golden = {
        "source": (f"torchsort {importlib.metadata.version('torchsort')}"
                   f" (CPU build), torch {torch.__version__}, float64; "
                   "written by scripts/reference_torchsort.py"),
        "inputs": {name: {"x": _round(x), "cotangent": _round(cotangents[name])}
                   for name, x in inputs.items()},
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    print(f"{len(cases)} cases, non-finite left out: {skipped}; "
          f"{os.path.getsize(OUT) / 1024:.0f} KB -> {os.path.normpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
