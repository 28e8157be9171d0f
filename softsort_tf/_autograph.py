"""The core package is never converted by autograph.

Its control flow on tensors is explicit (`tf.cond`, `tf.while_loop`, `tf.where`), as
Keras' is, so converting it inside a user's `tf.function` only costs tracing time.
`register()` puts it on TensorFlow's do-not-convert list
(`autograph.core.config.CONVERSION_RULES`, nothing where a version lacks it); the
research harness (`experiments`, `datasets`) stays convertible, as user code.
"""

from __future__ import annotations

PACKAGE = __name__.rpartition(".")[0]
CONVERTED_SUBPACKAGES = ("experiments", "datasets")


def register() -> bool:
    """Puts the core of the package on autograph's do-not-convert list (idempotent);
    returns whether the list exists in this TensorFlow."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:  # pragma: no cover (a TensorFlow without the module)
        return False
    rules = getattr(config, "CONVERSION_RULES", None)
    if not isinstance(rules, tuple) or not hasattr(config, "DoNotConvert"):
        return False  # pragma: no cover
    if any(getattr(rule, "_prefix", None) == PACKAGE for rule in rules):
        return True
    ours = tuple(config.Convert(f"{PACKAGE}.{sub}") for sub in CONVERTED_SUBPACKAGES)
    config.CONVERSION_RULES = ours + (config.DoNotConvert(PACKAGE),) + rules
    return True
