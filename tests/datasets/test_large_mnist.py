"""Tests of the large-MNIST tf.data pipeline (softsort_tf.datasets.large_mnist)."""

import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.datasets import large_mnist
from softsort_tf.datasets.large_mnist import (
    LargeMnistSampler,
    load_digit_splits,
    make_dataset,
)


@pytest.fixture(scope="module")
def embedded():
    return load_digit_splits("embedded")


def _sample(split, n=4, batch=16, seed=(3, 7)):
    out = LargeMnistSampler(split, n).sample(batch, tf.constant(seed, tf.int64))
    return {k: v.numpy() for k, v in out.items()}


def test_shapes_and_dtypes(embedded):
    b = _sample(embedded.train, n=5, batch=6)
    assert b["images"].shape == (6, 5, 112, 28, 1) and b["images"].dtype == np.float32
    assert b["numbers"].shape == (6, 5) and b["permutation"].shape == (6, 5)
    assert b["digit_indices"].shape == (6, 5, 4)
    assert 0.0 <= b["images"].min() and b["images"].max() <= 1.0 and b["images"].max() > 0.9
    ds = make_dataset(embedded.validation, n=3, batch_size=4, seed=0, num_batches=3)
    elems = list(ds)
    assert len(elems) == 3
    assert [int(e["step"][0]) for e in elems] == [0, 1, 2]
    assert ds.element_spec["images"].shape.as_list() == [4, 3, 112, 28, 1]


def test_labels_are_the_descending_sorting_permutations(embedded):
    b = _sample(embedded.test, n=7, batch=64)
    for numbers, perm in zip(b["numbers"], b["permutation"], strict=True):
        assert sorted(perm.tolist()) == list(range(7))
        np.testing.assert_array_equal(perm, np.argsort(-numbers, kind="stable"))
        assert np.all(np.diff(numbers[perm]) <= 0)  # the i-th entry is the i-th largest


def test_each_image_is_the_stack_of_its_digits(embedded):
    split = embedded.train
    b = _sample(split, n=3, batch=32)
    pixels = np.rint(b["images"][..., 0] * 255).astype(np.uint8)  # [32, 3, 112, 28]
    digits = (b["numbers"][..., None] // np.array([1000, 100, 10, 1])) % 10
    # The source images used have the digit classes of the number, thousands first ...
    np.testing.assert_array_equal(split.labels[b["digit_indices"]], digits)
    # ... and the 4 tiles of each 112×28 image are exactly those images, top to bottom.
    for k in range(4):
        np.testing.assert_array_equal(pixels[:, :, 28 * k:28 * (k + 1), :],
                                      split.images[b["digit_indices"][..., k]])


def test_numbers_are_uniform_and_all_images_of_a_class_are_used(embedded):
    b = _sample(embedded.validation, n=10, batch=400, seed=(0, 1))
    numbers = b["numbers"].ravel()
    assert numbers.min() >= 0 and numbers.max() <= 9999
    assert abs(numbers.mean() - 4999.5) < 4 * 2887 / np.sqrt(numbers.size)
    counts = np.bincount((numbers // 1000) % 10, minlength=10)
    assert counts.min() > 0.7 * numbers.size / 10
    used = np.unique(b["digit_indices"])
    assert len(used) == len(embedded.validation)  # 16000 draws cover all 129 images


def test_sampling_is_a_pure_function_of_seed_and_step(embedded):
    a = _sample(embedded.train, seed=(5, 2))
    b = _sample(embedded.train, seed=(5, 2))
    c = _sample(embedded.train, seed=(5, 3))
    np.testing.assert_array_equal(a["images"], b["images"])
    assert not np.array_equal(a["numbers"], c["numbers"])
    stream = [e["numbers"].numpy() for e in make_dataset(embedded.train, 3, 2, 9, num_batches=5)]
    resumed = [e["numbers"].numpy()
               for e in make_dataset(embedded.train, 3, 2, 9, num_batches=2, start_step=3)]
    np.testing.assert_array_equal(np.stack(stream[3:]), np.stack(resumed))


def _check_disjoint(splits, source_images):
    ids = [s.ids for s in (splits.train, splits.validation, splits.test)]
    all_ids = np.concatenate(ids)
    assert len(np.unique(all_ids)) == len(all_ids)  # no image in two splits
    for s in (splits.train, splits.validation, splits.test):
        np.testing.assert_array_equal(s.images, source_images[s.ids])  # ids are honest


def test_embedded_splits_are_disjoint_and_mnist_like(embedded):
    images, labels = large_mnist.embedded_digit_images()
    assert images.shape == (1797, 28, 28) and images.dtype == np.uint8
    assert images[:, :4].max() == 0 and images[:, :, -4:].max() == 0  # MNIST-like border
    assert images.max() == 255
    _check_disjoint(embedded, images)
    sizes = np.array([len(embedded.train), len(embedded.validation), len(embedded.test)])
    assert sizes.sum() == 1797
    np.testing.assert_allclose(sizes / 1797, [55 / 70, 5 / 70, 10 / 70], atol=0.01)
    for s in (embedded.train, embedded.validation, embedded.test):
        np.testing.assert_array_equal(s.labels, labels[s.ids])


def test_npz_splits_are_55k_5k_10k_and_disjoint(mnist_npz):
    splits = load_digit_splits("npz", mnist_npz)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (55000, 5000, 10000)
    with np.load(mnist_npz) as f:
        source = np.concatenate([f["x_train"], f["x_test"]])
        labels = np.concatenate([f["y_train"], f["y_test"]])
    _check_disjoint(splits, source)
    np.testing.assert_array_equal(splits.test.labels, labels[splits.test.ids])
    assert splits.test.ids.min() == 60000  # test sequences only use MNIST test digits
    small = load_digit_splits("npz", mnist_npz, limit_per_class=3)
    assert len(small.train) == 30 and set(small.train.ids) <= set(splits.train.ids)


def test_tfds_source_uses_the_mnist_train_and_test_splits(monkeypatch):
    rng = np.random.default_rng(0)
    fake = {"train": (rng.integers(0, 256, (5100, 28, 28, 1), dtype=np.uint8),
                      np.arange(5100) % 10),
            "test": (rng.integers(0, 256, (50, 28, 28, 1), dtype=np.uint8), np.arange(50) % 10)}
    calls = []

    def load(name, split, batch_size, as_supervised):
        calls.append((name, tuple(split), batch_size, as_supervised))
        return [fake[s] for s in split]

    module = types.SimpleNamespace(load=load, as_numpy=lambda x: x)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", module)
    splits = load_digit_splits("tfds")
    assert calls == [("mnist", ("train", "test"), -1, True)]
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (100, 5000, 50)
    np.testing.assert_array_equal(splits.validation.images, fake["train"][0][:5000, ..., 0])
    np.testing.assert_array_equal(splits.test.images, fake["test"][0][..., 0])


def test_bad_arguments_raise_value_errors(embedded, tmp_path):
    with pytest.raises(ValueError, match="source"):
        load_digit_splits("cifar")
    with pytest.raises(ValueError, match="mnist_npz"):
        load_digit_splits("npz")
    with pytest.raises(ValueError, match="mnist_npz"):
        load_digit_splits("npz", str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "digits.npz", x_train=np.zeros([3, 28, 28], np.uint8))
    with pytest.raises(ValueError, match=r"lacks the arrays \['y_train', 'x_test', 'y_test'\]"):
        load_digit_splits("npz", str(tmp_path / "digits.npz"))
    with pytest.raises(ValueError, match="limit_per_class"):
        load_digit_splits("embedded", limit_per_class=0)
    with pytest.raises(ValueError, match="n must"):
        LargeMnistSampler(embedded.test, 1)
    with pytest.raises(ValueError, match="batch_size"):
        make_dataset(embedded.test, 3, 0, seed=0)
