"""Functional operators: the families of differentiable sorting operators, relaxed
permutations, sampling, hard statistics.

Importing this package registers the built-in families in the one table,
`softsort_tf.ops.family.FAMILIES`, in the order of the front door's table.
"""

from softsort_tf.ops import lapsum, permutahedron, permutation, sinkhorn, sorting_networks
from softsort_tf.ops.family import register_family

for _family in (sinkhorn.SINKHORN, lapsum.LAPSUM, permutahedron.PERMUTAHEDRON,
                permutation.SOFTSORT, permutation.NEURALSORT, sorting_networks.DIFFSORT):
    register_family(_family)
del _family
