"""Learning-to-rank benchmark: listwise losses vs pointwise, pairwise and ApproxNDCG.

Two offline, synthetic tasks (no public LTR data set is reachable here), the same model
and budget for every loss, test NDCG@k (k = 10, 5 for the Keras-RS task) on held-out
lists; one line of CSV per (task, loss, seed) in --output (appended, so a rerun with the
same --output skips what is done):

- `ltr`: queries with 10–`--max_list` documents (uniform), `--features` features per
  document. Relevance is personal to the query: the latent score of a document is
  a_q · (w_q · x) + b_q with w_q = w + `--drift` · N(0, I) (features whose relation to
  relevance varies across queries), and a query-level offset c_q is added to every
  document's features (so the absolute feature values, and the absolute scores a
  pointwise model learns, are misleading across queries). Grades 1–4 go to the top
  5 % of each query's latent scores (2 %, 1.5 %, 1 %, 0.5 %; at least one relevant
  document per query), 0 to the rest: few relevant documents in long lists. Model: an
  MLP (64, 32, 1) on a document's features. Lists padded with label −1.
- `keras_rs`: the synthetic stand-in of Keras-RS's listwise example (issue 40): 300
  users × 600 items, 100 rated items per user (80 for training lists, 20 for test
  lists), lists of 5, grades 0–4 (40/25/18/11/6 %) from the quantiles of u·v + noise
  (d = 8, noise 1), 50 training lists and 5 test lists per user; the example's model
  (user and item embeddings of 32, MLP 256, 64, 1), Adam 0.01, batch 64.

Losses written here from their definitions (on padded lists; per-list means):
MSE on the grades; pairwise hinge max(0, 1 − (s_i − s_j)), logistic log(1 + e^−(s_i −
s_j)) over pairs with y_i > y_j (Keras-RS's PairwiseHingeLoss and PairwiseLogisticLoss
up to their weighting); softmax cross-entropy −Σ_i (2^{y_i} − 1)/Σ(2^y − 1) ·
log softmax(s)_i (ListNet-style, TF-Ranking's SoftmaxLoss with gains as targets; not
checked against Keras-RS's PairwiseSoftmaxLoss); ListMLE
(Xia et al. 2008) −Σ_i log(e^{s_π(i)} / Σ_{j ≥ i} e^{s_π(j)}) over the order π by
decreasing grade (ties broken at random); ApproxNDCG (Qin, Liu & Li 2010; Bruch et al.
2019, TF-Ranking's ApproxNDCGLoss): ranks r̂_i = 1 + Σ_{j ≠ i} σ((s_j − s_i)/T), T =
0.1 by default, loss −Σ (2^{y_i} − 1)/log₂(1 + r̂_i) / IDCG. Ours through the public API
only: `softsort_tf.SoftNDCGLoss(method)` for every family at its default (scale-free)
temperature, `ListwisePermutationLoss()`, `SpearmanLoss(negative_labels_are_padding=True)`.
Keras-RS's own classes as a side-by-side reference (`krs_pairwise_hinge`,
`krs_pairwise_logistic`, `krs_listmle`; keras-rs is a test-only dependency here,
imported only when one of them is asked for).

Validation: every run also scores validation lists drawn apart from the test lists
(`ltr`: `--validation` more queries of the same task draw; `keras_rs`: 10 held-out lists
per user, 5 for validation and 5 for test, distinct lists over the user's held-out
items). A loss spec is `name[@T][+spread=λ][+nscale=p]` (`make_loss`); `--grid` runs a
loss at several temperatures, and `--summarize --select` reports for each seed the
test NDCG at the temperature with the best validation NDCG (never the test's).

    python scripts/bench_ltr.py --task=keras_rs --seeds=0 --output=/tmp/ltr.csv
    python scripts/bench_ltr.py --task=ltr --seeds=0,1,2,3,4 --epochs=10 --output=/tmp/ltr.csv
    python scripts/bench_ltr.py --task=ltr --losses= --grid='soft_ndcg_lapsum:1,3,10,30;\
        approx_ndcg:0.01,0.1,1' --output=/tmp/ltr.csv
    python scripts/bench_ltr.py --task=ltr --output=/tmp/ltr.csv --summarize --select

Diagnostics (printed, not written to --output): `--curve` prints after every epoch the
NDCG@k of 1,500 training lists, the validation and the test lists (is a gap one of
fitting or of generalisation?); `--noise` sets the `keras_rs` task's grade noise (0:
grades are quantiles of u·v alone); `--oracle` prints, for the `ltr` task, the test
NDCG@10 of the expected relevance given a document's own features, x·w (the query's
drift w_q − w is unobservable to a model that scores one document at a time), per seed:
what such a model can reach.

    python scripts/bench_ltr.py --task=keras_rs --losses=soft_ndcg_lapsum --curve \
        --noise=0 --output=/tmp/diag.csv
    python scripts/bench_ltr.py --task=ltr --seeds=0,1,2,3,4 --oracle
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import softsort_tf as ss  # noqa: E402
from softsort_tf.experiments import ranking  # noqa: E402

FAMILIES = ("sinkhorn", "lapsum", "permutahedron", "softsort", "neuralsort", "sorting_network")


# ---------------------------------------------------------------------------------
# Losses from their definitions (labels < 0 = padding).
# ---------------------------------------------------------------------------------
def _valid(y):
    return tf.cast(y >= 0, y.dtype)


def _pairs(y, s):
    """(weight of the pair (i, j): y_i > y_j, both valid; s_i − s_j)."""
    v = _valid(y)
    better = tf.cast(y[..., :, None] > y[..., None, :], y.dtype)
    weight = better * v[..., :, None] * v[..., None, :]
    return weight, s[..., :, None] - s[..., None, :]


def _per_list_mean(weight, value):
    total = tf.reduce_sum(weight, axis=[-2, -1])
    return tf.reduce_sum(weight * value, axis=[-2, -1]) / tf.maximum(total, 1.0)


def mse(y, s):
    v = _valid(y)
    return tf.reduce_sum(v * tf.square(s - tf.maximum(y, 0.0)), -1) / tf.maximum(
        tf.reduce_sum(v, -1), 1.0)


def pairwise_hinge(y, s):
    weight, diff = _pairs(y, s)
    return _per_list_mean(weight, tf.nn.relu(1.0 - diff))


def pairwise_logistic(y, s):
    weight, diff = _pairs(y, s)
    return _per_list_mean(weight, tf.nn.softplus(-diff))


def _gains(y):
    return tf.where(y > 0, tf.pow(2.0, y) - 1.0, tf.zeros_like(y))


def softmax_ce(y, s):
    v = y >= 0
    g = _gains(y)
    total = tf.reduce_sum(g, -1, keepdims=True)
    logits = tf.where(v, s, tf.fill(tf.shape(s), -1e9))
    log_p = tf.nn.log_softmax(logits, -1)
    return -tf.reduce_sum(tf.where(v, g / tf.maximum(total, 1e-9) * log_p, 0.0), -1)


def list_mle(y, s, seed=None):
    v = y >= 0
    noise = tf.random.uniform(tf.shape(y), 0.0, 1e-3, seed=seed)
    key = tf.where(v, y + noise, tf.fill(tf.shape(y), -1e9))
    order = tf.argsort(key, -1, direction="DESCENDING")
    s_sorted = tf.gather(s, order, batch_dims=1)
    v_sorted = tf.gather(v, order, batch_dims=1)
    logits = tf.where(v_sorted, s_sorted, tf.fill(tf.shape(s), -1e9))
    # log Σ_{j ≥ i} e^{s_j}: a reversed cumulative logsumexp.
    tail = tf.reverse(tf.math.cumulative_logsumexp(tf.reverse(logits, [-1]), axis=-1), [-1])
    return tf.reduce_sum(tf.where(v_sorted, tail - s_sorted, 0.0), -1)


def approx_ndcg(y, s, temperature=0.1):
    v = y >= 0
    vf = tf.cast(v, s.dtype)
    diff = (s[..., None, :] - s[..., :, None]) / temperature  # [i, j]: s_j − s_i
    others = vf[..., None, :] * (1.0 - tf.eye(tf.shape(s)[-1], dtype=s.dtype))
    ranks = 1.0 + tf.reduce_sum(others * tf.sigmoid(diff), -1)
    g = _gains(y) * vf
    dcg = tf.reduce_sum(g / (tf.math.log1p(ranks) / np.log(2.0)), -1)
    ideal_g = tf.sort(g, -1, direction="DESCENDING")
    positions = tf.cast(tf.range(1, tf.shape(s)[-1] + 1), s.dtype)
    ideal = tf.reduce_sum(ideal_g / (tf.math.log1p(positions) / np.log(2.0)), -1)
    return -tf.where(ideal > 0, dcg / tf.maximum(ideal, 1e-9), 0.0)


def _list_std(y, s):
    """Standard deviation of each list's valid scores `[batch]` (0 with < 2 valid)."""
    v = _valid(y)
    count = tf.maximum(tf.reduce_sum(v, -1), 1.0)
    mean = tf.reduce_sum(v * s, -1) / count
    return tf.sqrt(tf.reduce_sum(v * tf.square(s - mean[:, None]), -1) / count)


def spread_penalty(y, s):
    """(log std)² of each list's scores: 0 at std 1, pulls an inflating or collapsing
    spread back (lists with fewer than two distinct valid scores: 0)."""
    std = _list_std(y, s)
    ok = std > 0
    return tf.where(ok, tf.square(tf.math.log(tf.where(ok, std, 1.0))), 0.0)


def parse_spec(spec: str):
    """`base[@temperature][+spread=λ][+nscale=p][+scale=c]` → (base, temperature, λ, p,
    c)."""
    parts = spec.split("+")
    base, temperature = parts[0], None
    if "@" in base:
        base, t = base.split("@")
        temperature = float(t)
    options = dict(spread=0.0, nscale=0.0, scale=1.0, lingain=0.0)
    for part in parts[1:]:
        key, value = part.split("=")
        if key not in options:
            raise ValueError(f"unknown modifier {key!r} in {spec!r}")
        options[key] = float(value)
    return (base, temperature, options["spread"], options["nscale"], options["scale"],
            bool(options["lingain"]))


def make_loss(spec: str):
    """The loss of a spec: `base[@temperature][+spread=λ][+nscale=p][+scale=c]`.

    `@T`: ApproxNDCG's T; `ListwisePermutationLoss`'s τ (score units); for
    `soft_ndcg_*` and `spearman` a scale-free temperature in standard deviations of
    each list. `+spread=λ`: adds λ · mean (log list std)². `+nscale=p` (soft NDCG of
    LapSum, SoftSort, NeuralSort, permutahedron): each list's standardised scores are
    multiplied by (n/5)^p before ranking at T (default the family's scale-free one),
    i.e. a temperature of T · (5/n)^p standard deviations for a list of n valid items.
    `+scale=c`: the loss times c (for Adam only its ε = 1e-7 sees the difference).
    `+lingain=1`: the loss sees the labels log₂(1 + y), so that a gain 2^y − 1 is the
    grade y itself (linear gains; the metric keeps 2^y − 1).
    """
    base, temperature, spread, nscale, scale, lingain = parse_spec(spec)
    loss = _base_loss(base, temperature, nscale)
    if not spread and scale == 1.0 and not lingain:
        return loss

    def modified(y, s):
        labels = tf.where(y >= 0, tf.math.log1p(tf.maximum(y, 0.0)) / np.log(2.0), y)
        value = scale * loss(labels if lingain else y, s)
        return value + spread * tf.reduce_mean(spread_penalty(y, s))

    return modified


def _keras_rs_loss(name):
    import keras_rs  # a test-only reference here: imported only when asked for

    cls = {"krs_pairwise_hinge": keras_rs.losses.PairwiseHingeLoss,
           "krs_pairwise_logistic": keras_rs.losses.PairwiseLogisticLoss,
           "krs_listmle": keras_rs.losses.ListMLELoss}[name]
    return cls()


def _base_loss(name, temperature, nscale):
    own = {"mse": mse, "pairwise_hinge": pairwise_hinge,
           "pairwise_logistic": pairwise_logistic, "softmax_ce": softmax_ce,
           "listmle": list_mle}
    if name in own:
        fn = own[name]
        return lambda y, s: tf.reduce_mean(fn(y, s))
    if name.startswith("krs_"):
        return _keras_rs_loss(name)
    if name == "approx_ndcg":
        t = 0.1 if temperature is None else temperature
        return lambda y, s: tf.reduce_mean(approx_ndcg(y, s, t))
    if name.startswith("approx_ndcg_t"):  # the former spelling of approx_ndcg@T
        t = float(name[len("approx_ndcg_t"):])
        return lambda y, s: tf.reduce_mean(approx_ndcg(y, s, t))
    relative = {} if temperature is None else {"temperature": temperature,
                                               "scale_free": True}
    if name.startswith("soft_ndcg_"):
        family = name[len("soft_ndcg_"):]
        padding = {"negative_labels_are_padding": False} if family == "permutahedron" else {}
        if nscale:
            return _length_scaled_soft_ndcg(family, temperature, nscale, padding)
        return ss.SoftNDCGLoss(method=family, **relative, **padding)
    if name == "listwise_neuralsort":
        return ss.ListwisePermutationLoss(temperature=temperature)
    if name == "spearman":
        return ss.SpearmanLoss(negative_labels_are_padding=True, **relative)
    raise ValueError(f"unknown loss {name!r}")


def _standardized(scores, valid):
    """(s − mean) / std of each list over its valid entries (0 at padded ones; a list of
    equal scores gives 0): the standardisation of the scale-free losses."""
    v = tf.cast(valid, scores.dtype)
    n = tf.maximum(tf.reduce_sum(v, -1, keepdims=True), 1.0)
    mean = tf.reduce_sum(scores * v, -1, keepdims=True) / n
    centred = (scores - mean) * v
    std = tf.sqrt(tf.reduce_sum(centred * centred, -1, keepdims=True) / n)
    return tf.math.divide_no_nan(centred, std)


def _length_scaled_soft_ndcg(family, temperature, power, padding):
    if family == "sinkhorn":
        raise ValueError("+nscale: Sinkhorn's squash standardises the scores again")
    if temperature is None:  # the scale-free default, in standard deviations
        temperature = ss.SoftNDCGLoss(method=family, **padding).get_config()["temperature"]
    inner = ss.SoftNDCGLoss(method=family, temperature=temperature, scale_free=False,
                            **padding)

    def loss(y, s):
        valid = y >= 0 if not padding else tf.ones_like(y, tf.bool)
        n = tf.reduce_sum(tf.cast(valid, s.dtype), -1, keepdims=True)
        z = _standardized(s, valid) * tf.pow(n / 5.0, power)
        return inner(y, z)

    return loss


# Left out of the 'ltr' task by default: the permutahedron takes no padding, and the
# odd-even sorting network has n layers of O(n²) (lists of 200: more than 13 minutes
# for 8 epochs, stopped).
LTR_LEFT_OUT = ("soft_ndcg_permutahedron", "soft_ndcg_sorting_network")
DEFAULT_LOSSES = ("mse", "pairwise_hinge", "pairwise_logistic", "softmax_ce",
                  "listmle", "approx_ndcg", *(f"soft_ndcg_{f}" for f in FAMILIES),
                  "listwise_neuralsort", "spearman")


# ---------------------------------------------------------------------------------
# Tasks.
# ---------------------------------------------------------------------------------
def ltr_data(seed, queries, max_list, features, drift, min_list=10):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=features)
    lengths = rng.integers(min_list, max_list + 1, size=queries)
    n = int(lengths.max())
    x = np.zeros((queries, n, features), np.float32)
    y = -np.ones((queries, n), np.float32)
    fractions = np.array([0.005, 0.01, 0.015, 0.02])  # grades 4, 3, 2, 1
    for q, m in enumerate(lengths):
        wq = w + drift * rng.normal(size=features)
        docs = rng.normal(size=(m, features))
        latent = rng.uniform(0.3, 3.0) * (docs @ wq + 0.5 * np.sin(2 * docs[:, 0]))
        latent = latent + rng.normal(0, 3.0)
        order = np.argsort(-latent)
        grades = np.zeros(m, np.float32)
        counts = np.maximum(np.round(np.cumsum(fractions) * m).astype(int), [1, 1, 1, 1])
        counts = np.maximum.accumulate(counts)
        grades[order[:counts[3]]] = 1
        grades[order[:counts[2]]] = 2
        grades[order[:counts[1]]] = 3
        grades[order[:counts[0]]] = 4
        x[q, :m] = docs + rng.normal(0, 2.0, size=features)  # the query's feature offset
        y[q, :m] = grades
    return x, y


def ltr_oracle(seed, args) -> float:
    """Test NDCG@10 of the `ltr` task's scorer x·w (w: the mean of the queries' weights,
    the first draw of `ltr_data`), the expected relevance given a document's features."""
    w = np.random.default_rng(seed).normal(size=args.features)
    n_train, n_test = args.queries, args.queries // 4
    x, y = ltr_data(seed, n_train + n_test + _n_valid(args), args.max_list, args.features,
                    args.drift)
    metric = ss.NDCGMetric(k=10)
    metric.update_state(y[n_train:n_train + n_test], x[n_train:n_train + n_test] @ w)
    return float(metric.result())


def _n_valid(args) -> int:
    return args.validation if args.validation >= 0 else args.queries // 4


def run_ltr(loss_name, seed, args):
    n_train, n_test = args.queries, args.queries // 4
    x, y = ltr_data(seed, n_train + n_test + _n_valid(args), args.max_list, args.features,
                    args.drift)
    cut = n_train + n_test
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:cut], y[n_train:cut]
    xva, yva = x[cut:], y[cut:]
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.build((None, None, args.features))

    def score(batch):
        return tf.squeeze(model(batch), -1)

    return _train(loss_name, seed, args, score, model.trainable_variables,
                  (xtr, ytr), (xva, yva), (xte, yte), k=10, batch=args.batch or 32)


def run_keras_rs(loss_name, seed, args):
    # 10 held-out lists per user (of its 20 held-out items): 5 for validation, 5 for
    # test (distinct lists; a user's validation and test lists share its held-out items).
    (utr, itr, ytr), (uho, iho, yho) = ranking.user_item_lists(
        seed, train_lists=args.train_lists, test_lists=10, noise=args.noise)
    is_valid = np.arange(len(uho)) % 10 < 5
    xtr = (utr, itr)
    xva, yva = (uho[is_valid], iho[is_valid]), yho[is_valid]
    xte, yte = (uho[~is_valid], iho[~is_valid]), yho[~is_valid]
    keras.utils.set_random_seed(seed)
    users, items = keras.layers.Embedding(300, 32), keras.layers.Embedding(600, 32)
    mlp = keras.Sequential([keras.layers.Dense(256, activation="relu"),
                            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])

    def score(batch):
        u, i = batch
        pair = tf.concat([tf.repeat(users(u)[:, None], tf.shape(i)[1], axis=1), items(i)], -1)
        return tf.squeeze(mlp(pair), -1)

    score((xte[0][:2], xte[1][:2]))
    variables = users.trainable_variables + items.trainable_variables + mlp.trainable_variables
    return _train(loss_name, seed, args, score, variables, (xtr, ytr), (xva, yva), (xte, yte),
                  k=5, batch=args.batch or 64)


def _take(x, j):
    return tuple(v[j] for v in x) if isinstance(x, tuple) else x[j]


def _train(loss_name, seed, args, score, variables, train, valid, test, k, batch):
    """Trains `variables` for `args.epochs`; returns (untrained test NDCG@k, validation
    NDCG@k, test NDCG@k, training seconds, median standard deviation of a test list's
    valid scores)."""
    loss = make_loss(loss_name)
    optimizer = keras.optimizers.Adam(args.learning_rate)
    optimizer.build(variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, score(x))
        optimizer.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    metric = ss.NDCGMetric(k=k)

    def evaluate(data, spread=None):
        metric.reset_state()
        x, y = data
        for start in range(0, len(y), 256):
            j = slice(start, start + 256)
            s = score(_take(x, j))
            metric.update_state(y[j], s)
            if spread is not None:
                spread.extend(_list_std(tf.constant(y[j]), s).numpy().tolist())
        return float(metric.result())

    untrained = evaluate(test)
    rng = np.random.default_rng(seed)
    xtr, ytr = train
    if args.curve:  # a fixed subset of the training lists, drawn apart from the order
        fit = np.random.default_rng(seed + 1).choice(len(ytr), min(1500, len(ytr)), False)
        fit = (_take(xtr, fit), ytr[fit])
    start_time = time.time()
    for epoch in range(args.epochs):
        order = rng.permutation(len(ytr))
        for start in range(0, len(order) - batch + 1, batch):
            j = order[start:start + batch]
            value = float(step(_take(xtr, j), ytr[j]))
            if not np.isfinite(value):
                raise FloatingPointError(f"{loss_name}: non-finite loss {value}")
        if args.curve:
            print(f"curve {loss_name} seed {seed} epoch {epoch + 1}: train "
                  f"{evaluate(fit):.4f} validation {evaluate(valid):.4f} test "
                  f"{evaluate(test):.4f}", flush=True)
    seconds = time.time() - start_time
    spread = []
    trained = evaluate(test, spread)
    return untrained, evaluate(valid), trained, seconds, float(np.median(spread))


def _group(spec: str) -> tuple[str, str]:
    """(the spec without its temperature, the temperature or '' for the default)."""
    head, *mods = spec.split("+")
    base, _, temperature = head.partition("@")
    return "+".join([base, *mods]), temperature


def _with_temperature(spec: str, temperature: str) -> str:
    head, *mods = spec.split("+")
    return "+".join([f"{head}@{temperature}", *mods])


def expand_grid(grid: str) -> list[str]:
    """`"spec:t1,t2;spec2:t3"` → [spec@t1, spec@t2, spec2@t3]."""
    specs = []
    for item in filter(None, grid.split(";")):
        spec, _, values = item.partition(":")
        specs += [_with_temperature(spec, t) for t in values.split(",")]
    return specs


def _mean_se(v):
    v = np.asarray(v, float)
    return v.mean(), (v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan"))


def summarize(path: str, task: str, reference: str, select: bool = False) -> None:
    """A markdown table: test NDCG mean ± standard error over seeds, the paired
    difference (same seed: same task draw, queries and initialisation) to `reference`,
    the median list score std.

    `select`: the specs that differ only by their temperature (`name@T`, and `name` at
    its default) form one row; for each seed the temperature with the highest
    validation NDCG is taken and its test NDCG reported (the chosen temperatures are
    listed, '' = the default)."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == task]
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        key, temperature = _group(r["loss"]) if select else (r["loss"], "")
        best = groups.setdefault(key, {}).get(r["seed"])
        if best is None or float(r["val_ndcg"]) > float(best["val_ndcg"]):
            groups[key][r["seed"]] = dict(r, temperature=temperature or "default")
    ref = groups.get(reference, {})
    print(f"| loss | seeds | test NDCG (mean ± s.e.) | paired difference to `{reference}` "
          f"| validation NDCG | {'chosen temperatures | ' if select else ''}list score std "
          f"| untrained | train s (mean) |")
    print("|---|---|---|---|---|" + ("---|" if select else "") + "---|---|---|")
    for name, by_seed in groups.items():
        test = [float(r["test_ndcg"]) for r in by_seed.values()]
        m, se = _mean_se(test)
        d = [float(by_seed[k]["test_ndcg"]) - float(ref[k]["test_ndcg"])
             for k in by_seed if k in ref]
        dm, dse = _mean_se(d) if d else (float("nan"), float("nan"))
        paired = f"{dm:+.4f} ± {dse:.4f} ({len(d)})" if d else "—"
        val = np.mean([float(r["val_ndcg"]) for r in by_seed.values()])
        chosen = ""
        if select:
            chosen = ", ".join(by_seed[k]["temperature"] for k in sorted(by_seed)) + " | "
        std = np.median([float(r["score_std"]) for r in by_seed.values()])
        untrained = np.mean([float(r["untrained"]) for r in by_seed.values()])
        seconds = np.mean([float(r["train_seconds"]) for r in by_seed.values()])
        print(f"| `{name}` | {len(test)} | {m:.4f} ± {se:.4f} | {paired} | {val:.4f} | "
              f"{chosen}{std:.3g} | {untrained:.4f} | {seconds:.0f} |")


COLUMNS = ["task", "loss", "seed", "epochs", "untrained", "val_ndcg", "test_ndcg",
           "train_seconds", "score_std"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("ltr", "keras_rs"), default="ltr")
    parser.add_argument("--losses", default=None, help="comma-separated specs "
                        "(`make_loss`); default: all (ltr: without LTR_LEFT_OUT); '' "
                        "with --grid: the grid only")
    parser.add_argument("--grid", default="", help="temperatures to run for validation "
                        "selection: 'spec:t1,t2;spec2:t3' (e.g. 'soft_ndcg_lapsum:3,10,30;"
                        "approx_ndcg:0.01,0.1,1'), added to --losses")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=0, help="0: 32 (ltr), 64 (keras_rs)")
    parser.add_argument("--queries", type=int, default=1200, help="ltr: training queries")
    parser.add_argument("--validation", type=int, default=-1,
                        help="ltr: validation queries (-1: as many as test, queries // 4)")
    parser.add_argument("--max_list", type=int, default=200, help="ltr: longest list")
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--drift", type=float, default=0.7)
    parser.add_argument("--train_lists", type=int, default=50,
                        help="keras_rs: training lists per user")
    parser.add_argument("--noise", type=float, default=1.0,
                        help="keras_rs: the grades' noise (0: quantiles of u·v alone)")
    parser.add_argument("--curve", action="store_true", help="print the training, "
                        "validation and test NDCG after every epoch")
    parser.add_argument("--oracle", action="store_true", help="ltr: print the test NDCG "
                        "of the expected relevance x·w for each seed, and stop")
    parser.add_argument("--output", default="bench_ltr.csv")
    parser.add_argument("--reference", default="pairwise_logistic",
                        help="--summarize: the loss the paired differences are taken to")
    parser.add_argument("--summarize", action="store_true",
                        help="print a markdown table (mean ± standard error over the seeds "
                             "in --output) instead of running")
    parser.add_argument("--select", action="store_true", help="--summarize: one row per "
                        "loss at the temperature chosen on validation for each seed")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.output, args.task, args.reference, args.select)
        return
    if args.oracle:
        for seed in (int(s) for s in args.seeds.split(",")):
            print(f"ltr oracle x·w seed {seed}: test NDCG@10 {ltr_oracle(seed, args):.4f}")
        return
    done = set()
    if os.path.exists(args.output):
        with open(args.output) as f:
            done = {(r["task"], r["loss"], r["seed"], r["epochs"]) for r in csv.DictReader(f)}
    run = run_ltr if args.task == "ltr" else run_keras_rs
    if args.losses is None and not args.grid:
        losses = [n for n in DEFAULT_LOSSES if args.task == "keras_rs" or n not in LTR_LEFT_OUT]
    else:
        losses = [n for n in (args.losses or "").split(",") if n] + expand_grid(args.grid)
    for name in losses:
        make_loss(name)  # refuse a bad spec before any training
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in losses:
            key = (args.task, name, str(seed), str(args.epochs))
            if key in done:
                continue
            untrained, val, trained, seconds, spread = run(name, seed, args)
            new = not os.path.exists(args.output)
            with open(args.output, "a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(COLUMNS)
                writer.writerow([args.task, name, seed, args.epochs, f"{untrained:.4f}",
                                 f"{val:.4f}", f"{trained:.4f}", f"{seconds:.1f}",
                                 f"{spread:.4g}"])
            print(f"{args.task} {name:28s} seed {seed}: {untrained:.4f} -> val {val:.4f}, "
                  f"test {trained:.4f} (list std {spread:.3g}, {seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
