"""Properties every family must have, through the front door (`soft_rank`, `soft_sort`,
`soft_topk`, `soft_quantile`, `permutation_matrix`) for every operation it defines:

- shift invariance: adding c (|c| up to 10³ × the list's spread) to float32 scores
  changes ranks, top-k masses and matrices no more than the float32 rounding of the
  shifted scores does (compared with the float64 result on the same rounded scores);
  sorted values and quantiles move by c;
- scale equivariance: x·c with the temperature scaled as its units say (× c, or ÷ c
  for a steepness, unchanged for Sinkhorn's ε on squashed scores) gives the same
  ranks, masses and matrices, and sorted values × c;
- Σ top-k = k to the dtype's precision;
- the relaxed matrices are stochastic (rows sum to 1, entries ≥ 0), doubly for the
  families that say so;
- non-finite scores: a NaN at an entry makes its whole list NaN, a ±inf entry gives
  either the limits of a score growing without bound or NaN for the whole list
  (`softsort_tf._masking`, "Non-finite scores"); other lists are untouched;
- a long float32 list agrees with the float64 computation of the same scores to
  float32 precision.

Small lists and a few cases each: the whole file runs in about 20 s."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.ops import family

FAMILIES = tuple(family.FAMILIES)
# Temperatures relative to a list of spread ~3 (standard normal scores, n = 7): soft,
# but not flat.
TEMPERATURE = {"sinkhorn": 0.05, "lapsum": 0.3, "permutahedron": 0.3, "softsort": 0.3,
               "neuralsort": 0.3, "sorting_network": 3.0}
# How the temperature follows a rescaling x·c of the scores.
# The power of c by which a family's temperature scales with the scores x·c, read from
# its record (`Family.temperature_units`).
SCALES_WITH = {name: {"scores": 1, "inverse_scores": -1, "normalized": 0}[f.temperature_units]
               for name, f in family.FAMILIES.items()}


def _operations(method):
    """`{name: fn(x, temperature)}` for every operation `method` defines, and its
    relaxed matrix (descending)."""
    fam = family.FAMILIES[method]
    ops = {}
    if "rank" in fam.operations:
        ops["rank"] = lambda x, t: ss.soft_rank(x, method, temperature=t)
    if "sort" in fam.operations:
        ops["sort"] = lambda x, t: ss.soft_sort(x, method, temperature=t)
    if "topk" in fam.operations:
        ops["topk"] = lambda x, t: ss.soft_topk(x, 3, method, temperature=t)
    if "quantile" in fam.operations:
        ops["quantile"] = lambda x, t: ss.soft_quantile(x, [0.25, 0.5, 0.8], method,
                                                        temperature=t)
    if fam.matrix_fn is not None:
        ops["matrix"] = lambda x, t: ss.permutation_matrix(x, method, temperature=t)
    return ops


# Outputs in the units of the scores (they move with a shift, scale with a rescaling).
VALUED = ("sort", "quantile")
CASES = [(m, op) for m in FAMILIES for op in _operations(m)]
# Sinkhorn's marginals are exact up to its solver's threshold: an L1 error of 1e-3 of
# the unit mass (`SinkhornOptions.threshold`), n·1e-3 in the units of P and of masses.
SINKHORN_THRESHOLD = 1e-3


def _xfail(cases, known):
    """`cases` with the (method, op) pairs of `known` marked xfail(strict=True)."""
    return [pytest.param(*c, marks=pytest.mark.xfail(strict=True, reason=known[c]))
            if c in known else c for c in cases]


SCALE_KNOWN = {
    ("permutahedron", "sort"): "the permutahedron sort projects ρ/ε onto the "
    "permutahedron of the scores (Blondel et al., as torchsort): equivariant under "
    "(x·c, ε/c), so its regularization_strength is in inverse units of the scores "
    "(the ranks' is in the units of the scores)",
}
LONG_KNOWN = {
    ("neuralsort", "rank"): "NeuralSort's logits (n + 1 − 2i)·s_j − Σ_k |s_j − s_k| are "
    "O(n·spread/τ) and cancel in the softmax: float32 rounds them by ~1e-3 at n = 512 "
    "(rank error 0.27); forming them in float64 brings P to 5e-7 and the ranks to 5.6e-4 "
    "but costs 1.4x (n = 100) to 2.6x (n = 512) the step's time",
    ("neuralsort", "topk"): "NeuralSort's logits cancel in float32 at large n (see rank)",
}


def _scores(seed, n=7, batch=3):
    """Standard normal scores with neighbours at least 0.05 apart."""
    rng = np.random.default_rng(seed)
    while True:
        x = rng.normal(size=[batch, n])
        if np.diff(np.sort(x, axis=-1), axis=-1).min() > 0.05:
            return x


def _finite(a):
    a = np.asarray(a)
    assert np.all(np.isfinite(a)), a
    return a


# ---------------------------------------------------------------------------------
# Shift invariance.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method, op", CASES)
def test_shift_invariance(method, op):
    """float32 scores + c, c up to 10³ × the spread: the float32 result is the float64
    result of the same (rounded) scores, within float32 rounding of the differences
    (the rounding of the shifted scores is in both; an absolute threshold or centre
    would add an error of ulp(c)/temperature)."""
    fn = _operations(method)[op]
    t = TEMPERATURE[method]
    x = _scores(1)
    for c in (3e3,):
        shifted = (x + c).astype(np.float32)
        got = _finite(fn(tf.constant(shifted), t).numpy()).astype(np.float64)
        exact = shifted.astype(np.float64)
        # The float64 lists and the same lists shifted back, as one batch (independent
        # rows): the first half is `want`, the second `base` below.
        both = fn(tf.constant(np.concatenate([exact, exact - c])), t).numpy()
        want = _finite(both[:len(exact)])
        # float32 rounding of differences (~1e-7 of the spread) amplified by at most
        # 1/temperature, and of the outputs themselves; valued outputs near c carry
        # its ulp.
        atol = 2e-5 * max(1.0, 1.0 / t) + (8 * np.spacing(np.float32(abs(c)))
                                             if op in VALUED else 0.0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=f"c={c}")
        # And the shift itself: the results of x, moved by c for valued outputs.
        base = both[len(exact):]
        np.testing.assert_allclose(want, base + (c if op in VALUED else 0.0),
                                   rtol=1e-9, atol=1e-9 * max(1.0, abs(c)) / t)


# ---------------------------------------------------------------------------------
# Scale equivariance.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method, op", _xfail(CASES, SCALE_KNOWN))
def test_scale_equivariance(method, op):
    """x·c with the temperature in the units of the scores: the same ranks, masses and
    matrices, sorted values and quantiles × c (exactly for a power of two c)."""
    fn = _operations(method)[op]
    t = TEMPERATURE[method]
    x = _scores(2)
    base = _finite(fn(tf.constant(x), t).numpy())
    for c in (2.0 ** -9, 3.7):
        got = _finite(fn(tf.constant(x * c), t * c ** SCALES_WITH[method]).numpy())
        want = base * (c if op in VALUED else 1.0)
        scale = c if op in VALUED else 1.0
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * scale,
                                   err_msg=f"c={c}")


RAW = [m for m in FAMILIES if family.FAMILIES[m].raw_scores_settings is not None]


@pytest.mark.parametrize("method", RAW)
def test_raw_scores_settings_put_the_temperature_in_the_units_of_the_scores(method):
    """A normalising family with its `raw_scores_settings` follows the scores' scale as a
    temperature in their units: P̂(x·c, T·c) = P̂(x, T), and P̂(x·c, T) differs; with its
    own normalisation (the defaults) P̂(x·c, T) = P̂(x, T). `on_raw_scores` tells the two
    apart."""
    fam = family.FAMILIES[method]
    raw = dict(fam.raw_scores_settings)
    assert fam.temperature_units == "normalized"
    assert fam.on_raw_scores(raw) and fam.on_raw_scores({**raw, "extra": 1})
    assert not fam.on_raw_scores({})
    assert (fam.units(raw), fam.units({})) == ("scores", "normalized")

    def matrix(x, t, **kwargs):
        return _finite(ss.permutation_matrix(tf.constant(x), method, temperature=t,
                                             **kwargs).numpy())

    x, t = _scores(2), 1.0
    base, normalized = matrix(x, t, **raw), matrix(x, t)
    for c in (2.0 ** -3, 3.7):
        np.testing.assert_allclose(matrix(x * c, t * c, **raw), base, rtol=1e-9, atol=1e-9,
                                   err_msg=f"c={c}")
        assert np.abs(matrix(x * c, t, **raw) - base).max() > 0.1, c
        np.testing.assert_allclose(matrix(x * c, t), normalized, rtol=1e-9, atol=1e-9)


def test_families_without_raw_scores_settings_are_never_on_raw_scores():
    for name, fam in family.FAMILIES.items():
        if fam.raw_scores_settings is None:
            assert not fam.on_raw_scores({}) and not fam.on_raw_scores({"squash": None}), name
            assert fam.units({"squash": None}) == fam.temperature_units, name


# ---------------------------------------------------------------------------------
# Σ top-k = k, stochastic matrices.
# ---------------------------------------------------------------------------------
TOPK = [m for m in FAMILIES if "topk" in family.FAMILIES[m].operations]
MATRIX = [m for m in FAMILIES if family.FAMILIES[m].matrix_fn is not None]


@pytest.mark.parametrize("method", TOPK)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_sums_to_k(method, dtype):
    """Σp = k; each p in [0, 1] for the doubly stochastic families (SoftSort's and
    NeuralSort's masses are column sums of row-stochastic rows: they may exceed 1)."""
    x = _scores(3, n=9).astype(dtype)
    eps = np.finfo(dtype).eps
    for k in (1, 4, 8):
        p = _finite(ss.soft_topk(x, k, method, temperature=TEMPERATURE[method]).numpy())
        assert p.dtype == dtype and np.all(p >= 0)
        if family.FAMILIES[method].doubly_stochastic:
            assert np.all(p <= 1 + 8 * eps)
        tol = 9 * SINKHORN_THRESHOLD if method == "sinkhorn" else 16 * eps * 9
        np.testing.assert_allclose(p.astype(np.float64).sum(-1), k, rtol=0, atol=tol)


@pytest.mark.parametrize("method", MATRIX)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matrices_are_stochastic(method, dtype):
    x = _scores(4, n=8).astype(dtype)
    eps = np.finfo(dtype).eps
    P = _finite(ss.permutation_matrix(x, method, temperature=TEMPERATURE[method]).numpy())
    assert P.dtype == dtype and np.all(P >= 0)
    tol = 8 * SINKHORN_THRESHOLD if method == "sinkhorn" else 64 * eps
    np.testing.assert_allclose(P.astype(np.float64).sum(-1), 1.0, rtol=0, atol=tol)
    if family.FAMILIES[method].doubly_stochastic:
        np.testing.assert_allclose(P.astype(np.float64).sum(-2), 1.0, rtol=0, atol=tol)


# ---------------------------------------------------------------------------------
# Non-finite scores.
# ---------------------------------------------------------------------------------
def _limit(op, row, out_finite, k=3, taus=(0.25, 0.5, 0.8), mass=1.0):
    """The limits of `op` (ascending rank and sort, descending top-k and matrix) on a
    row with ±inf entries, from its output on the finite entries alone (and for ranks,
    the finite entries' column `mass`es in the finite list's ascending matrix)."""
    inf = np.inf
    fin, pos, neg = np.isfinite(row), row == inf, row == -inf
    n, n_pos, n_neg, n_fin = len(row), pos.sum(), neg.sum(), fin.sum()
    if op == "rank":
        out = np.zeros(n)
        out[fin] = out_finite + n_neg * np.asarray(mass)
        out[neg] = (n_neg + 1) / 2
        out[pos] = n - (n_pos - 1) / 2
        return out
    if op == "sort":
        return np.concatenate([[-inf] * n_neg, out_finite, [inf] * n_pos])
    if op == "topk":
        out = np.zeros(n)
        out[pos] = min(k / n_pos, 1.0) if n_pos else 0.0
        out[fin] = out_finite
        return out
    if op == "quantile":
        levels = n * np.asarray(taus) - n_neg
        return np.where(levels <= 0, -inf, np.where(levels >= n_fin, inf, out_finite))
    out = np.zeros([n, n])   # matrix, descending: +inf rows first
    out[:n_pos][:, pos] = 1.0 / max(n_pos, 1)
    out[n_pos:n_pos + n_fin][:, fin] = out_finite
    out[n_pos + n_fin:][:, neg] = 1.0 / max(n_neg, 1)
    return out


# The (family, operation) pairs whose lists with a ±inf score are NaN (docs/api.md,
# "Non-finite scores"); the others take the limits.
NAN_ON_INFINITY = {(method, op) for method in ("sinkhorn", "sorting_network")
                   for op in ("rank", "sort", "topk", "quantile", "matrix")}
# The pairs whose limit moves the whole list with its infinities (the permutahedron
# sort's projection pools an infinite score with every entry): infinities of one sign
# give that infinity throughout, of both signs NaN.
WHOLE_LIST_LIMIT = {("permutahedron", "sort")}


@pytest.mark.parametrize("method, op", CASES)
def test_non_finite_scores(method, op):
    """NaN: the whole list NaN. ±inf: the limits (finite entries as in the finite list
    alone) or the whole list NaN. The other lists of the batch are untouched and their
    gradient finite."""
    fn = _operations(method)[op]
    fam = family.FAMILIES[method]
    t = TEMPERATURE[method]
    inf = np.inf
    clean = np.array([0.3, -1.2, 2.0, 0.7, -0.1, 1.1])
    rows = np.array([clean, [0.3, -1.2, np.nan, 0.7, -0.1, 1.1],
                     [0.3, -1.2, inf, 0.7, -0.1, 1.1], [inf, -1.2, -inf, 0.7, inf, 1.1]])
    x = tf.constant(rows)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = fn(x, t)
        loss = tf.reduce_sum(out[:1])
    g = tape.gradient(loss, x).numpy()
    assert np.all(np.isfinite(g[0])), g
    out = out.numpy()
    np.testing.assert_allclose(out[0], fn(tf.constant(rows[:1]), t).numpy()[0], atol=1e-12)
    assert np.all(np.isnan(out[1])), out[1]
    limits = 0
    for i in (2, 3):
        if np.all(np.isnan(out[i])):
            continue
        fin = np.isfinite(rows[i])
        if (method, op) in WHOLE_LIST_LIMIT:
            signs = {np.sign(v) for v in rows[i][~fin]}
            assert len(signs) == 1, f"row {i}: infinities of both signs must give NaN"
            np.testing.assert_array_equal(out[i], np.full(len(rows[i]), signs.pop() * inf))
            limits += 1
            continue
        if op == "topk":  # the finite entries get the top-(k − n₊) of their list
            k_fin = 3 - np.sum(rows[i] == inf)
            alone = (np.ones(fin.sum()) if k_fin >= fin.sum() else
                     ss.soft_topk(rows[i][fin][None], k_fin, method,
                                  temperature=t).numpy()[0] if k_fin > 0 else
                     np.zeros(fin.sum()))
        elif op == "quantile":
            n_neg = np.sum(rows[i] == -inf)
            levels = 6 * np.array([0.25, 0.5, 0.8]) - n_neg
            inner = (levels > 0) & (levels < fin.sum())
            alone = np.zeros(3)
            alone[inner] = ss.soft_quantile(rows[i][fin][None], levels[inner] / fin.sum(),
                                            method, temperature=t).numpy()[0]
        else:
            alone = fn(tf.constant(rows[i][fin][None]), t).numpy()[0]
        mass = 1.0
        if op == "rank" and fam.matrix_fn is not None and not fam.doubly_stochastic:
            # Ranks read off P̂ (Σ_i i·P̂[i, j]): the infinities before an entry add
            # n₋ × its column's mass, the finite list's column sum.
            mass = ss.permutation_matrix(rows[i][fin][None], method, temperature=t,
                                         direction="ASCENDING").numpy()[0].sum(axis=0)
        np.testing.assert_allclose(out[i], _limit(op, rows[i], alone, mass=mass), atol=1e-9,
                                   err_msg=f"row {i}: neither the limits nor NaN")
        limits += 1
    if (method, op) in WHOLE_LIST_LIMIT:  # one sign in row 2, both in row 3
        assert limits == 1, out
    elif (method, op) not in NAN_ON_INFINITY:  # the limits in both rows
        assert limits == 2, out


# ---------------------------------------------------------------------------------
# Long lists in float32.
# ---------------------------------------------------------------------------------
# A list length each family computes in well under a second.
LONG_N = {"sinkhorn": 256, "lapsum": 20_000, "permutahedron": 4_000, "softsort": 512,
          "neuralsort": 512, "sorting_network": 64}


@pytest.mark.parametrize("method, op", _xfail([c for c in CASES if c[1] != "matrix"],
                                              LONG_KNOWN))
def test_long_float32_list_matches_float64(method, op):
    """n standard normal float32 scores at a temperature of a few neighbour spacings:
    the float32 result is the float64 result on the same scores within float32
    precision of the output's scale (ranks: a few ulp of n; masses: 1e-5; values:
    1e-5 of the spread)."""
    n = LONG_N[method]
    x = np.random.default_rng(5).normal(size=[1, n]).astype(np.float32)
    # A temperature of ~30 neighbour spacings (2.5/n in the bulk), in the family's units.
    t = {1: 75.0 / n, -1: n / 75.0, 0: 30.0 / n}[SCALES_WITH[method]]
    fn = _operations(method)[op]
    got = _finite(fn(tf.constant(x), t).numpy()).astype(np.float64)
    want = _finite(fn(tf.constant(x.astype(np.float64)), t).numpy())
    if op == "rank":
        atol = 4 * np.spacing(np.float32(n))
    elif op == "topk":
        atol = 1e-5
        np.testing.assert_allclose(got.sum(), 3.0, atol=1e-4 if method != "sinkhorn"
                                   else n * SINKHORN_THRESHOLD)
    else:
        atol = 1e-5 * (x.max() - x.min())
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
