"""float64 in the traced forward graphs of every family, by phase (issue 41 item 2).

Each family's forward (rank, sort, top-k, quantile and the relaxed permutation matrix,
as it defines them) is traced on float32 lists and the nodes with a float64 dtype
attribute are counted, in the function itself ('forward') and in the bodies and
conditions of its while loops ('loop': the Sinkhorn iterations, LapSum's scan).

What holds (docs/deploy.md, "TFLite"):
- lists of a static length (here 6): no float64 anywhere, Sinkhorn's forward included
  under its default float64 implicit backward (the read-outs are computed in float32 and
  differentiated in float64 only in the backward);
- lists of a length unknown at trace time: LapSum accumulates its kernel sums in float64
  (`lapsum.FLOAT32_SUMS_UP_TO`) and the Sinkhorn loop its marginal sums
  (`solvers.sinkhorn.LONG_SUM`); the other families stay float32.

About 15 s of CPU (30 traces).
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

import softsort_tf
from softsort_tf.ops import family as family_module

PHASES = ("rank", "sort", "topk", "quantile", "matrix")


def _forward(method: str, phase: str, **kwargs):
    @tf.autograph.experimental.do_not_convert
    def fn(x):
        if phase == "matrix":
            return family_module.get_family(method).matrix(x, **kwargs)
        if phase == "topk":
            return softsort_tf.soft_topk(x, 2, method=method, **kwargs)
        if phase == "quantile":
            return softsort_tf.soft_quantile(x, 0.3, method=method, **kwargs)
        return getattr(softsort_tf, f"soft_{phase}")(x, method=method, **kwargs)

    return fn


def _cases():
    for method, fam in family_module.FAMILIES.items():
        for phase in PHASES:
            if (phase == "matrix" and fam.has_matrix) or phase in fam.operations:
                yield method, phase


def float64_ops(fn, spec) -> dict[str, int]:
    """`{'forward': n, 'loop': m}`: the nodes of the traced `fn` with a float64 dtype
    attribute, outside and inside while loops."""
    graph_def = tf.function(fn).get_concrete_function(spec).graph.as_graph_def()

    def count(nodes):
        return sum(any(v.type == types_pb2.DT_DOUBLE or types_pb2.DT_DOUBLE in v.list.type
                       for v in node.attr.values()) for node in nodes)

    counts = {"forward": count(graph_def.node), "loop": 0}
    for function in graph_def.library.function:
        loop = function.signature.name.startswith(("while_body", "while_cond"))
        counts["loop" if loop else "forward"] += count(function.node_def)
    return counts


@pytest.mark.parametrize("method, phase", list(_cases()))
def test_no_float64_in_float32_forwards_of_static_length(method, phase):
    counts = float64_ops(_forward(method, phase), tf.TensorSpec([2, 6], tf.float32))
    assert counts == {"forward": 0, "loop": 0}, (method, phase, counts)


def test_unknown_length_float64_only_where_documented():
    spec = tf.TensorSpec([2, None], tf.float32)
    first = {}
    for method, phase in _cases():
        first.setdefault(method, phase)  # one phase per family: they share the core
    for method, phase in first.items():
        counts = float64_ops(_forward(method, phase), spec)
        if method == "lapsum":
            assert counts["forward"] + counts["loop"] > 0  # the kernel sums
        elif method == "sinkhorn":
            assert counts["loop"] > 0  # long marginal sums
        else:
            assert counts == {"forward": 0, "loop": 0}, (method, phase, counts)


def test_the_count_sees_float64():
    """The counter is not blind: a float64 op inside a loop and outside is counted."""

    def fn(x):
        y = tf.cast(x, tf.float64) * 2.0
        _, z = tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v * 2.0), (0, y))
        return tf.cast(z, tf.float32)

    counts = float64_ops(fn, tf.TensorSpec([3], tf.float32))
    assert counts["forward"] > 0 and counts["loop"] > 0
    assert float64_ops(lambda x: x * 2.0, tf.TensorSpec([3], tf.float32)) == {
        "forward": 0, "loop": 0}
