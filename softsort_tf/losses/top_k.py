"""The S-top-k classification loss (Cuturi, Teboul & Vert 2019, §4)."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _docs
from softsort_tf._permutation_targets import check_at_run_time
from softsort_tf.losses.method import MethodLoss
from softsort_tf.ops.family import get_family
from softsort_tf.ops.sinkhorn import EPSILON_PER_RANK_SCALE, MIN_LENGTH_EPSILON
from softsort_tf.ops.soft import soft_rank

_PACKAGE = "softsort_tf"
FORMS = ("rank", "cdf")
# ε = TOPK_EPSILON_SCALE / L² keeps the rank blur L·√(ε/2) at ≈ 0.39 of a rank for any L.
TOPK_EPSILON_SCALE = EPSILON_PER_RANK_SCALE
TOPK_MIN_EPSILON = MIN_LENGTH_EPSILON


def _check_form(form: str) -> str:
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {FORMS}, got {form!r}.")
    return form


def default_top_k_epsilon(num_classes: int) -> float:
    """The default ε of `SoftTopKLoss` for L classes: max(0.3 / L², 1e-6).

    The logistic squash standardises the logits, so the loss does not depend on their
    scale, and maps them into (0, 1), where the L targets are 1/L apart. Swapping
    two neighbouring ranks changes the cost by about 2/L², and each Sinkhorn rank
    blurs over about L·√(ε/2) neighbours. ε = 0.3/L² keeps that blur at ≈ 0.4 of a
    rank whatever L is (3e-3 for 10 classes, 3e-5 for 100): small enough that a label
    ahead of the others by a clear margin gets a loss of exactly 0 for k ≥ 2, large
    enough that a label within about a rank of the top-k boundary gets a useful
    gradient (smaller ε gives vanishing gradients, paper §3). The floor 1e-6 keeps ε
    above the float32 resolution of the costs for L ≳ 500.
    """
    num_classes = _checks.check_positive_int("num_classes", num_classes, minimum=2)
    return max(TOPK_EPSILON_SCALE / num_classes**2, TOPK_MIN_EPSILON)


def soft_topk_loss(y_true, logits, k: int = 1, *, form: str = "rank",
                    from_sparse: bool = False, mask=None, method: str = "sinkhorn",
                    temperature: float | None = None, **kwargs):
    """Per-example S-top-k loss of logits `[..., L]` (paper §4; talk, "Applications").

    - form='rank' (talk): J_k(L − R̃_l) with J_k(u) = max(0, u − k + 1), where R̃ are
      the ascending soft ranks of the logits by `method` (`soft_rank`), in [1, L]. In
      the hard limit it is the number of places by which label l misses the top k: 0
      inside the top-k.
    - form='cdf' (paper): J_k(1 − F̃_l) with J_k(u) = max(0, u − k/L), F̃ = R̃/L the
      soft CDF (for 'sinkhorn', the S-CDF).
      In the hard limit F = R/L, so this is max(0, L − R_l − k)/L: the paper's hinge
      sits one place later than the rank form, and the loss is already 0 when the
      label is (k+1)-th (it equals the rank form with k + 1, divided by L).

    For soft labels (rows of `y_true` summing to 1, e.g. label smoothing) the loss is
    the expectation Σ_j y_j J_k(·)_j; for one-hot labels it is the term of the label.

    Padding (softsort_tf._masking): `mask` marks the candidate classes of each example
    (e.g. a variable set of candidates padded to L); the ranks and the CDF are those
    of the valid classes alone, L above is their number L_v, and a padded class has
    loss 0 (a label on one contributes nothing). k ≥ L_v selects every valid class
    (loss 0 in the hard limit). Padded *examples* are Keras' business: give them
    `sample_weight` 0 (their logits must then be finite, as for any Keras loss).

    Args:
      y_true: integer labels in [0, L) `[...]` or `[..., 1]` if `from_sparse` (a label
        out of range raises, see `permutation_targets.check_at_run_time`), else one-hot
        or soft labels `[..., L]`.
      logits: `[..., L]` real tensor, L ≥ 2. L may be unknown when the graph is built
        (`None`) if `epsilon` is given (the default ε depends on L); k < L is then
        checked at run time.
      k: an integer in [1, L).
      form: 'rank' or 'cdf' (see above).
      from_sparse: whether `y_true` holds integer class indices.
      mask: optional boolean `[..., L]` (or `[L]`), True = valid class (see above);
        not with 'permutahedron'.
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`. For
        'sinkhorn' (the Sinkhorn settings `options`, `squash`, `targets`, `epsilon`,
        ... in kwargs), ε defaults to `default_top_k_epsilon(L)` when neither
        `temperature` nor `epsilon` is given (or given as None); the other families
        default to their own temperature.

    Returns:
      `[...]` non-negative losses, in the dtype of the logits.

    Example:
    >>> loss = soft_topk_loss([2, 0], [[0.1, 5.0, 9.0], [0.0, 1.0, 2.0]], k=1,
    ...                        from_sparse=True)
    >>> np.round(loss.numpy(), 1)
    array([0., 2.], dtype=float32)
    """
    _checks.check_dense("logits", logits)
    _checks.check_dense("y_true", y_true, mask=None)
    logits = tf.convert_to_tensor(logits)
    if logits.shape.rank is None or logits.shape.rank < 1:
        raise ValueError("`logits` must have rank >= 1 with classes on the last axis.")
    static_classes = logits.shape[-1]
    if static_classes is not None and static_classes < 2:
        raise ValueError(f"`logits` must have L >= 2 classes on the last axis, got shape "
                         f"{logits.shape}.")
    form = _check_form(form)
    family = get_family(method)
    # The family's settings; a temperature its settings leave to the caller (Sinkhorn's
    # `epsilon=None`) is chosen for the number of classes L (`Settings.for_length`).
    if temperature is None:
        kwargs = family.settings.leave_temperature(kwargs)
    settings, temperature, kwargs = family.settings.create(
        family, family.check_temperature(temperature), None, kwargs)
    if static_classes is None:
        # L is only known at run time: k < L is checked then, and a default that
        # depends on L cannot be chosen when the graph is built.
        k = _checks.check_positive_int("k", k)
        settings = settings.for_length(None)
        num_classes = tf.shape(logits)[-1]
        logits = check_at_run_time(
            tf.logical_and(k < num_classes, num_classes >= 2), logits,
            f"`k` must be an integer in [1, L), L the number of classes; got k = {k}.")
    else:
        num_classes = static_classes
        k = _checks.check_k(k, num_classes)
        settings = settings.for_length(num_classes)
    kwargs = {**kwargs, **settings.operator_kwargs()}
    soft = soft_rank(logits, method, "ASCENDING", mask=mask, temperature=temperature,
                     **kwargs)
    classes = tf.cast(num_classes, soft.dtype)
    if mask is not None:
        mask = tf.broadcast_to(tf.cast(mask, tf.bool), tf.shape(soft))
        classes = tf.reduce_sum(tf.cast(mask, soft.dtype), axis=-1, keepdims=True)
    if form == "cdf":
        soft = soft / tf.maximum(classes, 1.0)
    k_float = tf.cast(k, soft.dtype)
    if form == "rank":
        per_class = tf.nn.relu(classes - k_float + 1.0 - soft)
    else:
        per_class = tf.nn.relu(1.0 - k_float / tf.maximum(classes, 1.0) - soft)
    if mask is not None:
        per_class = tf.where(mask, per_class, tf.zeros_like(per_class))
    if from_sparse:
        labels = tf.convert_to_tensor(y_true)
        if labels.shape.rank == logits.shape.rank:
            if labels.shape[-1] != 1:
                raise ValueError(f"Sparse `y_true` must have shape [...] or [..., 1], got "
                                 f"{labels.shape} for logits {logits.shape}.")
            labels = labels[..., 0]
        labels = tf.cast(labels, tf.int32)
        labels = check_at_run_time(
            tf.reduce_all((labels >= 0) & (labels < num_classes)), labels,
            "Sparse `y_true` must hold class indices in [0, L) = "
            + (f"[0, {static_classes})." if static_classes else "[0, number of classes)."))
        return tf.gather(per_class, labels, batch_dims=labels.shape.rank)
    labels = tf.cast(y_true, per_class.dtype)
    if labels.shape.rank != logits.shape.rank or not labels.shape[-1:].is_compatible_with(
            logits.shape[-1:]):
        raise ValueError(f"One-hot `y_true` must have the shape of the logits {logits.shape}, "
                         f"got {labels.shape}; pass from_sparse=True for integer labels.")
    return tf.reduce_sum(labels * per_class, axis=-1)


@_docs.fill
@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftTopKLoss(MethodLoss):
    """Differentiable top-k classification loss on logits (Cuturi et al. 2019, §4).

    For logits f ∈ R^L and the true label l (`soft_topk_loss`):

        form='rank' (NeurIPS talk):  J_k(L − R̃_l),      J_k(u) = max(0, u − k + 1)
        form='cdf'  (arXiv §4):      J_k(1 − F̃_l),      J_k(u) = max(0, u − k/L)

    with R̃ the ascending soft ranks of f in [1, L] by `method` (`soft_rank`) and
    F̃ = R̃/L (for 'sinkhorn', the S-CDF of Definition 2). In the hard limit the rank
    form is the number of places by which l misses the top k (0 inside it), a hinge
    version of the 0/1 top-k loss H(L − R_l − k + 1). The paper's cdf form equals that
    with k + 1, divided by L (the paper's hinge sits one place late), so it is 0 as
    soon as l is (k+1)-th; it is kept as written for faithfulness, the rank form is
    the default.

    Behaviour (for 'sinkhorn'; the other families' temperatures are in the units of
    the logits): the loss is 0 when l is inside the top k by a clear margin, positive
    when it is outside, and decreases as f_l grows. It is invariant to shifting and
    scaling the logits (the logistic squash standardises them), so unlike
    cross-entropy it never pushes logits to grow. With k ≥ 2 the loss of a label
    inside the top k by a clear margin is exactly 0. With k = 1 the hinge sits at the
    top rank itself, so a correctly classified example keeps the Sinkhorn blur of its
    rank, L − R̃_l ≥ 0, as a small loss that vanishes as ε → 0 or as its lead grows
    (see `default_top_k_epsilon` for typical values): like the residual push of
    cross-entropy on examples that are already right.

    Default ε: None means `default_top_k_epsilon(L)` = 0.3/L² (3e-3 for 10 classes):
    the squashed logits are compared with a grid of L targets 1/L apart, and this ε
    keeps each soft rank blurred over ≈ 0.4 of a rank whatever L is. Larger ε gives
    smoother but blurrier losses (the paper used ε = 1e-2 with 10 and 100 classes);
    much smaller ε gives vanishing gradients.

    Use `keras.metrics.SparseTopKCategoricalAccuracy(k)` (or
    `TopKCategoricalAccuracy` for one-hot labels) as the matching hard metric.

    Args:
      k: an integer in [1, L) (default 1: a relaxed 0/1 loss).
      form: 'rank' (default) or 'cdf'.
      from_sparse: `y_true` holds integer labels `[batch]` or `[batch, 1]` instead of
        one-hot (or soft) labels `[batch, L]` (default False, like
        `keras.losses.CategoricalCrossentropy`).
      {method}
      temperature: the method's temperature (None: its default; for 'sinkhorn', ε,
        whose default is 0.3/L², see above).
      {method_kwargs}
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`);
        only with method='sinkhorn'. Without `epsilon` (or with `epsilon=None`),
        ε = 0.3/L² (see above); the other fields keep the defaults of
        `SinkhornOptions`.
      reduction: Keras reduction over examples (default 'sum_over_batch_size').
      name, dtype: as in `keras.losses.Loss`.

    Input shapes: logits `y_pred` `[batch, L]`; `y_true` `[batch, L]` or `[batch]`;
    `sample_weight` `[batch]`. Output: a scalar, or `[batch]` for reduction 'none'.

    Padding: a Keras mask of the logits of their shape `[batch, L]` marks the valid
    classes (the `mask` of `soft_topk_loss`); `sample_weight` 0
    removes an example, as in every Keras loss. L may be unknown when the model is
    built if `epsilon` is given. Runs under XLA (where the run-time checks of k < L and
    of sparse labels are compiled out).

    Example:
    >>> loss = SoftTopKLoss(k=1, from_sparse=True)
    >>> float(loss([1], [[0.0, 5.0, 1.0]])) < 5e-3
    True
    """

    item_mask = True

    def __init__(self, k: int = 1, form: str = "rank", from_sparse: bool = False, *,
                 method: str = "sinkhorn", temperature: float | None = None,
                 method_kwargs: dict | None = None,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_topk_loss", dtype=None, **kwargs):
        if temperature is None:  # the family's default for L classes, if it has one
            kwargs = get_family(method).settings.leave_temperature(kwargs)
        super().__init__(
            soft_topk_loss,
            dict(k=_checks.check_positive_int("k", k), form=_check_form(form),
                 from_sparse=_checks.check_bool("from_sparse", from_sparse)),
            method=method, temperature=temperature, method_kwargs=method_kwargs,
            reduction=reduction, name=name, dtype=dtype, **kwargs)
