"""The CQR regression data sets (`softsort_tf.datasets.cqr`): the published files' formats
read with the reference preprocessing, the split and the scaling.

The data files are stand-ins in the same formats (`cqr_standin.py`, fixture `cqr_dir`).
"""

import os

import numpy as np
import pytest

from softsort_tf.datasets import cqr


def test_cqr_formats_are_read_with_the_reference_preprocessing(cqr_dir):
    path, truth = cqr_dir
    x, y = cqr.load_dataset("bio", path)
    np.testing.assert_allclose(x, truth["bio"][0])
    np.testing.assert_allclose(y, truth["bio"][1])
    x, y = cqr.load_dataset("concrete", path)
    np.testing.assert_allclose(x, truth["concrete"][0])
    np.testing.assert_allclose(y, truth["concrete"][1])

    x, y = cqr.load_dataset("bike", path)
    rows = truth["bike"]
    np.testing.assert_array_equal(y, [r[-1] for r in rows])  # count; casual/registered gone
    assert x.shape == (len(rows), 6 + 4 + 4 + 4)
    np.testing.assert_array_equal(x[:, 6:10].sum(1), 1)  # season one-hot
    np.testing.assert_array_equal(x[:, 6:10].argmax(1) + 1, [r[1] for r in rows])
    np.testing.assert_array_equal(x[:, 10:14].argmax(1) + 1, [r[4] for r in rows])
    np.testing.assert_array_equal(x[:, 14], [int(r[0][11:13]) for r in rows])  # hour
    np.testing.assert_array_equal(x[:, 17], [int(r[0][:4]) - 2011 for r in rows])  # year 0/1

    x, y = cqr.load_dataset("star", path)
    np.testing.assert_array_equal(y, truth["star"])  # rows with NA dropped, 8 scores summed
    # id and scores removed: gender, ethnicity, birth and the 4 class/school columns
    assert x.shape == (len(truth["star"]), 3 + 4)
    assert set(np.unique(x[:, 0])) == {0.0, 1.0}  # gender coded as integers

    x, y = cqr.load_dataset("community", path)
    values, other = truth["community"]
    np.testing.assert_allclose(y, values[:, -1])
    # population, OtherPerCap (imputed), householdsize, a0..a3; LemasSwornFT dropped.
    expected = np.column_stack([values[:, 0], other, values[:, 2], values[:, 4:-1]])
    np.testing.assert_allclose(x, expected)


def test_cqr_split_and_scaling(cqr_dir):
    from sklearn.model_selection import train_test_split

    path, _ = cqr_dir
    x, y = cqr.load_dataset("concrete", path)
    s = cqr.load_split("concrete", path, seed=3, validation_fraction=0.25)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=3)
    assert len(s.y_test) == len(y_te) == 30 and len(s.y_train) + len(s.y_val) == len(y_tr)
    assert s.y_scale == pytest.approx(np.mean(np.abs(y_tr)))
    np.testing.assert_allclose(s.y_test * s.y_scale, y_te, rtol=1e-5)
    np.testing.assert_allclose(s.x_test, (x_te - x_tr.mean(0)) / x_tr.std(0), rtol=1e-4,
                               atol=1e-5)
    whole = np.concatenate([s.x_train, s.x_val])
    np.testing.assert_allclose(whole.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(whole.std(0), 1, atol=1e-4)
    with pytest.raises(ValueError, match="dataset"):
        cqr.load_dataset("facebook", path)
    with pytest.raises(ValueError, match="no file"):
        cqr.load_dataset("bio", str(os.path.dirname(path)))


def test_real_data_sets_need_a_data_dir():
    with pytest.raises(ValueError, match="data_dir"):
        cqr.load_split("bio", None, 0)
