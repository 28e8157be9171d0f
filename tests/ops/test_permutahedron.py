"""Permutahedron projections (softsort_tf.ops.permutahedron) against a float64 numpy
reference: an O(n²) pool-adjacent-violators written from the definition, checked itself
against the projection solved by scipy.optimize."""

import itertools
import json
import os

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import tensorflow as tf
from operator_cases import weighted_gradient_check

from softsort_tf.ops import permutahedron as P


def _logsumexp(v):
    """log Σ exp(v) of a finite vector (scipy.special.logsumexp's value, without its
    general handling of infinities and signs: 20 times faster on a few entries)."""
    top = v.max()
    return top + np.log(np.sum(np.exp(v - top)))


def isotonic_decreasing(s, w, kl):
    """Decreasing isotonic solution by PAV: repeatedly pool the first adjacent pair of
    blocks whose values increase (O(n²), from the definition of the blocks' values)."""
    blocks = [[i] for i in range(len(s))]

    def value(b):
        if kl:
            return _logsumexp(s[b]) - _logsumexp(w[b])
        return np.mean(s[b] - w[b])

    changed = True
    while changed:
        changed = False
        for j in range(len(blocks) - 1):
            if value(blocks[j]) < value(blocks[j + 1]):
                blocks[j:j + 2] = [blocks[j] + blocks[j + 1]]
                changed = True
                break
    v = np.empty(len(s))
    for b in blocks:
        v[b] = value(b)
    return v


def ref_rank(x, eps, kl):
    z = x / eps
    order = np.argsort(-z, kind="stable")
    s = z[order]
    rho = np.arange(len(x), 0, -1.0)
    w = np.log(rho) if kl else rho
    out = np.empty(len(x))
    out[order] = s - isotonic_decreasing(s, w, kl)
    return np.exp(out) if kl else out


def ref_sort(x, eps, kl):
    sw = np.sort(-x)[::-1]
    rho = np.arange(len(x), 0, -1.0) / eps
    return isotonic_decreasing(rho, sw, kl) - rho


def test_reference_is_the_euclidean_projection():
    """The l2 rank is argmin ½‖μ − θ/ε‖² over the permutahedron of (n, ..., 1),
    written as its linear inequalities (sums of the k largest ≤ those of ρ)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=5)
    z = x / 0.7
    n = len(x)
    rho = np.arange(n, 0, -1.0)
    cons = [{"type": "eq", "fun": lambda m: m.sum() - rho.sum()}]
    for k in range(1, n):
        for subset in itertools.combinations(range(n), k):
            cons.append({"type": "ineq",
                         "fun": lambda m, s=subset, k=k: rho[:k].sum() - m[list(s)].sum()})
    res = scipy.optimize.minimize(lambda m: 0.5 * np.sum((m - z) ** 2), np.full(n, 3.0),
                                  jac=lambda m: m - z, constraints=cons, method="SLSQP",
                                  options={"ftol": 1e-14, "maxiter": 500})
    np.testing.assert_allclose(ref_rank(x, 0.7, False), res.x, atol=1e-6)


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_values_match_reference(reg, eps):
    x = np.random.default_rng(1).normal(size=[3, 8]) * 2
    kl = reg == "kl"
    r = P.permutahedron_rank(x, reg, eps).numpy()
    s = P.permutahedron_sort(x, reg, eps).numpy()
    np.testing.assert_allclose(r, np.stack([ref_rank(v, eps, kl) for v in x]), atol=1e-10)
    np.testing.assert_allclose(s, np.stack([ref_sort(v, eps, kl) for v in x]), atol=1e-10)
    rd = P.permutahedron_rank(x, reg, eps, "DESCENDING").numpy()
    np.testing.assert_allclose(rd, np.stack([ref_rank(-v, eps, kl) for v in x]), atol=1e-10)
    sd = P.permutahedron_sort(x, reg, eps, "DESCENDING").numpy()
    np.testing.assert_allclose(sd, np.stack([-ref_sort(-v, eps, kl) for v in x]), atol=1e-10)
    if not kl:
        np.testing.assert_allclose(r.sum(-1), 8 * 9 / 2, atol=1e-9)
        np.testing.assert_allclose(s.sum(-1), x.sum(-1), atol=1e-9)


def test_paper_examples():
    """θ = (5, 1, 2), worked by hand: hard ranks for small ε; for large ε the projection
    is θ/ε shifted to the mean rank; at ε = 2, θ/ε − ρ (sorted) = (−½, −1, −½) pools its
    last two entries to −¾, giving the ranks (3, 1.25, 1.75)."""
    x = np.array([[5.0, 1.0, 2.0]])
    np.testing.assert_allclose(P.permutahedron_rank(x, "l2", 0.1).numpy(), [[3, 1, 2]])
    np.testing.assert_allclose(P.permutahedron_rank(x, "l2", 100.0).numpy(),
                               x / 100 - np.mean(x / 100) + 2, atol=1e-12)
    np.testing.assert_allclose(P.permutahedron_rank(x, "l2", 2.0).numpy(), [[3, 1.25, 1.75]],
                               atol=1e-12)


def test_hard_limit():
    x = np.random.default_rng(2).normal(size=[2, 30])
    for reg in ("l2", "kl"):
        np.testing.assert_allclose(P.permutahedron_rank(x, reg, 1e-4).numpy(),
                                   scipy.stats.rankdata(x, axis=-1), atol=1e-9)
        np.testing.assert_allclose(P.permutahedron_sort(x, reg, 1e-4).numpy(),
                                   np.sort(x, axis=-1), atol=1e-9)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_gradients_match_finite_differences(reg):
    """Gradients of two random weightings of the outputs against central differences
    along every input entry, all evaluated in one batched call per operator."""
    x = np.random.default_rng(3).normal(size=[2, 6])
    for name, fn in (("rank", lambda v: P.permutahedron_rank(v, reg, 0.7)),  # noqa: B023
                     ("sort", lambda v: P.permutahedron_sort(v, reg, 0.7,  # noqa: B023
                                                             "DESCENDING"))):
        grad, num = weighted_gradient_check(fn, [x], delta=1e-6, seed=4)
        assert np.all(np.isfinite(grad)), name
        np.testing.assert_allclose(grad, num, atol=1e-6, err_msg=name)


def test_xla_equals_eager_dynamic_n():
    spec = [tf.TensorSpec([None, None], tf.float32)]

    @tf.autograph.experimental.do_not_convert
    def both(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outs = [P.permutahedron_rank(x, "l2", 0.5), P.permutahedron_sort(x, "kl", 0.5)]
            loss = sum(tf.reduce_sum(o * tf.sin(o)) for o in outs)
        return outs + [tape.gradient(loss, x)]

    xla = tf.function(both, jit_compile=True, input_signature=spec)
    x = tf.constant(np.random.default_rng(5).normal(size=[3, 7]).astype(np.float32))
    for got, want in zip(xla(x), both(x), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_new_lengths_and_batch_sizes_reuse_one_compiled_pav(monkeypatch):
    """Outside an XLA caller, the compiled PAV is called on lists padded to the next
    power of two (at least 8) of the batch size and of the length, so that lists of new
    lengths and batch sizes reuse its compiled program; the values are those of the
    unpadded lists, by the reference, eagerly and in a graph of unknown shape. Under XLA
    the program has the lists' own shape."""
    seen = {False: [], True: []}
    for kl, pav in ((False, P._pav_l2), (True, P._pav_kl)):
        def spy(a, c, rows, length, pav=pav, shapes=seen[kl]):
            # The shape the compiled program runs on: static inside an XLA caller, else
            # recorded when it runs.
            if P._in_xla_context():
                shapes.append(a.shape.as_list())
                return pav(a, c, rows, length)
            record = tf.py_function(lambda s: shapes.append(s.numpy().tolist()) or 0,
                                    [tf.shape(a)], tf.int32)
            with tf.control_dependencies([record]):
                return pav(tf.identity(a), c, rows, length)

        monkeypatch.setattr(P, "_pav_kl" if kl else "_pav_l2", spy)
        # The package's padding function, traced afresh so that it calls the spy.
        name = "_padded_pav_kl" if kl else "_padded_pav_l2"
        monkeypatch.setattr(P, name, tf.function(getattr(P, name).python_function))
    rng = np.random.default_rng(11)
    graph = tf.function(lambda x: [P.permutahedron_rank(x, "kl", 0.3),
                                   P.permutahedron_sort(x, "l2", 0.3)],
                        input_signature=[tf.TensorSpec([None, None], tf.float64)])
    for batch, n, padded in [(1, 1, [8, 8]), (3, 9, [8, 16]), (5, 16, [8, 16]),
                             (9, 13, [16, 16])]:
        x = rng.normal(size=[batch, n])
        for rank, sort in (P.permutahedron_rank(x, "kl", 0.3),
                           P.permutahedron_sort(x, "l2", 0.3)), graph(tf.constant(x)):
            assert rank.shape == sort.shape == (batch, n)
            assert np.all(np.isfinite(rank.numpy())) and np.all(np.isfinite(sort.numpy()))
            np.testing.assert_allclose(rank.numpy(), [ref_rank(r, 0.3, True) for r in x],
                                       rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(sort.numpy(), [ref_sort(r, 0.3, False) for r in x],
                                       rtol=1e-12, atol=1e-12)
            assert seen[True].pop() == seen[False].pop() == padded
    buckets = [int(P._bucket(tf.constant(k))) for k in range(0, 70)]
    assert buckets == [max(8, 1 << max(k - 1, 0).bit_length()) for k in range(0, 70)]
    xla = tf.function(lambda x: P.permutahedron_rank(x, "l2", 0.3), jit_compile=True)
    xla(tf.constant(rng.normal(size=[3, 9])))
    assert seen[False] == [[3, 9]]


def test_an_empty_batch_gives_empty_results():
    """A batch of no lists (a last, empty shard of a distributed batch, say) gives empty
    ranks, sorts and gradients, eagerly, in a graph of unknown shape and under XLA (the
    compiled PAV had failed on a zero-size shape)."""
    def both(x):
        return [P.permutahedron_rank(x, "kl", 0.3), P.permutahedron_sort(x, "l2", 0.3)]

    spec = [tf.TensorSpec([None, None], tf.float32)]
    graph = tf.function(both, input_signature=spec)
    xla = tf.function(both, input_signature=spec, jit_compile=True)
    x = tf.zeros([0, 5])
    with tf.GradientTape() as tape:
        tape.watch(x)
        outs = [P.permutahedron_rank(x, "l2", 0.3), P.permutahedron_sort(x, "kl", 0.3)]
        loss = sum(tf.reduce_sum(o) for o in outs)
    assert [o.shape for o in outs] == [(0, 5), (0, 5)]
    assert tape.gradient(loss, x).shape == (0, 5)
    assert [o.shape for o in graph(x)] == [o.shape for o in xla(x)] == [(0, 5), (0, 5)]


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_reduced_precision(dtype):
    x = tf.cast(tf.constant([[0.5, -1.0, 2.0, 0.25]]), dtype)
    for fn in (P.permutahedron_rank, P.permutahedron_sort):
        out = fn(x, "l2", 0.5)
        assert out.dtype == dtype
        np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(),
                                   fn(tf.cast(x, tf.float32), "l2", 0.5).numpy(), atol=0.02)


def test_bad_input():
    x = tf.constant([[1.0, 2.0]])
    with pytest.raises(ValueError, match="regularization"):
        P.permutahedron_rank(x, "l1")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="regularization_strength"):
            P.permutahedron_sort(x, "l2", bad)
    with pytest.raises(ValueError, match="mask"):
        P.permutahedron_rank(x, mask=[True, False])
    with pytest.raises(ValueError, match="direction"):
        P.permutahedron_rank(x, direction="UP")


# torchsort 0.1.10's soft_rank / soft_sort (values and VJPs, float64), written by
# scripts/reference_torchsort.py; 'DESCENDING' is torchsort applied to −x.
with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden",
                       "torchsort.json")) as _f:
    TORCHSORT = json.load(_f)


@pytest.mark.parametrize("case", TORCHSORT["cases"], ids=lambda c: "-".join(
    str(c[k]) for k in ("input", "op", "regularization", "strength", "direction")))
def test_matches_torchsort(case):
    """Values and vector-Jacobian products equal torchsort's to 1e-5, ties included
    (neighbouring blocks of equal value pooled, as torchsort does)."""
    inputs = TORCHSORT["inputs"][case["input"]]
    x = tf.constant(inputs["x"], tf.float64)
    cotangent = tf.constant(inputs["cotangent"], tf.float64)
    fn = P.permutahedron_rank if case["op"] == "rank" else P.permutahedron_sort
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = fn(x, case["regularization"], case["strength"], case["direction"])
        loss = tf.reduce_sum(cotangent * out)
    vjp = tape.gradient(loss, x).numpy()
    assert np.all(np.isfinite(out.numpy())) and np.all(np.isfinite(vjp))
    np.testing.assert_allclose(out.numpy(), case["value"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(vjp, case["vjp"], rtol=0, atol=1e-5)


def test_torchsort_golden_covers_the_conventions():
    """The golden file holds ties, a batch, both regularizations, several strengths and
    both directions for both operators."""
    cases = TORCHSORT["cases"]
    keys = {(c["op"], c["regularization"], c["direction"]) for c in cases}
    assert keys == set(itertools.product(("rank", "sort"), ("l2", "kl"),
                                         ("ASCENDING", "DESCENDING")))
    assert {c["strength"] for c in cases} >= {0.1, 1.0, 10.0}
    assert all(np.shape(TORCHSORT["inputs"][c["input"]]["x"])[0] > 1 for c in cases)
    assert any(len(set(row)) < len(row) for row in TORCHSORT["inputs"]["ties5"]["x"])


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_non_finite_scores(reg):
    """±inf entries of a rank are the limits of scores growing without bound: an
    isolated block at the end of the order (+inf ranked n, ties averaged) while the
    finite entries get the projection of their own list onto the ρ values left between
    (for 'l2': their ranks + the number of −inf entries); a NaN makes its list NaN
    (0.3 was ranked above 0.7). The sort's limits: PAV pools a ±inf score's block with
    every other, so under 'l2' a list with +inf (−inf) entries sorts to +inf (−inf)
    throughout, with both to NaN; under 'kl' a −inf entry makes the list −inf, and +inf
    entries beside finite ones give the finite limit, that of the reference at a large
    finite score (reached there: the same at 1e3 and 1e4, gradient included).
    Other lists are untouched; gradients are finite, zero at the non-finite entries, in
    the NaN lists and in the lists whose sort is infinite throughout."""
    inf = np.inf
    x = np.array([[0.3, np.nan, 2.0, 0.7, -0.1], [0.3, -1.2, inf, 0.7, -0.1],
                  [-inf, -1.2, inf, 0.7, inf], [0.3, -1.2, 2.0, 0.7, -0.1],
                  [0.3, -inf, 2.0, 0.7, -inf], [inf] * 5])
    eps = 0.3
    xt = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        rank = P.permutahedron_rank(xt, reg, eps)
        sort = P.permutahedron_sort(xt, reg, eps)
        losses = [tf.reduce_sum(tf.where(tf.math.is_finite(o), tf.sin(o), 0.0))
                  for o in (rank, sort)]
    rank, sort = rank.numpy(), sort.numpy()
    assert np.all(np.isnan(rank[0])) and np.all(np.isnan(sort[0]))
    kl = reg == "kl"
    for i in (1, 2, 4, 5):
        row = x[i]
        fin = np.isfinite(row)
        n_neg, n_pos = np.sum(row == -inf), np.sum(row == inf)
        # The finite entries: the projection of their list onto the permutahedron of
        # the ρ values left between the −inf and +inf entries, (F..1) + n₋.
        z = row[fin] / eps
        order = np.argsort(-z, kind="stable")
        rho = np.arange(fin.sum(), 0, -1.0) + n_neg
        mu = np.empty(fin.sum())
        mu[order] = z[order] - isotonic_decreasing(z[order], np.log(rho) if kl else rho, kl)
        want = np.zeros(5)
        want[fin] = np.exp(mu) if kl else mu
        want[row == -inf] = (n_neg + 1) / 2
        want[row == inf] = 5 - (n_pos - 1) / 2
        np.testing.assert_allclose(rank[i], want, atol=1e-12)
    np.testing.assert_allclose(rank[3], ref_rank(x[3], eps, kl), atol=1e-12)
    np.testing.assert_allclose(sort[3], ref_sort(x[3], eps, kl), atol=1e-12)
    # The infinite sorts: +inf lists (row 5), −inf lists (row 4), and row 2 (both).
    assert np.all(sort[5] == inf) and np.all(sort[4] == -inf)
    if kl:
        assert np.all(sort[2] == -inf)
        far = []
        for big in (1e3, 1e4):
            row = tf.constant(np.where(x[1] == inf, big, x[1])[None])
            with tf.GradientTape() as far_tape:
                far_tape.watch(row)
                out = P.permutahedron_sort(row, reg, eps)
                far_loss = tf.reduce_sum(tf.sin(out))
            far.append((out.numpy()[0], far_tape.gradient(far_loss, row).numpy()[0]))
            np.testing.assert_allclose(far[-1][0], ref_sort(row.numpy()[0], eps, True),
                                       atol=1e-12)
        # The same at 1e3 and 1e4 (up to rounding: the midrange moves with the score).
        np.testing.assert_allclose(far[0][0], far[1][0], atol=1e-11)
        np.testing.assert_allclose(sort[1], far[1][0], atol=1e-11)
        assert np.all(np.isfinite(sort[1]))
    else:
        assert np.all(sort[1] == inf) and np.all(np.isnan(sort[2]))
    for loss in losses:
        g = tape.gradient(loss, xt).numpy()
        assert np.all(np.isfinite(g))
        assert np.all(g[~np.isfinite(x)] == 0) and np.all(g[0] == 0)
    g = tape.gradient(losses[1], xt).numpy()
    assert np.all(g[[2, 4, 5]] == 0)
    if kl:
        np.testing.assert_allclose(g[1], far[1][1], atol=1e-11)
        assert np.all(far[1][1][x[1] == inf] == 0) and np.any(g[1] != 0)
    else:
        assert np.all(g[1] == 0)


@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_regularization_strength_units_of_ranks_and_sorts(regularization):
    # What the family record says ε means: scores scaled by c are ranked as the scores
    # with ε / c (ε in the units of the scores, both regularisations) and, with 'l2',
    # sorted as c × the sort with c · ε (inverse units: ρ/ε is projected onto the
    # permutahedron of the values).
    x = np.array([[0.3, -1.2, 2.0, 0.7, 0.1], [1.5, 1.4, -0.2, 0.0, 3.1]])
    for c, eps in [(10.0, 0.5), (0.25, 2.0)]:
        rank = P.permutahedron_rank(c * x, regularization, eps).numpy()
        np.testing.assert_allclose(rank, P.permutahedron_rank(x, regularization, eps / c),
                                   rtol=1e-12, atol=1e-12)
        assert np.all(np.isfinite(rank))
        if regularization == "l2":
            sort = P.permutahedron_sort(c * x, "l2", eps).numpy()
            np.testing.assert_allclose(sort, c * P.permutahedron_sort(x, "l2", c * eps),
                                       rtol=1e-12, atol=1e-12)
            assert np.all(np.isfinite(sort))
            # and not the other way round: the test tells the two units apart
            assert np.abs(sort - c * P.permutahedron_sort(x, "l2", eps / c)).max() > 1e-3


def _mixed_rows(n=40):
    """float32 rows of different block structures: random, heavy ties with signed zeros,
    a pooling cascade (sorted gaps just above 1 with a tie at the bottom: at ε = 1 the
    bottom block absorbs its neighbours one by one), and ±inf entries."""
    rng = np.random.default_rng(9)
    tied = rng.integers(-1, 2, n).astype(np.float32)
    tied[np.flatnonzero(tied == 0)[::2]] = -0.0
    cascade = 1.01 * np.arange(n, 0, -1.0)
    cascade[-1] = cascade[-2]
    infinite = rng.normal(size=n)
    infinite[[3, 17]], infinite[29] = np.inf, -np.inf
    return np.stack([rng.normal(size=n) * 3, tied, rng.permutation(cascade),
                     infinite]).astype(np.float32)


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_float32_rows_are_independent_and_match_float64(reg):
    """The float32 path (integer sort keys, the stack one row at a time): a batch of
    rows of different block structures gives each row's values and gradients exactly as
    that row alone, matches the O(n²) float64 reference (finite rows) and the float64
    operator (all rows) to float32 rounding, and compiles with XLA to the same values."""
    x = _mixed_rows()
    w = np.random.default_rng(10).normal(size=x.shape).astype(np.float32)
    kl = reg == "kl"

    def run(v, jit=False):
        def step(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                outs = [P.permutahedron_rank(v, reg, 1.0), P.permutahedron_sort(v, reg, 1.0)]
                loss = sum(tf.reduce_sum(tf.where(tf.math.is_finite(o), w[:v.shape[0]] * o,
                                                  0.0)) for o in outs)
            return outs + [tape.gradient(loss, v)]
        fn = tf.function(step, jit_compile=True) if jit else step
        return [t.numpy() for t in fn(tf.constant(v))]

    batch = run(x)
    for got, want in zip(batch, run(x, jit=True), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # each row alone (w's first row weights it): the same numbers
    w_rows = w.copy()
    for i in range(len(x)):
        w[:1] = w_rows[i]
        alone = run(x[i:i + 1])
        for got, want in zip(batch, alone, strict=True):
            np.testing.assert_array_equal(got[i], want[0])
    w[:] = w_rows
    wide = run(x.astype(np.float64))
    for got, want in zip(batch, wide, strict=True):
        assert np.all(np.isfinite(got[np.isfinite(want)]))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for i in range(3):
        x64 = x[i].astype(np.float64)
        np.testing.assert_allclose(batch[0][i], ref_rank(x64, 1.0, kl), atol=1e-4)
        np.testing.assert_allclose(batch[1][i], ref_sort(x64, 1.0, kl), rtol=1e-5, atol=1e-4)
