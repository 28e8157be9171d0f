"""Permutations as inputs: the SUQUAN benchmark and Kendall-kernel SVMs.

The experiment of the talk "permutations as inputs" (`vert_permutations_slides`,
"Experiments: CIFAR-10"; Le Morvan & Vert 2017, "Supervised quantile normalisation"):
the 45 one-vs-one binary problems of a 10-class image set, a linear logistic
regression on the p pixels of each image, with the pixels

- `raw`: as they are (grey levels in [0, 1]);
- `uniform`, `gaussian`, `median`: quantile-normalised onto a fixed target quantile
  function f: the uniform quantiles (j − ½)/m, the standard normal quantiles
  Φ⁻¹((j − ½)/m), or the element-wise median of the training images' own quantile
  functions;
- `suquan`: quantile-normalised onto an f learned jointly with the linear model
  (SUQUAN), started at the median f.

Quantile normalisation Ψ_f(x) = Π_σ(x) f keeps the order of the pixels of x and
replaces their values by those of f ("keep the order of x, change the values to f").
f has m levels (default m = p, one per rank, as in the talk); level j covers the ranks
in [(j − 1)p/m, jp/m). Ties, which are many in MNIST (about 80 % of the pixels of a
digit are 0), are handled as the transport does: the t pixels tied at ranks
[lo, lo + t) share that mass interval and all take the mean of f over it,

    Ψ_f(x)_i = (G(hi_i / p) − G(lo_i / p)) / ((hi_i − lo_i) / p),   G(u) = ∫₀ᵘ f,

lo_i = #{k: x_k < x_i}, hi_i = #{k: x_k ≤ x_i} (without ties: Ψ_f(x)_i = f at the rank
of x_i). This is the ε → 0 limit of `softsort_tf.SinkhornQuantileNormalization` (the
entropic transport of the pixels onto m equal bins tends to the monotone coupling, and
a tied block is spread evenly over its bins), computed exactly: for raw-pixel inputs
the ranks do not depend on the parameters, so the hard operator is differentiable in f
and needs no relaxation. The learned f uses that layer's parameterisation
(`target_values()` with `learn_range=False`): f = cumsum(softmax(h)), increasing from
above 0 to 1 at every step of training; the linear model then fixes the scale.

Training (ours; the talk gives no budget): for every normalisation of `NORMALIZATIONS`,
one model per L2 strength λ of `l2_grid` trains at once (loss: mean logistic loss +
λ‖w‖²) by full-batch Adam for `steps` steps from w = 0; every `eval_every` steps the
validation accuracy is read, and the (λ, step) with the best validation accuracy (then
the lowest validation loss) is kept. The test set is the standard test set restricted
to the pair; reported: test accuracy and AUC.

Kendall kernels (Jiao & Vert 2015; talk: "kernel trick useful with few samples in
large dimensions"): an SVM (`sklearn.svm.SVC(kernel='precomputed')`) on the Gram matrix
of Kendall's τ-b between the pixel vectors (`softsort_tf.kendall_kernel`; τ-b counts a
pair of pixels tied in an image, such as two background pixels, as neither concordant
nor discordant and normalises by the untied pairs), against a linear SVM and an L2
logistic regression on the raw pixels, at small training sizes. To compute one Gram
matrix for all 45 problems, each digit gets a fixed pool of training images and of
test images; the problem (a, b) at size s uses the first s/2 pool images of each
digit, so the sizes are nested. The SVM's C (and the logistic regression's C) is
chosen by stratified cross-validation on the training images alone.

`run(config)` writes one JSON file per problem as it finishes (`pairs/a_b.json`,
`kernel/pairs/a_b.json`, the Gram blocks in `kernel/gram/`): a restarted run skips the
finished problems and blocks. `results.json` (rewritten after each problem) holds the
mean ± standard error over the finished problems of every normalisation and kernel
method, and the per-problem numbers. `scripts/train_suquan.py` is the binary.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time

import numpy as np
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.datasets import arrays, images
from softsort_tf.experiments import checks, training

__all__ = ["KERNEL_METHODS", "NORMALIZATIONS", "PAIRS", "SOURCES", "PairData",
           "QuantileNormalizer", "SuquanConfig", "fixed_quantile_function", "format_tables",
           "gram_blocks", "load_images", "pair_data", "quantile_functions",
           "quantile_normalize", "rank_intervals", "run", "suquan_targets", "summarize",
           "train_linear_models"]

# The inputs of the linear models: raw pixels, or quantile-normalised onto a fixed f
# (uniform, Gaussian, median of the training images) or onto SUQUAN's learned f.
NORMALIZATIONS = ("raw", "uniform", "gaussian", "median", "suquan")
KERNEL_METHODS = ("kendall_svm", "linear_svm", "logistic")
PAIRS = tuple(itertools.combinations(range(10), 2))
# The image sources of `--dataset` (of `softsort_tf.datasets.images.SOURCES`).
SOURCES = ("npz", "digits", "mnist", "cifar10")
DEFAULT_MNIST_NPZ = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    os.pardir, "shared", "data", "mnist.npz")
_C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
_FLOOR = 1e-4  # smallest step of a learned f, in units of its range / m (see suquan_targets)


@dataclasses.dataclass
class SuquanConfig:
    """Everything a run depends on (the binary's flags; see the module docstring)."""

    output_dir: str = "/tmp/softsort_tf_suquan"
    dataset: str = "npz"
    mnist_npz: str | None = DEFAULT_MNIST_NPZ  # read with dataset='npz' only
    validation_size: int = 5000
    pairs: tuple = ()  # (a, b) problems; empty: all 45
    normalizations: tuple = NORMALIZATIONS  # empty: the kernel methods only
    train_size: int = 1000
    val_size: int = 1000
    num_levels: int | None = None  # m; None: one level per pixel
    l2_grid: tuple = (1e-5, 1e-4, 1e-3, 1e-2)
    steps: int = 300
    eval_every: int = 25
    learning_rate: float = 0.02
    jit_compile: bool = True
    kernel_sizes: tuple = (50, 100, 200)
    kernel_test_per_class: int = 50
    kernel_block: int = 100
    cv_folds: int = 5
    seed: int = 0
    stop_after_pairs: int | None = None
    verbose: int = 1

    def finalize(self) -> SuquanConfig:
        """Validates the fields (ValueError naming the field); returns self."""
        self.pairs = tuple(tuple(int(c) for c in p) for p in (self.pairs or PAIRS))
        for a, b in self.pairs:
            if not (0 <= a < b <= 9):
                raise ValueError(f"pairs must be (a, b) with 0 <= a < b <= 9, got {(a, b)}.")
        self.normalizations = tuple(self.normalizations)
        if self.dataset != "npz":
            self.mnist_npz = None  # read by the npz source only
        elif not (self.mnist_npz and os.path.isfile(self.mnist_npz)):
            raise ValueError(f"mnist_npz: no file {self.mnist_npz!r} (an npz with x_train, "
                             "y_train, x_test, y_test); pass --mnist_npz, or "
                             "--dataset=digits (offline, scikit-learn) or --dataset=mnist / "
                             "cifar10 (tensorflow-datasets).")
        checks.check_config(self, dataset=SOURCES, normalizations=NORMALIZATIONS)
        self.l2_grid = tuple(float(v) for v in self.l2_grid)
        if not self.l2_grid or min(self.l2_grid) < 0:
            raise ValueError(f"l2_grid must be non-empty values >= 0, got {self.l2_grid}.")
        self.kernel_sizes = tuple(sorted(int(s) for s in self.kernel_sizes))
        for s in self.kernel_sizes:
            if s < 2 * self.cv_folds or s % 2:
                raise ValueError(f"kernel_sizes must be even and >= 2 * cv_folds "
                                 f"({2 * self.cv_folds}), got {s}.")
        return self


# ----------------------------------------------------------------------------- data


def load_images(config: SuquanConfig) -> images.ImageSplits:
    """The images of `config.dataset`, flattened to grey levels `[N, p]` float32 in
    [0, 1] (colour images: 0.299 R + 0.587 G + 0.114 B), with int labels; the last
    `validation_size` training images are the validation part (scikit-learn digits:
    their fixed split)."""
    splits = images.load_image_splits(config.dataset, npz_path=config.mnist_npz,
                                      validation_size=config.validation_size)

    def grey_rows(x):
        if x.shape[-1] == 3:
            x = x @ np.array([0.299, 0.587, 0.114], np.float32)
        return np.asarray(x, np.float32).reshape(len(x), -1)

    return splits.map_x(grey_rows)


@dataclasses.dataclass(frozen=True)
class PairData(arrays.Splits):
    """One binary problem: label 1 for digit b, 0 for digit a."""


def _subset(x, y, a, b, size, rng):
    idx = np.flatnonzero((y == a) | (y == b))
    if size is not None and size < len(idx):
        idx = np.sort(rng.choice(idx, size, replace=False))
    return x[idx], (y[idx] == b).astype(np.float32)


def pair_data(data: arrays.Splits, a: int, b: int, train_size: int, val_size: int,
              seed: int) -> PairData:
    """The problem (a, b) of the images `data`: a random sample of `train_size` training
    and `val_size` validation images of the two classes (seeded by `seed` and the
    pair), all their test images."""
    rng = np.random.default_rng([seed, a, b])
    return PairData(*_subset(data.x_train, data.y_train, a, b, train_size, rng),
                    *_subset(data.x_val, data.y_val, a, b, val_size, rng),
                    *_subset(data.x_test, data.y_test, a, b, None, rng))


# ------------------------------------------------------------ quantile normalisation


def rank_intervals(x) -> tuple[np.ndarray, np.ndarray]:
    """`(lo, hi)`, int32 `[N, p]`: lo_i = #{k: x_k < x_i}, hi_i = #{k: x_k ≤ x_i} per
    row; the t entries of a tie block share the ranks [lo, lo + t) (the mid-rank of
    `softsort_tf.rankdata` is (lo + hi + 1)/2)."""
    x = np.asarray(x)
    n = x.shape[1]
    order = np.argsort(x, axis=1, kind="stable")
    s = np.take_along_axis(x, order, axis=1)
    change = s[:, 1:] != s[:, :-1]
    positions = np.broadcast_to(np.arange(n), s.shape)
    starts = np.ones(s.shape, bool)
    starts[:, 1:] = change
    start = np.maximum.accumulate(np.where(starts, positions, 0), axis=1)
    ends = np.ones(s.shape, bool)
    ends[:, :-1] = change
    end = np.minimum.accumulate(np.where(ends, positions + 1, n)[:, ::-1], axis=1)[:, ::-1]
    lo, hi = np.empty_like(order), np.empty_like(order)
    np.put_along_axis(lo, order, start, axis=1)
    np.put_along_axis(hi, order, end, axis=1)
    return lo.astype(np.int32), hi.astype(np.int32)


class QuantileNormalizer:
    """Quantile normalisation Ψ_f of fixed rows x onto any target f of m levels, as a
    TensorFlow function of f (module docstring): the rank intervals of x are computed
    once, Ψ_f(x)_i = (G(hi_i/p) − G(lo_i/p)) / ((hi_i − lo_i)/p) is read off the
    cumulative sums of f, and gradients flow to f.

    Args:
      x: `[N, p]` rows.
      m: number of levels of the targets f.

    Example:
    >>> qn = QuantileNormalizer([[0.3, 0.0, 0.0, 0.9]], 2)
    >>> qn.apply([0.0, 1.0]).numpy().tolist()
    [[1.0, 0.0, 0.0, 1.0]]
    """

    def __init__(self, x, m: int):
        lo, hi = rank_intervals(x)
        p = lo.shape[1]
        self.m = m
        t_lo, t_hi = lo.astype(np.float64) * m / p, hi.astype(np.float64) * m / p
        self.j_lo = np.floor(t_lo).astype(np.int32)  # in [0, m]
        self.j_hi = np.floor(t_hi).astype(np.int32)
        self.frac_lo = (t_lo - self.j_lo).astype(np.float32)
        self.frac_hi = (t_hi - self.j_hi).astype(np.float32)
        self.inv_width = (1.0 / (t_hi - t_lo)).astype(np.float32)  # levels have width 1/m
        self.exact = not (self.frac_lo.any() or self.frac_hi.any())  # e.g. m = p

    def apply(self, f):
        """Ψ_f(x) for sorted f `[m]` or `[K, m]` (differentiable in f): `[N, p]` or
        `[K, N, p]` float32."""
        f = tf.convert_to_tensor(f, tf.float32)
        c = tf.concat([tf.zeros_like(f[..., :1]), tf.cumsum(f, axis=-1)], axis=-1)
        if self.exact:
            return (tf.gather(c, self.j_hi, axis=-1)
                    - tf.gather(c, self.j_lo, axis=-1)) * self.inv_width
        step = tf.concat([f, f[..., -1:]], axis=-1)  # slope of G on [j/m, (j+1)/m)

        def g(j, frac):
            return tf.gather(c, j, axis=-1) + frac * tf.gather(step, j, axis=-1)

        return (g(self.j_hi, self.frac_hi) - g(self.j_lo, self.frac_lo)) * self.inv_width


def quantile_normalize(x, f):
    """Quantile normalisation Ψ_f(x) of the rows of x onto the m levels of f, ties
    sharing the mean of f over their ranks (module docstring); the ε → 0 limit of
    `softsort_tf.sinkhorn_quantile_normalization`.

    Args:
      x: `[N, p]` array.
      f: `[m]` target values (any order is read sorted, as the library does).

    Returns:
      `[N, p]` float32 numpy array.

    Example:
    >>> quantile_normalize([[0.3, 0.0, 0.0, 0.9]], [1.0, 2.0, 3.0, 4.0]).tolist()
    [[3.0, 1.5, 1.5, 4.0]]
    """
    x = np.asarray(x, np.float32)
    f = np.sort(np.asarray(f, np.float32))
    return QuantileNormalizer(x, len(f)).apply(f).numpy()


def quantile_functions(x, m: int) -> np.ndarray:
    """Each row's own quantile function at m levels: the mean of its sorted values over
    the ranks [(j − 1)p/m, jp/m) of level j; `[N, m]` (the sorted rows when m = p)."""
    s = np.sort(np.asarray(x, np.float64), axis=1)
    p = s.shape[1]
    c = np.concatenate([np.zeros((len(s), 1)), np.cumsum(s, axis=1)], axis=1)
    edges = np.arange(m + 1) * p / m
    left = np.floor(edges).astype(int)
    frac = edges - left

    def integral(k):  # ∫ of the sorted values up to position edges[k]
        nxt = s[:, np.minimum(left[k], p - 1)]
        return c[:, left[k]] + frac[k] * nxt

    total = np.stack([integral(k) for k in range(m + 1)], axis=1)
    return (np.diff(total, axis=1) * m / p).astype(np.float32)


def fixed_quantile_function(normalization: str, m: int, x_train=None) -> np.ndarray:
    """The target f of a fixed normalisation: 'uniform' (j − ½)/m, 'gaussian'
    Φ⁻¹((j − ½)/m), 'median' (element-wise median of the training rows' quantile
    functions, needs `x_train`)."""
    levels = (np.arange(m) + 0.5) / m
    if normalization == "uniform":
        return levels.astype(np.float32)
    if normalization == "gaussian":
        from scipy.special import ndtri  # noqa: PLC0415

        return ndtri(levels).astype(np.float32)
    if normalization == "median":
        return np.median(quantile_functions(x_train, m), axis=0).astype(np.float32)
    raise ValueError(f"normalization must be 'uniform', 'gaussian' or 'median', got "
                     f"{normalization!r}.")


def suquan_targets(f_init, count: int = 1) -> list:
    """`count` built `softsort_tf.SinkhornQuantileNormalization(learn_range=False)`
    layers whose trainable targets start at `f_init` rescaled to [0, 1]: f =
    cumsum(softmax(h)) with softmax(h) the steps of the rescaled f (flat steps get
    `_FLOOR` times the mean step, so that every step stays positive)."""
    f = np.sort(np.asarray(f_init, np.float64))
    m = len(f)
    span = f[-1] - f[0]
    f = (f - f[0]) / span if span > 0 else np.linspace(0.0, 1.0, m)
    steps = np.maximum(np.diff(np.concatenate([[0.0], f])), _FLOOR / m)
    logits = np.log(steps / steps.sum()).astype(np.float32)
    layers = []
    for _ in range(count):
        layer = ss.SinkhornQuantileNormalization(num_targets=m, learn_range=False)
        layer.build((None, m))
        layer.logits.assign(logits)
        layers.append(layer)
    return layers


# -------------------------------------------------------------------------- training


def _adam(params, grads, state, lr, t, beta1=0.9, beta2=0.999, eps=1e-8):
    for p, g, (mom, vel) in zip(params, grads, state, strict=True):
        mom.assign(beta1 * mom + (1 - beta1) * g)
        vel.assign(beta2 * vel + (1 - beta2) * g * g)
        m_hat = mom / (1 - beta1 ** t)
        v_hat = vel / (1 - beta2 ** t)
        p.assign_sub(lr * m_hat / (tf.sqrt(v_hat) + eps))


def _logistic(scores, y):
    """Mean logistic loss per model, scores `[K, N]`, labels `[N]` in {0, 1}."""
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.broadcast_to(y, tf.shape(scores)), logits=scores), axis=-1)


_FIXED_FEATURES_CHUNKS: dict = {}


def _fixed_features_chunk(jit_compile: bool):
    """`count` Adam steps of the K logistic regressions on fixed features, a
    `tf.function` shared by every `train_linear_models` call (the variables and data
    are its arguments: calls of the same shapes trace and compile it once)."""
    if jit_compile not in _FIXED_FEATURES_CHUNKS:
        @tf.function(jit_compile=jit_compile)
        def chunk(w, b, w_mom, w_vel, b_mom, b_vel, x, y, lam, lr, start, count):
            params, state = [w, b], [(w_mom, w_vel), (b_mom, b_vel)]
            for i in tf.range(count):
                with tf.GradientTape() as tape:
                    s = tf.linalg.matmul(w, x, transpose_b=True) + b[:, None]
                    loss = tf.reduce_sum(_logistic(s, y) + lam * tf.reduce_sum(w * w, axis=1))
                grads = tape.gradient(loss, params)
                _adam(params, grads, state, lr, tf.cast(start + i + 1, tf.float32))

        _FIXED_FEATURES_CHUNKS[jit_compile] = chunk
    return _FIXED_FEATURES_CHUNKS[jit_compile]


def train_linear_models(features, y_train, val_features, y_val, l2_grid, steps: int,
                        eval_every: int, learning_rate: float, targets=None,
                        jit_compile: bool = True) -> dict:
    """Trains one logistic regression per L2 strength, together, by full-batch Adam.

    Args:
      features: `[N, p]` fixed features, or, with `targets`, a `QuantileNormalizer` of
        the training images (features Ψ_f(x) with f learned).
      y_train, y_val: labels in {0, 1}.
      val_features: as `features`, for the validation images.
      l2_grid: K L2 strengths λ (loss: mean logistic loss + λ‖w‖²).
      steps, eval_every, learning_rate: the budget (module docstring).
      targets: None (fixed features) or K `SinkhornQuantileNormalization` layers whose
        `target_values()` are the learned f of each model.
      jit_compile: XLA-compile the training steps (faster for large problems).

    Returns:
      A dict: `l2`, `step`, `val_accuracy`, `val_loss` of the chosen (λ, step), and
      `predict(features)`: scores of the chosen model (with `targets`: takes a
      `QuantileNormalizer`), and `f` (the chosen learned f, or None).
    """
    num = len(l2_grid)
    learn_f = targets is not None
    p = (features.j_lo if learn_f else features).shape[1]
    prior = float(np.clip(np.mean(y_train), 1e-3, 1 - 1e-3))
    w = tf.Variable(tf.zeros([num, p]))
    b = tf.Variable(tf.fill([num], float(np.log(prior / (1 - prior)))))
    params = [w, b] + ([layer.logits for layer in targets] if learn_f else [])
    state = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in params]
    lam = tf.constant(l2_grid, tf.float32)
    y_tr = tf.constant(y_train, tf.float32)

    def current_f():
        return tf.stack([layer.target_values() for layer in targets]) if learn_f else None

    def scores(feats, f):
        if learn_f:
            return tf.einsum("kp,knp->kn", w, feats.apply(f)) + b[:, None]
        return tf.linalg.matmul(w, feats, transpose_b=True) + b[:, None]

    x_tr = features if learn_f else tf.constant(features, tf.float32)

    if learn_f:
        @tf.function(jit_compile=jit_compile)
        def train_chunk(start, count):
            for i in tf.range(count):
                with tf.GradientTape() as tape:
                    f = current_f()
                    loss = tf.reduce_sum(_logistic(scores(x_tr, f), y_tr)
                                         + lam * tf.reduce_sum(w * w, axis=1))
                grads = tape.gradient(loss, params)
                _adam(params, grads, state, learning_rate, tf.cast(start + i + 1, tf.float32))
    else:
        # Fixed features: one traced (and, with XLA, compiled) step for every call of
        # the same shapes (all the fixed normalisations of all the pairs).
        lr = tf.constant(learning_rate, tf.float32)

        def train_chunk(start, count):
            _fixed_features_chunk(jit_compile)(w, b, *state[0], *state[1], x_tr, y_tr, lam,
                                               lr, start, count)

    x_va = val_features if learn_f else tf.constant(val_features, tf.float32)
    y_va = tf.constant(y_val, tf.float32)
    best = None
    done = 0
    while done < steps:
        count = min(eval_every, steps - done)
        train_chunk(tf.constant(done), tf.constant(count))
        done += count
        f = current_f()
        s = scores(x_va, f)
        acc = tf.reduce_mean(tf.cast((s > 0) == (y_va[None] > 0.5), tf.float32), axis=1).numpy()
        vloss = _logistic(s, y_va).numpy()
        for k in range(num):
            key = (acc[k], -vloss[k])
            if best is None or key > best[0]:
                best = (key, k, done, w[k].numpy(), float(b[k].numpy()),
                        None if f is None else f[k].numpy())
    (acc_k, neg_loss), k, step, w_k, b_k, f_k = best

    def predict(feats):
        if learn_f:
            return (feats.apply(f_k) @ w_k[:, None])[:, 0].numpy() + b_k
        return np.asarray(feats, np.float32) @ w_k + b_k

    return {"l2": float(l2_grid[k]), "step": int(step), "val_accuracy": float(acc_k),
            "val_loss": float(-neg_loss), "predict": predict,
            "f": None if f_k is None else f_k.astype(np.float32)}


def _metrics(y, scores) -> dict:
    from sklearn.metrics import roc_auc_score  # noqa: PLC0415

    return {"test_accuracy": float(np.mean((scores > 0) == (y > 0.5))),
            "test_auc": float(roc_auc_score(y, scores))}


def _run_pair(config: SuquanConfig, pair: PairData) -> dict:
    """Trains and tests the model of every normalisation of `config.normalizations` on one
    problem."""
    p = pair.x_train.shape[1]
    m = config.num_levels or p
    out = {"num_train": len(pair.y_train), "num_val": len(pair.y_val),
           "num_test": len(pair.y_test), "num_levels": m, "normalizations": {}}
    kwargs = dict(l2_grid=config.l2_grid, steps=config.steps, eval_every=config.eval_every,
                  learning_rate=config.learning_rate, jit_compile=config.jit_compile)
    split_intervals = {}

    def intervals(name):
        if name not in split_intervals:
            x = getattr(pair, f"x_{name}")
            split_intervals[name] = QuantileNormalizer(x, m)
        return split_intervals[name]

    f_median = fixed_quantile_function("median", m, pair.x_train)
    for normalization in config.normalizations:
        start = time.time()
        f = None
        if normalization == "suquan":
            layers = suquan_targets(f_median, len(config.l2_grid))
            fit = train_linear_models(intervals("train"), pair.y_train, intervals("val"),
                                      pair.y_val, targets=layers, **kwargs)
            scores = fit["predict"](intervals("test"))
            f = fit["f"]
        else:
            if normalization == "raw":
                feats = {s: getattr(pair, f"x_{s}") for s in ("train", "val", "test")}
            else:
                f = (f_median if normalization == "median"
                     else fixed_quantile_function(normalization, m))
                feats = {s: intervals(s).apply(f).numpy() for s in ("train", "val", "test")}
            fit = train_linear_models(feats["train"], pair.y_train, feats["val"], pair.y_val,
                                      **kwargs)
            scores = fit["predict"](feats["test"])
        out["normalizations"][normalization] = {
            **_metrics(pair.y_test, scores), "val_accuracy": fit["val_accuracy"],
            "l2": fit["l2"], "step": fit["step"], "seconds": time.time() - start,
            "f": None if f is None else np.asarray(f, np.float32).round(5).tolist()}
    return out


# ------------------------------------------------------------------- kernel methods


def _kernel_pools(data, config: SuquanConfig):
    """Per-digit pools, as indices and labels `(train, train labels, test, test
    labels)`: the first max(kernel_sizes)/2 training images of a seeded permutation of
    each digit, and its first `kernel_test_per_class` test images."""
    y_train, y_test = data.y_train, data.y_test
    rng = np.random.default_rng([config.seed, 12345])
    per_class = config.kernel_sizes[-1] // 2
    train_idx, test_idx = [], []
    for c in range(10):
        train_idx.append(rng.permutation(np.flatnonzero(y_train == c))[:per_class])
        test_idx.append(rng.permutation(np.flatnonzero(y_test == c))[
            :config.kernel_test_per_class])
    for c, idx in enumerate(train_idx):
        if len(idx) < per_class:
            raise ValueError(f"kernel_sizes: digit {c} has {len(idx)} training images, "
                             f"fewer than max(kernel_sizes)/2 = {per_class}.")
    return (np.concatenate(train_idx), np.repeat(np.arange(10), per_class),
            np.concatenate(test_idx), np.concatenate(
                [np.full(len(i), c) for c, i in enumerate(test_idx)]))


def gram_blocks(x, y, folder: str, block: int, symmetric: bool, log=None) -> np.ndarray:
    """The Kendall Gram matrix `softsort_tf.kendall_kernel(x, y)` computed by blocks of
    `block` × `block` rows, each saved to `folder` as it finishes (a restarted run
    reads the finished blocks); `symmetric` (y is x): the lower blocks are mirrored."""
    os.makedirs(folder, exist_ok=True)
    gram = np.zeros((len(x), len(y)), np.float32)
    starts_x, starts_y = range(0, len(x), block), range(0, len(y), block)
    for i in starts_x:
        for j in starts_y:
            if symmetric and j < i:
                gram[i:i + block, j:j + block] = gram[j:j + block, i:i + block].T
                continue
            path = os.path.join(folder, f"block_{i}_{j}.npy")
            if os.path.exists(path):
                k = np.load(path)
            else:
                start = time.time()
                k = ss.kendall_kernel(x[i:i + block], y[j:j + block],
                                      algorithm="pairwise").numpy()
                np.save(path + ".tmp.npy", k)
                os.replace(path + ".tmp.npy", path)
                if log:
                    log(f"Kendall Gram block ({i}, {j}) of {folder}: "
                        f"{time.time() - start:.1f} s")
            gram[i:i + block, j:j + block] = k
    return gram


def _cv_choice(make, gram_or_x, y, folds: int, seed: int, precomputed: bool):
    from sklearn.model_selection import StratifiedKFold  # noqa: PLC0415

    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    best = None
    for c in _C_GRID:
        correct = 0
        for tr, va in cv.split(np.zeros(len(y)), y):
            if precomputed:
                model = make(c).fit(gram_or_x[np.ix_(tr, tr)], y[tr])
                pred = model.predict(gram_or_x[np.ix_(va, tr)])
            else:
                model = make(c).fit(gram_or_x[tr], y[tr])
                pred = model.predict(gram_or_x[va])
            correct += int(np.sum(pred == y[va]))
        if best is None or correct > best[0]:
            best = (correct, c)
    return best[1], best[0] / len(y)


def _kernel_pair(a, b, pools, grams, config: SuquanConfig) -> dict:
    """The kernel methods on problem (a, b) at every size of `config.kernel_sizes`."""
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.svm import SVC  # noqa: PLC0415

    train_x, train_labels, test_x, test_labels = pools
    gram_train, gram_test = grams
    per_class = config.kernel_sizes[-1] // 2
    test = np.flatnonzero((test_labels == a) | (test_labels == b))
    y_test = (test_labels[test] == b).astype(int)
    out = {}
    for size in config.kernel_sizes:
        half = size // 2
        train = np.concatenate([a * per_class + np.arange(half), b * per_class + np.arange(half)])
        y = (train_labels[train] == b).astype(int)
        res = {}
        kendall_tr = gram_train[np.ix_(train, train)].astype(np.float64)
        kendall_te = gram_test[np.ix_(test, train)].astype(np.float64)
        x_tr, x_te = train_x[train].astype(np.float64), test_x[test].astype(np.float64)
        linear_tr, linear_te = x_tr @ x_tr.T, x_te @ x_tr.T
        for name, k_tr, k_te in (("kendall_svm", kendall_tr, kendall_te),
                                 ("linear_svm", linear_tr, linear_te)):
            c, cv_acc = _cv_choice(lambda c: SVC(C=c, kernel="precomputed"), k_tr, y,
                                   config.cv_folds, config.seed, True)
            model = SVC(C=c, kernel="precomputed").fit(k_tr, y)
            res[name] = {**_metrics(y_test, model.decision_function(k_te)), "C": c,
                         "cv_accuracy": cv_acc}

        def logistic(c):
            return LogisticRegression(C=c, max_iter=2000)

        c, cv_acc = _cv_choice(logistic, x_tr, y, config.cv_folds, config.seed, False)
        model = logistic(c).fit(x_tr, y)
        res["logistic"] = {**_metrics(y_test, model.decision_function(x_te)), "C": c,
                           "cv_accuracy": cv_acc}
        out[str(size)] = res
    out["num_test"] = int(len(test))
    return out


# --------------------------------------------------------------------- aggregation


def _mean_se(values) -> dict:
    v = np.asarray(values, np.float64)
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return {"mean": float(v.mean()), "se": se, "count": int(len(v))}


def summarize(per_pair: dict, kernel_per_pair: dict) -> dict:
    """Mean ± standard error (sample std / √problems) over the finished problems of the
    test accuracy and AUC of every normalisation (and kernel method at every size)."""
    summary = {"linear": {}, "kernel": {}}
    done = {n for r in per_pair.values() for n in r["normalizations"]}
    for normalization in [n for n in NORMALIZATIONS if n in done]:
        rows = [r["normalizations"][normalization] for r in per_pair.values()
                if normalization in r["normalizations"]]
        summary["linear"][normalization] = {k: _mean_se([r[k] for r in rows])
                                            for k in ("test_accuracy", "test_auc")}
    sizes = sorted({s for r in kernel_per_pair.values() for s in r if s != "num_test"}, key=int)
    for size in sizes:
        for method in KERNEL_METHODS:
            rows = [r[size][method] for r in kernel_per_pair.values() if size in r]
            summary["kernel"][f"{method}@{size}"] = {
                k: _mean_se([r[k] for r in rows]) for k in ("test_accuracy", "test_auc")}
    return summary


_NAMES = {"raw": "raw pixels", "uniform": "uniform QN", "gaussian": "Gaussian QN",
          "median": "median QN", "suquan": "SUQUAN (learned f)",
          "kendall_svm": "Kendall-kernel SVM", "linear_svm": "linear SVM (raw pixels)",
          "logistic": "logistic regression (raw pixels)"}


def format_tables(results: dict, baseline: str = "raw") -> str:
    """Markdown tables of a `results.json`: per normalisation, the mean ± s.e. over the
    problems of the test accuracy (%) and AUC, and the paired difference in accuracy
    to `baseline` (mean ± s.e. of the per-problem differences, and the problems won /
    tied / lost); per training size, the same for the kernel methods."""
    lines = []
    pairs = results.get("pairs", {})
    linear = results["summary"]["linear"]
    if linear:
        lines += [f"| normalisation | test accuracy (%) | test AUC | Δ accuracy vs "
                  f"{_NAMES[baseline]} (points, paired) | won / tied / lost | problems |",
                  "|---|---|---|---|---|---|"]
        for name in [n for n in NORMALIZATIONS if n in linear]:
            acc, auc = linear[name]["test_accuracy"], linear[name]["test_auc"]
            both = [r["normalizations"] for r in pairs.values()
                    if name in r["normalizations"] and baseline in r["normalizations"]]
            diff = np.array([100 * (r[name]["test_accuracy"] - r[baseline]["test_accuracy"])
                             for r in both])
            paired = (f"{diff.mean():+.2f} ± {diff.std(ddof=1) / math.sqrt(len(diff)):.2f}"
                      if name != baseline and len(diff) > 1 else "–")
            record = (f"{np.sum(diff > 0)} / {np.sum(diff == 0)} / {np.sum(diff < 0)}"
                      if name != baseline else "–")
            lines.append(f"| {_NAMES[name]} | {100 * acc['mean']:.2f} ± {100 * acc['se']:.2f} "
                         f"| {auc['mean']:.4f} ± {auc['se']:.4f} | {paired} | {record} "
                         f"| {acc['count']} |")
    kernel = results["summary"]["kernel"]
    if kernel:
        if lines:
            lines.append("")
        sizes = sorted({key.split("@")[1] for key in kernel}, key=int)
        lines += ["| training images | " + " | ".join(
            f"{_NAMES[m]}: accuracy (%) / AUC" for m in KERNEL_METHODS) + " | problems |",
            "|---|" + "---|" * (len(KERNEL_METHODS) + 1)]
        for size in sizes:
            cells = []
            for method in KERNEL_METHODS:
                acc = kernel[f"{method}@{size}"]["test_accuracy"]
                auc = kernel[f"{method}@{size}"]["test_auc"]
                cells.append(f"{100 * acc['mean']:.2f} ± {100 * acc['se']:.2f} / "
                             f"{auc['mean']:.4f} ± {auc['se']:.4f}")
            count = kernel[f"{KERNEL_METHODS[0]}@{size}"]["test_accuracy"]["count"]
            lines.append(f"| {size} | " + " | ".join(cells) + f" | {count} |")
    return "\n".join(lines) + "\n"


def _read_folder(folder: str) -> dict:
    out = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".json"):
                with open(os.path.join(folder, name)) as f:
                    out[name[:-5]] = json.load(f)
    return out


def _write_results(config, start, sessions_seconds, complete):
    per_pair = _read_folder(os.path.join(config.output_dir, "pairs"))
    kernel = _read_folder(os.path.join(config.output_dir, "kernel", "pairs"))
    training.write_json(os.path.join(config.output_dir, "results.json"), {
        "config": dataclasses.asdict(config), "machine": training.machine_info(),
        "complete": complete, "wall_seconds": sessions_seconds + time.time() - start,
        "summary": summarize(per_pair, kernel), "pairs": per_pair, "kernel_pairs": kernel})


def run(config: SuquanConfig) -> dict:
    """Runs (or resumes) the benchmark; returns the contents of `results.json`."""
    config.finalize()
    log = print if config.verbose else (lambda *_: None)
    start = time.time()
    with training.output_directory(config.output_dir):
        results_path = os.path.join(config.output_dir, "results.json")
        sessions_seconds = 0.0
        if os.path.exists(results_path):
            with open(results_path) as f:
                sessions_seconds = float(json.load(f).get("wall_seconds", 0.0))
        data = load_images(config)
        pairs_dir = os.path.join(config.output_dir, "pairs")
        kernel_dir = os.path.join(config.output_dir, "kernel")
        os.makedirs(pairs_dir, exist_ok=True)
        finished = 0

        def stop():
            return config.stop_after_pairs is not None and finished >= config.stop_after_pairs

        for a, b in config.pairs if config.normalizations else ():
            path = os.path.join(pairs_dir, f"{a}_{b}.json")
            if os.path.exists(path) or stop():
                continue
            result = _run_pair(config, pair_data(data, a, b, config.train_size,
                                                 config.val_size, config.seed))
            training.write_json(path, result)
            finished += 1
            _write_results(config, start, sessions_seconds, False)
            log(f"pair {a}-{b}: " + ", ".join(
                f"{m} {r['test_accuracy']:.4f}" for m, r in result["normalizations"].items()))
        if config.kernel_sizes and not stop():
            train_idx, train_labels, test_idx, test_labels = _kernel_pools(data, config)
            train_x, test_x = data.x_train[train_idx], data.x_test[test_idx]
            gram_train = gram_blocks(train_x, train_x, os.path.join(kernel_dir, "gram", "train"),
                                     config.kernel_block, True, log)
            gram_test = gram_blocks(test_x, train_x, os.path.join(kernel_dir, "gram", "test"),
                                    config.kernel_block, False, log)
            grams = (gram_train, gram_test)
            pools = (train_x, train_labels, test_x, test_labels)
            os.makedirs(os.path.join(kernel_dir, "pairs"), exist_ok=True)
            for a, b in config.pairs:
                path = os.path.join(kernel_dir, "pairs", f"{a}_{b}.json")
                if os.path.exists(path):
                    continue
                result = _kernel_pair(a, b, pools, grams, config)
                training.write_json(path, result)
                log(f"kernel pair {a}-{b}: " + ", ".join(
                    f"{m}@{s} {result[s][m]['test_accuracy']:.3f}"
                    for s in map(str, config.kernel_sizes) for m in KERNEL_METHODS))
        complete = ((not config.normalizations or all(
                        os.path.exists(os.path.join(pairs_dir, f"{a}_{b}.json"))
                        for a, b in config.pairs))
                    and (not config.kernel_sizes or all(
                        os.path.exists(os.path.join(kernel_dir, "pairs", f"{a}_{b}.json"))
                        for a, b in config.pairs)))
        _write_results(config, start, sessions_seconds, complete)
        with open(results_path) as f:
            results = json.load(f)
        log(format_tables(results))
        return results
