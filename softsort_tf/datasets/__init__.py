"""Datasets for the training binaries (large-MNIST)."""

from softsort_tf.datasets.large_mnist import (
    DigitSplit,
    DigitSplits,
    LargeMnistSampler,
    load_digit_splits,
    make_dataset,
)

__all__ = ["DigitSplit", "DigitSplits", "LargeMnistSampler", "load_digit_splits",
           "make_dataset"]
