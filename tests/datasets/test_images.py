"""Image classification splits (`softsort_tf.datasets.images`)."""

import pytest

from softsort_tf.datasets import images


def test_image_splits_are_disjoint_and_scaled():
    s = images.load_image_splits("embedded")
    assert s.image_shape == (28, 28, 1) and s.x_train.max() <= 1.0
    assert len(s.y_train) + len(s.y_val) + len(s.y_test) == 1797
    with pytest.raises(ValueError, match="source"):
        images.load_image_splits("imagenet")
