"""Keras losses built on the package's soft sorting and ranking operators.

Each loss is a thin `keras.losses.Loss` around a functional form
(`losses.base.LossFunctionWrapper`): the class validates its arguments at
construction, the function computes one loss per example or per list, and Keras
reduces them with `sample_weight`. The losses and their functional forms: docs/api.md
("Losses").

The losses that take `method=` call that family's temperature `temperature`
(`Family.temperature`); Sinkhorn's settings (`options`, its fields such as `epsilon`,
`squash`, `targets`) are keyword arguments of their own, part of `get_config()`.
"""
