"""Datasets of the training binaries.

- `large_mnist`: sequences of 4-digit handwritten numbers (sorting, median regression);
  its public names are re-exported here;
- `images`: small image-classification sets (top-k, kNN);
- `cqr`: the regression data sets of the quantile-regression benchmark (files the
  project does not ship);
- `arrays`: resumable, deterministic mini-batch streams over in-memory arrays.
"""

from softsort_tf.datasets.large_mnist import (
    DigitSplit,
    DigitSplits,
    LargeMnistSampler,
    load_digit_splits,
    make_dataset,
)

__all__ = ["DigitSplit", "DigitSplits", "LargeMnistSampler", "load_digit_splits",
           "make_dataset"]
