"""The one table of the package's families of differentiable sorting operators.

A family is one `Family` record (its temperature, operations, relaxed matrix, masks and
`Settings`) plus its maths. Everything that takes `method=` reads this table; built-in
families register themselves from their modules, others with `register_family`
(docs/adding_a_family.md).

Example:
>>> sorted(FAMILIES)[:3]
['lapsum', 'neuralsort', 'permutahedron']
>>> get_family("lapsum").temperature
'alpha'
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import types
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.ops.permutation_readout import permute_values, ranks_from_permutation
from softsort_tf.ops.wrapper import ListResult, list_operator

OPERATIONS = ("rank", "sort", "topk", "quantile")
# What a temperature is measured in: the scores' units (τ, α), their inverse (a
# steepness β), or units independent of the scores' scale (Sinkhorn's ε on [0, 1]).
TEMPERATURE_UNITS = ("scores", "inverse_scores", "normalized")
# Arguments that the front door, the layers and the losses set themselves.
RESERVED = ("direction", "axis", "mask")


def normal_range(dtype) -> tuple[float, float]:
    """`(low, high)`: the positive normal numbers of `dtype`, a family's default
    temperature range."""
    info = np.finfo(tf.as_dtype(dtype).as_numpy_dtype)
    return float(info.tiny), float(info.max)


def _is_tensor(value) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) or (
        hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "assign"))


def check_temperature_value(value, name: str = "temperature"):
    """A temperature as given: None, a real number (returned as a float) or a
    floating-point scalar tensor or variable (returned unchanged: a learnable
    temperature). Bools, strings and other objects are refused."""
    if value is None:
        return None
    if _is_tensor(value) and not isinstance(value, (tf.Tensor, tf.Variable)):
        value = tf.convert_to_tensor(value)  # a keras.Variable: its value, differentiable
    if _is_tensor(value):
        dtype = tf.as_dtype(value.dtype)
        if not dtype.is_floating:
            raise ValueError(f"`{name}` must be a real number or a floating-point tensor, "
                             f"got a tensor of dtype {dtype.name}.")
        if value.shape.rank not in (None, 0):
            raise ValueError(f"`{name}` must be a scalar, got a tensor of shape {value.shape}.")
        static = _static_value(value)
        if static is not None and not (math.isfinite(static) and static > 0):
            raise ValueError(f"`{name}` must be a finite number > 0, got {static!r}.")
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"`{name}` must be a real number (or a floating-point tensor), "
                         f"got {value!r}.")
    return _checks.check_positive(name, value)


def _named_parameters(fn: Callable) -> frozenset[str]:
    """The names of the parameters of `fn` after its first that a keyword can set."""
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    return frozenset(p.name for p in parameters
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def _keywords(fn: Callable) -> frozenset[str] | None:
    """The keywords `fn` takes after its input (`fn.keywords` when recorded); None for
    any (`**kwargs`)."""
    recorded = getattr(fn, "keywords", None)
    if recorded is not None:
        return frozenset(recorded)
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    return None if any(p.kind == p.VAR_KEYWORD for p in parameters) else _named_parameters(fn)


def _static_value(value) -> float | None:
    """The value of a scalar temperature when known now, else None (symbolic)."""
    if not _is_tensor(value):
        return float(value)
    if isinstance(value, tf.Variable) and tf.executing_eagerly():
        return float(value.numpy())
    static = tf.get_static_value(value)
    return None if static is None else float(static)


def family_operation(fn: Callable, *, keywords=()) -> Callable:
    """`fn(x, *args, direction=..., mask=..., **kwargs)` as an operation of a `Family`,
    with the keywords it takes recorded (its named parameters and `keywords`, e.g. the
    fields of an options object it reads from `**kwargs`)."""

    def operation(x, *args, direction, mask, **kwargs):
        return fn(x, *args, direction=direction, mask=mask, **kwargs)

    operation.keywords = _named_parameters(fn) | frozenset(keywords)
    operation.__name__ = operation.__qualname__ = getattr(fn, "__name__", "operation")
    return operation


class Settings:
    """A family's own keywords, split from a constructor's arguments (`create`), validated
    once, handed to every call (`operator_kwargs`) and serialised (`get_config`). This
    base class takes them in `method_kwargs`; Sinkhorn's subclass takes arguments of
    their own (`options`, `squash`, `targets`, the `SinkhornOptions` fields).

    Args:
      family: the `Family`.
      method_kwargs: the family's own arguments (a dict, default none), as `create`
        validated them.

    Attributes:
      family: the `Family`.
      method_kwargs: the family's own validated arguments (a dict).

    Example:
    >>> settings, tau, rest = Settings.create(get_family("softsort"), 0.5,
    ...                                       {"distance_power": 2.0}, {})
    >>> settings.operator_kwargs(), tau, rest
    ({'distance_power': 2.0}, 0.5, {})
    """

    #: Constructor keywords read by `create` besides `method_kwargs` (none here), their
    #: "not set" values (dropped, not refused, for another family), and whether the
    #: settings hold the temperature themselves.
    keywords: frozenset[str] = frozenset()
    keyword_defaults: dict = {}
    holds_temperature = False

    def __init__(self, family: Family, method_kwargs: dict | None = None):
        self.family = family
        self.method_kwargs = dict(method_kwargs or {})

    @classmethod
    def create(cls, family: Family, temperature, method_kwargs, kwargs: dict,
               operation: str = "rank") -> tuple[Settings, object, dict]:
        """`(settings, temperature kept, the other kwargs)` from a constructor's
        validated `temperature`, `method_kwargs` and other keywords `kwargs` (a setting of
        another family is refused); `operation` is the one the layer or loss runs."""
        kwargs = refuse_foreign_keywords(family, kwargs)
        return cls(family, family.check_method_kwargs(method_kwargs, operation)), \
            temperature, dict(kwargs)

    @classmethod
    def leave_temperature(cls, kwargs: dict) -> dict:
        """`kwargs` of a constructor given no temperature, marked so that the caller
        chooses it for the list length (`for_length`); unchanged here."""
        return kwargs

    def for_length(self, n: int | None) -> Settings:
        """The settings for lists of n items (None: unknown at trace time)."""
        del n
        return self

    def attributes(self) -> dict:
        """The settings a layer exposes as attributes of its own (e.g. `layer.options`)."""
        return {}

    def operator_kwargs(self) -> dict:
        """The keywords handed to the family's operators at every call."""
        return dict(self.method_kwargs)

    def get_config(self) -> dict:
        """The settings' part of a layer's or loss's config, besides `method_kwargs`."""
        return {}

    def check_temperature(self, temperature, dtype, name: str = "temperature"):
        """`temperature` checked in the family's range for `dtype` (the settings' own
        temperature when they hold it)."""
        return self.family.check_temperature(temperature, dtype, name=name)


_UNSET = object()


def refuse_foreign_keywords(family: Family, kwargs: dict) -> dict:
    """`kwargs` without the settings of other families left at their defaults; a
    `ValueError` naming the family whose settings another keyword belongs to."""
    kwargs = dict(kwargs)
    for other in _REGISTRY.values():
        if other is family or other.settings is family.settings:
            continue
        defaults = other.settings.keyword_defaults
        for name in set(kwargs) & other.settings_keywords():
            default = defaults.get(name, _UNSET)
            if default is not _UNSET and kwargs[name] == default:
                del kwargs[name]
        foreign = sorted(set(kwargs) & other.settings_keywords())
        if foreign:
            raise ValueError(f"`{foreign[0]}` is a setting of method={other.name!r} only "
                             f"(the settings {sorted(other.settings_keywords())} only apply "
                             f"to method={other.name!r}), got method={family.name!r}.")
    return kwargs


@dataclasses.dataclass(frozen=True)
class Family:
    """One family of differentiable sorting operators: its key `name` (the `method`
    argument everywhere), its temperature's own argument name (`temperature=` means it
    wherever a family is chosen by name), default, `meaning` and `reference`; the
    `operations` it computes itself (`{operation: fn(x, *args, direction, mask,
    **kwargs)}`, along any axis or the last one), and/or `matrix_fn` (the relaxed
    permutation matrix P̂, rank/sort/top-k then read off it). `register_family` adds it
    to the table.

    Args:
      name: the `method` key (an identifier).
      temperature: the name of its temperature's own argument (e.g. 'tau').
      default_temperature: that argument's default.
      meaning: what the temperature is, in a phrase (for error messages and docs).
      reference: where the maths come from.
      operations: `{operation: fn}` for the operations in `OPERATIONS` it computes itself.
      matrix_fn: `fn(scores, *, direction, hard, mask, **own)` → P̂ `[..., n, n]`, or None.
      The other fields and their defaults: docs/adding_a_family.md ("The record").

    Example:
    >>> family = get_family("neuralsort")
    >>> family.temperature, family.default_temperature, family.matrix_fn is not None
    ('tau', 1.0, True)
    """

    name: str
    temperature: str
    default_temperature: float
    meaning: str
    reference: str
    operations: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    matrix_fn: Callable | None = None
    masks: bool = True
    doubly_stochastic: bool = False
    log_domain: bool = False
    settings: type[Settings] = Settings
    temperature_range: Callable[..., tuple[float, float]] = normal_range
    real_k: bool = False
    tensor_temperature: bool = False
    temperature_units: str = "scores"
    scale_free_temperature: float | None = None
    scale_free_settings: Mapping[str, object] = dataclasses.field(default_factory=dict)
    raw_scores_settings: Mapping[str, object] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"A family's `name` must be an identifier, got {self.name!r}.")
        if not isinstance(self.temperature, str) or not self.temperature.isidentifier():
            raise ValueError(f"`temperature` must name an argument, got {self.temperature!r}.")
        operations = dict(self.operations)
        unknown = sorted(set(operations) - set(OPERATIONS))
        if unknown:
            raise ValueError(f"Unknown operations {unknown}; the operations are {OPERATIONS}.")
        if self.matrix_fn is not None:
            for operation, fn in _matrix_operations(self).items():
                operations.setdefault(operation, fn)
        operations = {name: along_any_axis(name, fn) for name, fn in operations.items()}
        if not operations:
            raise ValueError(f"Family {self.name!r} defines no operation: give `operations` "
                             f"or `matrix_fn`.")
        object.__setattr__(self, "operations", types.MappingProxyType(operations))
        if self.temperature_units not in TEMPERATURE_UNITS:
            raise ValueError(f"`temperature_units` must be one of {TEMPERATURE_UNITS}, got "
                             f"{self.temperature_units!r}.")

    def on_raw_scores(self, settings: Mapping[str, object]) -> bool:
        """Whether the family's `settings` apply it to the scores as they are: they
        include its `raw_scores_settings` (a family that normalises the scores, with the
        normalisation off), its temperature then in the units of the scores."""
        raw = self.raw_scores_settings
        return raw is not None and all(k in settings and settings[k] == v
                                       for k, v in raw.items())

    def units(self, settings: Mapping[str, object]) -> str:
        """The units of the temperature with the family's `settings`: 'scores' on the raw
        scores (`on_raw_scores`), else `temperature_units`."""
        return "scores" if self.on_raw_scores(settings) else self.temperature_units

    def temperature_for_scale(self, scale: float, normalized: float | None = None) -> float:
        """The temperature as sharp as `scale` is for scores (1/`scale` for inverse units;
        `normalized`, default the family's default, for 'normalized' units)."""
        if self.temperature_units == "scores":
            return float(scale)
        if self.temperature_units == "inverse_scores":
            return 1.0 / float(scale)
        return float(self.default_temperature if normalized is None else normalized)

    def operation(self, operation: str) -> Callable:
        """The function of `operation`; a `ValueError` names the families that define it."""
        if operation not in self.operations:
            able = [f.name for f in _REGISTRY.values() if operation in f.operations]
            raise ValueError(f"method={self.name!r} does not define a soft {operation}; "
                             f"the methods that do are {able}.")
        return self.operations[operation]

    def keywords(self, operation: str) -> frozenset[str] | None:
        """The keyword arguments the family's `operation` takes (None: any)."""
        return _keywords(self.operation(operation))

    def settings_keywords(self) -> frozenset[str]:
        return frozenset(self.settings.keywords)

    @property
    def has_matrix(self) -> bool:
        return self.matrix_fn is not None

    def matrix(self, scores, *, direction: str = "DESCENDING", hard: bool = False,
               mask=None, **kwargs):
        """P̂ `[..., n, n]` of `scores` (see `permutation_matrix`)."""
        if self.matrix_fn is None:
            able = [f.name for f in _REGISTRY.values() if f.matrix_fn is not None]
            raise ValueError(f"method={self.name!r} has no relaxed permutation matrix; the "
                             f"methods that have one are {able}.")
        if kwargs.get("log") and not self.log_domain:
            able = [f.name for f in _REGISTRY.values() if f.log_domain]
            raise ValueError(f"method={self.name!r} has no log-domain matrix (`log=True`); "
                             f"the methods that have one are {able}.")
        if "axis" in kwargs or "return_info" in kwargs:
            raise ValueError("`axis` and `return_info` are not supported here: scores are "
                             "sorted along their last axis; call the operator directly.")
        return self.matrix_fn(scores, direction=direction, hard=hard, mask=mask, **kwargs)

    def check_temperature(self, temperature, dtype=None, *, name: str = "temperature"):
        """`temperature` validated (`check_temperature_value`) and, with a compute `dtype`
        and a value known now, inside `temperature_range(dtype)`."""
        temperature = check_temperature_value(temperature, name)
        if _is_tensor(temperature) and not self.tensor_temperature:
            able = [f.name for f in _REGISTRY.values() if f.tensor_temperature]
            raise ValueError(f"`{name}` of method={self.name!r} must be a Python number: its "
                             f"operators read it as a constant, so a tensor or variable would "
                             f"get no gradient. A learnable temperature is taken by {able}.")
        if temperature is None or dtype is None:
            return temperature
        value = _static_value(temperature)
        if value is None:
            return temperature
        low, high = self.temperature_range(dtype)
        if not low <= value <= high:
            dtype = tf.as_dtype(dtype).name
            raise ValueError(
                f"`{name}` (method={self.name!r}: {self.temperature}) computing in {dtype} "
                f"must be in [{low:.3g}, {high:.3g}], got {value:g}: outside, {dtype} cannot "
                f"hold the computation" + ("; compute in float64 for a wider range."
                                           if dtype != "float64" else "."))
        return temperature

    def check_k(self, k, n: int | None = None):
        """`k` of a top-k: an integer in [1, n) (a real in (0, n) for `real_k` families,
        or a scalar tensor); n is checked when known."""
        if self.real_k:
            if _is_tensor(k):
                return k
            k = _checks.check_positive("k", k)
            if n is not None and not k < n:
                raise ValueError(f"`k` must be in (0, n) = (0, {n}) for method="
                                 f"{self.name!r}, got {k!r}.")
            return k
        if n is not None:
            return _checks.check_k(k, n)
        return _checks.check_positive_int("k", k)

    def check_method_kwargs(self, method_kwargs: dict | None, operation: str = "rank") -> dict:
        """The validated `method_kwargs` of the family (a new dict; `{}` for None): a dict
        of the family's own argument names (not `direction`, `axis`, `mask`, the
        temperature or its `Settings`' keywords), accepted by one eager call of its
        operator on a three-item list."""
        self.operation(operation)
        if method_kwargs is None:
            return {}
        if not isinstance(method_kwargs, dict) or not all(isinstance(k, str)
                                                          for k in method_kwargs):
            raise ValueError(f"`method_kwargs` must be a dict of argument names, got "
                             f"{method_kwargs!r}.")
        if not method_kwargs:
            return {}
        if self.settings.keywords:
            raise ValueError(f"The settings of method={self.name!r} are arguments of their "
                             f"own ({sorted(self.settings.keywords)[:4]}, ...): "
                             f"`method_kwargs` must be empty, got {method_kwargs!r}.")
        reserved = sorted(set(method_kwargs) & {*RESERVED, self.temperature})
        if reserved:
            raise ValueError(f"`method_kwargs` cannot set `{reserved[0]}`: it is an argument "
                             f"of its own (the temperature is `temperature`).")
        self.check_keywords(method_kwargs, operation, what="`method_kwargs`")
        probe = "rank" if "rank" in self.operations else operation
        args = {"topk": (1,), "quantile": (0.5,)}.get(probe, ())
        with tf.init_scope():  # one eager call validates the values
            try:
                self.operations[probe](tf.constant([[0.0, 1.0, 2.0]]), *args,
                                       direction="ASCENDING", mask=None, **method_kwargs)
            except TypeError as error:
                raise ValueError(f"`method_kwargs` {method_kwargs!r} are not arguments of "
                                 f"method={self.name!r}: {error}") from None
        return dict(method_kwargs)

    def check_keywords(self, kwargs: Mapping, operation: str, what: str = "keyword") -> None:
        """A `ValueError` naming the first of `kwargs` that the family's `operation` does
        not take, and the family's temperature."""
        accepted = self.keywords(operation)
        if accepted is None:
            return
        accepted = accepted | self.settings_keywords()
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            owners = [f.name for f in _REGISTRY.values()
                      if unknown[0] == f.temperature or unknown[0] in f.settings_keywords()]
            hint = f" (an argument of method={owners[0]!r})" if owners else ""
            where = "" if what == "keyword" else f" (in {what})"
            raise ValueError(
                f"`{unknown[0]}`{where}{hint} is not an argument of method={self.name!r}: its "
                f"temperature is `temperature` (or `{self.temperature}`), its own arguments "
                f"are {sorted(accepted - {*RESERVED, 'hard', 'log'})}.")


# What each operation returns per list (`softsort_tf.ops.wrapper.ListResult.kind`).
_OUTPUT_KINDS = dict(rank="elementwise", sort="sorted", topk="elementwise", quantile="per_list")
_NO_ARGUMENT = object()


def along_any_axis(operation: str, fn: Callable) -> Callable:
    """`fn`, an operation written along the last axis of `[..., n]`, as a `list_operator`
    keeping the keywords `fn` takes; `fn` itself when it takes `axis` already."""
    if "axis" in {*inspect.signature(fn).parameters, *(getattr(fn, "keywords", None) or ())}:
        return fn
    kind = _OUTPUT_KINDS[operation]

    def body(x, argument=_NO_ARGUMENT, *, direction, axis=-1, mask=None, **kwargs):
        del axis, mask  # read by `list_operator` into `x`
        args = () if argument is _NO_ARGUMENT else (argument,)
        values = fn(x.values, *args, direction=direction, mask=x.mask, **kwargs)
        lengths = x.count(tf.int32) if kind == "sorted" and x.mask is not None else None
        return ListResult(values, kind, lengths)

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", operation)
    operator = list_operator(body)
    operator.keywords = _keywords(fn)
    return operator


def _matrix_operations(family: Family) -> dict[str, Callable]:
    """Rank, sort and top-k read off the relaxed permutation matrix of `family`, along
    the last axis (`along_any_axis` makes them list operators)."""

    def rank(x, *, direction, mask, **kwargs):
        return ranks_from_permutation(family.matrix(x, direction=direction, mask=mask,
                                                    **kwargs))

    def sort(x, *, direction, mask, **kwargs):
        perm = family.matrix(x, direction=direction, mask=mask, **kwargs)
        return permute_values(perm, x, mask=mask)

    def topk(x, k, *, direction, mask, **kwargs):
        perm = family.matrix(x, direction=direction, mask=mask, **kwargs)
        return tf.reduce_sum(perm[..., :k, :], axis=-2)

    accepted = _keywords(family.matrix_fn)
    if accepted is not None:
        accepted -= {"log", "hard"}
    for fn in (rank, sort, topk):
        fn.keywords = accepted
    return dict(rank=rank, sort=sort, topk=topk)


class _View(Mapping):
    """A read-only, live view of the registered families that pass `keep`."""

    def __init__(self, keep: Callable[[Family], bool] = lambda family: True):
        self._keep = keep

    def _items(self):
        return {name: f for name, f in _REGISTRY.items() if self._keep(f)}

    def __getitem__(self, name: str) -> Family:
        return self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return f"FamilyView({list(self._items())})"


_REGISTRY: dict[str, Family] = {}
#: Every registered family, by name (read-only; `register_family` adds one).
FAMILIES: Mapping[str, Family] = _View()
#: The families with a relaxed permutation matrix (read-only).
MATRIX_FAMILIES: Mapping[str, Family] = _View(lambda family: family.matrix_fn is not None)


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Adds `family` to the table: every entry point that takes `method=` accepts its name.

    Args:
      family: a `Family`.
      replace: allow replacing a registered family of the same name.

    Returns:
      `family`.

    Example:
    >>> import softsort_tf as ss
    >>> def double_rank(x, *, direction="ASCENDING", mask=None, scale=1.0):
    ...     return 2.0 * ss.soft_rank(x, "softsort", direction=direction, mask=mask,
    ...                               temperature=scale) - 1.0
    >>> _ = register_family(Family("double_rank", "scale", 1.0, "τ of SoftSort", "-",
    ...                            operations=dict(rank=double_rank)))
    >>> ss.soft_rank([[0.0, 100.0]], "double_rank").numpy()
    array([[1., 3.]], dtype=float32)
    >>> unregister_family("double_rank")
    """
    if not isinstance(family, Family):
        raise ValueError(f"register_family takes a Family, got {family!r}.")
    if family.name in _REGISTRY and not replace:
        raise ValueError(f"A family called {family.name!r} is registered already; pass "
                         f"replace=True to replace it.")
    _REGISTRY[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Removes the family `name` from the table (a `KeyError` if there is none).

    Args:
      name: a registered family's name.

    Example:
    >>> _ = register_family(dataclasses.replace(get_family("softsort"), name="copy"))
    >>> "copy" in FAMILIES
    True
    >>> unregister_family("copy")
    >>> "copy" in FAMILIES
    False
    """
    del _REGISTRY[name]


def get_family(method) -> Family:
    """The family called `method`; a `ValueError` lists the names otherwise.

    Args:
      method: a registered family's name (the `method` argument of the entry points).

    Returns:
      its `Family`.

    Example:
    >>> get_family("sinkhorn").temperature
    'epsilon'
    """
    try:
        return _REGISTRY[method]
    except (KeyError, TypeError):
        raise ValueError(f"`method` must be one of {tuple(_REGISTRY)}, got {method!r}.") from None


def get_matrix_family(method) -> Family:
    """The family called `method` with a relaxed permutation matrix."""
    family = get_family(method)
    if family.matrix_fn is None:
        raise ValueError(f"`method` must be one of {tuple(MATRIX_FAMILIES)} (the families "
                         f"with a relaxed permutation matrix), got {method!r}.")
    return family
