"""In-memory training batches (`softsort_tf.datasets.arrays`)."""

import numpy as np
import pytest

from softsort_tf.datasets import arrays


def test_shuffled_batches_resume_at_the_same_batches():
    x = np.arange(50)
    full = [b.numpy() for b in arrays.shuffled_batches(x, 8, seed=4).take(14)]
    later = [b.numpy() for b in arrays.shuffled_batches(x, 8, seed=4, start_step=9).take(5)]
    for a, b in zip(full[9:], later, strict=True):
        np.testing.assert_array_equal(a, b)
    first_epoch = np.concatenate(full[:6])
    assert len(np.unique(first_epoch)) == 48  # a pass visits distinct examples
    with pytest.raises(ValueError, match="batch_size"):
        arrays.steps_per_epoch(5, 8)
