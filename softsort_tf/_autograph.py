"""The library's code is never converted by autograph.

Inside a user's `tf.function` (autograph on, the default), autograph rewrites every
function the traced code calls unless the function's module is on its list of packages
not to convert (TensorFlow, Keras, NumPy, TF-Probability, ...). softsort_tf's control
flow on tensors is explicit (`tf.cond`, `tf.while_loop`, `tf.where`), as Keras' is, so
converting it changes nothing but the cost of each trace: parsing and rewriting the
source of every library function reached (a tenth of the tracing time of a ranking
loss). `register()` adds the core package to that list, as TensorFlow does for Keras.
The research harness (`softsort_tf.experiments`, `softsort_tf.datasets`) stays
convertible: its helpers are ordinary user code of `tf.function`.

The list is TensorFlow's `autograph.core.config.CONVERSION_RULES` (the mechanism its
own tests use); where a TensorFlow version lacks it, nothing is registered and
autograph converts the library as before, with the same results.
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
