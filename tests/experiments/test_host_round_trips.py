"""The binaries' training steps run as traced graphs without host round trips: no
Python function (`tf.py_function`/`tf.numpy_function`) inside the step of the
large-MNIST sorting model (Sinkhorn with its convergence check and LapSum, the two
families with host-side choices) nor of the stochastic median regressor (Gumbel
sampling), so a GPU step never waits for the host.

The optimizer's and metrics' variables are built first from a validation batch, as
`training.fit_resumable` does before `fit`: the step is then traced once, as the binaries
trace it (a first trace that creates variables would be traced a second time)."""

import pytest
import tensorflow as tf

from softsort_tf.experiments import large_mnist as experiment
from softsort_tf.experiments import training

HOST_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
CASES = [("sort", "sinkhorn", False), ("sort", "lapsum", False), ("median", "neuralsort", True)]


def _op_types(graph) -> set[str]:
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return {node.op for node in nodes}


@pytest.mark.parametrize("task, method, stochastic", CASES)
def test_training_step_has_no_host_round_trip(task, method, stochastic):
    config = experiment.ExperimentConfig(task=task, method=method, n=3, stochastic=stochastic,
                                         batch_size=2, num_val_sequences=2,
                                         num_test_sequences=2).finalize()
    model = experiment.build_model(config)
    train_dataset, val_ds, _ = experiment.make_datasets(config)
    assert training.build_training_state(model, val_ds)
    batch = next(iter(train_dataset(0)))
    graph = tf.function(model.train_step).get_concrete_function(batch).graph
    types = _op_types(graph)
    assert "AssignVariableOp" in types or "AssignAddVariableOp" in types  # a real step
    assert not HOST_OPS & types, sorted(HOST_OPS & types)
