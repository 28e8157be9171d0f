"""Docstring fragments: each argument convention of the package written once.

A docstring names a fragment by a line that holds only `{name}` (indented as an entry
of its `Args:`); `fill` replaces the line by the fragment, indented the same way (the
continuation lines four spaces deeper). The entry points that share a convention (the
front door, its layers, the losses that take `method=`) all read it from here, so the
convention is stated in one place and reads the same everywhere.

Example:
>>> def f(x, direction="ASCENDING"):
...     '''Args:
...       {direction}
...     '''
>>> print(fill(f).__doc__.splitlines()[1].strip())
direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
"""

from __future__ import annotations

import re
import textwrap

FRAGMENTS = {
    "method": (
        "method: the family that computes the operation, a key of `softsort_tf.FAMILIES` "
        "('sinkhorn', 'lapsum', 'permutahedron', 'softsort', 'neuralsort', "
        "'sorting_network', or one added with `register_family`)."),
    "temperature": (
        "temperature: the family's temperature (`get_family(method).temperature`: ε, α, "
        "τ, the regularisation strength or the steepness); None: the family's default. "
        "A real number, or a scalar tensor or variable through which gradients flow for "
        "the families with `tensor_temperature` (LapSum); refused, with the range, "
        "outside the values the compute dtype resolves (`Family.temperature_range`)."),
    "method_kwargs": (
        "method_kwargs: the family's own arguments as a dict, e.g. "
        "`{\"regularization\": \"kl\"}` for 'permutahedron' or `{\"distance_power\": 2.0}` "
        "for 'softsort'; checked against the keywords the family takes."),
    "sinkhorn_settings": (
        "options, squash, targets, **kwargs: Sinkhorn's settings as arguments of their own "
        "(a `SinkhornOptions` or its fields such as `epsilon`, the squash of the inputs "
        "and the target grid), accepted only with method='sinkhorn'."),
    "direction": "direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.",
    "direction_rank": (
        "direction: 'ASCENDING' (rank 1 = smallest) or 'DESCENDING' (rank 1 = largest)."),
    "axis": (
        "axis: the axis of the lists: any axis of an input of any rank (the last one for "
        "a `tf.RaggedTensor`)."),
    "mask": (
        "mask: optional boolean (or 0/1) `[..., n]` of the input's shape or `[n]`, True = "
        "valid entry (the package's padding convention, `softsort_tf._masking`): padded "
        "entries take no part in the result of the valid ones, whatever their value (NaN "
        "included), and get a zero gradient."),
}

_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)\{(?P<name>[a-z_]+)\}[ \t]*$", re.MULTILINE)


def _entry(name: str, indent: str) -> str:
    return textwrap.fill(FRAGMENTS[name], width=88, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False)


def fill(obj):
    """`obj` with each fragment placeholder line of its docstring replaced (see the
    module docstring); an unknown name raises a `KeyError` at import."""
    if obj.__doc__:
        obj.__doc__ = _PLACEHOLDER.sub(
            lambda m: _entry(m.group("name"), m.group("indent")), obj.__doc__)
    return obj
