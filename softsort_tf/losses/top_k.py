"""The S-top-k classification loss (Cuturi, Teboul & Vert 2019, §4)."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _docs
from softsort_tf._permutation_targets import check_at_run_time
from softsort_tf.losses.method import MethodLoss
from softsort_tf.ops.family import get_family
from softsort_tf.ops.sinkhorn import epsilon_for_length
from softsort_tf.ops.soft import soft_rank

_PACKAGE = "softsort_tf"
FORMS = ("rank", "cdf")


def default_top_k_epsilon(num_classes: int) -> float:
    """The default ε of `SoftTopKLoss` for L classes, max(0.3 / L², 1e-6)
    (`softsort_tf.ops.sinkhorn.epsilon_for_length`): each soft rank blurred over ≈ 0.4
    of a rank whatever L is (3e-3 for 10 classes), so that a label ahead by a clear
    margin has loss 0 for k ≥ 2 and one near the top-k boundary a useful gradient."""
    return epsilon_for_length(_checks.check_positive_int("num_classes", num_classes,
                                                        minimum=2))


def soft_topk_loss(y_true, logits, k: int = 1, *, form: str = "rank",
                    from_sparse: bool = False, mask=None, method: str = "sinkhorn",
                    temperature: float | None = None, **kwargs):
    """Per-example S-top-k loss of logits `[..., L]` (paper §4; talk, "Applications").

    With R̃ the ascending soft ranks of the logits by `method` (`soft_rank`), in [1, L]:

    - form='rank' (talk): J_k(L − R̃_l), J_k(u) = max(0, u − k + 1): in the hard limit
      the number of places by which label l misses the top k.
    - form='cdf' (paper): J_k(1 − F̃_l), J_k(u) = max(0, u − k/L), F̃ = R̃/L (for
      'sinkhorn', the S-CDF): in the hard limit the rank form with k + 1, divided by L.

    For soft labels (rows of `y_true` summing to 1) the loss is Σ_j y_j J_k(·)_j. A
    `mask` marks the candidate classes of each example: ranks and CDF are those of the
    L_v valid classes, a padded class has loss 0, k ≥ L_v selects every valid class.

    Args:
      y_true: integer labels in [0, L) `[...]` or `[..., 1]` if `from_sparse` (a label
        out of range raises), else one-hot or soft labels `[..., L]`.
      logits: `[..., L]` real tensor, L ≥ 2; L may be unknown when the graph is built
        if the temperature is given (k < L is then checked at run time).
      k: an integer in [1, L).
      form: 'rank' or 'cdf'.
      from_sparse: whether `y_true` holds integer class indices.
      mask: optional boolean `[..., L]` (or `[L]`), True = valid class.
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`; without a
        temperature, Sinkhorn's ε is `default_top_k_epsilon(L)`, the other families
        take their default.

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
    form = _checks.check_choice("form", form, FORMS)
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
    k_float = tf.cast(k, soft.dtype)
    if form == "rank":
        per_class = tf.nn.relu(classes - k_float + 1.0 - soft)
    else:
        classes = tf.maximum(classes, 1.0)
        per_class = tf.nn.relu(1.0 - k_float / classes - soft / classes)
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
    """Differentiable top-k classification loss on logits (`soft_topk_loss`: the rank
    form, a hinge version of the 0/1 top-k loss, or the paper's cdf form).

    For 'sinkhorn' the loss does not depend on the logits' shift and scale (the squash
    standardises them), so unlike cross-entropy it never pushes logits to grow; with
    k = 1 a correct example keeps the blur of its rank as a small loss. Its hard
    counterpart: `keras.metrics.SparseTopKCategoricalAccuracy(k)`.

    Args:
      k: an integer in [1, L) (default 1: a relaxed 0/1 loss).
      form: 'rank' (default) or 'cdf'.
      from_sparse: `y_true` holds integer labels `[batch]` or `[batch, 1]` instead of
        one-hot (or soft) labels `[batch, L]` (default False).
      {method}
      temperature: the family's temperature (None: its default; for 'sinkhorn' ε =
        `default_top_k_epsilon(L)` = 0.3/L², unless `epsilon` is given).
      {method_kwargs}
      {sinkhorn_settings}
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: logits `y_pred` `[batch, L]` (a Keras mask of their shape marks the
    valid classes); `y_true` `[batch, L]` or `[batch]`; `sample_weight` `[batch]`. Runs
    under XLA (where the run-time checks of k < L and of sparse labels are compiled out).

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
            dict(k=_checks.check_positive_int("k", k),
                 form=_checks.check_choice("form", form, FORMS),
                 from_sparse=_checks.check_bool("from_sparse", from_sparse)),
            method=method, temperature=temperature, method_kwargs=method_kwargs,
            reduction=reduction, name=name, dtype=dtype, **kwargs)
