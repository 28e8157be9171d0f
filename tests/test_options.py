"""Tests of `softsort_tf.options`: `SinkhornOptions`, one validated settings object
shared by the Sinkhorn operators, layers and losses."""

import numpy as np
import pytest

import softsort_tf as ss
from softsort_tf.options import ImplicitDiff, SinkhornOptions
from softsort_tf.solvers import sinkhorn as solver_lib


@pytest.mark.parametrize("kwargs, name", [
    (dict(epsilon="0.1"), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=True), "epsilon"),
    (dict(power=1.0), "power"),
    (dict(power=0.5), "power"),
    (dict(power=float("inf")), "power"),
    (dict(threshold=0.0), "threshold"),
    (dict(max_iterations=0), "max_iterations"),
    (dict(max_iterations=2.5), "max_iterations"),
    (dict(implicit_diff="yes"), "implicit_diff"),
    (dict(epsilon_decay=1.0), "epsilon_decay"),
])
def test_bad_options_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SinkhornOptions(**kwargs)
    # The operators, layers and losses validate through the same object.
    with pytest.raises(ValueError, match=name):
        ss.sinkhorn_rank([[1.0, 2.0]], **kwargs)
    with pytest.raises(ValueError, match=name):
        ss.SinkhornSort(**kwargs)
    with pytest.raises(ValueError, match=name):
        ss.SpearmanLoss(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(squash="tanh"), "squash"),
    (dict(targets="edges"), "targets"),
])
def test_operator_settings_are_validated_at_construction(kwargs, name):
    for make in (ss.SinkhornRank, ss.SinkhornSort, ss.SinkhornPermutation, ss.SpearmanLoss,
                 ss.SoftTopKLoss, ss.SoftNDCGLoss):
        with pytest.raises(ValueError, match=name):
            make(**kwargs)


def test_power_at_most_one_is_rejected_because_its_limit_is_not_the_sort():
    # For p = 1 the 1-D transport has many optimal plans and the ε → 0 limit of the
    # entropic plan is not the sort (ranks off by 0.5–0.75 before this was rejected).
    with pytest.raises(ValueError, match="power"):
        ss.sinkhorn_rank(np.array([[0.3, -1.2, 2.0, 0.9]]), power=1.0, epsilon=1e-6)
    ranks = ss.sinkhorn_rank(np.array([[0.3, -1.2, 2.0, 0.9]]), power=1.5, epsilon=1e-5,
                             threshold=1e-6)
    np.testing.assert_allclose(ranks.numpy(), [[2.0, 1.0, 4.0, 3.0]], atol=1e-3)


def test_unknown_option_names_are_rejected():
    with pytest.raises(TypeError, match="tolerance"):
        SinkhornOptions().replace(tolerance=1.0)
    with pytest.raises(TypeError, match="tolerance"):
        ss.sinkhorn_sort([[1.0, 2.0]], tolerance=1.0)
    with pytest.raises(TypeError, match="tolerance"):
        ss.SoftTopKLoss(tolerance=1.0)


def test_keywords_override_the_options_object():
    base = SinkhornOptions(epsilon=1e-3, threshold=1e-5)
    resolved = SinkhornOptions.resolve(base, threshold=1e-6)
    assert resolved == SinkhornOptions(epsilon=1e-3, threshold=1e-6)
    assert SinkhornOptions.resolve(base.get_config()) == base
    assert SinkhornOptions.resolve(None) == SinkhornOptions()
    x = np.array([[0.4, -2.0, 1.0, 0.1]])
    np.testing.assert_array_equal(ss.sinkhorn_sort(x, options=base).numpy(),
                                  ss.sinkhorn_sort(x, epsilon=1e-3, threshold=1e-5).numpy())


def test_layer_carries_its_options_unchanged_to_the_solver(monkeypatch):
    options = SinkhornOptions(epsilon=2e-3, threshold=1e-4,
                              implicit_diff=ImplicitDiff(solver="cg"))
    layer = ss.SinkhornRank(options=options, max_iterations=77)
    assert layer.options == options.replace(max_iterations=77)
    assert layer.options.epsilon == 2e-3 and layer.options.max_iterations == 77
    seen = {}
    original = solver_lib.solve

    def spy(x, y, a=None, b=None, options=None, **kwargs):
        seen["options"] = options
        return original(x, y, a, b, options, **kwargs)

    monkeypatch.setattr(solver_lib, "solve", spy)
    layer(np.array([[1.0, 3.0, 2.0]], np.float32))
    assert seen["options"] == layer.options


@pytest.mark.parametrize("make", [
    lambda: ss.SinkhornQuantile(0.3, epsilon=1e-3, check_every=3),
    lambda: ss.SinkhornPermutation(epsilon=1e-3, implicit_diff=None, output_mode="ranks",
                                   squash="atan"),
    lambda: ss.SinkhornRank(targets="centres", implicit_diff=ImplicitDiff(solver="dense")),
    lambda: ss.SoftTopKLoss(2, threshold=1e-4, squash=None),
    lambda: ss.SoftNDCGLoss(epsilon=3e-2, targets="centres"),
    lambda: ss.SoftLeastQuantileRegressionLoss(0.3, error_power=2.0, epsilon=1e-3),
])
def test_options_are_the_config(make):
    obj = make()
    config = obj.get_config()
    fields = SinkhornOptions.field_names()
    assert SinkhornOptions.from_config({f: config[f] for f in fields}) == obj.options
    clone = type(obj).from_config(config)
    assert clone.options == obj.options
    assert clone.get_config() == config


def test_former_argument_names_are_rejected():
    with pytest.raises(TypeError, match="cost_power"):
        ss.SpearmanLoss(cost_power=3.0)
    with pytest.raises(TypeError, match="solver_options"):
        ss.SpearmanLoss(solver_options={"implicit_diff": None})
    with pytest.raises(ValueError, match="power"):  # Keras: unrecognized keyword argument
        ss.SoftSort(tau=0.5, power=2.0)
    with pytest.raises(TypeError, match="epsilon"):
        ss.PermutationCrossEntropy(epsilon=1e-7)
